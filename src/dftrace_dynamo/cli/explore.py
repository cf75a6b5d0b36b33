"""``dftrace-dynamo explore``: text view of a model's graphs (the graph explorer)."""

import sys

from dftrace_dynamo.graphs.options import add_machine_arguments, add_model_arguments


def register(subparsers):
    p = subparsers.add_parser(
        "explore", help="text view of the traced graph: nodes, arguments, modules, shapes, FLOPs, bottlenecks",
        description="Trace MODEL (FX symbolic_trace, Dynamo when it fails) and print its nodes, numbered from 1 "
                    "across graph partitions (the numbers 'profile' shows), with arguments, module, output shape, "
                    "FLOPs, bytes, arithmetic intensity and bottleneck; graph breaks are listed with their "
                    "reasons. Parameter and buffer inputs are folded into the ops that use them.")
    add_model_arguments(p)
    add_machine_arguments(p)
    view = p.add_argument_group("which nodes")
    view.add_argument("--start", type=int, metavar="N", help="first node to show (default 1)")
    view.add_argument("--end", type=int, metavar="N", help="last node to show (default: the last)")
    view.add_argument("--around", type=int, metavar="N", help="show node N with --context nodes on each side")
    view.add_argument("--context", type=int, default=5, metavar="K", help="nodes each side of --around (default 5)")
    view.add_argument("--max-nodes", type=int, metavar="M", help="show at most M nodes")
    view.add_argument("--show-params", action="store_true",
                      help="also list the parameter and buffer inputs (folded into their ops by default)")
    p.add_argument("--output", "-o", metavar="FILE", help="write the view to FILE instead of stdout")
    p.set_defaults(func=run)


def run(args):
    from dftrace_dynamo.graphs import commands

    return commands.run_explore(args, sys.stdout)
