"""``dftrace-dynamo profile``: per-node cost profile of a model's graphs."""

import sys

from dftrace_dynamo.graphs.options import add_depth_argument, add_machine_arguments, add_model_arguments

from ._common import warn

FORMATS = ("table", "csv", "json")


def register(subparsers):
    p = subparsers.add_parser(
        "profile", help="per-op parameters, shapes, MACs, FLOPs, memory, intensity, bottleneck and measured time",
        description="Trace MODEL (FX symbolic_trace, Dynamo when it fails), then list every op by module with "
                    "parameters, output shape, MACs, FLOPs, bytes read/written, arithmetic intensity and whether "
                    "it is compute- or memory-bound against the machine balance; op times are measured by "
                    "running the graphs under the tracer, with a warning when they vary too much between runs. "
                    "Ops carry the node numbers 'explore' shows. Ends with a model summary and the bottleneck "
                    "distribution.")
    add_model_arguments(p)
    add_machine_arguments(p)
    p.add_argument("--showshape", action="store_true", help="show each op's output shape")
    add_depth_argument(p, "table of modules only, like fvcore's max_depth")
    p.add_argument("--runs", type=int, default=5, metavar="N",
                   help="traced runs for op times, median per op (default 5; 0: no timing)")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.set_defaults(func=run)


def run(args):
    from dftrace_dynamo.graphs import commands
    from dftrace_dynamo.traces.reader import TraceError

    if args.runs < 0:
        raise TraceError("--runs must be >= 0")
    if args.depth is not None and args.format != "table":
        raise TraceError("--depth applies to the table format (csv and json list every op with its module)")
    return commands.run_profile(args, sys.stdout, warn)
