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

    def add(self, ev, offset=0):
        """``offset``: µs still to subtract from the event's times."""
        ts = ev.get("ts")
        if not is_number(ts):
            return
        ts -= offset
        dur = ev.get("dur")
        end = ts + dur if is_number(dur) else ts
        self.first = ts if self.first is None else min(self.first, ts)
        self.last = end if self.last is None else max(self.last, end)
        if is_start_record(ev):
            run_id = (ev.get("args") or {}).get("run_id")
            if run_id is not None:
                self.run_id = run_id if isinstance(run_id, str) else orjson.dumps(run_id).decode()


class Inputs:
    """The inputs of a merge, read one after another (:meth:`events`): pids and tids
    made unique across inputs, one ``process_name`` and ``process_sort_index``
    record per process after its input's events, aggregate records left out.
    ``processes`` (input, old pid, new pid, name) and ``warnings`` grow as inputs are read."""

    def __init__(self, paths, progress=None):
        for p in paths:
            check_trace(p)
        self.paths, self.progress = paths, progress
        self.pids, self.tids = _Ids(), _Ids()
        self.processes, self.warnings, self.spans = [], [], []
        self.offsets = clock.offsets_us(paths, warnings=self.warnings)

    def shift_us(self, index):
        """The clock offset subtracted from the times of input ``index``: whole µs (far finer than
        the offset's error), so integer times stay integers, which Perfetto reads exactly (a fraction
        at today's epoch µs loses the ns it needs to nest); 0: none."""
        return round(self.offsets.get(index, (0.0,))[0])

    def events(self, index, shift=True):
        """Yields ``(raw JSON, event)`` of input ``index``; ``shift=False`` leaves
        its times for the caller to move by :meth:`shift_us`."""
        path, rank = self.paths[index], rank_of(self.paths[index])
        pid_map, tid_map, names = {}, {}, {}
        lines = EventLines(path)
        span = _Span()
        self.spans.append((index, span))
        offset = self.shift_us(index)
        for _, raw, ev in lines:
            if is_aggregate_record(ev):  # it stands for its own file only: summary reads the events
                continue
            if offset and shift and is_number(ev.get("ts")):
                ev["ts"] -= offset
                raw = orjson.dumps(ev)
            span.add(ev, 0 if shift else offset)
            pid, tid = ev.get("pid"), ev.get("tid")
            new_pid = _remap(pid_map, self.pids, pid, pid)
            new_tid = _remap(tid_map, self.tids, tid, new_pid if tid == pid else tid)
            if ev.get("ph") == "M" and ev.get("name") == "process_name":
                names[new_pid] = _name(path, rank, (ev.get("args") or {}).get("name"))
                continue  # given below, once per process
            if (new_pid, new_tid) != (pid, tid):
                ev.update((k, v) for k, v in (("pid", new_pid), ("tid", new_tid)) if v is not None)
                raw = orjson.dumps(ev)
            yield raw, ev
        for old, new in pid_map.items():
            name = names.get(new) or _name(path, rank, None)
            sort = rank if rank is not None else index
            for key, args in (("process_name", {"name": name}), ("process_sort_index", {"sort_index": sort})):
                ev = {"name": key, "ph": "M", "pid": new, "args": args}
                yield orjson.dumps(ev), ev
            self.processes.append((path, old, new, name))
            if offset:
                self.warnings.append(clock.note(name, *self.offsets[index]))
        self.warnings += lost_notes(lines)
        if self.progress:
            self.progress(os.path.getsize(path))

    def check_runs(self, all_runs, command):
        """Raises :class:`.reader.TraceError` when the inputs read hold several runs, unless ``all_runs``."""
        found = runs.find_runs(self.paths, [(i, s.first, s.last, {"run_id": s.run_id}) for i, s in self.spans
                                            if s.first is not None])
        if len(found) > 1 and not all_runs:
            raise TraceError(runs.mixed_message(found, self.paths, command))


def merge(paths, out, force=False, progress=None, all_runs=False):
    """Writes the events of ``paths`` into ``out``. Returns ``(events written,
    processes as (input, old pid, new pid, name), warnings)``. Raises
    :class:`.reader.TraceError` (and writes nothing) when the inputs hold
    several runs, unless ``all_runs``."""
    inputs = Inputs(paths, progress)
    out = prepare_output(out, paths, force)
    with TraceWriter(out) as w:
        for index in range(len(paths)):
            for raw, _ in inputs.events(index):
                w.write(raw)
        inputs.check_runs(all_runs, "merge")  # the writer removes the file
    return w.events, inputs.processes, inputs.warnings
