"""Per-file partials: the files' verified source (their aggregate records, or their events) turned
into the mergeable partial result that :mod:`.merged` adds up (see docs/design.rst, "Trace analysis").

:func:`of_files` is the one function an engine (:mod:`.engines`) maps over the files. A partial is
a picklable dict: small row sets (runs, compile records, step slices and parts, evaluation slices,
the events the rank analysis needs) and per group of each op view its count, duration count, exact
sum (integer ns), min, max and quantile sketch buckets. A process's events are all in one file, so
the warm-up steps (a per-process rule, see :mod:`.steps`) are found here and left out of every
statistic unless ``include_warmup``.

From an aggregate record (:mod:`.aggregates`), the partial is the same as a scan of the file's
events gives, or there is none when the record cannot answer exactly: the warm-up steps the
reader finds differ from those the record kept apart, per-step samples are asked for and
missing, or the record is not as documented. A writer's record (version 2) holds copied events,
read as the events of the files are (:func:`.events.load`).
"""

import json
import os
import tempfile

import duckdb
import orjson

from ..schema import CAT_DFTRACER
from . import aggregates, clock, kernels, ranks, sketch, steps, trust
from .events import BUCKETED, NS, load, rank_rows_of_columns, warm_filter
from .kinds import (GRAPH, KEYS, KIND_NAMES, OP, OP_VIEWS, OPTIMIZER, PROCESS_NAME, RANK_KINDS, SAMPLE_VIEWS,
                    SETS, VIEWS)
from .reader import TraceError


def of_files(paths, indices, source, options, whole=False, progress=None):
    """The partials of the files ``paths[i]``, i in ``indices`` (``options``: :func:`scan`'s
    ``views``, ``module_depth``, ``include_warmup`` and ``step_samples``): (a list of partials,
    None), or, from ``source`` ``"aggregates"``, (None, why not for the first file whose record
    cannot give them, or None when a file has no record). ``source`` ``"events"``: one scan of
    their events (``whole`` and ``progress``: see :func:`scan`)."""
    if source == "events":
        return [scan(paths, indices, **options, whole=whole, progress=progress)], None
    return _from_records(paths, indices, options)


def scan(paths, indices, views=VIEWS, module_depth=None, include_warmup=False, step_samples=False, whole=False,
         progress=None):
    """The mergeable partial result (a picklable dict) of the files ``paths[i]``, i in ``indices``:
    small row sets (runs, compile records, step slices and parts, evaluation slices, the events
    the rank analysis needs) and per group of each op view its count, duration count, exact sum
    (integer ns), min, max and quantile sketch buckets. A process's events are all in one file,
    so the warm-up steps (a per-process rule) are found here. ``whole``: ``indices`` are all
    the inputs; quantiles are then exact and the rank analysis is done here."""
    # a share of the files (an engine's task): one DuckDB thread, the engine runs a task per core
    # (more threads per task cost 10-15 % more CPU for the same work)
    con, out, info = load(paths, indices, module_depth, include_warmup, progress, rank_rows=not whole,
                          threads=None if whole else 1)
    warm = warm_filter(con, info["warmup_keys"]) if not include_warmup else ""
    out.update(whole=whole, steps=info,
               groups=_groups(con, [v for v in views if v in OP_VIEWS], warm, whole),
               kernels=_kernels(con, f"kind = {OP} {warm}", whole) if "kernel" in views else None,
               samples=_step_samples(con, [v for v in views if v in SAMPLE_VIEWS], warm)
               if step_samples else None)
    if whole and out["slices"]:
        out["ranks"] = ranks.analyse(ranks.rows(con, RANK_KINDS), paths, RANK_KINDS, out["records"], info,
                                     out["clocks"], out["warnings"])
    con.close()
    return out


def _groups(con, views, warm_filter, whole):
    """Per grouping set of ``views`` (and phase, process: the totals and labels) and group:
    (kind, set name, key values, sketch bucket, count, durations, sum in ns, min, max,
    exact quantiles or None, process name). A ``whole`` scan gives one row per group with its
    exact quantiles; else one per group and sketch bucket of op events."""
    names = list(dict.fromkeys(["phase", "process", *views]))
    sets = [SETS[v] for v in names]
    keys = [k for k in KEYS if any(k in s for s in sets)]
    bucket = "NULL" if whole else "b"
    grouping = ", ".join("(kind, " + ", ".join(s) + ("" if whole else ", b") + ")" for s in sets)
    quant = f"quantile_cont(dur, [0.5, 0.99]) FILTER (WHERE kind = {OP})" if whole else "NULL"
    source = "ev" if whole else BUCKETED
    rows = con.execute(f"""
SELECT kind, grouping({", ".join(keys)}), {", ".join(keys)}, {bucket}, count(*), count(dur), sum({NS}),
       min(dur), max(dur), {quant}, any_value(aname) FILTER (WHERE kind = {PROCESS_NAME})
FROM {source} e WHERE kind IN ({OP}, {GRAPH}, {PROCESS_NAME}) {warm_filter}
GROUP BY GROUPING SETS ({grouping})""").fetchall()
    by_mask = {_mask(keys, s): (name, [keys.index(k) for k in s]) for name, s in zip(names, sets)}
    out = []
    for kind, mask, *rest in rows:
        name, where = by_mask[mask]
        out.append((kind, name, tuple(rest[i] for i in where), *rest[len(keys):]))
    return out


def _kernels(con, where, whole):
    """The kernel view's partial: per kernel name and sketch bucket (one row per name in a
    ``whole`` scan) the same statistics as :func:`_groups`, and per name its kernel type,
    fused ops and, in a whole scan, exact quantiles (:func:`.kernels.view`)."""
    info = {r["key"]: r for r in kernels.view(con, where, None)}
    bucket = "NULL" if whole else sketch.key_sql("dur")
    rows = con.execute(f"""SELECT name, {bucket} AS b, count(*), count(dur), sum({NS}), min(dur), max(dur)
        FROM ev e WHERE extra IS NOT NULL AND {where} GROUP BY ALL""").fetchall()
    return {"info": {k: (r["kernel_type"], r["fused_ops"], (r["p50_us"], r["p99_us"]) if whole else None)
                     for k, r in info.items()},
            "rows": rows}


def _step_samples(con, views, warm_filter):
    """Rows (view, key, step, op time in that step in ns, all processes together) for the
    views of one key column (op, module, phase): the per-step samples ``diff`` tests."""
    if not views:
        return []
    cols = [SETS[v][0] for v in views]
    rows = con.execute(f"""
        SELECT grouping({", ".join(cols)}), step, {", ".join(cols)}, sum(coalesce({NS}, 0)) FROM ev e
        WHERE kind = {OP} AND step IS NOT NULL {warm_filter}
        GROUP BY GROUPING SETS ({", ".join(f"(step, {c})" for c in cols)})""").fetchall()
    masks = {_mask(cols, (c,)): (v, i) for i, (v, c) in enumerate(zip(views, cols))}
    return [(masks[mask][0], rest[masks[mask][1]], step, rest[-1]) for mask, step, *rest in rows]


def _mask(columns, keys):
    """DuckDB's grouping() bits: 1 for each of ``columns`` *not* in ``keys``."""
    return sum(1 << (len(columns) - 1 - i) for i, k in enumerate(columns) if k not in keys)


def _from_records(paths, indices, options):
    """(the partials of the files ``paths[i]``, i in ``indices``, from their aggregate records,
    None), or (None, why not for the first file that has a record and cannot give them, or None)."""
    records = {}
    for i in indices:
        try:
            records[i] = aggregates.trusted(paths[i])
            if records[i] is None:
                return None, None
        except trust.Untrusted as e:
            return None, f"{paths[i]}: its aggregate record {e}"
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            return None, f"{paths[i]}: its aggregate record is not as documented ({type(e).__name__})"
    written = [i for i in indices if records[i]["version"] == aggregates.WRITER_VERSION]
    try:
        out = [from_record(paths, i, records[i], **options) for i in indices if i not in written]
        if written:
            out.append(_from_writer(paths, written, records, **options))
    except trust.Untrusted as e:  # (a writer's record: the copied events, named with their file)
        return None, str(e)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, duckdb.Error, TraceError) as e:
        return None, f"{paths[indices[0]]}: its aggregate record is not as documented ({type(e).__name__})"
    if not all(out):
        return None, (f"{paths[indices[0]]}: its aggregate record cannot answer this exactly (other warm-up "
                      "steps, no per-step samples, or made by an earlier version)")
    return out, None


def _depth(module, depth):
    if not depth or module == "(top level)":
        return module
    return ".".join(module.split(".")[:depth])


def from_record(paths, index, record, views, module_depth=None, include_warmup=False, step_samples=False):
    """The :func:`scan` partial of ``paths[index]`` from its aggregate ``record`` (version 1), or None
    when the record cannot give exactly what a full scan gives."""
    if record.get("version") != aggregates.VERSION or (step_samples and record["samples"] is None):
        return None
    if not record.get("nested_parts") and any(r[3] == OPTIMIZER for r in record["parts"]):
        return None  # made before the parts nested in optimizer events were kept apart: read the events
    if not all(record.get(f"{p}_parts") for p in ("eager", "gc", "trainer")) and record["slices"]:
        return None  # made before the eager forward, garbage collection or trainer code was a part: read the events
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


def _text(value):
    """A JSON value as DuckDB reads it into a VARCHAR column."""
    return value if isinstance(value, str) or value is None else orjson.dumps(value).decode()


def _from_writer(paths, indices, records, views, module_depth, include_warmup, step_samples):
    """One :func:`scan` partial of the files ``paths[i]``, i in ``indices``, from the
    records the trace writer wrote (version 2), or None when one cannot answer. Their copied
    events are read as the events of the files are; op and graph groups, per-step op time
    and samples come from the record."""
    if any(step_samples and records[i]["samples"] is None for i in indices):
        return None
    if not all(records[i].get("gc") and records[i].get("trainer") for i in indices):
        return None  # written before the writer copied garbage collection and trainer slices: read the events
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
