"""Garbage collection in the trace: each collection inside the step windows is a slice.

Python's cyclic collector stops the thread that triggered it (an allocation
past the threshold, or ``gc.collect()``) for as long as it runs: tens of ms
for a large generation 2. A callback in ``gc.callbacks`` reads the clock at
its ``start`` and ``stop``, and writes the slice ``gc`` (cat ``gc``) on that
thread, with ``args.generation`` (0, 1 or 2), ``args.collected`` (unreachable
objects freed) and ``args.uncollectable`` (found but not freed,
``gc.garbage``). A collection during an op nests in the op's slice; one that
ends while the step's data or ``zero_grad`` slices are held back goes with
them, in what they turn out to begin. Outside the step windows, or with no
trace open, nothing is written: the callback reads a flag and returns. Nothing
runs per op. Like memory samples, they do not keep a forked worker's file that
holds nothing else (a DataLoader worker each epoch).
"""

from __future__ import annotations

import gc
import threading

from .. import _core
from ..schema import ARG_COLLECTED, ARG_GENERATION, ARG_UNCOLLECTABLE, CAT_GC
from ..session import config, hooks, logger

GROUP = "garbage collection"
_starts = threading.local()  # per thread: when its collection began (a collection runs on one thread)
slices = 0  # written in this process: a child's file holding only these (and samples) leaves none


def _callback(phase: str, info: dict) -> None:
    global slices
    try:
        if phase == "start":
            _starts.at = _core.now_ns() if _core.is_open() and _core.ops_on() else None
            return
        start, _starts.at = getattr(_starts, "at", None), None
        if start is None:
            return
        args = {ARG_GENERATION: info.get("generation"), ARG_COLLECTED: info.get("collected"),
                ARG_UNCOLLECTABLE: info.get("uncollectable")}
        logger.record("gc", CAT_GC, start, _core.now_ns(), args)
        slices += 1
    except Exception as exc:  # never in the way of the collector: slices stop, the program runs on
        hooks.remove(GROUP)
        config.get()
        config.log.error("garbage collection slices are off: %s: %s", type(exc).__name__, exc)


def _register():
    gc.callbacks.append(_callback)


def _unregister():
    if _callback in gc.callbacks:
        gc.callbacks.remove(_callback)


hooks.declare(hooks.Registration("gc callback", GROUP, _register, _unregister))


def _on_open() -> None:
    hooks.install(GROUP)


logger.add_hooks(_on_open, lambda: None)
logger.add_background(lambda: slices)
if _core.is_open():  # a trace opened before this module was imported
    _on_open()
