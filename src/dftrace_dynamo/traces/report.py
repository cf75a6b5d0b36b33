"""Renders a :func:`.summary.summarize` result as a table, CSV, JSON or a PNG chart."""

import csv
import io
import json

import orjson

from ..schema import STEP_PARTS
from .kinds import OP_VIEWS, ROW_VIEWS
from .reader import TraceError

TITLES = {
    "step": "Steps (ms; warm-up steps marked)",
    "op": "Top ops by total time",
    "module": "By module path",
    "phase": "By phase",
    "graph": "By graph",
    "process": "By process",
    "graphs": "Compiles, graph breaks and recompiles",
    "rank": "By rank (steady-state step time, ms)",
    "kernel": "By Inductor kernel (fused ATen ops)",
}
STEP_COLUMNS = ("wall", *STEP_PARTS)
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


def fmt_ms(us):
    return "-" if us is None else f"{us / 1e3:,.3f}"


def _one_line(text, width=200):
    """A multi-line reason (Dynamo's explanations and hints) as one line of at most ``width``."""
    text = " ".join(part.strip() for part in text.splitlines() if part.strip())
    return text if len(text) <= width else text[:width - 3] + "..."


def compile_lines(result):
    """Header lines: graphs compiled, graph breaks, recompiles, each with reason and location."""
    comp = result["compile"]
    breaks = sum(b["count"] for b in comp["graph_breaks"])
    recompiles = sum(r["count"] for r in comp["recompiles"])
    if not (comp["graphs_compiled"] or breaks or recompiles):
        return []
    return [f"compiled: {comp['graphs_compiled']} graph{'s' * (comp['graphs_compiled'] != 1)}, "
            f"{breaks} graph break{'s' * (breaks != 1)}, {recompiles} recompile{'s' * (recompiles != 1)}",
            *_break_lines(comp, full=False)]


def _break_lines(comp, full):
    """One line per graph break and recompile: where, how often, in which steps and why; ``full``
    (the graphs view) adds the frame and the processes, and keeps up to 1000 characters of reason."""
    out = []
    for what, entries in (("graph break", comp["graph_breaks"]), ("recompile", comp["recompiles"])):
        for e in entries:
            steps = f", step{'s' * full} {', '.join(map(str, e['steps']))}" if e["steps"] else ""
            if full:
                out.append(f"  {what} at {e['location']} in {e['frame'] or '?'} ({e['count']}x{steps}; "
                           f"{', '.join(e['processes'])}): {_one_line(e['reason'], 1000)}")
            else:
                out.append(f"  {what} at {e['location']} ({e['count']}x{steps}): {_one_line(e['reason'])}")
    return out


def step_lines(result):
    """Header lines on the steps: how many, which are warm-up, the steady-state series."""
    steps = result["steps"]
    if not steps:
        return []
    warm = steps["warmup_steps"]
    line = f"steps: {len(steps['rows'])}"
    if steps["recorded_steps"] < len(steps["rows"]):
        line += (f", {steps['recorded_steps']} recorded (the step windows; the others hold no events "
                 "and are left out of every statistic)")
    if warm:
        shown = ", ".join(f"step {w['step']} {w['reason']}" for w in warm[:10]) + (", ..." if len(warm) > 10 else "")
        line += ("; warm-up, counted in the statistics: " if steps["include_warmup"]
                 else "; warm-up, left out of every statistic (--include-warmup counts it): ") + shown
    out = [line]
    st = steps["steady"]
    if st is None:
        out.append("  no steady-state step: every step is a warm-up step (--include-warmup shows them)")
    else:
        out.append(f"  step time over {st['steps']} step{'s' * (st['steps'] != 1)}: min {fmt_ms(st['min_us'])} ms, "
                   f"median {fmt_ms(st['median_us'])} ms, p90 {fmt_ms(st['p90_us'])} ms, max {fmt_ms(st['max_us'])} ms; "
                   + ", ".join(f"{c} {fmt_ms(st[f'{c}_mean_us'])}" for c in STEP_COLUMNS[1:])
                   + f" ms on average, coverage {100 * st['coverage']:.1f}%")
    return out


def eval_lines(result):
    """Header line on the evaluation passes (``eval`` slices), which no step statistic counts."""
    ev = result.get("evaluation")
    if not ev:
        return []
    return [f"evaluation: {ev['count']} pass{'es' * (ev['count'] != 1)}, {fmt_ms(ev['total_us'])} ms in all, "
            f"{fmt_ms(ev['mean_us'])} ms per pass on average (median {fmt_ms(ev['median_us'])} ms); "
            "not in the step statistics"]


def _step_table(result, top):
    steps = result["steps"]
    rows = [r for r in steps["rows"] if r["recorded"]]  # (a step window: the others recorded nothing)
    warm = [r for r in rows if r["warmup"]]
    steady = [r for r in rows if not r["warmup"]]
    shown = warm + steady[:top]
    out = [f"{'step':>8}  " + "  ".join(f"{c:>10}" for c in STEP_COLUMNS) + f"  {'coverage':>8}"]
    for r in sorted(shown, key=lambda r: r["step"]):
        out.append(f"{r['step']:>8}  " + "  ".join(f"{fmt_ms(r[f'{c}_us']):>10}" for c in STEP_COLUMNS)
                   + f"  {100 * r['coverage']:>7.1f}%" + (f"  warm-up: {r['warmup']}" if r["warmup"] else ""))
    if len(steady) > top:
        out.append(f"  ... {len(steady) - top} more steady-state steps (--top, or --format json for all)")
    if len(rows) < len(steps["rows"]):
        out.append(f"  {len(steps['rows']) - len(rows)} steps not recorded (outside the step windows: their slices "
                   "hold no events; --format json lists them)")
    return out


def _rank_table(result):
    ranks = result["steps"]["ranks"]
    width = max(len("process"), *(len(r["process"]) for r in ranks))
    out = [f"{'process':<{width}}  {'steps':>6}  {'min':>10}  {'median':>10}  {'p90':>10}  {'max':>10}"
           f"  {'op ms/step':>10}  {'ops/step':>8}"]
    for r in ranks:  # (op time and count of op events per step: medians)
        count = r.get("ops_median")
        out.append(f"{r['process']:<{width}}  {r['steps']:>6}  " + "  ".join(
            f"{fmt_ms(r.get(k)):>10}" for k in ("min_us", "median_us", "p90_us", "max_us", "ops_median_us"))
            + f"  {'-' if count is None else f'{count:g}':>8}")
    spread = result["steps"]["rank_spread"]
    if spread:
        out.append(f"slowest: {spread['slowest']}, {fmt_ms(spread['spread_us'])} ms "
                   f"({100 * spread['spread']:.1f}%) above the fastest ({spread['fastest']}) in median step time")
    return out + _wait_lines(result.get("ranks"))


def _mb(n):
    return "-" if n is None else f"{n / 2**20:,.1f}"


def _each(n):
    """Who waits for the straggler: the wait is per waiting rank, never their sum."""
    if not n or n < 1:
        return "each of the others waits"
    return "the rank it delays waits" if n == 1 else f"each of the {n} ranks it delays waits"


def _slower(slower):
    """What in the straggler was slower than on its peers (:func:`.origin.cause`)."""
    if not slower:
        return ""
    where = slower["phase"]
    if "module" in slower:
        return (f"; slower than its peers in {where}, module {slower['module']} "
                f"(+{fmt_ms(slower['module_excess_us'])} ms per step)")
    return f"; slower than its peers in {where} (+{fmt_ms(slower['excess_us'])} ms per step)"


def _wait_lines(info):
    """Who waits for whom (traces.ranks): time per step by part, the straggler, skew, divergence,
    memory."""
    if not info:
        return []
    width = max(len("rank"), *(len(r["rank"]) for r in info["ranks"]))
    cols = ("wall", "compute", "comm", "wait", "data", "gc", "trainer", "other", "wait_caused", "overlap")
    out = ["", "Who waits for whom (ms per steady step, mean; wait: blocked in a collective before the "
           "last peer arrived; wait_caused: what each rank it delays loses to it, charged to the rank "
           "where the delay began; overlap: async communication in flight outside its wait())",
           f"{'rank':<{width}}  " + "  ".join(f"{c:>11}" for c in cols) + f"  {'peak MiB':>9}"]
    for r in info["ranks"]:
        out.append(f"{r['rank']:<{width}}  " + "  ".join(f"{fmt_ms(r.get(f'{c}_us')):>11}" for c in cols)
                   + f"  {_mb(r.get('peak_rss_max')):>9}")
    s = info["straggler"]
    if info["threshold_us"] is not None:
        why = (f"threshold {fmt_ms(info['threshold_us'])} ms: 3 x the step-to-step noise "
               f"({fmt_ms(info['noise_us'])} ms), at least 5% of the median step")
        out.append(f"straggler: {s['rank']}, {_each(s.get('waiting_ranks'))} "
                   f"{fmt_ms(s['wait_caused_median_us'])} ms per step for it (median of {s['steps']} steps; "
                   f"{why}){_slower(s.get('slower'))}"
                   if s else f"straggler: none (no rank makes the others wait more than the {why})")
    out.append(f"clocks: {info['clock']}")
    sk = info["skew"]
    if sk["median_us"] is not None:
        out.append(f"step-end skew across ranks: median {fmt_ms(sk['median_us'])} ms, max {fmt_ms(sk['max_us'])} ms")
    for rank, d in (info["divergence"] or {}).items():
        out.append(f"compile divergence: {rank} compiled {d['graphs_compiled']} graphs, recompiled in steps "
                   f"{d['recompile_steps'] or 'none'}")
    if info["memory"]:
        out.append("peak memory per step (MiB, largest rank): " + ", ".join(
            f"{m['step']}: {_mb(m['peak_rss_max'])}" for m in info["memory"][:20]))
    return out


def _graphs_table(result):
    comp = result["compile"]
    out = []
    for c in comp["compiles"]:
        where = f" at {c['location']}" if c["location"] else ""
        step = "" if c["step"] is None else f", step {c['step']}"
        out.append(f"  {compile_label(c['name'])}{where}: {fmt_ms(c['dur_us'])} ms ({c['process']}{step})")
    return out + _break_lines(comp, full=True) or ["  (no compile events)"]


def compile_label(name):
    """A compile event's name in the user's words (the trace keeps pydftracer's names)."""
    if name.startswith("dynamo compile "):
        return f"compile of {name[len('dynamo compile '):]}()"
    if name == "compile (lazy_backward)":
        return "compile of a backward graph (at its first backward)"
    return name


def op_label(name):
    """An op name without the trace's ``function.`` prefix; ``method.x`` is ``Tensor.x``."""
    if name.startswith("function."):
        return name[len("function."):]
    return "Tensor." + name[len("method."):] if name.startswith("method.") else name


def _special_view(result, view, top):
    """Lines of the step, graphs or rank view, or None when the traces hold nothing for it."""
    if view == "graphs":
        return _graphs_table(result)
    if not result["steps"]:
        return None
    return _step_table(result, top) if view == "step" else _rank_table(result)


def to_table(result, views=None, top=15):
    """The table report. ``views``: the views to show in order (default: those in
    the result, after the step view when there are steps)."""
    out = [headline(result), *compile_lines(result), *step_lines(result), *eval_lines(result)]
    for view in views or ["step", *result["views"]]:
        if view not in ROW_VIEWS:
            lines = _special_view(result, view, top)
            if lines is None:
                if views:
                    out += ["", TITLES[view], "  (no step slices in these traces)"]
                continue
            out += ["", TITLES[view], *lines]
            continue
        rows = result["views"].get(view, [])
        out += ["", TITLES[view]]
        if not rows:
            out.append("  (no kernel events: record them with level=\"inductor\")" if view == "kernel"
                       else "  (no op events)")
            continue
        keys = [op_label(r["key"]) if view == "op" else r["key"] for r in rows]
        width = max(len(view), *map(len, keys))
        out.append(f"{view:<{width}}  {'count':>11}  {'total ms':>11}  {'mean us':>10}  "
                   f"{'p50 us':>10}  {'p99 us':>10}  {'share':>6}")
        for key, r in zip(keys, rows):
            out.append(f"{key:<{width}}  {r['count']:>11,}  {r['total_us'] / 1e3:>11,.3f}  "
                       f"{r['mean_us']:>10,.3f}  {r['p50_us']:>10,.3f}  {r['p99_us']:>10,.3f}  "
                       f"{100 * r['share']:>5.1f}%" + (f"  {r['fused_ops']}" if r.get("fused_ops") else ""))
    return "\n".join(out) + "\n"


def to_csv(result, views=None, top=None):
    """The op views as one table; the step, rank or graphs view, asked for alone, as its own table."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if views == ["graphs"]:
        w.writerow(("kind", "location", "frame", "count", "steps", "processes", "reason"))
        for kind in ("graph_breaks", "recompiles"):
            for e in result["compile"][kind]:
                w.writerow((kind[:-1], e["location"], e["frame"], e["count"], " ".join(map(str, e["steps"])),
                            "; ".join(e["processes"]), e["reason"]))
        return buf.getvalue()
    if views in (["step"], ["rank"]):
        rows = (result["steps"] or {}).get("rows" if views == ["step"] else "ranks", [])
        if rows:
            w.writerow(rows[0].keys())
            w.writerows(r.values() for r in rows)
        return buf.getvalue()
    w.writerow(("view", "key", *_STATS))
    for view, rows in result["views"].items():
        for r in rows:
            w.writerow((view, r["key"], r["count"], *(f"{r[k]:.3f}" for k in _STATS[1:-1]),
                        f"{r['share']:.6f}"))
    return buf.getvalue()


def to_json(result, views=None, top=None):
    # orjson writes 200 files' per-rank-step rows in a tenth of json.dumps' time; json.dumps,
    # with the same layout, for what orjson refuses (a lone surrogate in a name, a huge int)
    try:
        return orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n"
    except TypeError:
        return json.dumps(result, indent=2) + "\n"


STEP_COLORS = {"data": "#8c6bb1", "forward": "#3b75af", "backward": "#e1812c", "optimizer": "#3a923a",
               "gc": "#c44e52", "trainer": "#937860", "other": "#bbbbbb"}


def _step_timeline(ax, result):
    """Stacked bars per step (time by category); warm-up steps hatched."""
    rows = result["steps"]["rows"]
    steps = [r["step"] for r in rows]
    bottom = [0.0] * len(rows)
    for c, color in STEP_COLORS.items():
        values = [r[f"{c}_us"] / 1e3 for r in rows]
        bars = ax.bar(steps, values, bottom=bottom, color=color, label=c, width=0.8, linewidth=0)
        for bar, r in zip(bars, rows):
            if r["warmup"]:
                bar.set_hatch("//")
                bar.set_alpha(0.5)
        bottom = [b + v for b, v in zip(bottom, values)]
    from matplotlib.patches import Patch

    handles = [Patch(color=color, label=c) for c, color in STEP_COLORS.items()]  # plain: bar 0 may be hatched
    st = result["steps"]["steady"]
    if st:
        handles.append(ax.axhline(st["median_us"] / 1e3, color="black", linewidth=0.8, linestyle="--",
                                  label=f"steady median {st['median_us'] / 1e3:.3f} ms"))
        ax.set_ylim(0, max(st["max_us"] / 1e3 * 1.3, st["median_us"] / 1e3 * 2))  # warm-up steps may go off scale
    ax.set_xlabel("step (hatched: warm-up, left out of the statistics)" if result["steps"]["warmup_steps"] else "step")
    ax.set_ylabel("time (ms)")
    ax.set_title("Step timeline: where each step's time went", fontsize=10)
    ax.legend(handles=handles, fontsize=8, ncol=3, loc="upper right")


def _bar_chart(ax, result, view):
    rows = result["views"][view][::-1]  # largest at the top
    ax.barh([r["key"] for r in rows], [r["total_us"] / 1e3 for r in rows], color="#3b75af")
    for i, r in enumerate(rows):
        ax.text(r["total_us"] / 1e3, i, f" {100 * r['share']:.1f}%  ({r['count']:,})",
                va="center", fontsize=8)
    ax.set_xlabel("total time (ms)   [labels: share of op time, (calls)]")
    ax.set_title(f"{TITLES[view]}: {headline(result).split(': ', 1)[1].split(';')[0]}", fontsize=10)
    ax.margins(x=0.25)


def plot(result, path):
    """Into ``path``: the step timeline when the traces have steps, and a
    horizontal bar chart of total time per key of the first op view the result
    holds; a :class:`TraceError` when it holds neither."""
    view = next((v for v in result["views"] if v in OP_VIEWS), None)
    if view is None and not result["steps"]:
        raise TraceError("--plot draws the step timeline and an op view (op, module, phase, graph, process): "
                         "the traces have no steps and --by names no op view")
    try:
        import matplotlib
    except ImportError:
        raise TraceError("--plot needs matplotlib: pip install 'dftrace-dynamo[plot]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heights = ([4.0] if result["steps"] else []) + ([1.2 + 0.35 * max(len(result["views"][view]), 1)] if view else [])
    # names from the trace ('$x^2$', '\\') are text: no mathtext, no LaTeX
    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
        fig, axes = plt.subplots(len(heights), 1, figsize=(10, sum(heights) + 0.5),
                                 gridspec_kw={"height_ratios": heights}, squeeze=False)
        try:
            if result["steps"]:
                _step_timeline(axes[0][0], result)
            if view:
                _bar_chart(axes[-1][0], result, view)
            fig.tight_layout()
            fig.savefig(path, dpi=110)
        finally:
            plt.close(fig)
