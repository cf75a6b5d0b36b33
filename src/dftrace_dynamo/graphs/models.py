"""Model loading and example inputs for the graph subcommands.

A model is named by one of (tried in this order):

* ``package.module:attr`` — a class or factory called with no arguments
  (a transformers model class is built from its default config);
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
import inspect
import json
import pathlib
import sys
from typing import Optional, Sequence

import torch

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


def _from_transformers_config(transformers, model_type: str, values: dict) -> torch.nn.Module:
    try:
        return transformers.AutoModel.from_config(transformers.AutoConfig.for_model(model_type, **values))
    except ValueError as exc:  # unknown model type, or a config type without a base model class
        raise ModelError(f"transformers cannot build a {model_type!r} model: {exc}") from exc


def _from_factory(spec: str, overrides: dict) -> torch.nn.Module:
    module_name, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ModelError(f"cannot import {spec}: {exc}") from exc
    # A transformers class means transformers is imported already: no need to import it here.
    transformers = sys.modules.get("transformers")
    if transformers and inspect.isclass(obj) and issubclass(obj, transformers.PreTrainedModel):
        return obj(obj.config_class(**overrides))
    if overrides:
        raise ModelError("--config-set only applies to transformers models")
    try:
        model = obj()
    except TypeError as exc:  # a factory that needs arguments
        raise ModelError(f"cannot call {spec}() without arguments: {exc}") from exc
    if not isinstance(model, torch.nn.Module):
        raise ModelError(f"{spec} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _torchvision_names() -> Optional[list]:
    try:
        import torchvision
    except ImportError:
        return None
    return list(torchvision.models.list_models())


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
        if "model_type" not in data:
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
    tv_names = _torchvision_names()
    if tv_names is not None and spec in tv_names:
        import torchvision
        if overrides:
            raise ModelError("--config-set only applies to transformers models")
        return torchvision.models.get_model(spec, weights=None), "torchvision"
    hints = ["package.module:Class", "a config .json"]
    hints.append("a transformers model type (bert, gpt2, vit...)" if transformers else
                 "transformers model types (transformers is not installed)")
    hints.append("a torchvision model name" if tv_names is not None else
                 "torchvision model names (torchvision is not installed: pip install torchvision)")
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


def make_inputs(model: torch.nn.Module, input_shape: Optional[Sequence[int]] = None,
                seq_len: int = 128, batch_size: int = 1, image_size: int = 224) -> tuple[tuple, dict]:
    """Example ``(args, kwargs)`` for ``model.forward``, from its signature.

    ``input_shape`` (batch included) wins for the image / tensor input.
    """
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    names = [p.name for p in params]
    if "input_ids" in names:
        vocab = int(_config_get(model, "vocab_size", default=2))
        shape = tuple(input_shape) if input_shape else (batch_size, seq_len)
        kwargs = {"input_ids": torch.randint(0, vocab, shape)}
        if "attention_mask" in names:
            kwargs["attention_mask"] = torch.ones(shape, dtype=torch.long)
        return (), kwargs
    if "pixel_values" in names:
        if input_shape:
            shape = tuple(input_shape)
        else:
            size = _config_get(model, "image_size", default=image_size)
            size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
            shape = (batch_size, int(_config_get(model, "num_channels", default=3)), *size)
        return (), {"pixel_values": torch.randn(shape)}
    required = [p for p in params if p.default is p.empty]
    if len(required) != 1:
        raise ModelError(f"cannot build inputs for forward({', '.join(names)}): "
                         "use a model with one tensor input, input_ids or pixel_values")
    if input_shape:
        return (torch.randn(tuple(input_shape)),), {}
    layer = _first_layer(model)
    if isinstance(layer, torch.nn.Embedding):
        return (torch.randint(0, layer.num_embeddings, (batch_size, seq_len)),), {}
    if isinstance(layer, torch.nn.Linear):
        return (torch.randn(batch_size, layer.in_features),), {}
    if isinstance(layer, torch.nn.Conv1d):
        return (torch.randn(batch_size, layer.in_channels, seq_len),), {}
    if isinstance(layer, torch.nn.Conv2d):
        return (torch.randn(batch_size, layer.in_channels, image_size, image_size),), {}
    raise ModelError(f"cannot tell the input shape of {type(model).__name__}: give --input-shape")
