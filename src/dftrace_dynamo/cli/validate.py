"""``dftrace-dynamo validate``: will these traces load in Perfetto?"""

import sys

from dftrace_dynamo.traces.reader import TraceError
from dftrace_dynamo.traces.validate import UI_MAX_EVENTS


def register(subparsers):
    p = subparsers.add_parser(
        "validate", help="check traces against what Perfetto's JSON importer relies on",
        description="Checks each trace: valid JSON on every line, the first-bytes sniff, pid/tid "
                    "range, X events with dur that nest per thread, complete gzip/zstd members; warns when a file "
                    f"holds more events than the Perfetto web UI loads ({UI_MAX_EVENTS // 10**6} M) and names the "
                    "command that cuts it, and when it is zstd-compressed (Perfetto reads zstd from v58). Exit "
                    "status 2 when a file is not a trace at all (one line each), else 1 when a problem is found, "
                    "0 when all files are clean.")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace files, directories or glob patterns")
    p.add_argument("--max-problems", type=int, default=20, metavar="N",
                   help="problems listed per file (default 20; all are counted)")
    p.set_defaults(func=run)


def run(args):
    from dftrace_dynamo.traces.reader import NotATrace, check_trace, find_traces
    from dftrace_dynamo.traces.validate import validate

    failed = not_traces = 0
    for path in find_traces(args.traces):
        try:
            check_trace(path)
        except NotATrace as e:  # not a damaged trace but some other file: one line, as every command says it
            print(f"dftrace-dynamo validate: error: {e}", file=sys.stderr)
            not_traces += 1
            continue
        except TraceError:  # empty or blank: validate reports it as a problem
            pass
        report = validate(path, max(args.max_problems, 0))
        n = report.count
        status = f"{n:,} problem{'s' * (n != 1)}" if n else "OK"
        print(f"{path}: {status} ({report.events:,} events)")
        for line, message in report.problems[:args.max_problems]:
            print(f"  {'line ' + str(line) if line else 'file'}: {message}")
        if n > args.max_problems:
            print(f"  ... and {n - args.max_problems} more")
        for note in report.warnings:
            print(f"  warning: {note}")
        for note in report.notes:
            print(f"  note: {note}")
        failed += bool(n)
    return 2 if not_traces else 1 if failed else 0
