"""Each rank's clock offset to rank 0, measured when the process group is set up.

Ranks on one host read one clock; ranks on different hosts each read their own,
which may be milliseconds or seconds apart. When
``torch.distributed.init_process_group`` returns, or when a trace file opens in
a process whose default group was set up before tracing began, every rank
passes ``ROUNDS`` barriers on the group's store (``add`` and ``wait`` on the
c10d Store, not collectives of the process group, so nothing the program
issues can be paired with them) and reads its clock just before and just after
each. The instant the last rank arrives lies inside every rank's interval, so
in each round rank r's offset to rank 0 lies in
``[before_r - after_0, after_r - before_0]``; the intersection over the rounds
gives the offset (its middle) and a bound on its error (half its width), as NTP
does with its round trips.

The result is the ``clock`` record (cat ``dftracer``, args ``rank``,
``clock_offset_ns``, ``clock_error_ns``) in the current trace file and in every
later one of the process (a forked child inherits it: it reads the same clock).
``merge`` and ``summary`` move a rank's events by the offset when it is larger
than its error bound, which on one host it never is (see traces/clock.py).

Ranks that open their traces apart (lazily, at their first compile) wait for
each other at most ``WAIT_S``; a rank whose peers do not come records no offset
and says so once. Any failure leaves the trace without a ``clock`` record.
"""

from __future__ import annotations

import datetime
import json
import sys
from typing import Optional

from .. import _core
from ..schema import ARG_CLOCK_ERROR, ARG_CLOCK_OFFSET, ARG_RANK, CAT_DFTRACER
from ..session import config, hooks, logger

GROUP = "clock"
ROUNDS = 8
WAIT_S = 30.0
KEY = "dftrace_dynamo/clock"


class _State:
    record: Optional[dict] = None  # the args of the clock record, once measured
    measured = 0  # measurements begun in this process (part of the store keys: every rank counts alike)
    child = False  # a forked child: the parent measured (or not) for this clock


_state = _State()


def _barriers(store, rank: int, world: int, prefix: str, wait) -> list:
    """(before, after) clock reads around each of ROUNDS store barriers."""
    times = []
    for k in range(ROUNDS):
        before = _core.now_ns()
        if store.add(f"{prefix}/{k}/n", 1) == world:
            store.set(f"{prefix}/{k}/go", b"1")
        else:
            store.wait([f"{prefix}/{k}/go"], wait)
        times.append((before, _core.now_ns()))
    store.set(f"{prefix}/{rank}", json.dumps(times))
    return times


def offset(mine, ref):
    """(offset, error bound) in ns of the clock that read ``mine`` to the one that read ``ref``,
    from the (before, after) pairs both read around the same barriers."""
    lo = max(b - a0 for (b, _), (_, a0) in zip(mine, ref))
    hi = min(a - b0 for (_, a), (b0, _) in zip(mine, ref))
    if lo > hi:  # a clock stepped between rounds: the tightest round alone
        (b, a), (b0, a0) = min(zip(mine, ref), key=lambda p: p[0][1] - p[0][0] + p[1][1] - p[1][0])
        lo, hi = b - a0, a - b0
    return (lo + hi) // 2, (hi - lo + 1) // 2


def measure() -> None:
    """Measures this rank's clock offset to rank 0 on the default group (every rank calls this)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or _state.child:
        return
    try:
        from torch.distributed import distributed_c10d as c10d

        store, rank, world = c10d._get_default_store(), dist.get_rank(), dist.get_world_size()
        prefix = f"{KEY}/{_state.measured}"
        _state.measured += 1
        if world < 2:
            return
        wait = datetime.timedelta(seconds=WAIT_S)
        _core.follow_wall_clock()  # a step since import is not this clock's offset to rank 0's
        times = _barriers(store, rank, world, prefix, wait)
        if rank == 0:
            off, err = 0, 0
        else:
            store.wait([f"{prefix}/0"], wait)
            off, err = offset(times, json.loads(store.get(f"{prefix}/0")))
        _state.record = {ARG_RANK: rank, ARG_CLOCK_OFFSET: off, ARG_CLOCK_ERROR: err}
        _emit()
    except Exception as exc:  # a peer that never came (timeout), a store without add: no offset
        config.get()
        config.log.warning("clock offset to rank 0 not measured: %s: %s", type(exc).__name__, exc)


def _emit() -> None:
    if _state.record is not None and _core.is_open():
        now = _core.now_ns()  # timed: other open hooks may still record events that began earlier
        _core.log("clock", CAT_DFTRACER, now, now, _state.record, timed=True)


def _wrap_init(original):
    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        measure()  # every rank is here: init_process_group returns on all of them together
        return result

    init_process_group.__wrapped__ = original
    return init_process_group


def _dist():
    import torch.distributed as dist

    return dist


def _c10d():
    from torch.distributed import distributed_c10d

    return distributed_c10d


def _in_child() -> None:
    _state.child = True


for _hook in (
    hooks.Patch("torch.distributed.init_process_group", GROUP, _dist, "init_process_group", _wrap_init),
    hooks.Patch("distributed_c10d.init_process_group", GROUP, _c10d, "init_process_group", _wrap_init),
    hooks.AtFork("clock: a forked child keeps its parent's offset", GROUP, _in_child),
):
    hooks.declare(_hook)


def _install() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available():
        hooks.install(GROUP)


def _on_open() -> None:
    try:
        _install()
        if _state.record is not None:
            _emit()
        elif _state.measured == 0:  # the group was set up before tracing began
            measure()
    except Exception as exc:
        config.get()
        config.log.warning("clock offset to rank 0 not measured: %s: %s", type(exc).__name__, exc)


logger.add_hooks(_on_open, lambda: None)
if _core.is_open():
    _on_open()
elif config.get().enable:  # a trace will open lazily: see the process group being set up
    _install()
