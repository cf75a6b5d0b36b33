"""Merged: the partials of every file (:mod:`.partials`) added up, the stage between the per-file
partials and the views (see docs/design.rst, "Trace analysis").

Counts and sums add up exactly (durations as integer ns, so totals do not depend on the order of
addition); quantiles come from the merged sketches (:mod:`.sketch`), or are the exact ones of a
single whole scan. Each partial's rows keep their order, and the partials are put in input order,
so the result does not depend on the engine or the order the partials came in.
"""

import json
import operator

from . import ranks, runs, sketch, steps
from .kinds import SAMPLE_VIEWS
from .reader import TraceError


def merge(paths, partials, views, all_runs=False, step_samples=False):
    """The partials of disjoint sets of ``paths`` added up: a dict of the rows and statistics
    :func:`.views.document` builds the views from. Raises :class:`TraceError` when the files hold
    several runs, unless ``all_runs``."""
    whole = len(partials) == 1 and partials[0]["whole"]

    def rows(field, file=operator.itemgetter(0)):  # the partials' rows, in input order (each partial's own order kept)
        return steps.in_order((p[field] for p in partials), file)

    warnings = [w for p in partials for w in p["warnings"]]
    found = runs.find_runs(paths, [(f, first, last, json.loads(start) if start else None, *pid)
                                   for f, first, last, start, *pid in rows("runs")])
    if len(found) > 1 and not all_runs:
        raise TraceError(runs.mixed_message(found, paths))
    records, slices = rows("records", operator.itemgetter("file")), rows("slices")
    groups = {}
    for p in partials:
        for kind, view, key, *stats in p["groups"]:
            groups.setdefault((kind, view), {}).setdefault(key, Stats()).add(*stats)
    # the rank analysis of a whole scan is in its partial; else it reads every partial's rank rows
    spread = not whole and slices
    return {"whole": whole, "warnings": warnings, "runs": found, "records": records,
            "steps": steps.join(p["steps"] for p in partials), "groups": groups,
            "unparsed": sum(p["unparsed"] for p in partials),
            "evaluation": [d for p in partials for d in p["evaluation"]],
            "samples": _merge_samples(views, (p["samples"] for p in partials)) if step_samples else None,
            "kernels": _kernel_stats([p["kernels"] for p in partials]) if "kernel" in views else None,
            "ranks": partials[0].get("ranks") if whole else None,
            "rank_rows": ranks.join(p.get("rank_rows") for p in partials) if spread else None,
            "clocks": {i: args for p in partials for i, args in (p.get("clocks") or {}).items()} if spread else None}


class Stats:
    """One group's statistics, merged over partials: count, count and exact sum (ns) of the
    durations, min, max, the exact quantiles (a whole scan) or the sketch, a process name."""

    __slots__ = ("count", "timed", "ns", "quant", "sketch", "aname")

    def __init__(self):
        self.count = self.timed = self.ns = 0
        self.quant, self.sketch, self.aname = None, sketch.Sketch(), None

    def add(self, bucket, count, timed, ns, lo, hi, quant, aname):
        self.count += count
        self.timed += timed
        self.ns += ns or 0
        self.quant = quant or self.quant
        self.aname = self.aname or aname
        if timed and bucket is not None:
            self.sketch.add_bucket(bucket, timed, lo, hi)

    def row(self):
        """count, total, mean, p50, p99 (µs)."""
        total = self.ns / 1000
        p50, p99 = self.quant or (self.sketch.quantile(0.5), self.sketch.quantile(0.99))
        return self.count, total, total / self.timed if self.timed else None, p50, p99


def _kernel_stats(partials):
    """(kernel name -> :class:`Stats`, kernel name -> (kernel type, fused ops, exact quantiles or
    None)) from the kernel view's partials."""
    stats, info = {}, {}
    for p in partials:
        for name, (kind, fused, quant) in p["info"].items():
            old = info.get(name, (kind, "", None))
            ops = {o for o in (old[1] + ", " + fused).split(", ") if o}
            info[name] = (old[0] or kind, ", ".join(sorted(ops)), quant)
        for name, bucket, count, timed, ns, lo, hi in p["rows"]:
            stats.setdefault(name, Stats()).add(bucket, count, timed, ns, lo, hi, info[name][2], None)
    return stats, info


def _merge_samples(views, partials):
    """view -> key -> {step: op time in that step (µs)} from the :func:`.partials.scan` samples rows, keys
    and steps in order. Steps in which a key has no event are absent."""
    ns = {v: {} for v in views if v in SAMPLE_VIEWS}
    for rows in partials:
        for view, key, step, total in rows:
            cell = ns[view].setdefault(key, {})
            cell[step] = cell.get(step, 0) + total
    # sorted: the same order whatever the engine or the order the groups came in
    return {view: {key: {step: v / 1000 for step, v in sorted(keys[key].items())} for key in sorted(keys)}
            for view, keys in ns.items()}
