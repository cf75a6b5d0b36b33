"""``dftrace-dynamo diff``: what changed between two runs, per steady-state step, judged
against each row's own step-to-step variation."""

import csv
import io
import sys

from ..traces.report import fmt_ms, to_json
from ._common import progress_bar, warn

FORMATS = ("table", "csv", "json")
_CSV = ("section", "view", "key", "base_count_per_step", "new_count_per_step", "base_us_per_step",
        "new_us_per_step", "change_us", "change", "interval_low_us", "interval_high_us", "base_samples",
        "new_samples", "p_value", "floor_us", "within_noise")


def register(subparsers):
    from ..traces import engines

    p = subparsers.add_parser(
        "diff", help="compare two runs: step time, and the ops, modules and phases that changed beyond noise",
        description="Steady-state comparison of two runs (warm-up steps left out). Every row (the step time, "
                    "each part of a step, each op, module and phase) is judged against its own variation "
                    "from step to step: its time in each steady step on both sides, compared with a "
                    "Mann-Whitney U test; the change is the Hodges-Lehmann shift with its confidence "
                    "interval, corrected for the number of rows (95% confidence for the whole comparison). "
                    "A row changed beyond noise when its interval lies outside its floor: the larger of --margin "
                    "percent of its BASE median time per step (what differs from run to run, which one run's "
                    "steps cannot show) and 0.1 us per event per step. Without step slices on both "
                    "sides the runs are compared per trace, and nothing is judged.")
    p.add_argument("base", metavar="BASE", help="trace file or directory of the reference run")
    p.add_argument("new", metavar="NEW", help="trace file or directory of the run to compare")
    p.add_argument("--top", type=int, default=10, metavar="N", help="rows that grew and shrank beyond noise, each (default 10)")
    p.add_argument("--include-warmup", action="store_true", help="count warm-up steps too")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.add_argument("--fail-above", type=float, metavar="PCT",
                   help="exit status 1 when some row grew beyond noise and its confidence interval lies entirely "
                        "above +PCT%% of its BASE median time per step: it grew by more than PCT%% (for CI; needs "
                        "step slices)")
    # the default is traces.diff.MARGIN, not imported here: the CLI starts without numpy
    p.add_argument("--margin", type=float, metavar="PCT",
                   help="a row changed beyond noise only when it moved by more than PCT%% of its BASE median "
                        "time per step, with confidence (default 5; 0: when its interval excludes zero)")
    engines.add_arguments(p)
    p.set_defaults(func=run)


def _pct(x):
    return "new" if x is None else f"{100 * x:+.1f}%"


def _interval(r):
    if r["interval"]:
        return f"[{100 * r['interval'][0]:+.1f}, {100 * r['interval'][1]:+.1f}]"
    if r["interval_us"]:
        return f"[{fmt_ms(r['interval_us'][0])}, {fmt_ms(r['interval_us'][1])}] ms"
    return "-" if r["samples"] is None else "too few steps"


def _side_text(st):
    return (f"{fmt_ms(st['median_us'])} ms [p25 {fmt_ms(st['p25_us'])}, p75 {fmt_ms(st['p75_us'])}, "
            f"min {fmt_ms(st['min_us'])}, max {fmt_ms(st['max_us'])}] over {st['steps']} steps")


def to_table(result):
    out = [f"verdict: {result['verdict']['text']}"]
    st = result["step_time"]
    if st:
        noise = "within noise" if st["within_noise"] else "beyond noise"
        out += [f"step time: base {_side_text(st['base'])}",
                f"           new  {_side_text(st['new'])}",
                f"change: {fmt_ms(st['change_us'])} ms ({_pct(st['change'])}), interval {_interval(st)}%: {noise}"]
        method = result["method"]
        out.append(f"method: Mann-Whitney U per row over its per-step times, Hodges-Lehmann shift and interval "
                   f"({100 * method['row_confidence']:.3f}% per row, {method['confidence']:.0%} for all "
                   f"{method['rows']} rows together)")
    else:
        out.append("no step slices on both sides: times are totals per trace, noise unknown")
    unit = "ms/step" if result["per"] == "step" else "ms"
    head = (f"{'view':<6}  {'key':<40}  {'calls b':>8}  {'calls n':>8}  {'base ' + unit:>12}  {'new ' + unit:>12}  "
            f"{'change':>10}  {'':>7}  {'interval %':>16}  {'p':>8}  {'mean us b':>10}  {'mean us n':>10}")

    def line(r, value):
        count = (lambda c: "" if c is None else f"{c:,.1f}")
        mean = (lambda m: "-" if m is None else f"{m:,.2f}")
        p = "-" if r["p_value"] is None else f"{r['p_value']:.2g}"
        return (f"{r['view']:<6}  {r['key'][:40]:<40}  {count(r['base_count_per_step']):>8}  "
                f"{count(r['new_count_per_step']):>8}  {fmt_ms(r[f'base_{value}']):>12}  "
                f"{fmt_ms(r[f'new_{value}']):>12}  {fmt_ms(r['change_us']):>10}  {_pct(r['change']):>7}  "
                f"{_interval(r):>16}  {p:>8}  {mean(r['base_mean_us']):>10}  {mean(r['new_mean_us']):>10}")

    judged = result["per"] == "step"
    value = "median_us" if judged else "us_per_step"
    what = "median time per step; calls per step" if judged else "time per trace; calls per trace"
    sections = (("Grew beyond noise" if judged else "Grew most", "up"),
                ("Shrank beyond noise" if judged else "Shrank most", "down"),
                ("Only in BASE", "only_base"), ("Only in NEW", "only_new"))
    for title, key in sections:
        if result[key]:
            out += ["", f"{title} ({what}; mean time per call)", head]
            out += [line(r, value) for r in result[key]]
    if judged:
        method = result["method"]
        out += ["", f"{result['within_noise']} rows changed within noise (their interval reaches into their "
                    f"floor: {method['margin']:g}% of BASE, at least {method['resolution_us']:g} us per event)"]
    return "\n".join(out) + "\n"


def _csv_row(section, r):
    low, high = r["interval_us"] or (None, None)
    n_base, n_new = r["samples"] or (None, None)
    return (section, r["view"], r["key"], r["base_count_per_step"], r["new_count_per_step"], r["base_us_per_step"],
            r["new_us_per_step"], r["change_us"], r["change"], low, high, n_base, n_new, r["p_value"],
            r["floor_us"], r["within_noise"])


def to_csv(result):
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(_CSV)
    if result["step_time"]:
        w.writerow(_csv_row("step_time", result["step_time"]))
    for section in ("up", "down", "only_base", "only_new"):
        for r in result[section]:
            w.writerow(_csv_row(section, r))
    return buf.getvalue()


def run(args):
    from dftrace_dynamo.traces import engines
    from dftrace_dynamo.traces.diff import MARGIN, diff
    from dftrace_dynamo.traces.reader import TraceError, find_traces

    if args.top < 1:
        raise TraceError("--top must be at least 1")
    base, new = find_traces([args.base]), find_traces([args.new])
    with engines.make(args.engine, args.scheduler, args.workers, args.timeout) as engine, \
            progress_bar(200, "diff", unit="%") as bar:
        result = diff(base, new, args.top, args.include_warmup, None if bar.disable else bar.update,
                      args.fail_above, engine, args.source, MARGIN if args.margin is None else args.margin)
    for note in result["warnings"]:
        warn("diff", note)
    for side, paths in (("base", base), ("new", new)):
        note = engines.source_note(result["scan"][side], len(paths), args.engine)
        if note:
            print(f"dftrace-dynamo diff: {side.upper()}: {note}", file=sys.stderr)
    render = {"table": to_table, "csv": to_csv, "json": to_json}[args.format]
    sys.stdout.write(render(result))
    if result["verdict"]["fail"]:
        print(f"dftrace-dynamo diff: {result['verdict']['text']}", file=sys.stderr)
        return 1
    return 0
