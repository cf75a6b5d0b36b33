"""Aggregates stored in a trace file, so that ``summary`` and ``diff`` need not read every event.

One metadata record (``"ph":"M"``, ``"name":"dftrace_aggregates"``, ``cat``
``dftracer``) holds in ``args`` what the summary needs of the file (see
docs/format.rst, "Aggregate records"): per op/graph group (name, module path,
phase, graph, process, kernel or not; kept per step for the warm-up steps, all
other steps together) its count, timed count, exact sum (integer ns), min, max,
sum of squares and the quantile sketch buckets (:mod:`.sketch`); the step
slices and their per-step sums, the compile records, the evaluation slices, the
events the rank view reads, the per-step samples of ``diff`` and the run's
time span. A file may hold several such records (checkpoints): the last one
counts.

:func:`partial` turns a record into the same mergeable partial as a full scan
of the file (:func:`.summary.scan`), or None when the record cannot answer
exactly: the warm-up steps the reader finds differ from those the record kept
apart, per-step samples are asked for and missing, or the record's version is
unknown, or it is not as documented. It is looked for in the last
few members of the file (:data:`SEARCH_MEMBERS`), each decoded once; in a file that was not
closed, further back (:data:`KILLED_BYTES`). :func:`compute` and :func:`write` make a version 1
record from a full scan of the file and store it in it. The trace writer writes version 2
records itself (csrc/aggregates.c): :func:`_from_writer` reads them.
"""

import json
import os
import tempfile
import zlib

import duckdb
import orjson

from ..schema import AGGREGATES_RECORD, CAT_DFTRACER
from . import clock, engines, kernels, ranks, sketch, steps, trust
from .reader import MAX_LINE, MEMBER_START, TraceError, compression_of, decode_members, starts_a_line
from .report import OP_VIEWS
from .summary import (BUCKETED, GRAPH, KIND_NAMES, NS, OP, OPTIMIZER, PROCESS_NAME, SAMPLE_VIEWS, load,
                      rank_columns, rank_rows_of_columns, warm_condition)
from .writer import compress

NAME = AGGREGATES_RECORD
VERSION = 1  # the records compute() makes
WRITER_VERSION = 2  # the records the trace writer writes (csrc/aggregates.c)
MARKER = b'"name":"' + NAME.encode() + b'"'
EVENTS = b',"events":['  # the last key of a writer's record
MAX_SAMPLES = 100_000  # per-step samples kept at most (else diff reads the events)
# the record is looked for in the last SEARCH_MEMBERS members (plain text: SEARCH_BYTES) of a
# file: a file without one (the common case) costs a summary only that much more decoding
SEARCH_BYTES, SEARCH_MEMBERS = 8 << 20, 4
KILLED_BYTES = 64 << 20  # searched for the last checkpoint of a file that was not closed
PARALLEL_FILES = 16  # from this many files up, partials(processes=None) uses one process per core
_GROUP_KEYS = ("name", "module", "phase", "graph")  # then pid; the view keys of a group


def compute(path):
    """The aggregate record (its ``args``) of the trace file ``path``, from a full scan."""
    con, base, info = load([path], [0], rank_rows=False)
    groups = con.execute(f"""
        SELECT kind, name, module, phase, graph, pid, extra IS NOT NULL AND kind = {OP},
               CASE WHEN {warm_condition(info["warmup_keys"])} THEN step END, b, count(*), count(dur), sum({NS}),
               min(dur), max(dur), sum(dur * dur)
        FROM {BUCKETED} WHERE kind IN ({OP}, {GRAPH}) GROUP BY ALL ORDER BY ALL""").fetchall()
    samples = con.execute(f"""
        SELECT grouping(name, module, phase), pid, step, name, module, phase, sum(coalesce({NS}, 0)) FROM ev
        WHERE kind = {OP} AND step IS NOT NULL
        GROUP BY GROUPING SETS ((pid, step, name), (pid, step, module), (pid, step, phase)) ORDER BY ALL""").fetchall()
    names = dict(con.execute(f"SELECT pid, any_value(aname) FROM ev WHERE kind = {PROCESS_NAME} GROUP BY pid")
                 .fetchall())
    info_rows = kernels.view(con, f"kind = {OP}", None)
    rank_rows = rank_columns(con) if base["slices"] else None
    con.close()
    views = {0b011: "op", 0b101: "module", 0b110: "phase"}  # grouping() bits of the columns left out
    return {
        "version": VERSION,
        "warmup": sorted([int(p), int(s)] for _, p, s in info["warmup_keys"]),
        "groups": groups,
        "process_names": [[p, n] for p, n in names.items()],
        "kernels": [[r["key"], r["kernel_type"], r["fused_ops"]] for r in info_rows],
        "samples": [[views[m], pid, step, name if m == 0b011 else module if m == 0b101 else phase, ns]
                    for m, pid, step, name, module, phase, ns in samples] if len(samples) <= MAX_SAMPLES else None,
        **{k: base[k] for k in ("runs", "unparsed", "evaluation", "records", "slices", "parts")},
        "rank_rows": rank_rows,
        "clock": clock.record(path),  # the rank view then reads no file for it
        "nested_parts": True,  # parts holds the rows of the parts nested in optimizer events
    }


def _depth(module, depth):
    if not depth or module == "(top level)":
        return module
    return ".".join(module.split(".")[:depth])


def partial(paths, index, record, views, module_depth=None, include_warmup=False, step_samples=False):
    """The :func:`.summary.scan` partial of ``paths[index]`` from its aggregate ``record``, or None
    when the record cannot give exactly what a full scan gives."""
    if record.get("version") != VERSION or (step_samples and record["samples"] is None):
        return None
    if not record.get("nested_parts") and any(r[3] == OPTIMIZER for r in record["parts"]):
        return None  # made before the parts nested in optimizer events were kept apart: read the events
    i = index
    records = [dict(r, file=i) for r in record["records"]]
    slices = [(i, *r[1:]) for r in record["slices"]]
    parts = [(i, *r[1:]) for r in record["parts"]]
    info = steps.analyse(slices, parts, records, KIND_NAMES, include_warmup)
    if {(p, s) for _, p, s in info["warmup_keys"]} != {tuple(w) for w in record["warmup"]}:
        return None
    names = list(dict.fromkeys(["phase", "process", *(v for v in views if v in OP_VIEWS)]))
    groups, kernel_rows = [], []
    for kind, name, module, phase, graph, pid, is_kernel, wstep, bucket, *stats in record["groups"]:
        if wstep is not None and not include_warmup:
            continue
        keys = {"op": (name,), "module": (_depth(module, module_depth),), "phase": (phase,),
                "graph": (graph, phase), "process": (i, pid)}
        groups += [(kind, view, keys[view], bucket, *stats[:5], None, None) for view in names]
        if is_kernel:
            kernel_rows.append((name, bucket, *stats[:5]))
    groups += [(PROCESS_NAME, "process", (i, pid), None, 1, 0, 0, None, None, None, name)
               for pid, name in record["process_names"]]
    warm = {tuple(w) for w in record["warmup"]}
    out = {"whole": False, "warnings": [], "runs": [(i, *record["runs"][0][1:])] if record["runs"] else [],
           "unparsed": record["unparsed"], "evaluation": record["evaluation"], "records": records,
           "slices": slices, "parts": parts, "steps": info, "groups": groups,
           "kernels": {"info": {k: (t, f, None) for k, t, f in record["kernels"]}, "rows": kernel_rows}
           if "kernel" in views else None,
           "samples": [(view, _depth(key, module_depth) if view == "module" else key, step, ns)
                       for view, pid, step, key, ns in record["samples"]
                       if view in views and (include_warmup or (pid, step) not in warm)]
           if step_samples else None}
    if "clock" in record:  # (records made before it was kept: the rank view reads the file for it)
        out["clocks"] = {i: record["clock"]}
    if record["rank_rows"] is not None:
        columns = [list(c) for c in record["rank_rows"]]
        columns[1] = [i] * len(columns[1])  # the file column
        out["rank_rows"] = rank_rows_of_columns(columns)
        out["rank_rows"]["ops"] = ranks.module_rows(_module_ns(  # op time per step and module
            (i, pid, step, _depth(key, module_depth), ns)
            for view, pid, step, key, ns in record["samples"] or () if view == "module"))
    return out


def _module_ns(rows):
    """(file, pid, step, module, ns) rows added up per file, pid, step and module."""
    out = {}
    for *key, ns in rows:
        out[tuple(key)] = out.get(tuple(key), 0) + ns
    return [(*key, ns) for key, ns in out.items()]


def partials(paths, views, module_depth=None, include_warmup=False, step_samples=False, processes=1):
    """(the partials of every file from its aggregate record, None), or (None, a note or None) when
    some file has none (no note) or one that does not describe its file or cannot answer (the
    note says which and why, in one line): the caller then scans the events. ``processes``: how
    many local processes read the files, this one and spawned ones, each its share of them into
    one partial (None: one per core from :data:`PARALLEL_FILES` files up, else 1). Spawned: the
    caller's main module must be importable (a script calls this under ``if __name__ ==
    "__main__":``)."""
    options = (views, module_depth, include_warmup, step_samples)
    if processes is None:
        processes = engines.cores() if len(paths) >= PARALLEL_FILES else 1
    processes = max(min(processes, len(paths)), 1)
    cuts = [len(paths) * w // processes for w in range(processes + 1)]
    shares = [list(range(lo, hi)) for lo, hi in zip(cuts, cuts[1:])]  # in file order
    if len(shares) == 1:
        out = [_share(paths, shares[0], options)]
    else:  # this process reads the first share while the others read theirs
        with engines.Processes(len(shares) - 1) as pool:
            rest = pool.map(_share, [paths] * (len(shares) - 1), shares[1:], [options] * (len(shares) - 1))
            out = [_share(paths, shares[0], options), *rest]
    notes = [note for _, note in out if note]
    if any(share is None for share, _ in out):
        if not notes:
            return None, None
        more = f" (and {len(notes) - 1} other file(s)'s)" if len(notes) > 1 else ""
        return None, f"{notes[0]}{more}: read the events of the {len(paths)} file(s) instead"
    return [p for share, _ in out for p in share], None


def _share(paths, indices, options):
    """(the partials of the files ``paths[i]``, i in ``indices``, from their aggregate records,
    None), or (None, why not for the first file that has a record and cannot give them, or None)."""
    records = {}
    for i in indices:
        try:
            records[i] = verified(paths[i], raw_events=True)
            if records[i] is None:
                return None, None
            _plausible(records[i])
        except trust.Untrusted as e:
            return None, f"{paths[i]}: its aggregate record {e}"
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            return None, f"{paths[i]}: its aggregate record is not as documented ({type(e).__name__})"
    written = [i for i in indices if records[i]["version"] == WRITER_VERSION]
    try:
        out = [partial(paths, i, records[i], *options) for i in indices if i not in written]
        if written:
            out.append(_from_writer(paths, written, records, *options))
    except trust.Untrusted as e:  # (a writer's record: the copied events, named with their file)
        return None, str(e)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, duckdb.Error, TraceError) as e:
        return None, f"{paths[indices[0]]}: its aggregate record is not as documented ({type(e).__name__})"
    if not all(out):
        return None, (f"{paths[indices[0]]}: its aggregate record cannot answer this exactly (other warm-up "
                      "steps, or no per-step samples)")
    return out, None


def _plausible(record):
    """Raises :class:`.trust.Untrusted` unless each value of a :func:`verified` ``record`` is plausible
    (a writer's copied events are checked once read, in :func:`_from_writer`)."""
    plausible = trust.Plausible(record["span"])
    if record.get("version") == WRITER_VERSION:
        plausible.writer_record(record, sketch.key)
    elif record.get("version") == VERSION:
        plausible.computed_record(record, sketch.key)
    else:
        raise trust.Untrusted(f"has a version this reader does not know ({record.get('version')!r})")


def _text(value):
    """A JSON value as DuckDB reads it into a VARCHAR column."""
    return value if isinstance(value, str) or value is None else orjson.dumps(value).decode()


def _from_writer(paths, indices, records, views, module_depth, include_warmup, step_samples):
    """One :func:`.summary.scan` partial of the files ``paths[i]``, i in ``indices``, from the
    records the trace writer wrote (version 2), or None when one cannot answer. Their copied
    events are read as the events of the files are; op and graph groups, per-step op time
    and samples come from the record."""
    if any(step_samples and records[i]["samples"] is None for i in indices):
        return None
    pids, clocks = {}, {}  # one process per file; its clock record
    with tempfile.TemporaryDirectory(prefix="dftrace-aggregates-") as tmp:
        copies = list(paths)
        for i in indices:  # each file's copied events, kept in memory only until written
            events = _events_text(records[i].pop("events"))
            pids[i], clocks[i] = _first_pid(events), _clock(events)
            copies[i] = os.path.join(tmp, f"{i}.json")
            with open(copies[i], "wb") as f:
                f.write(events)
        # a few thousand events per file: one thread (the files' shares are read in parallel)
        con, base, _ = load(copies, indices, rank_rows=True, analyse=False, layout="array", threads=1)
    names = dict(((f, p), n) for f, p, n in con.execute(
        f"SELECT file, pid, any_value(aname) FROM ev WHERE kind = {PROCESS_NAME} GROUP BY ALL").fetchall())
    con.close()
    checks = {i: trust.Plausible(records[i]["span"]) for i in indices}
    for i in indices:  # the copied events, as a scan of the file's events would read them
        try:
            checks[i].base(*([r for r in base[k] if r[0] == i] for k in ("slices",)),
                           [r for r in base["records"] if r["file"] == i], [],
                           *([r for r in base[k] if r[0] == i] for k in ("runs", "parts")))
            if i == max(checks, key=lambda j: checks[j].length_us):  # (evaluation slices are not kept per file)
                checks[i].base([], [], base["evaluation"], [], [])
        except trust.Untrusted as e:
            raise trust.Untrusted(f"{paths[i]}: its aggregate record {e}") from None
    base["unparsed"] += 2 * len(indices)  # the '[' and ']' lines of the files, which merge() discounts
    parts = [r for r in base["parts"] if r[3] != OP] + [
        (i, pids[i], step, OP, bool(bwd), ns / 1000, n) for i in indices for step, bwd, ns, n in records[i]["op_steps"]]
    info = steps.analyse(base["slices"], parts, base["records"], KIND_NAMES, include_warmup)
    warm = set(info["warmup_keys"])
    if any((i, pids[i], s) in warm and s not in set(records[i]["apart"]) for i, _, s in warm):
        return None  # a warm-up step folded into the steady totals
    # one row per view, group key and sketch bucket of all these files (what merge() adds up)
    totals, kernel_stats, kernel_info, samples = {}, [], {}, []
    names_of_views = list(dict.fromkeys(["phase", "process", *(v for v in views if v in OP_VIEWS)]))
    for i in indices:
        keys = [(kind, kernel, name if name is not None else "(no name)", _text(module) or "(top level)",
                 _text(phase) or "(none)", _text(graph) or "?", ktype, aten)
                for kind, kernel, name, module, phase, graph, ktype, aten in records[i]["keys"]]
        for gid, step, count, ns, lo, hi, zero, _sq, buckets in records[i]["groups"]:
            if step is not None and (i, pids[i], step) in warm and not include_warmup:
                continue
            kind, kernel, name, module, phase, graph, ktype, aten = keys[gid]
            lo, hi = lo / 1000, hi / 1000
            # the sums on one row, the sketch's bucket counts (op events) on the others
            rows = [(None, count, 0 if kind == OP else count, ns, lo, hi)]
            if kind == OP:
                rows += [(b, 0, n, 0, lo, hi) for b, n in zip(buckets[::2], buckets[1::2])]
                rows += [(sketch.ZERO, 0, zero, 0, lo, hi)] if zero else []
            view_keys = {"op": (name,), "module": (_depth(module, module_depth),), "phase": (phase,),
                         "graph": (graph, phase), "process": (i, pids[i])}
            for view in names_of_views:
                for bucket, count, timed, ns, lo, hi in rows:
                    key = (kind, view, view_keys[view], bucket)
                    total = totals.get(key)
                    if total is None:
                        totals[key] = [count, timed, ns, lo, hi]
                        continue
                    # as merge() adds them: min and max of the rows that enter the sketch (timed)
                    if timed:
                        total[3:] = (min(total[3], lo), max(total[4], hi)) if total[1] else (lo, hi)
                    total[0] += count
                    total[1] += timed
                    total[2] += ns
            if kernel:
                kernel_stats += [(name, *row) for row in rows]
                old = kernel_info.get(name, (None, set()))
                kernel_info[name] = (old[0] or _text(ktype), old[1] | set(aten if isinstance(aten, list) else []))
        if step_samples:
            samples += [(view, {"op": keys[gid][2], "module": _depth(keys[gid][3], module_depth),
                                "phase": keys[gid][4]}[view], step, ns)
                        for gid, step, ns in records[i]["samples"]
                        if include_warmup or (i, pids[i], step) not in warm for view in SAMPLE_VIEWS if view in views]
    groups = [(*key, count, timed, ns, lo, hi, None, None) for key, (count, timed, ns, lo, hi) in totals.items()]
    groups += [(PROCESS_NAME, "process", key, None, 1, 0, 0, None, None, None, name) for key, name in names.items()]
    warnings = base["warnings"] + [
        f"{paths[i]}: not closed (its process ended without closing the trace): counted up to its last "
        "aggregate checkpoint; --source events counts every event that reached the file"
        for i in indices if not records[i]["closed"]]
    if base.get("rank_rows") is not None:  # op time per step and module: what made a rank slow
        base["rank_rows"]["ops"] = ranks.module_rows(_module_ns(
            ((i, pids[i], step, _depth(_text(records[i]["keys"][gid][3]) or "(top level)", module_depth), ns)
             for i in indices for gid, step, ns in records[i]["samples"] or ())))
    return dict(base, whole=False, steps=info, parts=parts, groups=groups, clocks=clocks, warnings=warnings,
                rank_rows=base.get("rank_rows"),
                kernels={"info": {k: (t, ", ".join(sorted(f)), None) for k, (t, f) in kernel_info.items()},
                         "rows": kernel_stats} if "kernel" in views else None,
                samples=samples if step_samples else None)


def _events_text(events):
    """The copied events of a record as the JSON text of their array."""
    return events if isinstance(events, bytes) else orjson.dumps(events)


def _first_pid(events):
    """The ``pid`` of the first of the copied ``events`` (JSON array text); 0 without."""
    for size in (1 << 16, len(events)):  # a first event longer than that is read whole
        try:
            first, _ = json.JSONDecoder().raw_decode(events[:size].decode("utf-8", "replace"), 1)
        except ValueError:
            continue
        return int(first.get("pid", 0)) if isinstance(first, dict) else 0
    return 0


def _clock(events):
    """The args of the first ``clock`` record among the copied ``events`` (JSON array text), or None."""
    if clock.MARK not in events:  # no clock offset: the rank view aligns the ranks otherwise
        return None
    return next((e.get("args") for e in orjson.loads(events)
                 if isinstance(e, dict) and e.get("name") == "clock" and e.get("cat") == CAT_DFTRACER), None)


def _members_from_end(path, kind, budget=SEARCH_BYTES, members=SEARCH_MEMBERS):
    """(offset, end, text) of the file's last ``members`` members/frames that start a line, last
    first, within its last ``budget`` bytes, each decoded once; a plain file is one piece from
    its first whole line in that window to its end."""
    size = os.path.getsize(path)
    start = max(0, size - budget)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    if kind is None:
        first = 0 if start == 0 else data.find(b"\n") + 1
        yield start + first, size, data[first:]
        return
    end = pos = len(data)
    while (pos := data.rfind(MEMBER_START[kind], 0, pos)) >= 0:
        if starts_a_line(data[pos:pos + (1 << 18)], kind):
            # a member that large holds no record a reader would take, and must not fill the memory
            text = decode_members(data[pos:end], kind, 2 * MAX_LINE)
            if text is not None:  # else a false start inside compressed data
                yield start + pos, start + end, text
                end = pos
                members = members and members - 1
                if members == 0:
                    return


def _locate(path):
    """Where the last aggregate record of the trace file ``path`` stands, or None without one:
    (its line, the file offset of the member (plain text: the piece) read, where the line starts
    in that member's ``text``, the text after the member, whether the file was closed). In a
    closed file only the ``end`` record may follow it (:class:`.trust.Untrusted` otherwise: an
    event the record does not hold follows). A file that was not closed (its process was killed)
    is searched further back, up to :data:`KILLED_BYTES` from its end, for its last checkpoint."""
    def last(budget, members):  # (offset, text of the last member holding a record or None, text after it, closed)
        closed, after = None, b""
        for offset, _, piece in _members_from_end(path, kind, budget, members):
            closed = piece.rstrip().endswith(b"]") if closed is None else closed
            if MARKER in piece:
                return offset, piece, after, closed
            after = piece + after
        return None, None, after, closed

    kind = compression_of(path)
    offset, text, after, closed = last(SEARCH_BYTES, SEARCH_MEMBERS)
    if text is None and closed is False:
        offset, text, after, _ = last(KILLED_BYTES, None)
    if text is None:
        return None
    at = text.rfind(MARKER)
    end = text.find(b"\n", at) if text.find(b"\n", at) >= 0 else len(text)
    closed = closed is not False
    if closed and not all(_is_end(line) for line in (text[end:] + after).splitlines()):
        raise trust.Untrusted("is followed by events it does not hold")
    line_at = text.rfind(b"\n", 0, at) + 1
    return text[line_at:end].rstrip(b",\r"), offset, line_at, text, after, closed, kind


def _parse(line, raw_events):
    """The ``args`` of a record ``line`` (see :func:`read`); :class:`.trust.Untrusted` when it is not JSON
    as documented."""
    try:
        args = raw_events and _without_events(line) or orjson.loads(line)["args"]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        raise trust.Untrusted("is not JSON as documented (cut or edited?)") from None
    if not isinstance(args, dict):
        raise trust.Untrusted("is not JSON as documented (cut or edited?)")
    return args


def read(path, raw_events=False):
    """The last aggregate record (its ``args``, with ``closed``: whether the file was closed) of
    the trace file ``path``, or None when it has none that :func:`_locate` finds or it is no JSON.
    Unchecked: :func:`verified` says whether it describes the file. ``raw_events``: a writer's
    record keeps its copied events as the JSON text of their array."""
    try:
        found = _locate(path)
        return found and dict(_parse(found[0], raw_events), closed=found[5])
    except (OSError, trust.Untrusted):
        return None


def verified(path, raw_events=False):
    """:func:`read`'s record when the file still holds the bytes it stands for (its ``covers``),
    with ``span``, the time span its events must lie in (:func:`.trust.span`); None without one;
    :class:`.trust.Untrusted` when there is one that does not describe the file. Its values are
    checked apart (:class:`.trust.Plausible`)."""
    try:
        found = _locate(path)
    except OSError:
        return None
    if found is None:
        return None
    line, offset, line_at, text, after, closed, kind = found
    record = _parse(line, raw_events)
    trust.check_covers(path, kind is not None, offset, line_at, text, record.get("covers"))
    return dict(record, closed=closed, span=trust.span(path, text[:line_at], after, closed))


def _without_events(line):
    """The ``args`` of a writer's record ``line`` with its copied events left as the JSON text of
    their array (the writer writes them last; parsing them is most of the cost of reading a
    record, and DuckDB reads them anyway), or None when the line is not laid out so."""
    at = line.find(EVENTS)
    if at < 0 or not line.endswith(b"]}}"):
        return None
    try:  # the line up to the events, closed: parses only when they are a key of args
        args = orjson.loads(line[:at] + b"}}")["args"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    if not isinstance(args, dict) or args.get("version") != WRITER_VERSION:
        return None
    return dict(args, events=line[at + len(EVENTS) - 1:-2])


def _is_end(line):
    """Whether ``line`` may follow the last record of a closed file: blank, ``]`` or the ``end`` record."""
    line = line.strip().rstrip(b",")
    if line in (b"", b"]"):
        return True
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return isinstance(event, dict) and event.get("name") == "end" and event.get("cat") == CAT_DFTRACER


def write(path, record=None):
    """Stores the aggregate ``record`` (default: :func:`compute`) in the trace file ``path``, as a
    line just before its closing ``]`` (a compressed file's last member/frame is rewritten)."""
    record = record if record is not None else compute(path)
    kind = compression_of(path)
    pids = [p for p, _ in record.get("process_names") or []] + [g[5] for g in record.get("groups") or [] if len(g) > 5]
    pid = pids[0] if pids else 0
    size = os.path.getsize(path)
    # the last member (plain text: the tail) when it holds the closing ']', else the file's end
    offset, end, text = next(_members_from_end(path, kind), (size, size, b""))
    at = text.rfind(b"]")
    if end != size or at < 0 or text[at + 1:].strip():  # not closed (a running or killed process)
        offset, text, at = size, b"", 0
    # the bytes it stands for, as the trace writer cites them
    record = dict(record, covers={"bytes": offset, "crc32": trust.crc(path, 0, offset), "text_bytes": at,
                                  "text_crc32": zlib.crc32(text[:at])})

    def encode(args):
        return orjson.dumps({"name": NAME, "cat": CAT_DFTRACER, "ph": "M", "pid": pid, "tid": 0, "args": args}) + b"\n"

    line = encode(record)
    if len(line) > MAX_LINE:  # every reader skips longer lines: without the samples (diff reads the events)
        line = encode(dict(record, samples=None))
    if len(line) > MAX_LINE:
        raise TraceError(f"{path}: its aggregates take {len(line) >> 20} MiB, more than a line may hold")
    text = compress(text[:at] + line + text[at:], kind)
    with open(path, "r+b") as f:
        f.truncate(offset)
        f.seek(offset)
        f.write(text)

