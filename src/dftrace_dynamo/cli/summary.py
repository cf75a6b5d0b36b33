"""``dftrace-dynamo summary``: steps, compiles and op statistics of one or many traces."""

import sys

from ._common import progress_bar, warn

FORMATS = ("table", "csv", "json")


def register(subparsers):
    from dftrace_dynamo.traces import engines
    from dftrace_dynamo.traces.kinds import VIEWS

    p = subparsers.add_parser(
        "summary", help="step times, compiles, top ops, modules, phases, graphs, processes and ranks by time",
        description="Statistics of the trace files of one run. With step slices: per-step wall time split "
                    "into data, forward, backward, optimizer, garbage collection and other, the steady-state "
                    "step time (min, median, p90, max) and per-rank step times; warm-up steps (those that compiled or "
                    "recompiled, and those before the first step without compilation) are left out of every "
                    "statistic unless --include-warmup. Op statistics (count, total, mean, p50, p99, share "
                    "of op time) count op events only (one executed FX node or Inductor kernel call each). The header lists graphs "
                    "compiled, graph breaks and recompiles with their reasons. Files of different runs are "
                    "refused unless --all-runs.")
    p.add_argument("traces", nargs="+", metavar="TRACE",
                   help="trace files (.pfw, .pfw.gz, .pfw.zst), directories or glob patterns")
    p.add_argument("--top", type=int, default=15, metavar="N", help="rows per view (default 15)")
    p.add_argument("--by", action="append", choices=VIEWS, metavar="VIEW",
                   help=f"view to show, repeatable: {', '.join(VIEWS)} (default: step when the traces have "
                        "steps, the op views, kernel when there are kernel events)")
    p.add_argument("--module-depth", type=int, metavar="N",
                   help="group module paths by their first N components (layers.0.attn -> layers.0 with 2)")
    p.add_argument("--include-warmup", action="store_true",
                   help="count warm-up steps in the statistics (default: left out)")
    p.add_argument("--all-runs", action="store_true",
                   help="count files of different runs together instead of refusing")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="also draw the step timeline (when there are steps) and a bar chart of the first op view")
    engines.add_arguments(p)
    p.set_defaults(func=run)


def run(args):
    from dftrace_dynamo.traces import engines, report
    from dftrace_dynamo.traces.reader import TraceError, find_traces
    from dftrace_dynamo.traces.kinds import VIEWS
    from dftrace_dynamo.traces.summary import summarize

    if args.top < 1:
        raise TraceError("--top must be at least 1")
    if args.module_depth is not None and args.module_depth < 1:
        raise TraceError("--module-depth must be at least 1")
    paths = find_traces(args.traces)
    views = list(dict.fromkeys(args.by or VIEWS))
    with engines.make(args.engine, args.scheduler, args.workers, args.timeout) as engine, \
            progress_bar(100, "summary", unit="%") as bar:
        result = summarize(paths, views, args.top, args.module_depth, None if bar.disable else bar.update,
                           args.include_warmup, args.all_runs, engine=engine, source=args.source, processes=None)
    for note in result["warnings"]:
        warn("summary", note)
    note = engines.source_note(result["scan"], len(paths), args.engine)
    if note:
        print(f"dftrace-dynamo summary: {note}", file=sys.stderr)
    if not result["op_events"] and not result["steps"]:
        warn("summary", f"no op events in {len(paths)} file(s)")
    render = {"table": report.to_table, "csv": report.to_csv, "json": report.to_json}[args.format]
    sys.stdout.write(render(result, args.by and views, args.top))
    if args.plot:
        report.plot(result, args.plot)
        print(f"chart: {args.plot}", file=sys.stderr)
    return 0
