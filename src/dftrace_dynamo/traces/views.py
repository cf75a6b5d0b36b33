"""Views: the summary document (the ``--format json`` document, which :mod:`.report` renders) built
from the merged statistics (:mod:`.merged`): totals, the step and compile analyses, the op
views' rows, the kernel view, the rank view (see docs/design.rst, "Trace analysis")."""

import math
import os

from . import compiles, ranks, steps
from .kinds import GRAPH, OP, OP_VIEWS, PROCESS_NAME, RANK_KINDS
from .reader import rank_of


def document(paths, merged, views, top, scan_info=None):
    """The summary of ``paths`` (see :func:`.summary.summarize`) from their :func:`.merged.merge`
    statistics, at most ``top`` rows per view. ``scan_info``: the document's ``scan`` (what was
    read, where), by default that of the local or the Dask engine."""
    whole = merged["whole"]
    result = _result(paths, views, top, merged["groups"], merged["warnings"], merged["unparsed"], merged["records"],
                     merged["steps"], merged["runs"])
    # what was read, where, and how exact the quantiles are
    result["scan"] = scan_info or {"source": "events", "engine": "local" if whole else "dask",
                                   "quantiles": "exact" if whole else "sketch"}
    durations = merged["evaluation"]
    timed = [d for d in durations if d is not None]
    # evaluation passes (eval slices): apart from the training steps
    result["evaluation"] = {"count": len(durations), "total_us": math.fsum(timed) if timed else None,
                            "mean_us": math.fsum(timed) / len(timed) if timed else None,
                            "median_us": steps.quantile(timed, 0.5)} if durations else None
    if merged["samples"] is not None:
        result["step_samples"] = merged["samples"]
    if "kernel" in views:
        kernel_rows = _kernel_rows(*merged["kernels"], top)
        if kernel_rows:
            result["views"]["kernel"] = kernel_rows
    result["ranks"] = merged["ranks"] if merged["rank_rows"] is None else ranks.analyse(
        merged["rank_rows"], paths, RANK_KINDS, merged["records"], merged["steps"], merged["clocks"], result["warnings"])
    return result


def _kernel_rows(stats, info, top):
    """Rows of the kernel view from the merged kernel statistics, largest total first."""
    grand = sum(s.ns for s in stats.values()) / 1000
    out = []
    for name, s in stats.items():
        count, total, mean, p50, p99 = s.row()
        out.append({"key": name, "kernel_type": info[name][0], "count": count, "total_us": total, "mean_us": mean,
                    "p50_us": p50, "p99_us": p99, "share": total / grand if grand else 0.0,
                    "fused_ops": info[name][1]})
    out.sort(key=lambda r: (-r["total_us"], r["key"]))
    return out[:top]


def _result(paths, views, top, groups, warnings, unparsed, records, step_info, found):
    """The summary document from the merged groups ((kind, set name) -> key values -> :class:`.merged.Stats`)."""
    def total(kind):
        phase_rows = groups.get((kind, "phase"), {}).values()
        return sum(r.count for r in phase_rows), sum(r.ns for r in phase_rows) / 1000

    n_ops, op_time = total(OP)
    n_graph, graph_time = total(GRAPH)
    # DuckDB skips lines it cannot parse; '[', ']' and a cut last line are expected
    unparsed -= 2 * len(paths)
    if unparsed > 0:
        warnings.append(f"{unparsed:,} lines that are not JSON events were skipped "
                        "(corrupt data? dftrace-dynamo validate lists them)")
    names = {key: s.aname for key, s in groups.get((PROCESS_NAME, "process"), {}).items()}
    op_procs = groups.get((OP, "process"), {})
    # one label per process, for every view (the same name in two views means the same process)
    labels = _process_labels(paths, set(op_procs) | {(r["file"], r["pid"]) for r in records}
                             | set(step_info["processes"]), names)
    result = {
        "files": list(paths),
        "runs": [{"run": r["label"], "files": [paths[i] for i in r["files"]]} for r in found],
        "processes": len(labels),  # those with ops, compiles or steps
        "op_events": n_ops,
        "op_time_us": op_time,
        "graph_calls": n_graph,
        "graph_time_us": graph_time,
        "compile_events": len(records),
        "compile_time_us": _outer_time([(r["pid"], r["tid"], r["ts"], r["dur"]) for r in records]),
        "compile": compiles.report(records, lambda r: labels[(r["file"], r["pid"])]),
        "steps": steps.public(step_info, lambda key: labels[key]),
        "views": {},
        "warnings": warnings,
    }
    for view in views:
        if view not in OP_VIEWS:
            continue
        out = []
        for values, stats in groups.get((OP, view), {}).items():
            if view == "process":
                key = labels[values]
            else:
                key = " ".join(map(str, values))
                key = f"graph {key}" if view == "graph" else key
            count, dur, mean, p50, p99 = stats.row()
            out.append({"key": key, "count": count, "total_us": dur, "mean_us": mean, "p50_us": p50,
                        "p99_us": p99, "share": dur / op_time if op_time else 0.0})
        out.sort(key=lambda row: (-row["total_us"], row["key"]))
        result["views"][view] = out[:top]
    return result


def _process_labels(paths, processes, names):
    """One display label per (input, pid) of ``processes``: process name, rank, pid.
    ``names``: (input, pid) -> process_name."""
    labels = {}
    for f, p in processes:
        label = names.get((f, p)) or os.path.basename(paths[f]).split(".")[0]
        rank = rank_of(paths[f])
        if rank is not None and f"rank{rank}" not in label.replace(" ", ""):
            label = f"rank{rank} {label}"
        labels[(f, p)] = f"{label} [pid {p}]"
    seen = list(labels.values())
    for (f, p), label in labels.items():
        if seen.count(label) > 1:  # same name and pid in several files (several hosts)
            labels[(f, p)] = f"{label} {os.path.basename(paths[f])}"
    return labels


def _outer_time(events):
    """Total duration of compile events not enclosed by another one of their thread."""
    total, ends = 0.0, {}
    for pid, tid, ts, dur in sorted(events, key=lambda e: (e[0], e[1] or 0, e[2], -e[3])):
        if ts + dur <= ends.get((pid, tid), float("-inf")):
            continue
        ends[(pid, tid)] = ts + dur
        total += dur
    return total
