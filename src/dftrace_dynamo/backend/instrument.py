"""Rewrites an FX graph so that every executed op runs inside a ``_core.Interceptor``.

Each ``call_function`` / ``call_method`` / ``call_module`` node becomes a
``call_function`` node whose target is an Interceptor bound, once, to what the
node would have called: the function (``op._op`` for ATen OpOverloads, which
skips ``OpOverload.__call__``), the method name (METHOD mode) or the submodule
object. FX code generation binds the Interceptor as a global of the generated
``forward``, so a call costs no attribute lookup and no Python frame of ours.
"""

from __future__ import annotations

import re

import torch
import torch.fx

from .. import _core
from ..events import comm
from ..schema import CAT_COMM, CAT_OP
from ..session import config
from . import modules, sites

_IDENT = re.compile(r"\W+")

# Nodes Dynamo / AOTAutograd emit for grad-mode changes inside a graph. After them the
# events carry the mode statically (GraphCall's grad_fn only sees the mode at graph entry).
_SET_GRAD = torch._C._set_grad_enabled
_ENTER_INFERENCE = torch.autograd.grad_mode._enter_inference_mode
_EXIT_INFERENCE = torch.autograd.grad_mode._exit_inference_mode


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
               backward: bool = False) -> int:
    """Rewrites ``gm`` in place and recompiles it; returns the number of instrumented nodes.

    With module slices on (``DFTRACER_MODULE_SLICES``), the nodes of each ``nn.Module``
    call are also enclosed in a ``module`` event (see :mod:`.modules`); in a ``backward``
    graph that includes the module whose forward hooks frame its forward calls.

    ``device_timer`` (a ``cuda_events.DeviceTimer``) also brackets each op with CUDA events.
    """
    grad = _core.GRAD_INHERIT
    saved = []  # grad override in force before each open inference_mode region
    executed = []
    for node in list(gm.graph.nodes):
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        name = sites.op_name(node)
        args = sites.op_args(node, gm, graph_id, with_metadata)
        cat = CAT_OP
        if comm.is_functional_collective(node.target):  # communication, not computation
            cat = CAT_COMM
            args = {**args, **comm.graph_args(node)}
        site = _core.intern_site(name, cat, args)
        target, mode = _bind(node, gm)
        if device_timer is not None:
            target, mode = device_timer.op(target, mode, name, args), _core.CALL
        pyname = "dft_" + _IDENT.sub("_", name.removeprefix("function.")).strip("_")
        interceptor = _core.Interceptor(target, site, cell, mode, grad, name=pyname)
        original = node.target
        executed.append((node, sites.module_stack(node)))
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
    return len(executed)
