"""Steady-state comparison of two runs (``dftrace-dynamo diff BASE NEW``).

Each side is summarised (:func:`.summary.summarize`, warm-up steps left out),
both at the same time in two threads.
Times are compared **per step**: an op's total time divided by the side's
number of steady-state steps, so runs of different lengths compare. Without
step slices on both sides, totals are compared per trace instead.

Noise: the step-to-step spread of the step time, the larger interquartile
range (p75 - p25) of the two sides. A change of the median step time, or of
an op's / module's / phase's time per step, not larger than that is marked
*within noise*: steps of one run already differ by as much.
"""

from concurrent.futures import ThreadPoolExecutor

from .reader import TraceError
from .steps import CATEGORIES
from .summary import summarize

VIEWS = ("op", "module", "phase")


def _side(paths, include_warmup, progress):
    result = summarize(paths, VIEWS, top=None, progress=progress, include_warmup=include_warmup)
    if not result["op_events"] and not result["steps"]:
        raise TraceError(f"no op events and no steps in {', '.join(paths[:3])}")
    return result


def _changes(base, new, n_base, n_new, noise):
    """Rows per (view, key) present on either side, with per-step times and the change."""
    rows = []
    for view in VIEWS:
        b = {r["key"]: r for r in base["views"][view]}
        n = {r["key"]: r for r in new["views"][view]}
        for key in dict.fromkeys([*b, *n]):
            row = {"view": view, "key": key}
            for side, got, steps in (("base", b.get(key), n_base), ("new", n.get(key), n_new)):
                row[f"{side}_count_per_step"] = got["count"] / steps if got else 0.0
                row[f"{side}_us_per_step"] = got["total_us"] / steps if got else 0.0
                row[f"{side}_mean_us"] = got["mean_us"] if got else None
            row["change_us"] = row["new_us_per_step"] - row["base_us_per_step"]
            row["change"] = row["change_us"] / row["base_us_per_step"] if row["base_us_per_step"] else None
            row["within_noise"] = None if noise is None else abs(row["change_us"]) <= noise
            row["only_in"] = "base" if key not in n else "new" if key not in b else None
            rows.append(row)
    return rows


def _step_parts(b_st, n_st, noise):
    """Rows for the parts of a step (data, forward, backward, optimizer, other), mean per step."""
    rows = []
    for part in CATEGORIES:
        b, n = b_st[f"{part}_mean_us"], n_st[f"{part}_mean_us"]
        rows.append({"view": "step", "key": part, "base_count_per_step": None, "new_count_per_step": None,
                     "base_us_per_step": b, "new_us_per_step": n, "base_mean_us": None, "new_mean_us": None,
                     "change_us": n - b, "change": (n - b) / b if b else None,
                     "within_noise": abs(n - b) <= noise, "only_in": None})
    return rows


def diff(base_paths, new_paths, top=10, include_warmup=False, progress=None):
    """The comparison as a dict (the ``--format json`` document)."""
    # both sides at once: DuckDB runs without the GIL, so one side's Python work (cutting the
    # files into pieces, the step analysis) overlaps the other's scan
    with ThreadPoolExecutor(2) as pool:
        sides = [pool.submit(_side, paths, include_warmup, progress) for paths in (base_paths, new_paths)]
        base, new = (side.result() for side in sides)
    b_st, n_st = ((side["steps"] or {}).get("steady") for side in (base, new))
    per_step = bool(b_st and n_st)
    step = noise = None
    if per_step:
        noise = max(b_st["p75_us"] - b_st["p25_us"], n_st["p75_us"] - n_st["p25_us"])
        change = n_st["median_us"] - b_st["median_us"]
        step = {"base": b_st, "new": n_st, "change_us": change,
                "change": change / b_st["median_us"] if b_st["median_us"] else None,
                "noise_us": noise, "within_noise": abs(change) <= noise}
        rows = _changes(base, new, b_st["steps"], n_st["steps"], noise) + _step_parts(b_st, n_st, noise)
    else:
        rows = _changes(base, new, 1, 1, noise)
    both = [r for r in rows if r["only_in"] is None]
    return {
        "base": base_paths,
        "new": new_paths,
        "per": "step" if per_step else "trace",
        "step_time": step,
        "up": sorted((r for r in both if r["change_us"] > 0), key=lambda r: -r["change_us"])[:top],
        "down": sorted((r for r in both if r["change_us"] < 0), key=lambda r: r["change_us"])[:top],
        "only_base": sorted((r for r in rows if r["only_in"] == "base"), key=lambda r: -r["base_us_per_step"]),
        "only_new": sorted((r for r in rows if r["only_in"] == "new"), key=lambda r: -r["new_us_per_step"]),
        "warnings": base["warnings"] + new["warnings"],
    }


def regressed_above(result, pct):
    """True when the median step time grew by more than ``pct`` percent."""
    st = result["step_time"]
    return st is not None and st["change"] is not None and st["change"] * 100 > pct
