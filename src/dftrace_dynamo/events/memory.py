"""Memory in the trace: each step's peak, and counter tracks sampled in the background.

Each step slice carries the process's peak resident memory during that step
(``args.peak_rss``, bytes) and, where CUDA is initialised,
``torch.cuda.max_memory_allocated()`` since the previous step
(``args.cuda_max_allocated``). On Linux the kernel keeps the peak itself
(``VmHWM`` in ``/proc/self/status``); writing ``5`` to
``/proc/self/clear_refs`` resets it to the current size at each step end, so
the peak is exact, however short the spike. Where that file cannot be written
the peak is the largest background sample of the step (a spike shorter than
the sampling period is missed).

A daemon thread samples the resident size every :data:`PERIOD_S` seconds into
the counter track ``memory`` (``"ph":"C"``, ``args.rss`` in bytes): the
training thread never does this work; the sampler holds the GIL only for one
``pread`` and one record.
"""

from __future__ import annotations

import os
import threading
from typing import Optional

from .. import _core
from ..schema import ARG_CUDA_PEAK, ARG_PEAK_RSS, ARG_RSS, CAT_MEMORY
from ..session import config, logger, threads

PERIOD_S = 0.1  # at most ten counter samples a second
samples = 0  # counter samples recorded by this process (steps leaves them out of its counts)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _State:
    status_fd: Optional[int] = None  # /proc/self/status, kept open (one pread per step)
    statm_fd: Optional[int] = None  # /proc/self/statm (the sampler's)
    clear_refs: Optional[int] = None  # /proc/self/clear_refs, None where it cannot be written
    sampled_peak = 0  # the largest sample since the last step end (no clear_refs)
    stop: Optional[threading.Event] = None  # set: the sampler thread ends


_state = _State()


def _open(path: str, flags: int) -> Optional[int]:
    try:
        return os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None


def _rss() -> int:
    """Resident bytes now (0 where /proc is missing)."""
    if _state.statm_fd is None:
        return 0
    fields = os.pread(_state.statm_fd, 128, 0).split()
    return int(fields[1]) * _PAGE


def _hwm() -> Optional[int]:
    """VmHWM in bytes: the kernel's peak resident size since the last reset."""
    text = os.pread(_state.status_fd, 4096, 0)
    at = text.find(b"VmHWM:")
    return int(text[at + 6:text.index(b"kB", at)]) * 1024 if at >= 0 else None


def _reset_peak() -> None:
    _state.sampled_peak = _rss()
    if _state.clear_refs is not None:
        try:
            os.write(_state.clear_refs, b"5")
        except OSError:
            os.close(_state.clear_refs)
            _state.clear_refs = None


def _cuda_peak() -> Optional[int]:
    """max_memory_allocated since the last step end, reset for the next (CUDA only)."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    return peak


def step_args() -> Optional[dict]:
    """The args of the step slice that ends now (its peaks); the peaks restart for the next step.
    Called by :mod:`.steps` at every step end; never raises."""
    try:
        peak = _hwm() if _state.clear_refs is not None else None
        args = {ARG_PEAK_RSS: max(peak or 0, _state.sampled_peak, _rss())}
        cuda = _cuda_peak()
        if cuda is not None:
            args[ARG_CUDA_PEAK] = cuda
        _reset_peak()
        return args
    except Exception as exc:  # the step slice is written without memory
        config.get()
        config.log.warning("memory per step is off: %s: %s", type(exc).__name__, exc)
        _close_files()
        return None


def _sample(stop: threading.Event) -> None:
    global samples
    while True:  # a first sample at once: even a short trace has its memory track
        try:
            rss = _rss()
            _state.sampled_peak = max(_state.sampled_peak, rss)
            if _core.is_open():
                _core.counter("memory", CAT_MEMORY, _core.now_ns(), {ARG_RSS: rss})
                samples += 1
        except Exception:  # the file closed under us: the thread ends with the trace
            return
        if stop.wait(PERIOD_S):
            return


def _close_files() -> None:
    for name in ("status_fd", "statm_fd", "clear_refs"):
        fd = getattr(_state, name)
        if fd is not None:
            setattr(_state, name, None)
            try:
                os.close(fd)
            except OSError:
                pass


def _on_open() -> None:
    """A trace opened (also in a forked child): open the /proc files, reset the peak, start sampling."""
    try:
        _close_files()  # a forked child's are its parent's
        _state.status_fd = _open("/proc/self/status", os.O_RDONLY)
        _state.statm_fd = _open("/proc/self/statm", os.O_RDONLY)
        if _state.status_fd is not None:
            _state.clear_refs = _open("/proc/self/clear_refs", os.O_WRONLY)
        _reset_peak()
        _state.stop = threading.Event()
        threads.start(_sample, "dftrace memory", _state.stop)
    except Exception as exc:
        config.get()
        config.log.warning("memory sampling is off: %s: %s", type(exc).__name__, exc)


def _on_close() -> None:
    if _state.stop is not None:
        _state.stop.set()
        _state.stop = None


logger.add_hooks(_on_open, _on_close)
logger.add_background(lambda: samples)  # a child whose file holds only samples leaves none
if _core.is_open():  # a trace opened before this module was imported
    _on_open()
