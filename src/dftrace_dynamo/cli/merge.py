"""``dftrace-dynamo merge``: many process traces into one Perfetto file."""

import os
import sys

from ._common import progress_bar, warn


def register(subparsers):
    p = subparsers.add_parser(
        "merge", help="merge the traces of many processes/ranks into one file",
        description="Writes one trace holding the events of all inputs, one named process per "
                    "input process (rank names when the file name has rank<R>); pids that collide "
                    "between inputs are moved to free ones. Output compression follows its "
                    "extension (.pfw.gz gzip, .pfw.zst zstd, else plain). Files of different runs are "
                    "refused unless --all-runs, and so is an output inside a directory being merged.")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace files, directories or glob patterns")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="merged trace to write")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--all-runs", action="store_true",
                   help="merge files of different runs into one trace instead of refusing")
    p.set_defaults(func=run)


def run(args):
    from dftrace_dynamo.traces.merge import check_output_place, merge
    from dftrace_dynamo.traces.reader import find_traces

    check_output_place(args.output, args.traces)
    paths = find_traces(args.traces)
    with progress_bar(sum(os.path.getsize(p) for p in paths), "merge") as bar:
        events, processes, warnings = merge(paths, args.output, args.force, None if bar.disable else bar.update,
                                            args.all_runs)
    for note in warnings:
        warn("merge", note)
    for path, old, new, name in processes:
        moved = f" (pid {old} -> {new})" if old != new else ""
        print(f"{name}: {path}{moved}", file=sys.stderr)
    print(f"wrote {args.output}: {events:,} events, {len(processes)} processes from {len(paths)} files")
    return 0
