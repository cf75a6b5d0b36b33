"""Who waits for whom in a multi-rank run, from the per-rank trace files.

Input: what :func:`rows` reads of the summary's DuckDB table ``ev`` (step slices,
``comm`` events, data, graph calls, ``backward``, ``optimizer``; functional collectives inside
compiled graphs are ``comm`` events, and in traces of earlier versions op
events named ``function._c10d_functional.*``, which count as communication too)
and the compile records.

Clocks: where every rank's trace holds its clock offset to rank 0, measured
when the process group was set up (:mod:`.clock`), those offsets align the
ranks. Otherwise the ranks' clocks are aligned on the collectives themselves. Every
member of a collective finishes it at (nearly) the same instant, when the last
one has arrived and the data has moved, so each process's offset is the median
difference between its collective ends and those of the lowest rank
(``clock_offset_us``). Ranks on one host share a clock to within that.

A collective is matched across ranks by (process group, op, step, its ordinal
among the same op and group in that step). The **wait** of rank r in a
collective is ``min(latest arrival - arrival of r, its duration)``: the time it
sat in the collective before the last peer arrived. The last rank to arrive
is the one waited for: it is charged the median wait of the others (one
other rank that happens to be late itself does not hide the cost). Per rank and
steady step, the wall time is split (each instant counted once, in this order)
into wait, communication (the rest of the collectives' time), data, compute
(graph calls, ``backward``, optimizer) and other.

The first step of the run and warm-up steps are left out. The **straggler** is the rank charged
the most wait per step (median over the steady steps: a step where the wait fell in an
operation that is no event, such as DDP's bucket rebuild at its second iteration, does not
count), named only when that is above the threshold: three times the
run's own step-to-step noise (1.4826 × the median absolute deviation of the
step times, median over the ranks), and at least 5 % of the median step.
"""

import bisect
import json
import statistics

import numpy as np

from ..schema import ARG_CUDA_PEAK, ARG_GROUP, ARG_PEAK_RSS
from . import clock, compiles
from .reader import rank_of
from .steps import quantile

FUNCTIONAL = "function._c10d_functional."  # op events of functional collectives (events.comm)
PARTS = ("wait", "comm", "data", "compute", "other")  # in the order an instant is counted
PART_KEYS = tuple(f"{c}_us" for c in PARTS)  # the rows' fields
NOISE_FACTOR, MIN_SHARE = 3.0, 0.05


def _label(paths, file, pid, rank):
    return f"rank{rank}" if rank is not None else f"{paths[file].rsplit('/', 1)[-1].split('.')[0]} [pid {pid}]"


def _split(lo, hi, row, layer, start, end, layers):
    """Per row r, the time of [lo[r], hi[r]] in each of ``layers`` layers (the intervals
    [start, end) of that row and layer), an instant counted in the first layer that holds
    it; the rest is the last column. The pieces between a row's consecutive distinct
    boundaries (lo, hi and the interval ends between them) go, in time order, to the first
    layer holding their midpoint: the same sums as adding them one by one, for all rows in a
    few array passes instead of a set of points per row and step."""
    n = len(lo)
    ends_row, ends = np.concatenate([row, row]), np.concatenate([start, end])
    inside = (lo[ends_row] < ends) & (ends < hi[ends_row])
    prow = np.concatenate([np.arange(n), np.arange(n), ends_row[inside]])
    pval = np.concatenate([lo, hi, ends[inside]])
    order = np.lexsort((pval, prow))
    prow, pval = prow[order], pval[order]
    distinct = np.ones(len(prow), bool)
    distinct[1:] = (prow[1:] != prow[:-1]) | (pval[1:] != pval[:-1])
    prow, pval = prow[distinct], pval[distinct]
    piece = np.flatnonzero(prow[1:] == prow[:-1])  # piece k: pval[k] to pval[k + 1]
    a, b, prow = pval[piece], pval[piece + 1], prow[piece]
    mid = (a + b) / 2
    # layers holding each midpoint: +1 at an interval's start, -1 at its end, summed in time
    # order (at equal times the ends before the midpoint); empty intervals hold nothing
    real = end > start
    m = int(real.sum())
    at_row = np.concatenate([row[real], row[real], prow])
    at = np.concatenate([start[real], end[real], mid])
    is_mid = np.concatenate([np.zeros(2 * m, bool), np.ones(len(mid), bool)])
    order = np.lexsort((is_mid, at, at_row))
    mids = np.flatnonzero(is_mid[order])
    which = np.full(len(mid), layers)
    for i in reversed(range(layers)):
        step = np.zeros(len(at), np.int64)
        own = layer[real] == i
        step[:m][own], step[m:2 * m][own] = 1, -1
        held = np.cumsum(step[order])[mids] > 0
        which[order[mids[held]] - 2 * m] = i
    return np.bincount(prow * (layers + 1) + which, weights=b - a,
                       minlength=n * (layers + 1)).reshape(n, layers + 1)


def rows(con, kinds):
    """What :func:`analyse` reads of the summary's table ``ev`` (``kinds``: as there): the step
    slices and the collectives (row tuples by process and time), the spans (data, graph calls,
    ``backward``, optimizer: NumPy columns file, pid, step, kind, ts, dur). Small enough to send
    from a worker: one slice per step, the spans as arrays."""
    k = kinds
    slices = con.execute(f"SELECT file, pid, step, ts, dur, extra FROM ev WHERE kind = {k['step']} "
                         "AND step IS NOT NULL ORDER BY file, pid, ts").fetchall()
    comm = con.execute(f"""SELECT file, pid, step, name, ts, dur, extra FROM ev
        WHERE step IS NOT NULL AND (kind = {k['comm']} OR (kind = {k['op']} AND starts_with(name, '{FUNCTIONAL}')))
        ORDER BY file, pid, ts""").fetchall()
    spans = con.execute(f"""SELECT file, pid, step, kind, ts, coalesce(dur, 0) AS dur FROM ev
        WHERE step IS NOT NULL AND ts IS NOT NULL
        AND kind IN ({k['data']}, {k['graph']}, {k['backward']}, {k['optimizer']})""").fetchnumpy()
    return {"slices": slices, "comm": comm, "spans": {c: np.asarray(v) for c, v in spans.items()}}


def join(parts):
    """The :func:`rows` of disjoint sets of files as the rows of all of them."""
    parts = [p for p in parts if p is not None]
    if len(parts) < 2:
        return parts[0] if parts else {"slices": [], "comm": [], "spans": {}}

    def by_time(field, at):  # as ORDER BY file, pid, ts (NULLS LAST) would give them
        return sorted((r for p in parts for r in p[field]), key=lambda r: (r[0], r[1], r[at] is None, r[at] or 0))
    return {"slices": by_time("slices", 3), "comm": by_time("comm", 4),
            "spans": {c: np.concatenate([p["spans"][c] for p in parts]) for c in parts[0]["spans"]}}


def analyse(rank_rows, paths, kinds, records, step_info, clocks=None):
    """The rank document (JSON-ready), or None with fewer than two processes with steps.
    ``rank_rows``: what :func:`rows` reads; ``kinds``: the summary's kind numbers by name (step,
    comm, op, data, graph, backward, optimizer); ``clocks``: the clock records known without
    reading the files (see :func:`.clock.offsets_us`)."""
    k = kinds
    slices, comm, spans = rank_rows["slices"], rank_rows["comm"], rank_rows["spans"]
    procs = sorted({(f, p) for f, p, *_ in slices})
    if len(procs) < 2:
        return None
    rank = {(f, p): rank_of(paths[f]) for f, p in procs}
    label = {key: _label(paths, *key, rank[key]) for key in procs}
    warm = {tuple(w) for w in step_info["warmup_keys"]}

    step_of, memory = {}, {}  # (file, pid) -> step -> (ts, end, memory args); extra -> memory args
    for f, p, s, ts, dur, extra in slices:
        if extra not in memory:
            memory[extra] = _memory_args(extra)
        step_of.setdefault((f, p), {})[s] = (ts, ts + (dur or 0), memory[extra])
    starts = {q: sorted((v[0], s) for s, v in steps.items()) for q, steps in step_of.items()}

    def step_at(q, ts, step):
        """The step slice of process q that holds the instant ts (else the event's step)."""
        i = bisect.bisect_right(starts[q], (ts, float("inf"))) - 1
        if i >= 0:
            s = starts[q][i][1]
            if ts < step_of[q][s][1]:
                return s
        return step

    comm = [(f, p, step_at((f, p), ts, s), *rest, ts, dur, extra) for f, p, s, *rest, ts, dur, extra in comm
            if (f, p) in step_of]
    span_proc, span_step = _steps_at(procs, step_of, starts, spans)
    # collectives matched across ranks
    matched, seen = {}, {}
    for f, p, s, name, ts, dur, extra in comm:
        group = (json.loads(extra) if extra else {}).get(ARG_GROUP) or "graph"
        n = seen[(f, p, s, group, name)] = seen.get((f, p, s, group, name), -1) + 1
        matched.setdefault((group, name, s, n), {})[(f, p)] = (ts, ts + (dur or 0))
    measured = clock.offsets_us(paths, clocks)
    if all(f in measured for f, _ in procs):
        offsets, how = {q: measured[q[0]][0] for q in procs}, "measured offsets to rank 0 (process-group setup)"
    else:
        offsets, how = _offsets(procs, matched), "aligned on collective completions"
    common = set.intersection(*(set(step_of[q]) for q in procs))
    # the first step holds the job's start-up (process group, first collectives): never steady
    warm_steps = {s for f, p, s in warm if (f, p) in step_of}
    steady = sorted(s for s in common if s not in warm_steps and s != min(common))

    wait_iv, blame = {}, {}  # (proc, step) -> wait intervals; (proc, step) -> wait charged
    for (group, name, s, n), members in matched.items():
        if len(members) < 2:
            continue
        arrive = {q: members[q][0] - offsets[q] for q in members}
        last_q = max(arrive, key=arrive.get)
        waits = {q: min(arrive[last_q] - arrive[q], members[q][1] - members[q][0]) for q in members}
        for q, w in waits.items():
            wait_iv.setdefault((q, s), []).append((arrive[q], arrive[q] + w))
        others = [w for q, w in waits.items() if q != last_q]
        blame[(last_q, s)] = blame.get((last_q, s), 0.0) + statistics.median(others)

    # the rows: every process's steady steps, process after process; their intervals by layer (PARTS)
    proc_at, steady_of = {q: i for i, q in enumerate(procs)}, {s: j for j, s in enumerate(steady)}
    ivs = [(proc_at[q] * len(steady) + steady_of[s], 0, a, b)
           for (q, s), ivs in wait_iv.items() if s in steady_of for a, b in ivs]
    ivs += [(proc_at[(f, p)] * len(steady) + steady_of[s], 1, ts - offsets[(f, p)], ts + (dur or 0) - offsets[(f, p)])
            for f, p, s, name, ts, dur, extra in comm if s in steady_of]
    row, layer, start, end = (np.array(c, dtype) for c, dtype in
                              zip(zip(*ivs) if ivs else ([],) * 4, (np.int64, np.int64, float, float)))
    steady_at = np.searchsorted(steady, span_step)
    keep = steady_at < len(steady)
    keep[keep] = np.asarray(steady)[steady_at[keep]] == span_step[keep]
    shift = np.array([offsets[q] for q in procs])[span_proc[keep]]
    row = np.concatenate([row, span_proc[keep] * len(steady) + steady_at[keep]])
    layer = np.concatenate([layer, np.where(spans["kind"][keep] == k["data"], 2, 3)])
    start = np.concatenate([start, spans["ts"][keep] - shift])
    end = np.concatenate([end, (spans["ts"][keep] + spans["dur"][keep]) - shift])
    bounds = [(step_of[q][s][0] - offsets[q], step_of[q][s][1] - offsets[q]) for q in procs for s in steady]
    split = _split(np.array([b[0] for b in bounds], float), np.array([b[1] for b in bounds], float),
                   row, layer, start, end, len(PARTS) - 1).tolist() if bounds else []

    rows, per_rank = [], []
    for i, q in enumerate(procs):
        own = []
        for j, s in enumerate(steady):
            lo, hi = bounds[i * len(steady) + j]
            row = {"rank": label[q], "step": s, "wall_us": hi - lo, "end_us": hi,
                   **dict(zip(PART_KEYS, split[i * len(steady) + j])),
                   "wait_caused_us": blame.get((q, s), 0.0)}
            own.append(row)
        rows += own
        entry = {"rank": label[q], "steps": len(own), "clock_offset_us": offsets[q]}
        if own:
            entry.update({key: statistics.fmean([r[key] for r in own]) for key in ("wall_us", *PART_KEYS)})
            entry["wait_caused_us"] = statistics.fmean([r["wait_caused_us"] for r in own])
            entry["wait_caused_median_us"] = quantile([r["wait_caused_us"] for r in own], 0.5)
        peaks = [x[2].get(ARG_PEAK_RSS) for x in step_of[q].values() if x[2].get(ARG_PEAK_RSS) is not None]
        if peaks:
            entry["peak_rss_max"] = max(peaks)
            entry["peak_rss_median"] = quantile(peaks, 0.5)
        per_rank.append(entry)
    return {"ranks": per_rank, "rows": rows, "clock": how,
            **_straggler(per_rank, rows), "skew": _skew(rows, steady),
            "memory": _memory(procs, label, step_of), "divergence": _divergence(procs, label, records),
            "collectives": sum(1 for m in matched.values() if len(m) > 1)}


def _steps_at(procs, step_of, starts, events):
    """(index in ``procs`` of each of the ``events``' process, -1 for a process without step
    slices; the step of each event: that of its process's step slice holding its ``ts``, else
    its own). ``events``: columns file, pid, step, ts."""
    n = len(events["ts"])
    proc, step = np.full(n, -1), np.asarray(events["step"], np.int64).copy()
    if not n:
        return proc, step
    pids, pid_at = np.unique(events["pid"], return_inverse=True)
    pairs, pair_at = np.unique(np.asarray(events["file"], np.int64) * len(pids) + pid_at.reshape(-1),
                               return_inverse=True)
    index = {q: i for i, q in enumerate(procs)}
    proc = np.array([index.get((int(k // len(pids)), int(pids[k % len(pids)])), -1) for k in pairs])[pair_at.reshape(-1)]
    ts = np.asarray(events["ts"], float)
    # every process's slices by start (then step), one process after the other
    at, slice_step, ends = (np.array(c, dtype) for c, dtype in zip(
        zip(*[(t, s, step_of[q][s][1]) for q in procs for t, s in starts[q]]), (float, np.int64, float)))
    first = np.cumsum([0] + [len(starts[q]) for q in procs])
    by_proc = np.argsort(proc, kind="stable")
    cuts = np.searchsorted(proc[by_proc], np.arange(-1, len(procs) + 1))
    for i in range(len(procs)):
        own = by_proc[cuts[i + 1]:cuts[i + 2]]
        if not len(own):
            continue
        lo = first[i]
        j = np.searchsorted(at[lo:first[i + 1]], ts[own], side="right") - 1  # the last slice starting by ts
        inside = j >= 0
        inside[inside] = ts[own][inside] < ends[lo + j[inside]]
        step[own[inside]] = slice_step[lo + j[inside]]
    return proc, step


def _memory_args(extra):
    """The memory args of a step slice as numbers (the table holds them as text)."""
    out = {}
    for key, value in (json.loads(extra) if extra else {}).items():
        if key in (ARG_PEAK_RSS, ARG_CUDA_PEAK) and value is not None:
            try:
                out[key] = int(float(value))
            except ValueError:
                pass
    return out


def _offsets(procs, matched):
    """(file, pid) -> clock offset (µs) from the lowest process, from the collectives' ends."""
    ref = procs[0]
    diffs = {q: [] for q in procs}
    for members in matched.values():
        if ref in members:
            for q, (_, end) in members.items():
                diffs[q].append(end - members[ref][1])
    return {q: statistics.median(d) if d else 0.0 for q, d in diffs.items()}


def _mad_sigma(values):
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - med) for v in values)


def _straggler(per_rank, rows):
    """The straggler (or None), the threshold and the noise it comes from."""
    timed = [r for r in per_rank if r["steps"]]
    if not timed:
        return {"straggler": None, "threshold_us": None, "noise_us": None}
    walls = {}
    for x in rows:
        walls.setdefault(x["rank"], []).append(x["wall_us"])
    noise = statistics.median(_mad_sigma(walls.get(r["rank"], [])) for r in timed)
    median_step = statistics.median(x["wall_us"] for x in rows)
    threshold = max(NOISE_FACTOR * noise, MIN_SHARE * median_step)
    top = max(timed, key=lambda r: r["wait_caused_median_us"])
    straggler = None
    if top["wait_caused_median_us"] > threshold:
        straggler = {"rank": top["rank"], "wait_caused_us": top["wait_caused_us"],
                     "wait_caused_median_us": top["wait_caused_median_us"], "steps": top["steps"]}
    return {"straggler": straggler, "threshold_us": threshold, "noise_us": noise}


def _skew(rows, steady):
    """Step-end skew across ranks (max - min of the aligned step ends), per steady step."""
    ends = {}
    for r in rows:
        ends.setdefault(r["step"], []).append(r["end_us"])
    per_step = [{"step": s, "skew_us": max(ends[s]) - min(ends[s])} for s in steady]
    values = [x["skew_us"] for x in per_step]
    return {"median_us": quantile(values, 0.5), "max_us": max(values) if values else None, "steps": per_step}


def _memory(procs, label, step_of):
    """Peak resident memory (and CUDA max allocated) per step, each rank's and the largest."""
    steps = sorted({s for q in procs for s in step_of[q]})
    out = []
    for s in steps:
        by_rank = {label[q]: step_of[q][s][2].get(ARG_PEAK_RSS) for q in procs if s in step_of[q]}
        by_rank = {r: v for r, v in by_rank.items() if v is not None}
        if not by_rank:
            continue
        row = {"step": s, "peak_rss_max": max(by_rank.values()), "peak_rss": by_rank}
        cuda = [step_of[q][s][2].get(ARG_CUDA_PEAK) for q in procs if s in step_of[q]]
        if any(c is not None for c in cuda):
            row["cuda_max_allocated_max"] = max(c for c in cuda if c is not None)
        out.append(row)
    return out


def _divergence(procs, label, records):
    """Ranks that compiled a different number of graphs, or recompiled in different steps."""
    per, of_proc = {}, {}
    for r in records:
        of_proc.setdefault((r["file"], r["pid"]), []).append(r)
    for q in procs:
        own = of_proc.get(q, [])
        rep = compiles.report(own, lambda r: label[q])
        steps = sorted({r["step"] for r in own if compiles.kind_of(r) == "recompile" and r["step"] is not None})
        per[label[q]] = {"graphs_compiled": rep["graphs_compiled"], "recompile_steps": steps}
    kinds = {(v["graphs_compiled"], tuple(v["recompile_steps"])) for v in per.values()}
    if len(kinds) < 2:
        return None
    return per

