"""Renders a :func:`.summary.summarize` result as a table, CSV, JSON or a PNG chart."""

import csv
import io
import json

from .reader import TraceError

VIEWS = ("op", "module", "phase", "graph", "process", "kernel")
TITLES = {
    "op": "Top ops by total time",
    "module": "By module path",
    "phase": "By phase",
    "graph": "By graph",
    "process": "By process",
    "kernel": "By Inductor kernel (fused ATen ops)",
}
_STATS = ("count", "total_us", "mean_us", "p50_us", "p99_us", "share")


def _seconds(us):
    if us >= 1e6:
        return f"{us / 1e6:.3f} s"
    return f"{us / 1e3:.3f} ms" if us >= 1e3 else f"{us:.3f} us"


def headline(result):
    """One line of totals."""
    files, procs = len(result["files"]), result["processes"]
    line = (f"{files} file{'s' * (files != 1)}, {procs} process{'es' * (procs != 1)}: "
            f"{result['op_events']:,} op events, {_seconds(result['op_time_us'])} in ops")
    if result["graph_calls"]:
        n = result["graph_calls"]
        line += f"; {n:,} graph call{'s' * (n != 1)}, {_seconds(result['graph_time_us'])}"
        if result["op_time_us"] <= result["graph_time_us"]:  # else some ops ran outside graph events
            line += f" ({100 * result['op_time_us'] / result['graph_time_us']:.1f}% of it in ops)"
    if result["compile_events"]:
        n = result["compile_events"]
        line += f"; {n:,} compile event{'s' * (n != 1)}, {_seconds(result['compile_time_us'])}"
    return line


def to_table(result):
    out = [headline(result)]
    for view, rows in result["views"].items():
        out += ["", TITLES[view]]
        if not rows:
            out.append("  (no kernel events: record them with level=\"inductor\")" if view == "kernel"
                       else "  (no op events)")
            continue
        width = max(len(view), *(len(r["key"]) for r in rows))
        out.append(f"{view:<{width}}  {'count':>11}  {'total ms':>11}  {'mean us':>10}  "
                   f"{'p50 us':>10}  {'p99 us':>10}  {'share':>6}")
        for r in rows:
            out.append(f"{r['key']:<{width}}  {r['count']:>11,}  {r['total_us'] / 1e3:>11,.3f}  "
                       f"{r['mean_us']:>10,.3f}  {r['p50_us']:>10,.3f}  {r['p99_us']:>10,.3f}  "
                       f"{100 * r['share']:>5.1f}%" + (f"  {r['fused_ops']}" if r.get("fused_ops") else ""))
    return "\n".join(out) + "\n"


def to_csv(result):
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(("view", "key", *_STATS))
    for view, rows in result["views"].items():
        for r in rows:
            w.writerow((view, r["key"], r["count"], *(f"{r[k]:.3f}" for k in _STATS[1:-1]),
                        f"{r['share']:.6f}"))
    return buf.getvalue()


def to_json(result):
    return json.dumps(result, indent=1) + "\n"


def plot(result, view, path):
    """Horizontal bar chart of total time per key of ``view`` into ``path``."""
    try:
        import matplotlib
    except ImportError:
        raise TraceError("--plot needs matplotlib: pip install 'dftrace-dynamo[plot]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["views"][view][::-1]  # largest at the top
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.35 * max(len(rows), 1)))
    ax.barh([r["key"] for r in rows], [r["total_us"] / 1e3 for r in rows], color="#3b75af")
    for i, r in enumerate(rows):
        ax.text(r["total_us"] / 1e3, i, f" {100 * r['share']:.1f}%  ({r['count']:,})",
                va="center", fontsize=8)
    ax.set_xlabel("total time (ms)   [labels: share of op time, (calls)]")
    ax.set_title(f"{TITLES[view]}: {headline(result).split(': ', 1)[1].split(';')[0]}", fontsize=10)
    ax.margins(x=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
