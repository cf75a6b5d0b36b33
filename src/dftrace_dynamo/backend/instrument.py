"""Rewrites an FX graph so that every executed op runs inside a ``_core.Interceptor``.

Each ``call_function`` / ``call_method`` / ``call_module`` node that computes something
(:func:`.sites.computes`: not a ``getitem`` picking an output of a multi-output op) becomes a
``call_function`` node whose target is an Interceptor bound, once, to what the
node would have called: the function (``op._op`` for ATen OpOverloads, which
skips ``OpOverload.__call__``), the method name (METHOD mode) or the submodule
object. FX code generation binds the Interceptor as a global of the generated
``forward``, so a call costs no attribute lookup and no Python frame of ours.

Activation checkpointing (``torch.utils.checkpoint``) runs ops again in backward. At
``level="aten"`` AOTAutograd's partitioner copies them into the backward graph; at
``level="torch"`` Dynamo makes the checkpointed code a ``tag_activation_checkpoint`` body
that torch runs in forward and again in backward. Checkpointing applied from eager code
around compiled code runs a forward graph again in backward (:class:`Recomputing`). Each way
those second runs are recorded with ``recompute: true``.
"""

from __future__ import annotations

import copy
import re
import threading

import torch
import torch.fx
from torch.fx._lazy_graph_module import _LazyGraphModule

from .. import _core
from ..events import comm
from ..schema import ARG_NODE, ARG_RECOMPUTE, CAT_COMM, CAT_OP
from ..session import config
from . import modules, sites

_IDENT = re.compile(r"\W+")

# Nodes Dynamo / AOTAutograd emit for grad-mode changes inside a graph. After them the
# events carry the mode statically (GraphCall's grad_fn only sees the mode at graph entry).
_SET_GRAD = torch._C._set_grad_enabled
_ENTER_INFERENCE = torch.autograd.grad_mode._enter_inference_mode
_EXIT_INFERENCE = torch.autograd.grad_mode._exit_inference_mode
# torch.utils.checkpoint under Dynamo: tag_activation_checkpoint(body, *inputs, **checkpoint_kwargs)
_CHECKPOINT = torch.ops.higher_order.tag_activation_checkpoint
_graph_task = torch._C._current_graph_task_id  # -1 outside a backward pass


class Recomputing:
    """``call``, or, during a backward pass, ``again``: the same work with events that say it is
    activation checkpointing's recompute. ``build()`` makes ``again`` at its first call where it
    is not given (a graph's twin, see :class:`.tracer.TracerBackend`); a failure there runs
    ``call`` instead, never the user's failure. Used for the ops of a checkpointed body at torch
    level (torch runs it node by node with ``fx.Interpreter``, microseconds per op, so one more
    call here is noise) and for a forward graph that checkpointing outside the compiled code runs again."""

    __slots__ = ("call", "again", "build", "lock", "_boxed_call", "__name__")

    def __init__(self, call, again=None, build=None, name: str = "dft_recomputing", boxed: bool = False):
        self.call, self.again, self.build, self.lock, self.__name__ = call, again, build, threading.Lock(), name
        if boxed:  # AOTAutograd then passes its argument list as is
            self._boxed_call = True

    def __call__(self, *args, **kwargs):
        if _graph_task() < 0:
            return self.call(*args, **kwargs)
        if self.again is None:
            with self.lock:
                if self.again is None:
                    try:
                        self.again = self.build()
                    except Exception as e:
                        config.log.warning("recompute traced as forward: %s", e)
                        self.again = self.call
                    self.build = None
        return self.again(*args, **kwargs)


def _bind(node: torch.fx.Node, root: torch.nn.Module):
    """(callable or method name, mode) the Interceptor calls for ``node``."""
    if node.op == "call_method":
        return node.target, _core.METHOD
    if node.op == "call_module":
        return root.get_submodule(node.target), _core.CALL
    target = node.target
    if type(target) in (torch._ops.OpOverload, torch._ops.OpOverloadPacket):
        return target._op, _core.CALL
    return target, _core.CALL


def instrument(gm: torch.fx.GraphModule, graph_id: int, cell, with_metadata: bool, device_timer=None,
               backward: bool = False, recomputed: frozenset = frozenset(), body: str = "", outer: tuple = ()) -> int:
    """Rewrites ``gm`` in place and recompiles it; returns the number of instrumented nodes.

    With module slices on (``DFTRACER_MODULE_SLICES``), the nodes of each ``nn.Module``
    call are also enclosed in a ``module`` event (see :mod:`.modules`); in a ``backward``
    graph that includes the module whose forward hooks frame its forward calls.

    ``device_timer`` (a ``cuda_events.DeviceTimer``) also brackets each op with CUDA events.

    ``recomputed``: the names of the nodes whose events carry ``recompute`` (a backward graph's
    re-runs of checkpointed forward ops, see :func:`.sites.recomputed`; all nodes of a graph's
    recompute twin). ``body``: ``gm`` is the body of a checkpointed region (its attribute name in
    the graph that calls it), whose ops are recorded with ``recompute`` when run in backward;
    ``outer``: the module stack of that call, whose slices are already open around the body.
    """
    grad = _core.GRAD_INHERIT
    saved = []  # grad override in force before each open inference_mode region
    executed = []
    for node in list(gm.graph.nodes):
        if node.op not in ("call_function", "call_method", "call_module") or not sites.computes(node):
            continue
        stack = sites.module_stack(node)
        if [key for key, _, _ in stack[:len(outer)]] == [key for key, _, _ in outer]:
            stack = stack[len(outer):]
        executed.append((node, stack))
        if node.target is _CHECKPOINT:  # no event of its own: its body's ops would nest in it
            _instrument_body(gm, node, graph_id, cell, with_metadata, sites.module_stack(node), body)
            continue
        name = sites.op_name(node)
        args = sites.op_args(node, gm, graph_id, with_metadata)
        if node.name in recomputed:
            args[ARG_RECOMPUTE] = True
        if body:  # node names are unique within one graph: a body's own are not
            args[ARG_NODE] = f"{body}.{node.name}"
        cat = CAT_OP
        if comm.is_functional_collective(node.target):  # communication, not computation
            cat = CAT_COMM
            args = {**args, **comm.graph_args(node)}
        target, mode = _bind(node, gm)
        if device_timer is not None:
            target, mode = device_timer.op(target, mode, name, args), _core.CALL
        pyname = "dft_" + _IDENT.sub("_", name.removeprefix("function.")).strip("_")
        interceptor = _core.Interceptor(target, _core.intern_site(name, cat, args), cell, mode, grad, name=pyname)
        if body:
            again = _core.Interceptor(target, _core.intern_site(name, cat, {**args, ARG_RECOMPUTE: True}), cell,
                                      mode, grad, name=pyname)
            interceptor = Recomputing(interceptor, again, name=pyname)
        original = node.target
        node.op, node.target = "call_function", interceptor
        # the mode switch itself runs under the old mode; the nodes after it under the new one
        if original is _SET_GRAD and isinstance(node.args[0], bool):
            grad = _core.GRAD_ON if node.args[0] else _core.GRAD_OFF
        elif original is _ENTER_INFERENCE:
            saved.append(grad)
            if node.args and node.args[0] is not False:
                grad = _core.GRAD_OFF
        elif original is _EXIT_INFERENCE and saved:
            grad = saved.pop()
    if executed and config.get().module_slices:
        modules.add_spans(gm.graph, *zip(*executed), graph_id, cell, hooked=not backward)
    gm.recompile()
    # Dynamo's lazy graph modules generate their code at the first call, through a stub forward that
    # stays in every reference to gm.forward taken before: generate it now
    _LazyGraphModule.force_recompile(gm)
    direct_calls(type(gm).forward.__globals__)
    return sum(node.target is not _CHECKPOINT for node, _ in executed)


def direct_calls(namespace: dict) -> None:
    """The generated code in ``namespace`` calls each Interceptor through its ``builtin``: the
    interpreter calls a built-in function's C code directly, where calling the Interceptor object
    takes its generic call path (a few ns more per op). Graph nodes keep the Interceptor.

    The built-ins are chained (``_core.chain``) in the order the code first names them, which is
    the order it calls them: each op prefetches the next one's objects, so a graph of thousands of
    ops, whose per-op objects outgrow the caches, costs per op what a short one does."""
    calls = []
    for name, value in list(namespace.items()):
        if type(value) is _core.Interceptor:
            namespace[name] = value.builtin
            calls.append(namespace[name])
    _core.chain(calls)


def _instrument_body(gm: torch.fx.GraphModule, node: torch.fx.Node, graph_id: int, cell, with_metadata: bool,
                     stack: tuple, within: str) -> None:
    """Instruments a copy of the body that the checkpoint call ``node`` runs, in its place (a
    torch-level graph keeps an uninstrumented copy that still calls the original). Its ops get
    no device events: their second run is outside every graph call. ``within``: the body that
    holds ``node``, if any."""
    name = node.args[0].target
    original = gm.get_submodule(name)
    body = torch.fx.GraphModule(original, copy.deepcopy(original.graph))
    body.meta.update(original.meta)  # the checkpoint's own options (context_fn) are there
    instrument(body, graph_id, cell, with_metadata, body=f"{within}.{name}" if within else name, outer=stack)
    gm.add_submodule(name, body)
