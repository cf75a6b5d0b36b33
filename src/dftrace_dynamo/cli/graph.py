"""``dftrace-dynamo graph``: picture of a model's graphs and their Python code."""

from dftrace_dynamo.graphs.options import add_depth_argument, add_model_arguments

from ._common import warn


def register(subparsers):
    p = subparsers.add_parser(
        "graph", help="draw the traced graph (.dot/.svg/.png/.pdf) and export each partition as Python",
        description="Trace MODEL (FX symbolic_trace, Dynamo when it fails) and draw its graph partitions: one "
                    "box per op with its readable name, module and output shape, parameters and buffers folded "
                    "into the ops that use them; --depth N draws one box per module instead, which keeps large "
                    "models readable. The format follows the file suffix. SVG, PNG and PDF need Graphviz's "
                    "'dot' program (apt-get install graphviz); without it the DOT file is written, the message "
                    "says how to render it and the exit status is 0. FILE's directory must exist (exit 2 "
                    "otherwise). Graphviz's warnings are passed on, and a "
                    "raster picture too large to read is reported. --code writes each partition as a "
                    "standalone, importable Python module.")
    add_model_arguments(p)
    p.add_argument("-o", "--output", metavar="FILE", help="picture to write: FILE.dot, .svg, .png or .pdf")
    add_depth_argument(p, "module-level drawing")
    p.add_argument("--code", metavar="DIR", help="write each partition's Python code to DIR/<model>_graph_<i>.py")
    p.set_defaults(func=run)


def run(args):
    from dftrace_dynamo.graphs import commands

    return commands.run_graph(args, warn)
