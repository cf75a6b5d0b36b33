"""Hybrid tracing: warm-up, FX ``symbolic_trace``, Dynamo fallback.

The warm-up call runs first so lazily initialised models (buffers made on
the first forward) are in their steady state. ``symbolic_trace`` is tried
next: one graph with module-level nodes. When it raises, or its graph does
not reproduce the eager output (e.g. control flow FX could not see), the
model goes through Dynamo capture, which splits at graph breaks instead of
failing. The result says which method was used and why FX was not.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Optional

import torch
import torch.fx
from torch.utils._pytree import tree_leaves

from .capture import GraphBreak, GraphPartition, capture_graphs, make_partition

__all__ = ["METHODS", "TracedModel", "WarmupError", "trace_hybrid"]

METHODS = ("auto", "fx", "dynamo")


class WarmupError(RuntimeError):
    """The model fails on the example inputs before any tracing (wrong input shape, bad config)."""


@dataclasses.dataclass
class TracedModel:
    method: str  # "symbolic_trace" or "dynamo"
    partitions: list[GraphPartition]
    graph_breaks: list[GraphBreak]
    fx_error: Optional[str] = None  # why symbolic_trace was not used (None: it was, or not tried)
    output: Any = None  # eager output of the warm-up call


def _same(a: Any, b: Any) -> bool:
    left, right = tree_leaves(a), tree_leaves(b)
    if len(left) != len(right):
        return False
    for x, y in zip(left, right):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or not torch.allclose(x, y, rtol=1e-4, atol=1e-5, equal_nan=True):
                return False
        elif isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
    return True


def _fx_inputs(model: torch.nn.Module, gm: torch.fx.GraphModule, args: tuple, kwargs: dict) -> list:
    """Values of the traced graph's placeholders: forward's parameters, in order."""
    sig = inspect.signature(model.forward)
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
        raise TypeError("forward takes *args/**kwargs, which symbolic_trace cannot map to inputs")
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    values = list(bound.arguments.values())
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(values):
        raise TypeError(f"traced graph has {len(placeholders)} inputs, forward has {len(values)}")
    return values


def _try_fx(model: torch.nn.Module, args: tuple, kwargs: dict, expected: Any) -> tuple[Optional[GraphPartition], str]:
    try:
        gm = torch.fx.symbolic_trace(model)
        inputs = _fx_inputs(model, gm, args, kwargs)
        with torch.no_grad():
            out = gm(*inputs)
    except Exception as exc:  # any failure means "use Dynamo"; the reason is reported
        return None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if not _same(out, expected):
        return None, "symbolic_trace graph output differs from eager (control flow or randomness FX cannot see)"
    return make_partition(0, gm, inputs), ""


def trace_hybrid(model: Callable, args: tuple = (), kwargs: Optional[dict] = None, method: str = "auto") -> TracedModel:
    """Trace ``model`` on example inputs; ``method`` is "auto", "fx" or "dynamo"."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    args, kwargs = tuple(args), dict(kwargs or {})
    # Warm-up always: lazy initialisation must happen before any tracing.
    try:
        with torch.no_grad():
            output = model(*args, **kwargs)
    except Exception as exc:
        text = str(exc).strip()
        raise WarmupError(f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}") from exc
    fx_error = None
    if method in ("auto", "fx"):
        if isinstance(model, torch.nn.Module):
            partition, fx_error = _try_fx(model, args, kwargs, output)
            if partition is not None:
                return TracedModel("symbolic_trace", [partition], [], None, output)
        else:
            fx_error = "not a torch.nn.Module"
        if method == "fx":
            raise RuntimeError(f"symbolic_trace failed: {fx_error}")
    with torch.no_grad():
        captured = capture_graphs(model, args, kwargs)
    return TracedModel("dynamo", captured.partitions, captured.graph_breaks, fx_error, output)
