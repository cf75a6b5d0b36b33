"""``summary`` from the aggregate records the trace writer stores, at scale (issue 20 §1):
``--files`` stepgen rank files of one run written by the C writer (1,000 steps x 60 layers,
~487 k events each, a recompile in step 7), summarised in process (best of ``--repeat``, per
file, CPU seconds of this process beside) and end to end by the command (interpreter start
included, one run).

    python benchmarks/bench_scale.py [--files 4] [--dir DIR] [--repeat 3] [--processes N] [--no-cli]
        [--format table|json|csv]

The files are written once into DIR (generation takes ~3 s per file) and kept.
``--processes``: how many processes read the records in process (default 1; the command
uses one per core from 16 files up). Prints the figures, with the load average and the cost
of one ``time.perf_counter_ns()`` call. Another tree: ``PYTHONPATH=/tmp/before/src python ...``.
"""

import argparse
import glob
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from scripts.clitools import CLI  # noqa: E402

from dftrace_dynamo.traces.summary import summarize  # noqa: E402

STEPGEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "scripts", "stepgen.py")


def rank_files(directory, files):
    """The ``files`` rank files in ``directory``, written where missing."""
    os.makedirs(directory, exist_ok=True)
    env = dict(os.environ, DFTRACER_ENABLE="1", DFTRACER_RUN_ID="scale")
    paths = []
    for r in range(files):
        found = glob.glob(os.path.join(directory, f"job-rank{r}-*.pfw.gz"))
        if not found:
            print(f"writing rank {r}", file=sys.stderr)
            found = [subprocess.run([sys.executable, STEPGEN, os.path.join(directory, "job"), "--steps", "1000",
                                     "--layers", "60", "--rank", str(r), "--rng", str(r), "--recompile-at", "7"],
                                    env=env, capture_output=True, text=True, check=True).stdout.strip()]
        paths.append(found[0])
    return paths


def timer_cost_ns(n=100_000):
    start = time.perf_counter_ns()
    for _ in range(n):
        time.perf_counter_ns()
    return (time.perf_counter_ns() - start) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--dir", default="/tmp/dftrace-bench-scale")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--no-cli", action="store_true", help="only the in-process timing")
    ap.add_argument("--format", default="table", help="the command's --format (json writes every rank's "
                    "every step: ~0.01 s per file more, Python's json with indent)")
    a = ap.parse_args()
    paths = rank_files(a.dir, a.files)
    size = sum(os.path.getsize(p) for p in paths)
    print(f"{len(paths)} files, {size / 2**20:,.0f} MiB; load average before: {os.getloadavg()}; "
          f"perf_counter_ns() {timer_cost_ns():.0f} ns per call")
    walls, cpus = [], []
    for _ in range(a.repeat):
        wall, cpu = time.perf_counter_ns(), time.process_time()
        # (processes=1 is the default: left out, a tree from before it existed runs too)
        result = summarize(paths, **({"processes": a.processes} if a.processes != 1 else {}))
        walls.append((time.perf_counter_ns() - wall) / 1e9)
        cpus.append(time.process_time() - cpu)
    assert result["scan"]["source"] == "aggregates", result["scan"]
    best = min(walls)
    print(f"in process, {a.processes} reading process(es): best {best:.2f} s of {[round(w, 2) for w in walls]}, "
          f"{best / len(paths):.4f} s per file; CPU of this process {min(cpus):.2f} s")
    if not a.no_cli:
        load = os.getloadavg()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = time.perf_counter_ns()
        p = subprocess.run([*CLI, "summary", "--format", a.format, *paths], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
        wall = (time.perf_counter_ns() - wall) / 1e9
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert p.returncode == 0 and "aggregate records" in p.stderr, p.stderr[-2000:]
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime  # all its processes
        print(f"command (--format {a.format}), end to end: {wall:.2f} s, {wall / len(paths):.4f} s per file; CPU of all its processes "
              f"{cpu:.2f} s ({cpu / len(paths):.4f} s per file); largest resident set {after.ru_maxrss >> 10} MiB; "
              f"load average before {load}, after {os.getloadavg()}")


if __name__ == "__main__":
    main()
