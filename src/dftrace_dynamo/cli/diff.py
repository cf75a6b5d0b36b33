"""``dftrace-dynamo diff``: what changed between two runs, per steady-state step."""

import csv
import io
import json
import sys

from ..traces.report import fmt_ms
from ._common import progress_bar, warn

FORMATS = ("table", "csv", "json")
_CSV = ("section", "view", "key", "base_count_per_step", "new_count_per_step", "base_us_per_step",
        "new_us_per_step", "change_us", "change", "base_mean_us", "new_mean_us", "within_noise")


def register(subparsers):
    p = subparsers.add_parser(
        "diff", help="compare two runs: step time, and the ops, modules and phases that changed most per step",
        description="Steady-state comparison of two runs (warm-up steps left out): the median step time with "
                    "its spread on both sides, then the ops, modules and step phases whose time per step "
                    "changed most, up and down, with calls per step and mean time per call on both sides; "
                    "ops found on one side only. A change not larger than the step-to-step noise (the larger "
                    "interquartile range of the step times) is marked as within noise. Without step slices "
                    "the runs are compared per trace.")
    p.add_argument("base", metavar="BASE", help="trace file or directory of the reference run")
    p.add_argument("new", metavar="NEW", help="trace file or directory of the run to compare")
    p.add_argument("--top", type=int, default=10, metavar="N", help="rows up and down (default 10)")
    p.add_argument("--include-warmup", action="store_true", help="count warm-up steps too")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.add_argument("--fail-above", type=float, metavar="PCT",
                   help="exit status 1 when the median step time grew by more than PCT percent (for CI)")
    p.set_defaults(func=run)


def _pct(x):
    return "new" if x is None else f"{100 * x:+.1f}%"


def _side_text(st):
    return (f"{fmt_ms(st['median_us'])} ms [p25 {fmt_ms(st['p25_us'])}, p75 {fmt_ms(st['p75_us'])}, "
            f"min {fmt_ms(st['min_us'])}, max {fmt_ms(st['max_us'])}] over {st['steps']} steps")


def to_table(result):
    out = []
    st = result["step_time"]
    if st:
        noise = "within" if st["within_noise"] else "outside"
        out += [f"median step time: base {_side_text(st['base'])}",
                f"                  new  {_side_text(st['new'])}",
                f"change: {fmt_ms(st['change_us'])} ms ({_pct(st['change'])}), {noise} the step-to-step noise "
                f"(±{fmt_ms(st['noise_us'])} ms)"]
    else:
        out.append("no step slices on both sides: times are totals per trace, noise unknown")
    unit = "ms/step" if result["per"] == "step" else "ms"
    head = (f"{'view':<6}  {'key':<40}  {'calls b':>8}  {'calls n':>8}  {'base ' + unit:>12}  {'new ' + unit:>12}  "
            f"{'change':>10}  {'':>7}  {'mean us b':>10}  {'mean us n':>10}")

    def line(r):
        count = (lambda c: "" if c is None else f"{c:,.1f}")
        mean = (lambda m: "-" if m is None else f"{m:,.2f}")
        note = "  (within noise)" if r["within_noise"] else ""
        return (f"{r['view']:<6}  {r['key'][:40]:<40}  {count(r['base_count_per_step']):>8}  "
                f"{count(r['new_count_per_step']):>8}  {fmt_ms(r['base_us_per_step']):>12}  "
                f"{fmt_ms(r['new_us_per_step']):>12}  {fmt_ms(r['change_us']):>10}  {_pct(r['change']):>7}  "
                f"{mean(r['base_mean_us']):>10}  {mean(r['new_mean_us']):>10}{note}")

    for title, key in (("Grew most", "up"), ("Shrank most", "down"), ("Only in BASE", "only_base"),
                       ("Only in NEW", "only_new")):
        if result[key]:
            out += ["", f"{title} (time per {result['per']}; calls per {result['per']}; mean time per call)", head]
            out += [line(r) for r in result[key]]
    return "\n".join(out) + "\n"


def to_csv(result):
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(_CSV)
    st = result["step_time"]
    if st:
        w.writerow(("step_time", "step", "median", None, None, st["base"]["median_us"], st["new"]["median_us"],
                    st["change_us"], st["change"], None, None, st["within_noise"]))
    for section in ("up", "down", "only_base", "only_new"):
        for r in result[section]:
            w.writerow((section, *(r[k] for k in _CSV[1:])))
    return buf.getvalue()


def run(args):
    from dftrace_dynamo.traces.diff import diff, regressed_above
    from dftrace_dynamo.traces.reader import TraceError, find_traces

    if args.top < 1:
        raise TraceError("--top must be at least 1")
    base, new = find_traces([args.base]), find_traces([args.new])
    with progress_bar(200, "diff", unit="%") as bar:
        result = diff(base, new, args.top, args.include_warmup, None if bar.disable else bar.update)
    for note in result["warnings"]:
        warn("diff", note)
    render = {"table": to_table, "csv": to_csv, "json": lambda r: json.dumps(r, indent=1) + "\n"}[args.format]
    sys.stdout.write(render(result))
    if args.fail_above is not None and regressed_above(result, args.fail_above):
        print(f"dftrace-dynamo diff: median step time grew by {100 * result['step_time']['change']:.1f}%, "
              f"more than --fail-above {args.fail_above:g}%", file=sys.stderr)
        return 1
    return 0
