"""Where each training step's time goes, with warm-up steps apart.

Input: the step slices (cat ``step``, ``args.step = N``), the per-step sums
of the step-structure events (``data``, graph calls, ``backward``,
``optimizer``, all carrying ``args.step``) and the compile records. Pure
Python over rows already aggregated by DuckDB (one row per step and
category), so its cost does not grow with the number of events.

Per step: wall time (the step slice), data, forward (forward/inference graph
calls, and the eager forward: eager module slices and eager ops of phase
forward or inference, where no graph call, data or ``backward`` event holds
them), backward (``backward`` events; the backward graph calls when a trace
has no ``backward`` events), optimizer (``<Optimizer>.step`` and
``zero_grad``, and the optimizer-side work outside ``step()``: gradient clipping,
a scheduler's step, a model's ``zero_grad``), gc (garbage collection outside
those four: a collection during an op or a phase counts as that phase),
trainer (a trainer's loop code, ``trainer`` slices, outside those five), other
(wall time minus those six: loss, logging, Python between the phases,
untraced code) and coverage (share of the wall time in the six). Phases nest
and each millisecond counts once, in the innermost phase: the optimizer's time is its own, less the forward and backward of an
optimizer closure and the optimizer events nested in its slices (``parts``
rows of the kinds ``kinds.IN_OPTIMIZER``, and the eager forward inside
them); a graph call of phase
inference nested in an optimizer slice (a compiled optimizer step) is
optimizer time, not forward.

Recorded steps: outside the step windows (``DFTRACER_STEPS``) a step keeps its
slice but records nothing inside it. A step is *recorded* when a ``data``,
``backward`` or ``optimizer`` event or an op carries its number (in a process
where no step holds one, every step counts as recorded); only recorded steps enter the statistics,
and the document says how many there are.

Evaluation (``eval`` slices, whose events carry no step) is in no step.

Warm-up rule (:data:`WARMUP_RULE`), per process: a step is warm-up when a
compile event (Dynamo frame compile, recompile, backend compile, lazy
backward compile) ran in it, or when it comes before the first step in which
nothing compiled. A compile event belongs to the step slice of its process
that contains its start; outside every slice, to its ``args.step``.
"""

import itertools
import math
import operator
import statistics

from ..schema import STEP_PARTS as CATEGORIES
from . import compiles

WARMUP_RULE = ("warm-up steps: those in which something compiled (Dynamo compile, recompile, "
               "backend or lazy backward compile) and those before the first step without compilation")


KEYS = tuple(f"{c}_us" for c in ("wall", *CATEGORIES))  # the times of a step row
INSIDE = KEYS[1:-1]  # the parts inside a step's slice (all but other)


def quantile(values, q):
    """Linear interpolation between closest ranks (as DuckDB's quantile_cont)."""
    values = sorted(values)
    if not values:
        return None
    pos = (len(values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def series_stats(values):
    """min, p10, p25, median, p75, p90, max, mean of step times (µs); None when empty."""
    if not values:
        return None
    values = sorted(values)  # (once: quantile's sorts then find them in order)
    out = {"steps": len(values), "min_us": min(values), "max_us": max(values),
           "mean_us": statistics.fmean(values)}
    for name, q in (("p10_us", 0.1), ("p25_us", 0.25), ("median_us", 0.5), ("p75_us", 0.75), ("p90_us", 0.9)):
        out[name] = quantile(values, q)
    return out


def _compiled_steps(slices, records):
    """(file, pid) -> {step: set of compile kinds} for the compile records, each in the step
    whose slice holds it (:func:`.compiles.place`)."""
    out = {}
    for r in compiles.place([dict(r) for r in records], slices):
        if r["step"] is not None:
            out.setdefault((r["file"], r["pid"]), {}).setdefault(r["step"], set()).add(compiles.kind_of(r))
    return out


def _warmup(steps_of_proc, compiled):
    """step -> reason, for the warm-up steps of one process."""
    clean = [s for s in steps_of_proc if s not in compiled]
    first_clean = min(clean) if clean else float("inf")
    reasons = {}
    for s in steps_of_proc:
        if s in compiled:
            reasons[s] = "recompiled" if "recompile" in compiled[s] else "compiled"
        elif s < first_clean:
            reasons[s] = "before the first step without compilation"
    return reasons


def analyse(slices, parts, records, kind_names, include_warmup=False):
    """The step analysis. ``slices``: (file, pid, tid, step, ts, dur) of step
    slices; ``parts``: (file, pid, step, kind, is_backward_phase, total dur, count of events);
    ``records``: compile records (dicts with file, pid, ts, step, kind, name);
    ``kind_names``: kind -> "graph", "data", "backward", "optimizer", "ops", "gc", ..."""
    wall = {}
    for file, pid, _, step, _, dur in slices:
        key = (file, pid, step)
        wall[key] = max(wall.get(key, 0.0), dur or 0.0)
    sums, has_backward = {}, set()
    for file, pid, step, kind, backward_phase, total, count in parts:
        name = kind_names[kind]
        if name == "ops":
            got = sums.setdefault((file, pid, step), {})
            got["op_count"] = got.get("op_count", 0) + count
        if name in ("graph", "graph in optimizer"):
            name = name.replace("graph", "backward_graph" if backward_phase else "forward")
        elif name == "backward":
            has_backward.add((file, pid))
        got = sums.setdefault((file, pid, step), {})
        got[name] = got.get(name, 0.0) + total
    compiled = _compiled_steps(slices, records)
    steps_of = {}
    for f, p, s in sorted(wall):
        steps_of.setdefault((f, p), []).append(s)
    procs = list(steps_of)
    rows, warm_keys, series = [], [], []
    for proc, proc_steps in steps_of.items():
        reasons = _warmup(proc_steps, compiled.get(proc, {}))
        warm_keys += [(*proc, s) for s in reasons]
        # a graph call can start in a window and end in the next step: a graph alone is no record
        recorded = {s for s in proc_steps if set(sums.get((*proc, s), ())) - {"forward", "backward_graph", "op_count"}}
        for s in proc_steps:
            got = sums.get((*proc, s), {})
            backward = "backward" if proc in has_backward else "backward_graph"
            # each part's own time: what ran nested in an optimizer event is the closure's forward
            # and backward, or the optimizer's own (a compiled step's graph calls, zero_grad)
            nested = (got.get("forward in optimizer", 0.0) + got.get(f"{backward} in optimizer", 0.0)
                      + got.get("optimizer in optimizer", 0.0) + got.get("eager forward in optimizer", 0.0))
            eager = got.get("eager forward", 0.0) + got.get("eager forward in optimizer", 0.0)
            row = {"file": proc[0], "pid": proc[1], "step": s, "wall_us": wall[(*proc, s)],
                   "data_us": got.get("data", 0.0),
                   "forward_us": max(got.get("forward", 0.0) - got.get("inference in optimizer", 0.0), 0.0) + eager,
                   "backward_us": got.get(backward, 0.0),
                   "optimizer_us": max(got.get("optimizer", 0.0) - nested, 0.0), "gc_us": got.get("gc", 0.0),
                   "trainer_us": got.get("trainer", 0.0),
                   "ops_us": got.get("ops", 0.0),
                   "ops": got.get("op_count", 0),
                   "warmup": reasons.get(s), "recorded": s in recorded or not recorded}
            inside = sum([row[key] for key in INSIDE])
            row["other_us"] = max(row["wall_us"] - inside, 0.0)
            row["coverage"] = min(inside / row["wall_us"], 1.0) if row["wall_us"] else 0.0
            rows.append(row)
        series.append((proc, _series(rows[len(rows) - len(proc_steps):], include_warmup)))
    return {"processes": procs, "rows": rows, "series": series, "warmup_keys": warm_keys,
            "include_warmup": include_warmup}


def _series(rows, include_warmup):
    """The step-time statistics of one process's ``rows`` that count, and its median op time and
    count of op events per step."""
    own = [r for r in rows if counted(r, include_warmup)]
    stats = series_stats([r["wall_us"] for r in own]) or {"steps": 0}
    if own:
        stats["ops_median_us"] = quantile([r["ops_us"] for r in own], 0.5)
        stats["ops_median"] = quantile([r["ops"] for r in own], 0.5)
    return stats


def in_order(lists, key):
    """The items of ``lists`` sorted by ``key``, equal keys in list order (what a stable sort of
    their concatenation gives), moving each list's runs of equal keys as blocks: the lists
    are each in key order, or nearly."""
    blocks = sorted(((k, list(run)) for items in lists for k, run in itertools.groupby(items, key)),
                    key=operator.itemgetter(0))
    return [item for _, run in blocks for item in run]


def join(infos):
    """The :func:`analyse` of several sets of files from the analyses of each (its rules are per
    process, and a process's events are all in one file): processes, rows and warm-up steps in
    process order, as one analysis of all would give them."""
    infos = list(infos)
    if len(infos) == 1:
        return infos[0]
    return {"processes": in_order((info["processes"] for info in infos), tuple),
            "rows": in_order((info["rows"] for info in infos), operator.itemgetter("file", "pid")),
            "series": in_order((info["series"] for info in infos), operator.itemgetter(0)),
            "warmup_keys": in_order((info["warmup_keys"] for info in infos), operator.itemgetter(0, 1)),
            "include_warmup": infos[0]["include_warmup"]}


def _per_step(rows):
    """Rows of several processes merged per step number: the mean of each time."""
    out = []
    fields = operator.itemgetter(*KEYS, "coverage", "warmup", "recorded")
    for step, group in itertools.groupby(sorted(rows, key=operator.itemgetter("step")), operator.itemgetter("step")):
        *times, warmup, recorded = zip(*map(fields, group))
        merged = {"step": step, "processes": len(warmup)}
        # (statistics.fmean: math.fsum over the count)
        merged.update((key, math.fsum(values) / len(values)) for key, values in zip((*KEYS, "coverage"), times))
        merged["warmup"] = next((w for w in warmup if w), None)
        merged["recorded"] = any(recorded)
        out.append(merged)
    return out


def counted(row, include_warmup):
    """Whether a step row enters the statistics: recorded and (unless ``include_warmup``) not warm-up."""
    return row["recorded"] and (include_warmup or not row["warmup"])


def public(info, label):
    """The step analysis as the summary's ``steps`` document (JSON-ready).
    ``label((file, pid))`` names a process."""
    if not info["rows"]:
        return None
    per_step = _per_step(info["rows"])
    steady = [r for r in per_step if counted(r, info["include_warmup"])]
    stats = series_stats([r["wall_us"] for r in steady])
    if stats:
        stats.update({f"{c}_mean_us": statistics.fmean([r[f"{c}_us"] for r in steady]) for c in CATEGORIES})
        stats["coverage"] = statistics.fmean([r["coverage"] for r in steady])
    ranks = [{"process": label(proc), **stats} for proc, stats in info["series"]]
    timed = [r for r in ranks if r["steps"]]
    spread = None
    if len(timed) > 1:  # who waits for whom, the straggler: traces.ranks
        fast, slow = min(timed, key=lambda r: r["median_us"]), max(timed, key=lambda r: r["median_us"])
        spread = {"slowest": slow["process"], "fastest": fast["process"],
                  "spread_us": slow["median_us"] - fast["median_us"],
                  "spread": (slow["median_us"] - fast["median_us"]) / fast["median_us"] if fast["median_us"] else 0}
    return {
        "warmup_rule": WARMUP_RULE,
        "include_warmup": info["include_warmup"],
        "warmup_steps": [{"step": r["step"], "reason": r["warmup"]} for r in per_step if r["warmup"]],
        "recorded_steps": sum(r["recorded"] for r in per_step),
        "steady": stats,
        "rows": per_step,
        "ranks": ranks,
        "rank_spread": spread,
    }
