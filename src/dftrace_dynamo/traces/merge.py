"""Merges the traces of many processes into one file for Perfetto.

Every input keeps its own processes: a pid already used by an earlier input
is moved to a free one (its main-thread tid, equal to the pid, moves with it;
other colliding tids move too, since Perfetto keys threads by tid). Each
process gets a ``process_name`` (the input's own, prefixed with its rank when
the file name has ``rank<R>``; else a name made from the file name) and a
``process_sort_index`` so ranks are listed in order. A rank whose measured
clock offset to rank 0 exceeds its error bound has its times moved onto rank
0's clock (see :mod:`.clock`), with a note saying so, by a whole number of µs:
integer times stay integers.

Inputs of different runs (see :mod:`.runs`) are refused, as by ``summary``,
unless ``all_runs``; so is an output inside a directory being merged (a
later ``summary`` of that directory would count every event twice)."""

import os

import orjson

from . import clock, runs
from .convert import lost_notes, prepare_output
from .reader import (SUFFIXES, EventLines, TraceError, check_trace, is_aggregate_record, is_number,
                     is_start_record, rank_of)
from .writer import TraceWriter


class _Ids:
    """Hands out pids/tids unique across inputs, preferring the original."""

    def __init__(self):
        self.used, self.top = set(), 0

    def take(self, wanted):
        if not isinstance(wanted, int) or wanted in self.used or not 0 <= wanted < 1 << 32:
            wanted = self.top + 1
        self.used.add(wanted)
        self.top = max(self.top, wanted)
        return wanted


def _remap(mapping, ids, value, wanted):
    if value is None:  # e.g. an M event without tid: nothing to keep apart
        return None
    if value not in mapping:
        mapping[value] = ids.take(wanted)
    return mapping[value]


def _name(path, rank, given):
    label = given if isinstance(given, str) and given else os.path.basename(path).split(".")[0]
    if rank is not None and f"rank{rank}" not in label.replace(" ", ""):
        label = f"rank{rank} {label}"
    return label


def check_output_place(out, specs):
    """Refuses a trace output ``out`` inside a directory of the inputs ``specs``
    (command-line arguments), where later reads of the directory find it."""
    if not out.endswith(SUFFIXES):
        return
    out = os.path.abspath(out)
    for spec in specs:
        if os.path.isdir(spec) and os.path.commonpath([out, os.path.abspath(spec)]) == os.path.abspath(spec):
            raise TraceError(f"output {out} is inside the input directory {spec}: a later summary or merge "
                             "of that directory would count every event twice; write it elsewhere")


class _Span:
    """First and last event time and the ``start`` record's run_id of one input, for :mod:`.runs`."""

    def __init__(self):
        self.first = self.last = self.run_id = None

    def add(self, ev):
        ts = ev.get("ts")
        if not is_number(ts):
            return
        dur = ev.get("dur")
        end = ts + dur if is_number(dur) else ts
        self.first = ts if self.first is None else min(self.first, ts)
        self.last = end if self.last is None else max(self.last, end)
        if is_start_record(ev):
            run_id = (ev.get("args") or {}).get("run_id")
            if run_id is not None:
                self.run_id = run_id if isinstance(run_id, str) else orjson.dumps(run_id).decode()


def merge(paths, out, force=False, progress=None, all_runs=False):
    """Writes the events of ``paths`` into ``out``. Returns ``(events written,
    processes as (input, old pid, new pid, name), warnings)``. Raises
    :class:`.reader.TraceError` (and writes nothing) when the inputs hold
    several runs, unless ``all_runs``."""
    for p in paths:
        check_trace(p)
    out = prepare_output(out, paths, force)
    pids, tids = _Ids(), _Ids()
    processes, warnings, spans = [], [], []
    offsets = clock.offsets_us(paths, warnings=warnings)
    with TraceWriter(out) as w:
        for index, path in enumerate(paths):
            rank = rank_of(path)
            pid_map, tid_map, names = {}, {}, {}
            lines = EventLines(path)
            spans.append(_Span())
            # whole µs (far finer than the offset's error): integer times stay integers, which
            # Perfetto reads exactly (a fraction at today's epoch µs loses the ns it needs to nest)
            shift = round(offsets.get(index, (0.0,))[0])
            for _, raw, ev in lines:
                if is_aggregate_record(ev):  # it stands for its own file only: summary reads the events
                    continue
                if shift and is_number(ev.get("ts")):
                    ev["ts"] -= shift
                    raw = orjson.dumps(ev)
                spans[-1].add(ev)
                pid, tid = ev.get("pid"), ev.get("tid")
                new_pid = _remap(pid_map, pids, pid, pid)
                new_tid = _remap(tid_map, tids, tid, new_pid if tid == pid else tid)
                if ev.get("ph") == "M" and ev.get("name") == "process_name":
                    names[new_pid] = _name(path, rank, (ev.get("args") or {}).get("name"))
                    continue  # written below, once per process
                if (new_pid, new_tid) != (pid, tid):
                    ev.update((k, v) for k, v in (("pid", new_pid), ("tid", new_tid)) if v is not None)
                    raw = orjson.dumps(ev)
                w.write(raw)
            for old, new in pid_map.items():
                name = names.get(new) or _name(path, rank, None)
                sort = rank if rank is not None else index
                for key, args in (("process_name", {"name": name}), ("process_sort_index", {"sort_index": sort})):
                    w.write(orjson.dumps({"name": key, "ph": "M", "pid": new, "args": args}))
                processes.append((path, old, new, name))
                if shift:
                    warnings.append(clock.note(name, *offsets[index]))
            warnings += lost_notes(lines)
            if progress:
                progress(os.path.getsize(path))
        found = runs.find_runs(paths, [(i, s.first, s.last, {"run_id": s.run_id}) for i, s in enumerate(spans)
                                       if s.first is not None])
        if len(found) > 1 and not all_runs:  # the writer removes the file
            raise TraceError(runs.mixed_message(found, paths, "merge"))
    return w.events, processes, warnings
