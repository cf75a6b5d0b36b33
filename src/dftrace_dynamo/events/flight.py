"""The flight recorder: with ``DFTRACER_FLIGHT=N`` the trace keeps its last N steps in memory and
writes them only when something goes wrong.

The C writer formats and compresses events as usual but keeps each step's members in memory
(the step in progress and the N before it, at most ``DFTRACER_FLIGHT_BYTES`` of compressed
text: the oldest go first) instead of writing them; the trace file itself holds its metadata
and its ``end`` record only. Each trigger writes one numbered dump next to it,
``<trace>-flight<k>.pfw.gz``: a trace file like any other holding the kept steps in full and
one ``flight_dump`` record (cat ``dftracer``) whose args name the trigger:

* ``slow_step``: a steady step (warm-up steps, as ``summary`` counts them, excluded) longer than
  ``DFTRACER_FLIGHT_SLOW`` times the median of the last 51 steady steps (once there are 5) and
  by 20 ms at least; the dump holds that step and the N-1 before it;
* ``hang``: no step ended for ``DFTRACER_FLIGHT_HANG`` seconds (counted from the first step's
  end: the first step compiles, which may take long); the record also holds every
  thread's Python stack, and each ``torch.distributed`` operation still in flight is an event
  (cat ``comm``, ``args.pending``) from its issue to the dump, with its peers and bytes. It is
  written by a watchdog thread while the program stays blocked (a thread that holds the GIL
  in C code stops it too);
* ``exception``: an exception escaping the program or one of its threads (the exception then
  goes on as it would); ``signal``: SIGUSR2 (when the program has no handler of its own);
  ``dump``: :func:`dump` called by the program;
* ``peer``: in a ``torch.distributed`` job, another rank's trigger: each rank posts its triggers
  in the default process group's store and dumps the same steps on the others' (a slow step
  every rank saw, or a hang every rank timed out on, is dumped once per rank).

Recording goes on after a dump; ``DFTRACER_FLIGHT_DUMPS`` dumps per trace file at most.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import statistics
import sys
import threading
import time
import traceback
from typing import Optional

from .. import _core
from ..schema import ARG_HHASH, CAT_COMM
from ..session import config, hooks, logger, threads
from . import comm

GROUP = "flight"
NAME = "flight_dump"  # the trigger's record
STEADY_MIN = 5  # steady steps before a median is trusted
STEADY_WINDOW = 51  # the median of the last steady steps
SLOW_MIN_NS = 20_000_000  # and longer than it by this much: steps of microseconds jitter by more
POLL_S = 1.0  # the watchdog's period (shorter for a short hang time)
STORE_COUNT = "dftrace_flight/count"  # keys in the process group's store
STORE_REQUEST = "dftrace_flight/request/"


class _State:
    flight: Optional[config.Flight] = None  # settings of the open trace file (None: not in flight mode)
    dumps = 0
    capped = False
    steady: collections.deque = collections.deque(maxlen=STEADY_WINDOW)
    compiles_at = 0  # the compile counter when the last step ended
    progress: Optional[float] = None  # monotonic time of the last step end (None: none yet)
    hang_dumped = False  # since the last step end
    dumped_steps: set = set()  # last steps of the slow-step dumps
    opened_at = 0.0  # wall clock
    stop: Optional[threading.Event] = None
    store = None  # the default group's store once torch.distributed is initialized (False: unusable)
    rank: Optional[int] = None
    seen = 0  # store requests looked at


_state = _State()
_lock = threading.Lock()  # one dump at a time; a trigger while one is written is dropped


def _compiles() -> int:
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return int(utils.counters["frames"]["total"]) if utils is not None else 0
    except Exception:  # another torch
        return 0


def step_ended(number: int, start_ns: int, end_ns: int) -> None:
    """A step's slice was recorded: the hang clock restarts; a slow steady step dumps."""
    flight = _state.flight
    if flight is None:
        return
    try:
        _state.progress = time.monotonic()
        _state.hang_dumped = False
        compiles = _compiles()
        warm = compiles != _state.compiles_at  # something compiled in it (summary's warm-up rule)
        _state.compiles_at = compiles
        if warm:
            return
        dur = end_ns - start_ns
        steady = _state.steady
        median = statistics.median(steady) if len(steady) >= STEADY_MIN else None
        steady.append(dur)
        if median is not None and dur > flight.slow * median and dur - median > SLOW_MIN_NS:
            _dump("slow_step", f"step {number} took {dur / 1e6:.1f} ms, {dur / median:.1f}x the median "
                  f"{median / 1e6:.1f} ms of the last steady steps",
                  {"step": number, "dur_ms": dur / 1e6, "median_ms": median / 1e6}, last_step=number)
    except Exception as exc:  # never let tracing break the program
        config.log.error("flight recorder: %s: %s", type(exc).__name__, exc)


def dump(reason: str = "dump() called") -> Optional[str]:
    """Writes the flight recorder's kept steps to a new dump file now, with ``reason`` in its
    ``flight_dump`` record; returns its path (None: not in flight mode, or nothing written)."""
    return _dump("dump", str(reason), {})


def _dump_path(number: int) -> Optional[str]:
    path = _core.path()
    if path is None:
        return None
    for suffix in sorted(config.COMPRESSION_SUFFIX.values(), key=len, reverse=True):
        if path.endswith(suffix):
            return f"{path[: -len(suffix)]}-flight{number}{suffix}"
    return f"{path}-flight{number}"


def _record(name: str, cat: str, start_ns: int, end_ns: int, tid: int, args: dict) -> bytes:
    return logger.json_line({"name": name, "cat": cat, "pid": os.getpid(), "tid": tid, "ts": start_ns // 1000,
                             "dur": round((end_ns - start_ns) / 1000, 3), "ph": "X",
                             "args": {ARG_HHASH: logger.host_hash(), **args}})


def _stacks() -> dict:
    """Every thread's Python stack, innermost last, but the calling thread's (ours)."""
    by_ident = {t.ident: t for t in threading.enumerate()}
    out = {}
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        t = by_ident.get(ident)
        label = f"{t.name if t else 'thread'} (tid {t.native_id if t else '?'})"
        out[label] = [f"{f.filename}:{f.lineno} in {f.name}" + (f": {f.line}" if f.line else "")
                      for f in traceback.extract_stack(frame)]
    return out


def _in_flight(now: int) -> tuple:
    """The trigger's list of operations in flight, and an event for each."""
    pending, lines = [], []
    for op, start, args, tid, peers in comm.in_flight():
        waited = (now - start) / 1e9
        pending.append({"op": op, "peers": peers, "bytes": args.get("bytes"), "waited_s": round(waited, 3),
                        "tid": tid})
        lines.append(_record(op, CAT_COMM, start, now, tid, {**args, "peers": peers, "pending": True,
                                                             "waited_s": round(waited, 3)}))
    return pending, lines


def _dump(trigger: str, reason: str, detail: dict, last_step: Optional[int] = None, blocked: bool = False,
          share: bool = True) -> Optional[str]:
    """One dump: the kept steps (up to ``last_step``), the trigger's record; blocked: the stacks and
    the operations in flight too. Posted to the other ranks unless ``share`` is False."""
    flight = _state.flight
    if flight is None or not _lock.acquire(blocking=False):
        return None
    try:
        if _state.dumps >= flight.max_dumps:
            if not _state.capped:
                _state.capped = True
                config.log.warning("flight recorder: %d dumps written (DFTRACER_FLIGHT_DUMPS); later "
                                   "triggers are ignored (this one: %s)", _state.dumps, reason)
            return None
        number = _state.dumps + 1
        path = _dump_path(number)
        if path is None:
            return None
        now = _core.now_ns()
        args = {"trigger": trigger, "reason": reason, "dump": number, **detail}
        if _state.rank is not None:
            args["rank"] = _state.rank
        lines = []
        if blocked:
            args["pending"], lines = _in_flight(now)
            args["stacks"] = _stacks()
        lines.insert(0, _record(NAME, "dftracer", now, now, threading.get_native_id(), args))
        try:
            got = _core.flight_dump(path, b"".join(lines), last_step)
        except (OSError, RuntimeError) as exc:
            config.log.error("flight recorder: dump %d (%s) not written: %s", number, trigger, exc)
            return None
        _state.dumps = number
        if last_step is not None:
            _state.dumped_steps.add(last_step)
        if trigger == "hang" or detail.get("origin_trigger") == "hang":
            _state.hang_dumped = True
        steps = (f"steps {got['first_step']}-{got['last_step']}" if got["first_step"] is not None
                 else "no whole step")
        config.log.warning("flight recorder: dump %d (%s: %s) written to %s (%s, %d events)", number, trigger,
                           reason, path, steps, got["events"])
    finally:
        _lock.release()
    if share:
        _post({"trigger": trigger, "reason": reason, "last_step": last_step})
    return path


# ---- all ranks at once -------------------------------------------------------------------------

def _attach() -> bool:
    """The default process group's store, once torch.distributed is initialized."""
    if _state.store is None:
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is None or not dist.is_available() or not dist.is_initialized():
                return False
            _state.store = dist.distributed_c10d._get_default_store()
            _state.rank = dist.get_rank()
        except Exception:
            _state.store = False
    return bool(_state.store)


def _post(request: dict) -> None:
    if not _attach():
        return
    try:
        number = _state.store.add(STORE_COUNT, 1)
        request.update(origin=_state.rank, time=time.time())
        _state.store.set(f"{STORE_REQUEST}{number}", json.dumps(request))
    except Exception as exc:  # the store is gone (a rank exited): no more sharing
        _state.store = False
        config.log.info("flight recorder: cannot reach the other ranks: %s", exc)


def _serve_peers() -> None:
    """Dumps for the other ranks' new triggers (once per slow step and per hang)."""
    if not _attach():
        return
    try:
        count = _state.store.add(STORE_COUNT, 0)
        while _state.seen < count:
            key = f"{STORE_REQUEST}{_state.seen + 1}"
            if not _state.store.check([key]):
                return  # posted but not written yet: next time
            _state.seen += 1
            request = json.loads(_state.store.get(key))
            _serve(request)
    except Exception as exc:
        _state.store = False
        config.log.info("flight recorder: cannot reach the other ranks: %s", exc)


def _serve(request: dict) -> None:
    trigger, last_step = request.get("trigger"), request.get("last_step")
    if request.get("origin") == _state.rank or request.get("time", 0) < _state.opened_at:
        return
    if trigger == "slow_step" and last_step in _state.dumped_steps:
        return
    if trigger == "hang" and _state.hang_dumped:
        return
    blocked = trigger == "hang"
    _dump("peer", f"rank {request.get('origin')}: {request.get('reason')}",
          {"origin": request.get("origin"), "origin_trigger": trigger},
          last_step=last_step if trigger == "slow_step" else None, blocked=blocked, share=False)


# ---- the watchdog ------------------------------------------------------------------------------

def _watch(stop: threading.Event, flight: config.Flight) -> None:
    period = min(POLL_S, flight.hang / 4) if flight.hang else POLL_S
    while not stop.wait(period):
        try:
            progress = _state.progress
            idle = time.monotonic() - progress if progress is not None else 0.0
            if flight.hang and not _state.hang_dumped and idle > flight.hang:
                _dump("hang", f"no step ended for {idle:.0f} s", {"idle_s": round(idle, 3)}, blocked=True)
                _state.hang_dumped = True
            _serve_peers()
        except Exception as exc:  # the trace closed meanwhile, or an odd state: the program goes on
            config.log.info("flight recorder watchdog: %s: %s", type(exc).__name__, exc)


# ---- exceptions and SIGUSR2 --------------------------------------------------------------------

def _on_exception(exc_type, exc, tb) -> None:
    if _state.flight is None or exc_type is None or issubclass(exc_type, SystemExit):
        return
    try:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        _dump("exception", f"{exc_type.__name__}: {exc}", {"traceback": text})
    except Exception:  # the exception goes on as it would
        pass


def _wrap_excepthook(original):
    def excepthook(exc_type, exc, tb):
        _on_exception(exc_type, exc, tb)
        return original(exc_type, exc, tb)

    return excepthook


def _wrap_thread_excepthook(original):
    def excepthook(hook_args):
        _on_exception(hook_args.exc_type, hook_args.exc_value, hook_args.exc_traceback)
        return original(hook_args)

    return excepthook


def _on_sigusr2(signum, frame) -> None:
    _dump("signal", "SIGUSR2", {})


_SIGNAL_HOOK = "signal SIGUSR2"
for _hook in (hooks.Patch("sys.excepthook", GROUP, lambda: sys, "excepthook", _wrap_excepthook),
              hooks.Patch("threading.excepthook", GROUP, lambda: threading, "excepthook", _wrap_thread_excepthook)):
    hooks.declare(_hook)
hooks.declare(hooks.Signal(_SIGNAL_HOOK, f"{GROUP}-signal", signal.SIGUSR2, _on_sigusr2))


def _on_open() -> None:
    try:
        flight = config.get().flight
        if flight is None or not _core.flight_stats()["on"]:
            _state.flight = None
            return
        _state.flight = flight
        _state.dumps, _state.capped, _state.hang_dumped = 0, False, False
        _state.steady = collections.deque(maxlen=STEADY_WINDOW)
        _state.compiles_at = _compiles()
        _state.dumped_steps = set()
        _state.progress, _state.opened_at = None, time.time()
        hooks.install(GROUP)
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL):
            hooks.install(f"{GROUP}-signal")
        _state.stop = threading.Event()
        threads.start(_watch, "dftrace-flight", _state.stop, flight)
    except Exception as exc:
        _state.flight = None
        config.log.error("flight recorder is off: %s: %s", type(exc).__name__, exc)


def _on_close() -> None:
    if _lock.acquire(timeout=30):  # a dump being written ends first
        _lock.release()
    _state.flight = None
    if _state.stop is not None:
        _state.stop.set()
        _state.stop = None
    try:
        hooks.remove(GROUP)
        if threading.current_thread() is threading.main_thread():
            hooks.remove(f"{GROUP}-signal")
    except Exception:
        pass


logger.add_hooks(_on_open, _on_close)
if _core.is_open():  # a trace opened before this module was imported
    _on_open()
