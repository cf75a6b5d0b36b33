"""Wall time of ``dftrace-dynamo summary`` and ``diff`` on large traces, end to
end (the command as a user runs it: interpreter start, DuckDB scan, all views).

    python benchmarks/bench_summary.py [--ops 10000000] [--repeat 3] [--dir DIR] [--only NAME]

Traces are synthetic and cached in DIR. Without steps (tests/scripts/tracegen.py:
the documented layout, ~245 bytes per op event, graph and compile events around
them): one gzip file, the same events as 8 rank files, one zstd file. With
steps (tests/scripts/stepgen.py, written by the C writer: step slices holding
data, forward graph with module slices and ops, backward, optimizer; --ops
events in all): summary with the step view, and diff of two such traces (the
second with an injected cost). Prints an RST table (best and median wall
time, CPU time, load average).
"""

import argparse
import functools
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from scripts import tracegen  # noqa: E402
from scripts.clitools import CLI  # noqa: E402


STEP_LAYERS = 60  # 8 * 60 + 7 events per step


def step_trace(ops, directory, name, *extra):
    """A stepgen trace of about ``ops`` events (cached)."""
    path = os.path.join(directory, f"steps-{ops}-{name}.pfw.gz")
    if not os.path.exists(path):
        print(f"writing {path}", file=sys.stderr)
        steps = max(ops // (8 * STEP_LAYERS + 7), 2)
        gen = os.path.join(os.path.dirname(tracegen.__file__), "stepgen.py")
        written = subprocess.run([sys.executable, gen, os.path.join(directory, "partial-" + name), "--steps",
                                  str(steps), "--layers", str(STEP_LAYERS), *extra],
                                 capture_output=True, text=True, check=True).stdout.strip()
        os.rename(written, path)
    return path


def flat_traces(ops, directory, suffix, files):
    """A tracegen trace of ``ops`` events in ``files`` rank files (cached)."""
    paths = [os.path.join(directory, f"trace-{ops}-rank{r}-of{files}{suffix}") for r in range(files)]
    for rank, path in enumerate(paths):
        if not os.path.exists(path):
            print(f"writing {path}", file=sys.stderr)
            partial = os.path.join(directory, "partial-" + os.path.basename(path))  # same suffix
            tracegen.write(partial, ops // files, pid=1000 + rank, rank=rank if files > 1 else None)
            os.rename(partial, path)
    return paths


def variants(ops, directory, only=None):
    """name -> (subcommand and arguments, trace files) of the variants whose name holds
    ``only`` (all without it); only their traces are written, once."""
    os.makedirs(directory, exist_ok=True)
    base = functools.partial(step_trace, ops, directory, "base", "--seed", "1")
    new = functools.partial(step_trace, ops, directory, "new", "--seed", "2", "--slow", "0-999999:1")
    makers = {
        "1 file, gzip": (["summary"], lambda: flat_traces(ops, directory, ".pfw.gz", 1)),
        "8 rank files, gzip": (["summary"], lambda: flat_traces(ops, directory, ".pfw.gz", 8)),
        "1 file, zstd": (["summary"], lambda: flat_traces(ops, directory, ".pfw.zst", 1)),
        "steps, 1 file, gzip (step view)": (["summary"], lambda: [base()]),
        "diff of 2 step traces, gzip": (["diff"], lambda: [base(), new()]),
    }
    return {name: (command, make()) for name, (command, make) in makers.items() if not only or only in name}


def run(command, paths):
    """(wall seconds, CPU seconds of the child) of one summary or diff."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    p = subprocess.run([*CLI, *command, "--format", "json", *paths], capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(p.stderr)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=10_000_000, help="op events per variant")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join("/tmp", "dftrace-bench-summary"))
    ap.add_argument("--only", metavar="TEXT", help="only the variants whose name holds TEXT")
    a = ap.parse_args()
    rows = []
    for name, (command, paths) in variants(a.ops, a.dir, a.only).items():
        size = sum(os.path.getsize(p) for p in paths) / 2**20
        load = os.getloadavg()[0]
        runs = [run(command, paths) for _ in range(a.repeat)]
        walls = [w for w, _ in runs]
        rows.append((name, f"{size:,.0f} MiB", f"{min(walls):.2f}", f"{statistics.median(walls):.2f}",
                     f"{min(c for _, c in runs):.2f}", f"{load:.1f}"))
        print(rows[-1], file=sys.stderr)
    head = ("trace", "size", "best wall s", "median wall s", "CPU s", "load avg")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = " ".join("=" * w for w in widths)
    print(f"{a.ops:,} events per trace, {os.cpu_count()} CPUs, {a.repeat} runs each\n")
    print(line)
    for r in [head, None, *rows]:
        print(line if r is None else " ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    print(line)


if __name__ == "__main__":
    main()
