"""Helpers shared by the subcommands."""

import os
import sys


def interactive():
    """True when stderr is a terminal and not a CI log: progress bars only then."""
    return sys.stderr.isatty() and not os.environ.get("CI")


def progress_bar(total, desc, unit="B"):
    """A tqdm bar on stderr, shown after half a second on a terminal only; a
    disabled (no-op) bar otherwise."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", leave=False,
                delay=0.5, file=sys.stderr, disable=not interactive())


def warn(command, message):
    print(f"dftrace-dynamo {command}: warning: {message}", file=sys.stderr)
