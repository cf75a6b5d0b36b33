"""The ``dftrace-dynamo`` command.

Each subcommand is a module of this package with ``register(subparsers)``,
which adds its parser and ``set_defaults(func=...)``; ``func(args)`` returns the
exit status. Subcommand modules keep heavy imports (torch, duckdb, matplotlib)
inside their functions so that ``--help`` stays fast.
"""

import argparse
import importlib
import os
import sys

from dftrace_dynamo.traces.reader import TraceError

SUBCOMMANDS = ["demo", "run", "summary", "diff", "merge", "convert", "validate", "profile", "explore", "graph"]


class Parser(argparse.ArgumentParser):
    """Bad usage: exit 2 with one line, not the usage block, pointing at this (sub)command's --help."""

    _argv: list = []

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message):
        if message.startswith("the following arguments are required"):
            # an unknown option is the likelier mistake (it may have eaten a value): name it first
            unknown = [a for a in self._argv if a.startswith("-") and a != "-" and
                       a.split("=", 1)[0] not in self._option_string_actions]
            if unknown:
                message = f"unrecognized arguments: {' '.join(unknown)}"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _subcommand(name):
    """The subcommand module, or None when it is not part of this install.
    Only the module itself being absent is tolerated: an import error inside
    an existing module is a bug and propagates."""
    modname = f"{__name__}.{name}"
    try:
        return importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name == modname:
            return None
        raise


def _version():
    # the installed distribution's version; importing the package would import torch
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("dftrace-dynamo")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser():
    parser = Parser(prog="dftrace-dynamo",
                    description="Trace torch.compile'd models op by op and analyse the .pfw traces.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                       parser_class=Parser)
    for name in SUBCOMMANDS:
        module = _subcommand(name)
        if module is not None:
            module.register(subparsers)
    return parser


def main(argv=None):
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the subcommand's own usage error, pointing at its --help
        parser._subparsers._group_actions[0].choices[args.command].error(
            f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args) or 0
    except TraceError as e:
        print(f"dftrace-dynamo {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # Output piped into `head` and closed: not an error. Point stdout at
        # devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # unreadable input, full disk...: one line, no traceback
        where = f": {e.filename}" if e.filename else ""
        print(f"dftrace-dynamo {args.command}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dftrace-dynamo {args.command}: interrupted", file=sys.stderr)
        return 130
