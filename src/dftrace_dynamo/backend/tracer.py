"""The torch.compile backend: ``torch.compile(model, backend=tracer_backend)`` or ``backend="dftrace"``.

Levels:

``"aten"`` (default)
    The Dynamo graph goes through AOTAutograd (as ``backend="aot_eager"``); the
    forward, backward and inference graphs it produces are instrumented, so a
    training step shows every ATen op of both passes (``function.convolution.default``,
    ``function.convolution_backward.default``), as pydftracer users know them.
``"torch"``
    The Dynamo graph itself is instrumented (as ``backend="eager"``): torch-level
    ops (``function.linear``, ``method.view``), lower overhead, no compile-time
    AOT tracing, but backward runs in eager autograd and is not traced.

``"inductor"``
    The graph is compiled by Inductor, as ``backend="inductor"``, and every kernel
    call of the generated code (``cpp_fused_*``, ``extern_kernels.*``, ATen
    fallbacks, Triton launches) records one ``kernel`` event (see :mod:`.inductor`).
    ``options={"level": "inductor", ...}`` passes the other options to Inductor.

``inner="inductor"`` (any backend name or callable) compiles with that backend
and only wraps each compiled graph in a graph event; ops are not traced.
"""

from __future__ import annotations

import copy
import functools
import itertools
import threading
from typing import Any, Callable, Optional, Union

import torch

from .. import _core
from ..schema import (ARG_ATEN_OPS, ARG_FAILED, ARG_GRAD, ARG_GRAPH, ARG_HHASH, ARG_KERNEL_TYPE, ARG_LEVEL,
                      ARG_MODULE, ARG_MODULE_TYPE, ARG_NODE, ARG_PHASE, ARG_RECOMPUTE, ARG_STEP, CAT_GRAPH,
                      METADATA_ARGS, PHASE_BACKWARD, PHASE_FORWARD, PHASE_INFERENCE, PHASE_RECOMPUTE)
from ..events import cuda as cuda_events, eager, steps, trainers  # noqa: F401 (eager, trainers: their hooks)
from ..session import config, hooks, logger
from . import compile_events, instrument, modules, sites

LEVELS = ("aten", "torch", "inductor")
DEFAULT_LEVEL = "aten"
BACKEND_NAME = "dftrace"

_graph_ids = itertools.count()
_graph_ids_lock = threading.Lock()

_PHASE = {PHASE_FORWARD: _core.PHASE_FORWARD, PHASE_BACKWARD: _core.PHASE_BACKWARD, PHASE_INFERENCE: _core.PHASE_INFERENCE}


def _next_graph_id() -> int:
    with _graph_ids_lock:
        return next(_graph_ids)


def tracing_disabled() -> bool:
    """DFTRACER_ENABLE=0 (or a bad DFTRACER_* value): compiled code is left untouched."""
    cfg = config.get()
    off = cfg.enable is False or cfg.error is not None
    if off:
        logger.note_off()
    return off


# the fields the tracer writes on the events that carry tags (ops, graphs, modules, kernels): a
# tag named like one is written as user_<name> instead of clobbering it (step is no tag: update()
# names the step), DFTRACER_INC_METADATA's included; docs/format.rst lists them
OWN_FIELDS = frozenset({ARG_HHASH, ARG_GRAPH, ARG_NODE, ARG_MODULE, ARG_MODULE_TYPE, ARG_LEVEL, ARG_KERNEL_TYPE,
                        ARG_ATEN_OPS, ARG_PHASE, ARG_GRAD, ARG_FAILED, ARG_RECOMPUTE, *METADATA_ARGS})


class Tags:
    """Dynamic tags (name, epoch, step, ...) written in every event's args; shared by backends."""

    def __deepcopy__(self, memo):  # one set of tags per backend, shared by its copies
        return self

    def __reduce__(self):  # torch.save of a compiled model pickles its backend: the values, not the cell
        return Tags, (), dict(self.values)

    def __setstate__(self, values: dict) -> None:
        self.update(values)

    def __init__(self, **values):
        self.cell = _core.TagCell()
        self.values: dict = {}
        self.update(**values)

    def update(self, args: Optional[dict] = None, **values) -> None:
        """Sets the given tags (``None`` leaves a tag unchanged); later events carry them, no recompile.

        ``step`` is not a tag: it names the current step (every event carries the step it ran in).
        """
        values = {k: v for k, v in values.items() if v is not None}
        if args:
            values.update(args)
        step = values.pop(ARG_STEP, None)
        if step is not None:
            steps.name_step(step)
        self.values.update(logger.own_fields(values, OWN_FIELDS))
        self.cell.set(self.values)  # the previous tags are freed once written
        logger.note_arg_issues()


def resolve_level(level: Optional[str], autograd: Optional[bool]) -> Optional[str]:
    """pydftracer's ``autograd=True/False`` is ``level="aten"/"torch"``; it wins when given."""
    if autograd is None:
        return level
    return "aten" if autograd else "torch"


def _copy(gm: torch.fx.GraphModule) -> Optional[Callable[[], torch.fx.GraphModule]]:
    """A function that makes a copy of ``gm`` as it is now: its nodes are copied now (their meta
    shared: instrumenting does not change it), the module (and its code) when called. None if
    the graph cannot be copied."""
    try:
        graph = torch.fx.Graph()
        graph._codegen = copy.deepcopy(gm.graph._codegen)
        graph.output(graph.graph_copy(gm.graph, {}))
        attrs = {node.target: functools.reduce(getattr, node.target.split("."), gm) for node in graph.nodes
                 if node.op in ("get_attr", "call_module")}
    except Exception:
        return None
    return lambda: torch.fx.GraphModule(attrs, graph)


def _aot_grad_fn(phase: str, grad: bool) -> Union[Callable[[], bool], bool]:
    """grad_enabled of an AOT graph's events. The forward runs inside autograd.Function.forward
    (grad off): its grad_enabled is the user's mode ``grad``, a constant (``GraphCall`` takes it
    as is, no call per graph call); backward reads the mode the autograd engine set."""
    return torch.is_grad_enabled if phase == PHASE_BACKWARD else grad


def _probe(phase: str) -> Optional[Callable[[bool], None]]:
    """A forward graph's calls tell step tracking whether training or evaluation runs (from the
    grad mode, and the eval mode of the modules of the frame being compiled)."""
    if phase == PHASE_BACKWARD:
        return None
    info = compile_events.current() or {}
    return steps.probe_for(info.get("modules"), compile_events.running_modules(info))


def _check_level(level) -> None:
    if level not in LEVELS:
        raise ValueError(f"level={level!r} is not valid (accepted: {', '.join(map(repr, LEVELS))})")


class TracerBackend:
    """A configured tracing backend; pass it as ``torch.compile(..., backend=...)``."""

    def __deepcopy__(self, memo):  # Lightning's torch.compile deep-copies its arguments
        return self

    def __init__(self, *, level: str = DEFAULT_LEVEL, enable: bool = True, inner: Any = None,
                 on_graph: Optional[Callable] = None, tags: Optional[Tags] = None):
        _check_level(level)
        self.level = level
        self.enable = enable
        self.inner = inner
        self.on_graph = on_graph
        self.tags = tags if tags is not None else Tags()
        self.__name__ = BACKEND_NAME  # Dynamo names backends by __name__ in logs and guards

    def update(self, epoch=None, step=None, image_idx=None, image_size=None, args=None) -> "TracerBackend":
        """Changes the tags of the events recorded from now on (no recompile)."""
        self.tags.update(args, epoch=epoch, step=step, image_idx=image_idx, image_size=image_size)
        return self

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, **kwargs):
        # torch.compile(backend="dftrace", options={"level": ...}, mode=...) passes these
        options = dict(kwargs.pop("options", None) or {})
        level = options.pop("level", self.level)
        _check_level(level)
        mode = kwargs.pop("mode", None)
        graph_id = _next_graph_id()
        if not self.enable or tracing_disabled():
            # graph tools still see the graph; the graph itself runs untouched
            self._notify(gm, example_inputs, graph_id, "torch", self._torch_phase(), "dynamo", None)
            return gm.forward
        logger.ensure_open()
        compile_events.install()
        frame = compile_events.current() or {}
        start = _core.now_ns()
        self._notify(gm, example_inputs, graph_id, "torch", self._torch_phase(), "dynamo",
                     (start - frame["start_ns"]) if "start_ns" in frame else None)
        owner = sites.user_stacks(gm, frame.get("locals"), frame.get("globals"))
        if owner is not None and config.get().module_slices:
            modules.frame_slices(*owner, self.tags.cell)
        if self.inner is not None:
            extra = {k: v for k, v in (("options", options), ("mode", mode)) if v}  # for the inner backend
            compiled = self._compile_inner(gm, example_inputs, graph_id, **kwargs, **extra)
        elif level == "torch":
            compiled = self._graph_call(gm, example_inputs, graph_id, self._torch_phase(), "torch",
                                        torch.is_grad_enabled)
        elif level == "inductor":
            compiled = self._compile_inductor(gm, example_inputs, graph_id, start, options, mode)
        else:
            compiled = self._compile_aot(gm, example_inputs, graph_id, start)
        compile_events.emit("backend", f"backend graph {graph_id}", start, _core.now_ns(), graph=graph_id,
                            level="torch" if self.inner is not None else level,
                            inner=self._inner_name(), frame=frame.get("frame"), location=frame.get("location"),
                            compile_id=frame.get("compile_id"))
        return compiled

    @staticmethod
    def _torch_phase() -> str:
        # Dynamo guards on grad mode, so the mode now is the mode of every call of this graph.
        return PHASE_FORWARD if torch.is_grad_enabled() else PHASE_INFERENCE

    def _inner_name(self) -> Optional[str]:
        if self.inner is None:
            return None
        return self.inner if isinstance(self.inner, str) else getattr(self.inner, "__name__", type(self.inner).__name__)

    def _notify(self, gm, example_inputs, graph_id, level, phase, stage, compile_ns) -> None:
        if self.on_graph is not None:
            self.on_graph(gm, example_inputs, {
                "graph_id": graph_id, "level": level, "phase": phase, "stage": stage,
                "compile_time_s": None if compile_ns is None else compile_ns / 1e9,
                **{k: v for k, v in (compile_events.current() or {}).items() if k in ("compile_id", "frame", "location")},
            })

    def _notify_aot(self, fx_g, inputs, graph_id, level, phase, start) -> None:
        # AOTAutograd's time so far; a backward compiled at the first backward has none
        self._notify(fx_g, inputs, graph_id, level, phase, "aot",
                     None if phase == PHASE_BACKWARD else _core.now_ns() - start)

    def _graph_call(self, gm, example_inputs, graph_id: int, phase: str, level: str, grad_fn, boxed: bool = False,
                    recomputed: frozenset = frozenset()):
        """Instruments ``gm`` and wraps its forward in the graph event (``recomputed``: see
        :func:`.instrument.instrument`). A forward graph also gets a recompute twin, a copy instrumented at its
        first call during a backward pass (activation checkpointing outside the compiled code runs the graph
        again there): see :class:`.instrument.Recomputing`."""
        start = _core.now_ns()
        again = phase == PHASE_RECOMPUTE
        twin = _copy(gm) if phase == PHASE_FORWARD else None  # before instrumenting
        if boxed:
            from torch.fx.graph import _BoxedCodeGen

            gm.graph.set_codegen(_BoxedCodeGen())
        name = f"graph {graph_id} {phase}"
        timer = cuda_events.DeviceTimer(name, graph_id) if cuda_events.wanted(example_inputs) else None
        plain = self._plain(gm) if level == "torch" and not again else None
        nodes = instrument.instrument(gm, graph_id, self.tags.cell, config.get().inc_metadata, timer,
                                      backward=phase == PHASE_BACKWARD, recomputed=recomputed)
        site = _core.intern_site(name, CAT_GRAPH, {ARG_GRAPH: graph_id, ARG_LEVEL: level, "nodes": nodes})
        compile_events.emit("instrument", f"instrument {name}", start, _core.now_ns(),
                            graph=graph_id, phase=phase, level=level, nodes=nodes)
        forward = gm.forward if timer is None else timer.graph(gm.forward)
        if again:  # backward time; no probe: this is no new forward work for step tracking
            call = _core.GraphCall(forward, site, self.tags.cell, _PHASE[PHASE_BACKWARD], grad_fn)
        else:
            call = _core.GraphCall(forward, site, self.tags.cell, _PHASE[phase], grad_fn, plain, probe=_probe(phase))
        if boxed:  # AOTAutograd then passes its argument list as is
            call._boxed_call = True
        if twin is not None:
            def build():  # graph N recompute: phase backward, so that the step view counts it there
                source = twin()
                ops = frozenset(node.name for node in source.graph.nodes)
                return self._graph_call(source, example_inputs, graph_id, PHASE_RECOMPUTE, level, grad_fn, boxed, ops)

            call = instrument.Recomputing(call, build=build, boxed=boxed)
        return call

    @staticmethod
    def _plain(gm):
        """A copy of ``gm`` that instrumenting leaves alone: outside the step windows a torch-level
        graph runs it, at untraced cost. (ATen graphs keep their interceptors there: calling
        ``OpOverload._op`` directly is faster than their untraced code.) None if it cannot be copied."""
        try:
            return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph)).forward
        except Exception:
            return None

    def _compile_aot(self, gm, example_inputs, graph_id: int, start: int):
        from functorch.compile import min_cut_rematerialization_partition
        from torch._dynamo.backends.common import aot_autograd

        grad = torch.is_grad_enabled()  # guarded by Dynamo: the user's mode at every call
        forward_ops: set[str] = set()  # the forward graph's node names (compiled before the backward)

        def compiler(phase: str):
            def compile_graph(fx_g, inputs):
                self._notify_aot(fx_g, inputs, graph_id, "aten", phase, start)
                if phase == PHASE_FORWARD:
                    forward_ops.update(node.name for node in fx_g.graph.nodes)
                recomputed = sites.recomputed(fx_g, forward_ops) if phase == PHASE_BACKWARD else frozenset()
                return self._graph_call(fx_g, inputs, graph_id, phase, "aten", _aot_grad_fn(phase, grad),
                                        boxed=True, recomputed=recomputed)

            return compile_graph

        # Same AOTAutograd settings as backend="aot_eager", so numerics match it bit for bit.
        return aot_autograd(
            fw_compiler=compiler(PHASE_FORWARD),
            bw_compiler=compiler(PHASE_BACKWARD),
            inference_compiler=compiler(PHASE_INFERENCE),
            partition_fn=min_cut_rematerialization_partition,
            keep_inference_input_mutations=True,
        )(gm, example_inputs)

    def _compile_inductor(self, gm, example_inputs, graph_id: int, start: int, options: dict, mode):
        from torch._inductor import list_mode_options

        from . import inductor

        grad = torch.is_grad_enabled()  # guarded by Dynamo: the user's mode at every call

        def wrap(fn, phase, args, plain):
            site = _core.intern_site(f"graph {graph_id} {phase}", CAT_GRAPH, args)
            return _core.GraphCall(fn, site, self.tags.cell, _PHASE[phase], _aot_grad_fn(phase, grad), plain,
                                   probe=_probe(phase))

        def notify(fx_g, inputs, phase):
            self._notify_aot(fx_g, inputs, graph_id, "inductor", phase, start)

        patches = {**(list_mode_options(mode) if mode else {}), **options} or None
        return inductor.compile_graph(gm, example_inputs, graph_id, self.tags.cell, wrap, notify, patches)

    def _compile_inner(self, gm, example_inputs, graph_id: int, **kwargs):
        from torch._dynamo import lookup_backend

        inner = lookup_backend(self.inner) if isinstance(self.inner, str) else self.inner
        phase = self._torch_phase()
        compiled = inner(gm, example_inputs, **kwargs)
        site = _core.intern_site(f"graph {graph_id} {phase}", CAT_GRAPH,
                                 {ARG_GRAPH: graph_id, ARG_LEVEL: "torch", "inner": self._inner_name()})
        return _core.GraphCall(compiled, site, self.tags.cell, _PHASE[phase], torch.is_grad_enabled,
                               probe=_probe(phase))


def create_backend(name=None, epoch=None, step=None, image_idx=None, image_size=None, enable=True,
                   level: str = DEFAULT_LEVEL, inner: Any = None, on_graph: Optional[Callable] = None,
                   autograd: Optional[bool] = None) -> TracerBackend:
    """A tracing backend with its own tags; ``autograd=`` is pydftracer's spelling of the level, and
    a bool in ``level``'s place is pydftracer's 7th positional parameter, ``autograd``."""
    if isinstance(level, bool):
        level, autograd = DEFAULT_LEVEL, level if autograd is None else autograd
    level = resolve_level(level, autograd)
    tags = Tags(name=name, epoch=epoch, step=step, image_idx=image_idx, image_size=image_size)
    return TracerBackend(level=level, enable=enable, inner=inner, on_graph=on_graph, tags=tags)


tracer_backend = create_backend()
dftracer_dynamo_backend = tracer_backend


def _no_graph_note() -> None:
    """At exit, when DFTRACER_ENABLE=1 opened no trace although Dynamo compiled frames: none of
    them handed this backend a graph (Dynamo ran the model eagerly whole, as it does with
    torch.compile of DDP around an nn.Sequential). Without a word the user finds no file."""
    frames, first_break = compile_events.frames_seen()
    if not frames or config.get().enable is not True or config.get().error or logger.attempted():
        return
    why = ""
    if first_break is not None:
        where = f" at {first_break['location']}" if first_break.get("location") else ""
        why = f"; first graph break{where}: {first_break.get('reason', '')}"
    config.log.warning("DFTRACER_ENABLE=1 but no trace was written: Dynamo compiled %d frame(s) and handed "
                       "no graph to the dftrace backend%s", frames, why.split("\n", 1)[0][:500])


hooks.install_one(hooks.declare(hooks.AtExit("no graph note", compile_events.GROUP, _no_graph_note)).name)
# backend="dftrace" comes from the torch_dynamo_backends entry point in pyproject.toml
compile_events.install()  # before the first compile, so its start is seen
