"""Cuts a trace into parts that each load in the Perfetto UI (``convert --split``).

A part never cuts a slice in half: the unit is a *group*, one top-level
complete event of a thread with every event nested in it (a step slice and
everything inside it, a graph call and its ops...). Events are grouped in a
first pass (their times only, in NumPy arrays), then a second pass copies each
line byte for byte into its part. Every part also gets the metadata records
(``ph: M``: process and thread names...) and the ``start`` record, so each one
is a trace of the same run on its own.

Selections: the groups that start inside the window of step slices ``A``..``B``
(``args.step``), or inside a time range (seconds from the first event), or
all groups in start order, packed into parts of at most ``max_events``
events (a group larger than that becomes a part of its own).
"""

import os
from array import array

import numpy as np

from .convert import lost_notes, prepare_output
from .reader import EventLines, TraceError, check_trace, is_aggregate_record, is_number, is_start_record
from .writer import TraceWriter

ALL = -1  # copied into every part
LEFT_OUT = -2


def _scan(src):
    """Pass 1: per event (in file order) its start, end, thread and whether it is
    copied to every part; the step slices as (step, start, end); the indices of the aggregate
    records, which no part gets (a part holds only some of the events they stand for)."""
    ts, end, thread, everywhere = array("d"), array("d"), array("q"), array("b")
    threads, step_slices, records = {}, [], []
    lines = EventLines(src)
    for _, _, ev in lines:
        if is_aggregate_record(ev):
            records.append(len(ts))
        t, d = ev.get("ts"), ev.get("dur")
        meta = ev.get("ph") == "M" or is_start_record(ev) or not is_number(t)
        everywhere.append(meta)
        t = float(t) if is_number(t) else 0.0
        d = float(d) if ev.get("ph") == "X" and is_number(d) and d >= 0 else 0.0
        ts.append(t)
        end.append(t + d)
        thread.append(threads.setdefault((ev.get("pid"), ev.get("tid")), len(threads)))
        if ev.get("cat") == "step" and ev.get("ph") == "X":
            step = (ev.get("args") or {}).get("step")
            if isinstance(step, int):
                step_slices.append((step, t, t + d))
    return (np.frombuffer(ts, dtype=np.float64), np.frombuffer(end, dtype=np.float64),
            np.frombuffer(thread, dtype=np.int64), np.frombuffer(everywhere, dtype=np.int8).astype(bool),
            step_slices, records, lines)


def _groups(ts, end, thread, everywhere):
    """Group id per event (ALL for metadata) and the start time of each group."""
    group = np.full(len(ts), ALL, dtype=np.int64)
    idx = np.flatnonzero(~everywhere)
    # per thread, by start, longer first on ties (Perfetto's order): a top-level event
    # starts at or after the end of everything before it on its thread
    order = idx[np.lexsort((-(end[idx] - ts[idx]), ts[idx], thread[idx]))]
    if not len(order):
        return group, np.empty(0)
    o_ts, o_end, o_thr = ts[order], end[order], thread[order]
    bounds = np.flatnonzero(np.r_[True, o_thr[1:] != o_thr[:-1], True])
    top = np.empty(len(order), dtype=bool)
    for a, b in zip(bounds[:-1], bounds[1:]):  # per thread: the running max of the ends so far
        reach = np.maximum.accumulate(o_end[a:b])
        top[a:b] = np.r_[True, o_ts[a + 1:b] >= reach[:-1]]
    gid = np.cumsum(top) - 1
    group[order] = gid
    return group, o_ts[top]


def _part_names(src, out_dir, label, count):
    stem = os.path.basename(src).split(".pfw")[0].split(".json")[0]
    if count == 1:
        return [os.path.join(out_dir, f"{stem}-{label}.pfw.gz")]
    return [os.path.join(out_dir, f"{stem}-part{i + 1:03d}.pfw.gz") for i in range(count)]


def split(src, out_dir, steps=None, time=None, max_events=None, force=False):
    """Writes the parts into ``out_dir``. ``steps``: (first, last) step; ``time``:
    (start s, end s) from the first event; ``max_events``: events per part.
    Returns ``(parts as (path, events), warnings)``."""
    check_trace(src)
    ts, end, thread, everywhere, step_slices, records, lines = _scan(src)
    group, starts = _groups(ts, end, thread, everywhere)
    warnings = []
    if max_events:
        sizes = np.bincount(group[group != ALL], minlength=len(starts))
        order = np.argsort(starts, kind="stable")
        part_of_group = np.empty(len(starts), dtype=np.int64)
        part, filled = 0, 0
        for g in order:
            if filled and filled + sizes[g] > max_events:
                part, filled = part + 1, 0
            if sizes[g] > max_events:
                warnings.append(f"{src}: a slice holding {sizes[g]:,} events is more than --max-events "
                                f"{max_events:,}; it stays whole in part {part + 1}")
            part_of_group[g] = part
            filled += sizes[g]
        n_parts, label = part + 1, "part001"
    else:
        if steps:
            chosen = [(t, e) for s, t, e in step_slices if steps[0] <= s <= steps[1]]
            if not chosen:
                raise TraceError(f"{src}: no step slices numbered {steps[0]} to {steps[1]} (cat 'step', args.step)")
            lo, hi = min(t for t, _ in chosen), max(e for _, e in chosen)
            label = f"steps-{steps[0]}-{steps[1] if steps[1] != float('inf') else 'end'}"
        else:
            first = starts.min() if len(starts) else 0.0
            lo, hi = first + time[0] * 1e6, first + time[1] * 1e6
            label = f"time-{time[0]:g}-{time[1]:g}s".replace("inf", "end")
        part_of_group = np.where((starts >= lo) & (starts < hi), 0, LEFT_OUT)
        n_parts = 1
        if not (part_of_group == 0).any():
            raise TraceError(f"{src}: no events start in the selected window")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise TraceError(f"cannot create the output directory {out_dir}: {exc.strerror}") from None
    paths = [prepare_output(p, [src], force) for p in _part_names(src, out_dir, label, n_parts)]
    target = np.where(group == ALL, ALL, part_of_group[np.maximum(group, 0)] if len(starts) else ALL)
    target[records] = LEFT_OUT
    writers = []
    try:
        writers += [TraceWriter(p) for p in paths]
        for i, (_, raw, _) in enumerate(EventLines(src)):
            t = target[i]
            if t == ALL:
                for w in writers:
                    w.write(raw)
            elif t >= 0:
                writers[t].write(raw)
    except BaseException:
        for w in writers:
            w.abort()
        raise
    for w in writers:
        w.close()
    return [(p, w.events) for p, w in zip(paths, writers)], warnings + lost_notes(lines)
