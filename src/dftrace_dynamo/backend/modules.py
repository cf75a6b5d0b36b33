"""Module slices: one ``module`` event around the ops of each ``nn.Module`` call.

Where calls begin and end is decided once, at compile time, from each executed
node's module stack (:func:`sites.module_stack`, outermost call first). Walking
the nodes in execution order with a stack of open calls, a node closes the open
calls that are not in its own stack (innermost first) and opens the ones its
stack adds. Slices therefore always form a proper stack over the op sequence
and nest exactly in trace viewers; a call whose ops are interleaved with
another's (AOTAutograd's partitioning and the backward order do this) gets one
slice per run of its ops, and an op without a module sits in no slice.

At each boundary the calls closed there are recorded, innermost first, from their
start to now, and the calls that begin there are opened. The starts wait on a
per-thread stack in C; the graph call puts its depth back when the graph
returns or raises, so a graph that raised leaves no slice open. A boundary just
before an op is folded into that op's ``_core.Interceptor`` (``boundary=``): the
interceptor moves the stack with the same clock read that starts the op, so a
module call costs no call of its own. A boundary before anything else (the
graph's output, a checkpointed region) is a ``_core.boundary`` call with
constant arguments. At ``level="inductor"`` the same plan frames the kernel
calls of Inductor's generated code, folded into the kernels' interceptors the
same way (:func:`.inductor.add_spans`).

A module whose own code Dynamo compiles as a frame (called from eager code, or a
``forward`` resumed after a graph break) runs partly outside any graph: the code
between its graphs, a ``torch.compiler.disable``'d call. Its slice is written by
forward hooks around the whole call instead (:func:`frame_slices`), so that time
is the module's; its graphs sit inside it. The hooks cost one ``span`` call each,
which records nothing outside the step windows.

Eager module calls (a module Dynamo skips such as ``nn.LSTM``, a loss module called outside
the compiled model, a model never compiled) are seen by the eager-op hooks
(:mod:`..events.eager`); :func:`eager_module` gives each its path in the user's model, the
same the compiled graphs use, and says whether it is a slice of its own.
"""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Optional, Sequence

import torch.fx

from .. import _core
from ..events import eager
from ..schema import ARG_GRAPH, ARG_MODULE_TYPE, CAT_MODULE
from ..session import config, hooks
from . import sites

Frame = tuple[str, str, str]  # (call key, module path, module type), as sites.module_stack gives


def boundaries(stacks: Sequence[Sequence[Frame]]) -> list[tuple[int, list[Frame], list[Frame]]]:
    """``(i, closed, opened)`` for each point before op ``i`` where the open calls change;
    ``i == len(stacks)`` is after the last op. ``closed`` is innermost first, ``opened``
    outermost first. Frames are the same call when their keys are equal."""
    changes = []
    current: Sequence[Frame] = ()
    for i, stack in enumerate([*stacks, ()]):
        keep = 0
        while keep < min(len(current), len(stack)) and current[keep][0] == stack[keep][0]:
            keep += 1
        if keep < len(current) or keep < len(stack):
            changes.append((i, list(reversed(current[keep:])), list(stack[keep:])))
            current = stack
    return changes


def is_span(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a boundary call added by :func:`add_spans` (not one of the user's ops)."""
    return getattr(node.target, "func", None) is _core.boundary


def boundary_of(node: torch.fx.Node) -> Optional[tuple[int, tuple[int, ...]]]:
    """``(opened, closed sites)`` of the module-slice boundary at ``node``: a boundary call's
    arguments, or those folded into the op's interceptor; ``None`` where there is none."""
    if is_span(node):
        return node.args[0], tuple(node.args[1:])
    return node.target.boundary if isinstance(node.target, _core.Interceptor) else None


def span_plan(stacks: Sequence[Sequence[Frame]], graph_id: int,
              hooked: bool = True) -> list[tuple[int, int, list[int]]]:
    """The boundary calls for ops with these module stacks: ``(i, opened, sites)`` per
    boundary, in order, where ``i`` is as in :func:`boundaries`, ``opened`` the number of
    calls opened there and ``sites`` the site ids of the calls closed there, innermost
    first: the arguments of ``_core.boundary`` after the cell. ``hooked``: the frame's own
    module (``sites.SELF_KEY``) has its slice from forward hooks (not in backward graphs,
    where no hook runs)."""
    site_ids: dict[tuple[str, str], int] = {}

    def site(frame: Frame) -> int:
        _, path, mtype = frame
        if (path, mtype) not in site_ids:
            site_ids[path, mtype] = _core.intern_site(path, CAT_MODULE,
                                                      {ARG_MODULE_TYPE: mtype, ARG_GRAPH: graph_id})
        return site_ids[path, mtype]

    if hooked:
        stacks = [[frame for frame in stack if frame[0] != sites.SELF_KEY] for stack in stacks]
    return [(i, len(opened), [site(frame) for frame in closed]) for i, closed, opened in boundaries(stacks)]


def span_function(cell) -> functools.partial:
    """``_core.boundary`` bound to the graph's tag cell: the boundary call. (A partial of a
    module-level function: FX and Lightning deep-copy graph targets.)"""
    span = functools.partial(_core.boundary, cell)
    # FX binds the call as a global of the generated code under this name
    span.__name__, span.__module__ = "dft_module_span", _core.__name__
    return span


def add_spans(graph: torch.fx.Graph, nodes: Sequence[torch.fx.Node], stacks: Sequence[Sequence[Frame]],
              graph_id: int, cell, hooked: bool = True, fold: bool = True) -> int:
    """Adds the module-slice boundaries for ``nodes`` (the executed nodes, in order, and their
    module stacks) to ``graph``: each folded into the interceptor of the op it precedes where
    that is a plain ``_core.Interceptor`` with this ``cell`` (and ``fold``), else a boundary
    call inserted before it. Returns the number of module slices a call of the graph records."""
    plan = span_plan(stacks, graph_id, hooked)
    span = None
    anchors = [*nodes, next(n for n in reversed(graph.nodes) if n.op == "output")]
    for i, opened, closed in plan:
        op = anchors[i].target
        if fold and type(op) is _core.Interceptor and op.cell is cell and op.boundary is None:
            anchors[i].target = _with_boundary(op, opened, closed)
            continue
        span = span or span_function(cell)
        with graph.inserting_before(anchors[i]):
            graph.call_function(span, (opened, *closed))
    return sum(len(closed) for _, _, closed in plan)


def _with_boundary(op: _core.Interceptor, opened: int, closed: Sequence[int]) -> _core.Interceptor:
    """``op`` with the boundary ``(opened, closed)`` before it."""
    folded = _core.Interceptor(op.target, op.site, op.cell, op.mode, op.grad, name=op.__name__,
                               boundary=(opened, tuple(closed)))
    folded.__dict__.update(op.__dict__)
    return folded


GROUP = "module slices"


def frame_slices(module: torch.nn.Module, path: str, cell) -> None:
    """Writes ``module``'s slice around each of its calls, eager parts included (forward pre and
    post hooks, installed once per module)."""
    name = _hook_name(module, path)
    if hooks.installed(name) or module in _wrapped:
        return
    site = _core.intern_site(path, CAT_MODULE, {ARG_MODULE_TYPE: type(module).__name__})
    starts: list = []  # one per call in progress (a module may call itself)

    def pre(*_):
        starts.append(_core.span(cell))  # now, or 0 outside the step windows

    def post(*_):
        _core.span(cell, torch.is_grad_enabled(), starts.pop() if starts else 0, site)

    pre.__name__, post.__name__ = "dft_module_enter", "dft_module_exit"
    pre, post = torch._dynamo.disable(pre), torch._dynamo.disable(post)
    _framed.add(module)
    eager.forget(module)

    def register():
        handles = [module.register_forward_pre_hook(pre), module.register_forward_hook(post, always_call=True)]
        return _Handles(handles)

    hooks.declare(hooks.Registration(name, GROUP, register))
    hooks.install_one(name)


class _Handles:
    def __init__(self, handles):
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


_framed: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # modules with frame_slices hooks
_wrapped: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # modules whose slice is their wrapper's call


def _hook_name(module: torch.nn.Module, path: str) -> str:
    return f"module slice {path} {id(module):x}"


def eager_module(module: torch.nn.Module, caller: Optional[torch.nn.Module]) -> tuple[Optional[str], object, bool]:
    """``(path, slice, keep)`` of an eager call of ``module`` from ``caller``'s (see
    :func:`..events.eager.set_module_resolver`). A module first seen here is a model's root
    (:func:`sites.register`, named from the user's frames), as it would be at its compile. An
    unnamed root's own path is its name (a loss module). A ``torch.compile`` wrapper's call is
    the compiled model's slice (:func:`compiled_slice`); its ops keep the caller's path. The
    module it wraps is a compiled frame's root: its slice is the wrapper's, and it is registered
    by its compile. A module whose frame Dynamo compiles (:func:`frame_slices`) has its slice from
    those hooks; one whose ``forward`` is itself compiled has none. No slices with
    DFTRACER_MODULE_SLICES=0."""
    if isinstance(module, torch._dynamo.eval_frame.OptimizedModule):
        return compiled_slice(module._orig_mod)
    wrapped = isinstance(caller, torch._dynamo.eval_frame.OptimizedModule) and caller._orig_mod is module
    path = sites.path_of(module)
    if path is None:
        if wrapped:
            return None, False, False
        sites.register(module, sys._getframe(1))
        path = sites.path_of(module)
    if not path:
        if wrapped:
            return None, False, True
        path = sites.root_name(module)
    # a forward compiled itself (``torch.compile`` on the method) is a compiled frame's: no slice, as wrapped
    forward = getattr(module, "forward", None)  # (torch.compiler.disable marks its wrapper too, as disabled)
    compiled = getattr(forward, "_torchdynamo_orig_callable", None) is not None and not getattr(
        forward, "_torchdynamo_disable", False)
    return path, not (wrapped or compiled) and module not in _framed and config.get().module_slices, True


def compiled_slice(model: torch.nn.Module) -> tuple[None, object, bool]:
    """``(None, slice, keep)`` of a call of ``torch.compile(model)``: the whole call is ``model``'s
    slice, ``(name, module type)``, so the time Dynamo spends in it outside graphs (guards, each
    frame's set-up, resume functions after graph breaks, the return) is the model's forward. It
    replaces the slice :func:`frame_slices` gives a model with a path (a compiled submodule, a
    root named to tell it from another model), which begins only after Dynamo's entry. Not
    before ``model``'s compile has registered it (asked again at the next call); none with
    DFTRACER_MODULE_SLICES=0."""
    path = sites.path_of(model)
    if path is None:
        return None, False, False
    if not config.get().module_slices:
        return None, False, True
    _wrapped.add(model)
    if model in _framed:
        hooks.remove_one(_hook_name(model, path))
        _framed.discard(model)
    return None, (path or sites.root_name(model), type(model).__name__), True


eager.set_module_resolver(eager_module)
