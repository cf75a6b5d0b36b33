"""``dftrace-dynamo summary``: op statistics of one or many traces."""

import sys

from ._common import progress_bar, warn

FORMATS = ("table", "csv", "json")


def register(subparsers):
    from dftrace_dynamo.traces.report import VIEWS

    p = subparsers.add_parser(
        "summary", help="top ops, modules, phases, graphs and processes by time",
        description="Op statistics (count, total, mean, p50, p99, share of op time) of trace files. "
                    "Only op events (one executed FX node each) are counted; graph calls and "
                    "compile events appear in the totals line.")
    p.add_argument("traces", nargs="+", metavar="TRACE",
                   help="trace files (.pfw, .pfw.gz, .pfw.zst), directories or glob patterns")
    p.add_argument("--top", type=int, default=15, metavar="N", help="rows per view (default 15)")
    p.add_argument("--by", action="append", choices=VIEWS, metavar="VIEW",
                   help=f"view to show, repeatable: {', '.join(VIEWS)} (default: all)")
    p.add_argument("--module-depth", type=int, metavar="N",
                   help="group module paths by their first N components (layers.0.attn -> layers.0 with 2)")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.add_argument("--plot", metavar="FILE.png", help="also draw a bar chart of the first view")
    p.set_defaults(func=run)


def run(args):
    from dftrace_dynamo.traces import report
    from dftrace_dynamo.traces.reader import TraceError, find_traces
    from dftrace_dynamo.traces.report import VIEWS
    from dftrace_dynamo.traces.summary import summarize

    if args.top < 1:
        raise TraceError("--top must be at least 1")
    if args.module_depth is not None and args.module_depth < 1:
        raise TraceError("--module-depth must be at least 1")
    paths = find_traces(args.traces)
    views = list(dict.fromkeys(args.by or VIEWS))
    with progress_bar(100, "summary", unit="%") as bar:
        result = summarize(paths, views, args.top, args.module_depth, None if bar.disable else bar.update)
    for note in result["warnings"]:
        warn("summary", note)
    if not result["op_events"]:
        warn("summary", f"no op events in {len(paths)} file(s)")
    render = {"table": report.to_table, "csv": report.to_csv, "json": report.to_json}[args.format]
    sys.stdout.write(render(result))
    if args.plot:
        report.plot(result, views[0], args.plot)
        print(f"chart: {args.plot}", file=sys.stderr)
    return 0
