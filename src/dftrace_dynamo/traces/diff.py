"""Steady-state comparison of two runs (``dftrace-dynamo diff BASE NEW``).

Each side is summarised (:func:`.summary.summarize`, warm-up steps left out),
both at the same time in two threads.

Every row (the step time, each part of a step, each op, module and phase) is
judged against its **own** step-to-step variation: its samples are its time
in each steady-state step (per process: a step's time summed over the row's
events, divided by the processes that ran the step), on both sides. The test
is Mann-Whitney U with the Hodges-Lehmann shift: the change is the median of
all differences between a NEW step's and a BASE step's time, with the
distribution-free confidence interval made of two order statistics of those
differences (Hollander & Wolfe, normal approximation of the critical value).
The intervals are Bonferroni-corrected, so that :data:`CONFIDENCE` holds for
the whole comparison, every row at once.

Samples from one run cannot see what differs from run to run: where the
allocator placed the buffers, which core's caches a process got, the
tracer's own time inside each event. The same program run twice moves a row
by a few percent this way, and the interval of a row that hardly varies from
step to step is narrow enough to exclude zero. So a row changed *beyond
noise* only when its interval lies entirely outside its *floor*, ±(the
larger of ``margin`` % (default :data:`MARGIN`) of its BASE median time per
step and :data:`RESOLUTION_US` per event per step).

The verdict and the exit status follow one rule (:func:`_verdict`): with
``fail_above`` PCT, the comparison fails when some row grew beyond noise and
its whole interval lies above +PCT % of the row's BASE median time per step
(it grew by more than PCT % with that confidence). Without step slices on both
sides there are no samples: totals per trace are compared as raw deltas and
nothing is judged.
"""

import statistics
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .reader import TraceError
from .steps import CATEGORIES, counted
from .kinds import SAMPLE_VIEWS
from .summary import summarize

VIEWS = SAMPLE_VIEWS
CONFIDENCE = 0.95  # for all rows of a comparison together
MARGIN = 5.0  # run-to-run variation of a row, in percent of its BASE median time per step
RESOLUTION_US = 0.1  # the timing's resolution per event: the tracer's own time in it varies by this much
RULE = ("fails when some row grew beyond noise (its {:.0%} interval above its floor) and its whole interval lies "
        "above +PCT % of that row's BASE median time per step".format(CONFIDENCE))


def _side(paths, include_warmup, progress, engine, source):
    result = summarize(paths, VIEWS, top=None, progress=progress, include_warmup=include_warmup, step_samples=True,
                       engine=engine, source=source)
    if not result["op_events"] and not result["steps"]:
        raise TraceError(f"no op events and no steps in {', '.join(paths[:3])}")
    return result


def _kth_differences(x, y, ks, tol=1e-6):
    """The ``ks``-th smallest (1-based) of the differences ``y[j] - x[i]``, x and y sorted,
    without forming all of them: bisection on the value (counting the differences below
    it with one binary search per element of x) down to ``tol`` µs, below the traces'
    ns resolution; then the largest actual difference not above the bound found."""
    ks = np.asarray(ks, dtype=np.int64)
    lo = np.full(len(ks), y[0] - x[-1] - 1.0)  # count(lo) < k <= count(hi)
    hi = np.full(len(ks), y[-1] - x[0])
    while True:
        mid = (lo + hi) / 2
        # down to tol, or to the doubles' own spacing where the values are too large for it
        active = (hi - lo > tol) & (mid > lo) & (mid < hi)
        if not active.any():
            break
        counts = np.searchsorted(y, (x[None, :] + mid[:, None]).ravel(), "right").reshape(len(ks), -1).sum(1)
        below = counts < ks
        lo, hi = np.where(active & below, mid, lo), np.where(active & ~below, mid, hi)
    idx = np.searchsorted(y, x[None, :] + (hi[:, None] + tol / 2), "right") - 1  # tol/2: rounding of x + hi
    return np.where(idx >= 0, y[np.maximum(idx, 0)] - x[None, :], -np.inf).max(1)


def shift_test(base, new, z):
    """Mann-Whitney U test of two samples with the Hodges-Lehmann shift and its
    interval; ``z``: the normal quantile of the interval. Returns shift_us,
    interval_us ([low, high], or None with too few samples for that confidence),
    p_value (two-sided, normal approximation, tie-corrected) and prob_new_greater
    (U / nm: the chance that a NEW step's time exceeds a BASE step's, ties half)."""
    x, y = np.sort(np.asarray(base, float)), np.sort(np.asarray(new, float))
    n, m = len(x), len(y)
    _, inverse, ties = np.unique(np.concatenate([x, y]), return_inverse=True, return_counts=True)
    ranks = (np.cumsum(ties) - (ties - 1) / 2)[inverse]
    u = ranks[n:].sum() - m * (m + 1) / 2
    total = n + m
    var = n * m / 12 * (total + 1 - (ties ** 3 - ties).sum() / (total * (total - 1)))
    p = 1.0 if var <= 0 else min(1.0, 2 * (1 - statistics.NormalDist().cdf(max(abs(u - n * m / 2) - 0.5, 0)
                                                                            / var ** 0.5)))
    c = int(np.floor(n * m / 2 - z * (n * m * (total + 1) / 12) ** 0.5))
    half = (n * m + 1) // 2
    ks = [half, n * m + 1 - half] + ([c, n * m + 1 - c] if c >= 1 else [])
    got = _kth_differences(x, y, ks)
    return {"shift_us": float(got[:2].mean()), "interval_us": [float(got[2]), float(got[3])] if c >= 1 else None,
            "p_value": p, "prob_new_greater": float(u / (n * m))}


def _steady(side, include_warmup):
    """The step-analysis rows (one per step number) of the steps one side's statistics count."""
    return [r for r in side["steps"]["rows"] if counted(r, include_warmup)]


def _sides(base, new, include_warmup):
    """(view, key) -> [BASE, NEW] for every row with time in some step, each side a dict
    with count_per_step and mean_us (per call; None for the step rows), samples (the row's
    time in each steady step, 0 where it has none) and their mean, us_per_step; None for
    a side without the row."""
    out = {}
    for i, side in enumerate((base, new)):
        steady = _steady(side, include_warmup)
        procs = sum(r["processes"] for r in steady)  # count per step: per step and process
        found = {("step", "time"): (None, None, [r["wall_us"] for r in steady])}
        found.update({("step", part): (None, None, [r[f"{part}_us"] for r in steady]) for part in CATEGORIES})
        for view, keys in side["step_samples"].items():
            stats = {r["key"]: r for r in side["views"][view]}
            for key, by_step in keys.items():
                got = stats.get(key)
                found[(view, key)] = (got and got["count"] / procs, got and got["mean_us"],
                                      [by_step.get(r["step"], 0.0) / r["processes"] for r in steady])
        for key, (count, mean, samples) in found.items():
            out.setdefault(key, [None, None])[i] = {"count_per_step": count, "mean_us": mean, "samples": samples,
                                                    "us_per_step": statistics.fmean(samples)}
    return {key: got for key, got in out.items()
            if any(sum(s["samples"]) for s in got if s is not None) or key == ("step", "time")}


def _row(view, key, b, n):
    """A row of the comparison from its two sides (dicts with count_per_step, mean_us
    and us_per_step, or None where the row is missing)."""
    row = {"view": view, "key": key}
    for side, got in (("base", b), ("new", n)):
        row[f"{side}_count_per_step"] = got["count_per_step"] if got else 0.0
        row[f"{side}_us_per_step"] = got["us_per_step"] if got else 0.0
        row[f"{side}_mean_us"] = got["mean_us"] if got else None
    row["change_us"] = row["new_us_per_step"] - row["base_us_per_step"]
    row["change"] = row["change_us"] / row["base_us_per_step"] if row["base_us_per_step"] else None
    row["only_in"] = "base" if n is None else "new" if b is None else None
    row.update(base_median_us=None, new_median_us=None, interval_us=None, interval=None, samples=None,
               p_value=None, prob_new_greater=None, floor_us=None, within_noise=None)
    return row


def _per_trace_rows(base, new):
    """Rows of totals per trace (no step slices on both sides): raw deltas, nothing judged."""
    rows = []
    for view in VIEWS:
        b, n = ({r["key"]: dict(r, count_per_step=r["count"], us_per_step=r["total_us"]) for r in side["views"][view]}
                for side in (base, new))
        rows += [_row(view, key, b.get(key), n.get(key)) for key in dict.fromkeys([*b, *n])]
    return rows


def _per_step_rows(base, new, include_warmup, margin):
    """Rows judged on their per-step samples and floor (see the module docstring); also
    the normal quantile of each row's interval."""
    sides = _sides(base, new, include_warmup)
    steps = [len(_steady(side, include_warmup)) for side in (base, new)]
    z = statistics.NormalDist().inv_cdf(1 - (1 - CONFIDENCE) / len(sides) / 2)
    rows = []
    for (view, key), got in sides.items():
        row = _row(view, key, *got)
        if view == "step":
            row["base_count_per_step"] = row["new_count_per_step"] = None
        b_samples, n_samples = (s["samples"] if s else [0.0] * count for s, count in zip(got, steps))
        test = shift_test(b_samples, n_samples, z)
        # percent of the BASE median: the shift is one of medians, and one descheduled
        # step (tens of ms) would inflate a mean
        base_us = statistics.median(b_samples)
        lo, hi = test["interval_us"] or (float("-inf"), float("inf"))
        events = max(row["base_count_per_step"] or 0.0, row["new_count_per_step"] or 0.0)
        floor = max(margin / 100 * base_us, RESOLUTION_US * events)
        row.update(base_median_us=base_us, new_median_us=statistics.median(n_samples), change_us=test["shift_us"],
                   change=test["shift_us"] / base_us if base_us else None, interval_us=test["interval_us"],
                   interval=[lo / base_us, hi / base_us] if test["interval_us"] and base_us else None,
                   samples=[len(b_samples), len(n_samples)], p_value=test["p_value"],
                   prob_new_greater=test["prob_new_greater"], floor_us=floor,
                   within_noise=lo <= floor and -floor <= hi)
        rows.append(row)
    return rows, z


def _grew_above(row, pct):
    """Whether the row's whole interval lies above +pct % of its BASE median time per
    step (a row whose BASE median is zero: above zero)."""
    if not row["interval_us"] or row["interval_us"][0] <= 0:
        return False
    return row["interval"] is None or row["interval"][0] * 100 > pct


def _name(row):
    return f"{row['view']} {row['key']}"


def _change_text(row):
    if row["change"] is None:
        return f"{row['change_us'] / 1e3:+,.3f} ms/step (BASE median 0)"
    low, high = (f"{100 * v:+.1f}%" for v in row["interval"])
    return f"{100 * row['change']:+.1f}% [{low}, {high}]"


def _listed(rows):
    """The first five rows with their change, for the verdict."""
    return "; ".join(f"{_name(r)} {_change_text(r)}" for r in rows[:5]) + (
        f" and {len(rows) - 5} more" if len(rows) > 5 else "")


def _verdict(rows, per_step, fail_above, steps):
    """The headline: ``fail`` (the exit status is 1 exactly when it is true), ``text``,
    ``rows`` (the names of the rows that failed the rule, biggest change first)."""
    if not per_step:
        return {"fail": False, "rows": [], "text": "not judged: no step slices on both sides, so no per-step "
                                                   "samples; the changes are raw differences of totals"}
    moved = sorted((r for r in rows if r["within_noise"] is False), key=lambda r: -abs(r["change_us"]))
    grew = [r for r in moved if r["change_us"] > 0]
    failed = [r for r in grew if fail_above is not None and _grew_above(r, fail_above)]
    tested = f"{len(rows)} rows over {steps[0]} and {steps[1]} steady steps, {CONFIDENCE:.0%} confidence"
    if failed:
        text = f"FAIL: grew by more than --fail-above {fail_above:g}%: {_listed(failed)} ({tested})"
    elif moved:
        text = f"changed beyond noise: {_listed(moved)} ({tested})"
        if fail_above is not None:
            text = f"PASS: no row grew by more than --fail-above {fail_above:g}%; " + text
    else:
        text = f"no row changed beyond noise ({tested})"
        if fail_above is not None:
            text = "PASS: " + text
    return {"fail": bool(failed), "rows": [_name(r) for r in failed], "text": text}


def diff(base_paths, new_paths, top=10, include_warmup=False, progress=None, fail_above=None, engine=None,
         source="auto", margin=MARGIN):
    """The comparison as a dict (the ``--format json`` document); ``margin``: the floor's
    percent of a row's BASE median (see the module docstring); ``engine``, ``source``: see
    :func:`.summary.summarize` (``scan``: what each side read)."""
    for name, value in (("--fail-above", fail_above), ("--margin", margin)):
        if value is not None and not 0 <= value < float("inf"):
            raise TraceError(f"{name} must be a percentage of at least 0, not {value!r}")
    # both sides at once: DuckDB runs without the GIL, so one side's Python work (cutting the
    # files into pieces, the step analysis) overlaps the other's scan
    with ThreadPoolExecutor(2) as pool:
        sides = [pool.submit(_side, paths, include_warmup, progress, engine, source)
                 for paths in (base_paths, new_paths)]
        base, new = (side.result() for side in sides)
    b_st, n_st = ((side["steps"] or {}).get("steady") for side in (base, new))
    per_step = bool(b_st and n_st)
    if fail_above is not None and not per_step:
        raise TraceError("--fail-above needs step slices in both runs (per-step samples to judge a change "
                         "against); one of them has none")
    step, z, steps = None, None, None
    if per_step:
        rows, z = _per_step_rows(base, new, include_warmup, margin)
        step = dict(next(r for r in rows if (r["view"], r["key"]) == ("step", "time")), base=b_st, new=n_st)
        steps = [b_st["steps"], n_st["steps"]]
    else:
        rows = _per_trace_rows(base, new)
    both = [r for r in rows if r["only_in"] is None and r["within_noise"] is not True]
    judged = [r for r in rows if r["within_noise"] is not None]
    return {
        "base": base_paths,
        "new": new_paths,
        "per": "step" if per_step else "trace",
        "method": {
            "test": "Mann-Whitney U; change: Hodges-Lehmann shift (median of the differences NEW step - "
                    "BASE step) with its distribution-free interval, Bonferroni-corrected; beyond noise: the "
                    "interval clears the row's floor, max(margin % of BASE median, resolution_us x events per step)",
            "confidence": CONFIDENCE, "rows": len(judged), "row_confidence": 1 - (1 - CONFIDENCE) / len(judged)
            if judged else None, "z": z, "steps": steps, "margin": margin, "resolution_us": RESOLUTION_US,
            "fail_above": fail_above, "rule": RULE},
        "verdict": _verdict(judged, per_step, fail_above, steps),
        "step_time": step,
        "up": sorted((r for r in both if r["change_us"] > 0), key=lambda r: -r["change_us"])[:top],
        "down": sorted((r for r in both if r["change_us"] < 0), key=lambda r: r["change_us"])[:top],
        "within_noise": sum(r["within_noise"] is True for r in rows),
        "only_base": sorted((r for r in rows if r["only_in"] == "base"), key=lambda r: -r["base_us_per_step"]),
        "only_new": sorted((r for r in rows if r["only_in"] == "new"), key=lambda r: -r["new_us_per_step"]),
        "rows": rows,
        "warnings": base["warnings"] + new["warnings"],
        "scan": {"base": base["scan"], "new": new["scan"]},
    }
