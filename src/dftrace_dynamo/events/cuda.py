"""Device durations with CUDA events (opt-in: ``DFTRACER_CUDA_EVENTS=1``).

On CUDA the CPU timestamps of op events measure the kernel *launch*. With this
option each op of a graph whose inputs live on a CUDA device is bracketed by two
``torch.cuda.Event(enable_timing=True)``, and each graph call by two more. The
events are resolved off the hot path by one daemon thread (``dftrace-cuda``), which
waits for a call's last event and records one ``<op name> (cuda)`` event per op and
one per graph, category ``dynamo_cuda``, on its own track. Device times are placed on
the trace clock through the graph's first event: ``cpu time when it was recorded +
elapsed device time since``, so ordering and nesting hold, and the absolute offset
is the queueing delay of the first kernel. Before the trace file closes, the calls
submitted so far are resolved (waiting at most ``DRAIN_TIMEOUT_S``), so the last
step's device events are not lost at exit.

Costs a Python wrapper and two event records per op (microseconds): meant for GPU
runs where kernels take longer than that.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Optional

import torch

from .. import _core
from ..schema import ARG_GRAPH, CAT_CUDA
from ..session import config, hooks, logger, threads


DRAIN_TIMEOUT_S = 10.0

_pending: "queue.SimpleQueue[_Call]" = queue.SimpleQueue()
_resolver: Optional[threading.Thread] = None
_idle = threading.Condition()
_outstanding = 0  # calls submitted and not yet resolved
_current = threading.local()  # the graph call whose ops are being timed on this thread
_warned = False


def wanted(example_inputs) -> bool:
    """Whether this graph's calls get device timings (asked once per graph, at compile time)."""
    global _warned
    if not config.get().cuda_events:
        return False
    if not torch.cuda.is_available():
        if not _warned:
            config.log.warning("DFTRACER_CUDA_EVENTS=1 but CUDA is not available: no device timings")
            _warned = True
        return False
    return any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)


class _Call:
    __slots__ = ("graph_site", "anchor_ns", "start", "end", "ops")

    def __init__(self, graph_site: int, event_type):
        self.graph_site, self.ops = graph_site, []
        self.start = event_type(enable_timing=True)
        self.anchor_ns = _core.now_ns()
        self.start.record()
        self.end = None


class DeviceTimer:
    """Times one graph's ops and calls on the device; ``event_type`` is injectable for tests."""

    def __init__(self, graph_name: str, graph_id: int, event_type: Any = None):
        self.event_type = event_type or torch.cuda.Event
        self.graph_site = _core.intern_site(f"{graph_name} (cuda)", CAT_CUDA, {ARG_GRAPH: graph_id})

    def op(self, target: Callable, mode: int, name: str, args: dict) -> Callable:
        """A callable doing what the Interceptor would call, between two device events."""
        site = _core.intern_site(f"{name} (cuda)", CAT_CUDA, args)
        event_type = self.event_type
        call = (lambda *a, **k: getattr(a[0], target)(*a[1:], **k)) if mode == _core.METHOD else target

        def timed(*a, **k):
            begin = event_type(enable_timing=True)
            begin.record()
            result = call(*a, **k)
            finish = event_type(enable_timing=True)
            finish.record()
            owner = getattr(_current, "call", None)
            if owner is not None:
                owner.ops.append((site, begin, finish))
            return result

        return timed

    def graph(self, fn: Callable) -> Callable:
        def timed_graph(*args):
            call = _Call(self.graph_site, self.event_type)
            outer = getattr(_current, "call", None)
            _current.call = call
            try:
                return fn(*args)
            finally:
                _current.call = outer
                call.end = self.event_type(enable_timing=True)
                call.end.record()
                _submit(call)

        return timed_graph


def _submit(call: _Call) -> None:
    global _resolver, _outstanding
    with _idle:
        _outstanding += 1
    if _resolver is None:
        _resolver = threads.start(_resolve_forever, "dftrace-cuda")
    _pending.put(call)


def resolve(call: _Call) -> None:
    """Waits for the call's last device event and records its graph and op events."""
    call.end.synchronize()

    def at(event) -> int:
        return call.anchor_ns + int(call.start.elapsed_time(event) * 1e6)

    for site, begin, finish in call.ops:
        _core.record(site, at(begin), at(finish))
    _core.record(call.graph_site, call.anchor_ns, at(call.end))


def _resolve_forever() -> None:
    global _outstanding
    while True:
        call = _pending.get()
        try:
            resolve(call)
        except Exception as exc:  # a device error must not kill the resolver
            config.log.warning("CUDA event timing failed: %s", exc)
        with _idle:
            _outstanding -= 1
            _idle.notify_all()


def drain(timeout: float = DRAIN_TIMEOUT_S) -> bool:
    """Waits until every graph call submitted so far is recorded; False if ``timeout`` passed."""
    with _idle:
        return _idle.wait_for(lambda: _outstanding == 0, timeout)


def _after_fork_in_child() -> None:
    # the resolver thread and the parent's pending calls do not exist in the child
    global _pending, _resolver, _idle, _outstanding
    _pending, _resolver, _idle, _outstanding = queue.SimpleQueue(), None, threading.Condition(), 0


hooks.declare(hooks.AtFork("CUDA event resolver of a forked child", logger.GROUP, _after_fork_in_child))
logger.add_hooks(lambda: None, drain)
