"""Model loading and example inputs for the graph subcommands.

A model is named by one of (tried in this order):

* ``package.module:attr`` or ``path/to/file.py:attr`` — a class or factory called with no
  arguments (a transformers model class is built from its default config); modules in the
  current directory import, as with ``python -m``;
* a local ``*.json`` transformers config (its ``model_type`` picks the class);
* a transformers model type (``bert``, ``gpt2``, ``vit``...): default config;
* a torchvision model name (``resnet18``...) when torchvision is installed.

Weights are always random: nothing is downloaded. Inputs come from the
forward signature (``input_ids`` + ``attention_mask``, ``pixel_values``, or one
tensor shaped by the first layer) and the size options, never from the name.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import pathlib
import sys
from typing import Optional, Sequence

import torch

from ..naming import truncate

__all__ = ["ModelError", "LoadedModel", "load_model", "make_inputs", "parse_overrides"]


class ModelError(ValueError):
    """The model or its inputs cannot be built from what the user gave."""


@dataclasses.dataclass
class LoadedModel:
    model: torch.nn.Module
    name: str
    source: str  # "factory", "transformers", "torchvision"


def parse_overrides(items: Sequence[str]) -> dict:
    """``["hidden_size=32", "use_cache=false"]`` → dict with JSON-typed values."""
    out = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ModelError(f"config override {item!r} is not KEY=VALUE")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def _transformers():
    try:
        import transformers
    except ImportError:
        return None
    return transformers


def _first_line(exc: BaseException) -> str:
    exc = exc.__cause__ or exc  # transformers wraps the telling error (a TypeError) in its own
    text = str(exc).strip()
    return f"{type(exc).__name__}: {truncate(text.splitlines()[0], 300)}" if text else type(exc).__name__


# Config integers that are sizes or counts: negative is never valid, and zero
# heads or layers would only fail later inside the model code.
_SIZE_SUFFIXES = ("_size", "_dim", "_layers", "_heads", "_positions", "_embeddings", "_channels")
_SIZE_PREFIXES = ("num_", "n_", "d_")
_NONZERO_SUFFIXES = ("_heads", "_layers", "hidden_size", "d_model", "n_embd", "n_head", "n_layer")
_ACTIVATION_KEYS = ("hidden_act", "activation_function", "hidden_activation", "dense_act_fn")


def _is_size(key: str) -> bool:
    return key.endswith(_SIZE_SUFFIXES) or key.startswith(_SIZE_PREFIXES)


def _check_config(config, values: dict) -> None:
    """Reject values the model code would fail on with a traceback (types, sizes, activations)."""
    try:
        defaults = type(config)()
    except Exception:  # a config that needs arguments (encoder-decoder wrappers): no types to compare with
        defaults = None
    for key, value in values.items():
        default = getattr(defaults, key, None)
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ModelError(f"config value {key}={value!r}: expected true or false")
        if isinstance(default, int) and not isinstance(default, bool) and (
                isinstance(value, bool) or not isinstance(value, int)):
            raise ModelError(f"config value {key}={value!r}: expected an integer")
        if isinstance(default, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ModelError(f"config value {key}={value!r}: expected a number")
    for key, value in vars(config).items():
        if isinstance(value, bool) or not isinstance(value, int) or not _is_size(key):
            continue
        nonzero = key.endswith(_NONZERO_SUFFIXES)
        if value < 0 or (value == 0 and nonzero):
            raise ModelError(f"config value {key}={value}: must be {'positive' if nonzero else 'at least 0'}")
    from transformers.activations import ACT2FN

    for key in _ACTIVATION_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, str) and value not in ACT2FN:
            raise ModelError(f"config value {key}={value!r}: unknown activation; known: {', '.join(sorted(ACT2FN))}")


def _from_transformers_config(transformers, model_type: str, values: dict) -> torch.nn.Module:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise ModelError(f"transformers cannot build a {model_type!r} model: no such model type")
    try:
        config = transformers.AutoConfig.for_model(model_type, **values)
    except Exception as exc:  # unknown model type or a value the config rejects (transformers checks types)
        raise ModelError(f"transformers cannot build a {model_type!r} config: {_first_line(exc)}") from exc
    _check_config(config, values)
    try:
        return transformers.AutoModel.from_config(config)
    except Exception as exc:  # the model code rejects the config: one line, not its traceback
        raise ModelError(f"transformers cannot build a {model_type!r} model: {_first_line(exc)}") from exc


def _import(module_name: str):
    """``package.module`` importable from the current directory too, as with ``python -m``, or a
    ``path/to/file.py``."""
    if module_name.endswith(".py"):
        path = pathlib.Path(module_name)
        if not path.is_file():
            raise ModuleNotFoundError(f"no file {module_name}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module  # dataclasses and pickling look their module up by name
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[path.stem]
            raise
        return module
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(module_name)


def _from_factory(spec: str, overrides: dict) -> torch.nn.Module:
    module_name, _, attr = spec.rpartition(":")
    try:
        obj = _import(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # ImportError, AttributeError or the module's own import-time error
        raise ModelError(f"cannot import {spec}: {_first_line(exc)}") from exc
    # A transformers class means transformers is imported already: no need to import it here.
    transformers = sys.modules.get("transformers")
    is_transformers = transformers and inspect.isclass(obj) and issubclass(obj, transformers.PreTrainedModel)
    if overrides and not is_transformers:
        raise ModelError("--config-set only applies to transformers models")
    try:
        if is_transformers:
            config = obj.config_class(**overrides)
            _check_config(config, overrides)
            model = obj(config)
        else:
            model = obj()
    except ModelError:
        raise
    except Exception as exc:  # a factory that needs arguments or fails: its error in one line
        raise ModelError(f"{spec}() failed: {_first_line(exc)}") from exc
    if not isinstance(model, torch.nn.Module):
        raise ModelError(f"{spec} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _torchvision():
    """(torchvision or None, why it is unusable)."""
    try:
        import torchvision
    except ImportError:
        return None, "torchvision is not installed"
    except Exception as exc:  # e.g. a torchvision built for another torch: RuntimeError at import
        return None, f"torchvision does not load with torch {torch.__version__} ({_first_line(exc)})"
    return torchvision, ""


def load_model(spec: str, overrides: Optional[dict] = None) -> LoadedModel:
    """Build the model named by ``spec`` with random weights, in eval mode."""
    overrides = dict(overrides or {})
    if ":" in spec:
        model, source = _from_factory(spec, overrides), "factory"
    elif spec.endswith(".json") or pathlib.Path(spec).is_file():
        transformers = _transformers()
        if transformers is None:
            raise ModelError("a config JSON needs transformers (pip install transformers)")
        try:
            data = json.loads(pathlib.Path(spec).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelError(f"cannot read config {spec}: {exc}") from exc
        if not isinstance(data, dict) or "model_type" not in data:
            raise ModelError(f"{spec} has no \"model_type\" key")
        data.update(overrides)
        model, source = _from_transformers_config(transformers, data.pop("model_type"), data), "transformers"
    else:
        model, source = _by_name(spec, overrides)
    return LoadedModel(model=model.eval(), name=spec, source=source)


def _by_name(spec: str, overrides: dict):
    transformers = _transformers()
    if transformers is not None:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        if spec in CONFIG_MAPPING:
            return _from_transformers_config(transformers, spec, overrides), "transformers"
    torchvision, why = _torchvision()
    if torchvision is not None and spec in torchvision.models.list_models():
        if overrides:
            raise ModelError("--config-set only applies to transformers models")
        return torchvision.models.get_model(spec, weights=None), "torchvision"
    hints = ["package.module:Class", "a config .json"]
    hints.append("a transformers model type (bert, gpt2, vit...)" if transformers else
                 "transformers model types (transformers is not installed)")
    # Never suggest a plain "pip install torchvision": pip would replace the installed torch.
    hints.append("a torchvision model name" if torchvision is not None else
                 f"torchvision model names ({why}; it needs the torchvision release built for "
                 f"torch {torch.__version__})")
    raise ModelError(f"unknown model {spec!r}; expected one of: " + ", ".join(hints))


def _config_get(model: torch.nn.Module, *names, default=None):
    config = getattr(model, "config", None)
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def _first_layer(model: torch.nn.Module):
    for module in model.modules():
        if isinstance(module, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear, torch.nn.Embedding)):
            return module
    return None


def _shape_arg(input_shape: Sequence[int], what: str, rank: int, channels: Optional[int] = None) -> tuple:
    """``input_shape`` checked against the rank (and channel count) the model takes."""
    shape = tuple(input_shape)
    if len(shape) != rank:
        raise ModelError(f"--input-shape {' '.join(map(str, shape))}: {what} takes {rank} numbers")
    if channels is not None and shape[1] != channels:
        raise ModelError(f"--input-shape {' '.join(map(str, shape))}: the model takes {channels} channels, "
                         f"not {shape[1]}")
    return shape


def make_inputs(model: torch.nn.Module, input_shape: Optional[Sequence[int]] = None,
                seq_len: int = 128, batch_size: int = 1, image_size: int = 224) -> tuple[tuple, dict]:
    """Example ``(args, kwargs)`` for ``model.forward``, from its signature.

    ``input_shape`` (batch included) wins for the image / tensor input.
    Encoder-decoder models (T5, BART...) also get ``decoder_input_ids`` of
    the same shape as ``input_ids``.
    """
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    names = [p.name for p in params]
    if "input_ids" in names:
        vocab = int(_config_get(model, "vocab_size", default=2))
        shape = _shape_arg(input_shape, "input_ids (batch, tokens)", 2) if input_shape else (batch_size, seq_len)
        limit = _config_get(model, "max_position_embeddings", "n_positions")
        if isinstance(limit, int) and shape[1] > limit:
            raise ModelError(f"{shape[1]} tokens per sequence: the model takes at most {limit}")
        kwargs = {"input_ids": torch.randint(0, vocab, shape)}
        if "attention_mask" in names:
            kwargs["attention_mask"] = torch.ones(shape, dtype=torch.long)
        if "decoder_input_ids" in names and _config_get(model, "is_encoder_decoder", default=False):
            kwargs["decoder_input_ids"] = torch.randint(0, vocab, shape)
        return (), kwargs
    if "pixel_values" in names:
        channels = int(_config_get(model, "num_channels", default=3))
        if input_shape:
            shape = _shape_arg(input_shape, "pixel_values (batch, channels, height, width)", 4, channels)
        else:
            size = _config_get(model, "image_size", default=image_size)
            size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
            shape = (batch_size, channels, *size)
        return (), {"pixel_values": torch.randn(shape)}
    required = [p for p in params if p.default is p.empty]
    if len(required) != 1:
        raise ModelError(f"cannot build inputs for forward({', '.join(names)}): "
                         "use a model with one tensor input, input_ids or pixel_values")
    layer = _first_layer(model)
    if isinstance(layer, torch.nn.Embedding):
        shape = tuple(input_shape) if input_shape else (batch_size, seq_len)
        return (torch.randint(0, layer.num_embeddings, shape),), {}
    if input_shape:
        # Whether the shape fits is found by the warm-up call, which reports the model's own error.
        return (torch.randn(tuple(input_shape)),), {}
    if isinstance(layer, torch.nn.Linear):
        return (torch.randn(batch_size, layer.in_features),), {}
    if isinstance(layer, torch.nn.Conv1d):
        return (torch.randn(batch_size, layer.in_channels, seq_len),), {}
    if isinstance(layer, torch.nn.Conv2d):
        return (torch.randn(batch_size, layer.in_channels, image_size, image_size),), {}
    raise ModelError(f"cannot tell the input shape of {type(model).__name__}: give --input-shape")
