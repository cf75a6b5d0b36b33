"""``summary`` on the local engine, on the Dask engine (``--engine dask``) and from aggregate
records, over 8 rank files written by the C writer (tests/scripts/stepgen.py, as
bench_summary.py's step traces).

    python benchmarks/bench_engines.py [--events 2000000] [--files 8] [--workers 2] [--repeat 3] [--dir DIR]
    python benchmarks/bench_engines.py --traces 'DIR/ranks-10000000-of20-rank*.pfw.gz' --no-aggregates
    python benchmarks/bench_engines.py --traces 'DIR/ranks-10000000-of20-rank*.pfw.gz' --paired 5

Times :func:`dftrace_dynamo.traces.summary.summarize` in this process (no interpreter start),
wall time by ``time.perf_counter_ns()`` (its own cost is printed), after one warm-up call per
variant (file cache, imports); CPU time of this process and, for Dask, of its workers. The
Dask cluster is a LocalCluster of ``--workers`` worker processes started once (its start-up
time is printed apart). The aggregates variant reads copies of the files that hold their
aggregate record (traces.aggregates.write; the time to add them is printed apart). Prints
an RST table with the 1-minute load average before each variant: on a shared machine,
compare only rows measured at a similar load, and prefer the CPU column.

``--paired N``: local against Dask (``--workers``) the way drift cancels, N pairs of blocks in
the order A B, B A, ...: in this process (the cluster started once) and as the commands a user
types (``summary --source events`` against ``summary --source events --engine dask --workers
W``: interpreter, imports and the cluster's start included; CPU of the command and its worker
processes). Prints each side's median and the median of the paired differences with the ratio.
"""

import argparse
import glob
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_summary import CLI, step_trace  # noqa: E402

from dftrace_dynamo.traces import aggregates  # noqa: E402
from dftrace_dynamo.traces.engines import Dask  # noqa: E402
from dftrace_dynamo.traces.summary import summarize  # noqa: E402


def timer_cost_ns(n=200_000):
    t0 = time.perf_counter_ns()
    for _ in range(n):
        time.perf_counter_ns()
    return (time.perf_counter_ns() - t0) / n


def _worker_cpu(engine):
    return sum(engine.client.run(time.process_time).values()) if engine else 0.0


def measure(paths, repeat, engine=None, source="events"):
    """(wall times (s), CPU seconds per run, op events) of ``repeat`` summaries after one warm-up."""
    result = summarize(paths, all_runs=True, engine=engine, source=source)
    assert result["scan"]["source"] == source
    times = []
    cpu0 = time.process_time() + _worker_cpu(engine)
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        summarize(paths, all_runs=True, engine=engine, source=source)
        times.append((time.perf_counter_ns() - t0) / 1e9)
    cpu = (time.process_time() + _worker_cpu(engine) - cpu0) / repeat
    return times, cpu, result["op_events"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=2_000_000, help="events in all files together")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "dftrace-bench-engines"))
    ap.add_argument("--traces", metavar="GLOB", help="these trace files instead of written ones (bench_summary.py's "
                    "20 rank files: its --dir, ranks-*-of20-rank*.pfw.gz)")
    ap.add_argument("--no-aggregates", action="store_true", help="leave out the aggregate-records variant")
    ap.add_argument("--paired", type=int, metavar="N", help="N pairs of local and Dask blocks (see above), only")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    paths = sorted(glob.glob(a.traces)) if a.traces else [
        step_trace(a.events // a.files, a.dir, f"rank{r}", "--rank", str(r), "--seed", str(r)) for r in range(a.files)]
    a.files = len(paths)
    size = sum(os.path.getsize(p) for p in paths) / 2**20
    print(f"perf_counter_ns() cost: {timer_cost_ns():.0f} ns per call", file=sys.stderr)
    if a.paired:
        return paired(paths, a.paired, a.workers)
    rows = []
    load = os.getloadavg()[0]
    times, cpu, ops = measure(paths, a.repeat)
    rows.append(("local, events", load, times, cpu))
    t0 = time.perf_counter_ns()
    with Dask(workers=a.workers) as engine:
        start_s = (time.perf_counter_ns() - t0) / 1e9
        load = os.getloadavg()[0]
        times, cpu, dask_ops = measure(paths, a.repeat, engine)
        rows.append((f"dask ({a.workers} worker processes), events", load, times, cpu))
    assert dask_ops == ops
    if a.no_aggregates:
        return table(rows)
    agg_dir = os.path.join(a.dir, "with-aggregates")
    os.makedirs(agg_dir, exist_ok=True)
    t0 = time.perf_counter_ns()
    agg_paths = []
    for p in paths:
        agg_paths.append(os.path.join(agg_dir, os.path.basename(p)))
        if not os.path.exists(agg_paths[-1]):
            shutil.copy(p, agg_paths[-1])
            aggregates.write(agg_paths[-1])
    write_s = (time.perf_counter_ns() - t0) / 1e9
    load = os.getloadavg()[0]
    times, cpu, agg_ops = measure(agg_paths, a.repeat, source="aggregates")
    rows.append(("local, aggregate records", load, times, cpu))
    assert agg_ops == ops
    record_mib = sum(len(str(aggregates.read(p))) for p in agg_paths) / len(agg_paths) / 2**20
    print(f"{a.files} files, {size:.0f} MiB gzip, {ops:,} op events; Dask cluster start {start_s:.1f} s; "
          f"adding the aggregate records {write_s:.1f} s (0 s when cached), about {record_mib:.2f} MiB of "
          "JSON per record", file=sys.stderr)
    table(rows)


def paired(paths, pairs, workers):
    """Local against Dask in ``pairs`` pairs of blocks, A B then B A, in this process and as commands."""
    def in_process(engine):
        summarize(paths, all_runs=True, engine=engine, source="events")

    def command(engine):
        extra = ["--engine", "dask", "--workers", str(workers)] if engine else []
        subprocess.run([*CLI, "summary", "--all-runs", "--source", "events", "--format", "json", *extra, *paths],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    with Dask(workers=workers) as engine:
        _pairs("in this process (cluster started once)", in_process, (None, engine), pairs)
    _pairs(f"commands (--workers {workers}: the cluster's start included)", command, (None, True), pairs)


def _pairs(name, run, engines, pairs):
    """``run(engines[side])`` in ``pairs`` pairs, A B then B A; prints the medians and paired differences."""
    def cpu(side):  # this process, its ended children, an in-process cluster's workers
        return _cpu() + (_worker_cpu(engines[side]) if isinstance(engines[side], Dask) else 0)

    for engine in engines:  # warm-up: file cache, imports, the workers' imports
        run(engine)
    walls, cpus = ([], []), ([], [])
    for i in range(pairs):
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            load, cpu0 = os.getloadavg()[0], cpu(side)
            t0 = time.perf_counter_ns()
            run(engines[side])
            walls[side].append((time.perf_counter_ns() - t0) / 1e9)
            cpus[side].append(cpu(side) - cpu0)
            print(f"  {name}, pair {i}: {'dask' if side else 'local'} {walls[side][-1]:.2f} s wall, "
                  f"{cpus[side][-1]:.2f} CPU s, load {load:.1f}", file=sys.stderr)
    diffs = [d - l for l, d in zip(*walls)]
    print(f"{name}: local median {statistics.median(walls[0]):.2f} s ({statistics.median(cpus[0]):.2f} CPU s), "
          f"dask median {statistics.median(walls[1]):.2f} s ({statistics.median(cpus[1]):.2f} CPU s); "
          f"dask - local, median of {pairs} paired differences: {statistics.median(diffs):+.2f} s "
          f"(range {min(diffs):+.2f} .. {max(diffs):+.2f}), ratio {statistics.median(d / l for l, d in zip(*walls)):.3f}")


def _cpu():
    """CPU seconds of this process and its ended children (a command and its worker processes)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def table(rows):
    """The rows as an RST table on standard output."""
    header = ("variant", "best wall s", "median wall s", "CPU s", "load avg")
    widths = [max(len(header[0]), *(len(r[0]) for r in rows)), 11, 13, 6, 8]
    line = " ".join("=" * w for w in widths)
    print(line)
    print(" ".join(h.ljust(w) for h, w in zip(header, widths)))
    print(line)
    for name, load, times, cpu in rows:
        cells = (name, f"{min(times):.2f}", f"{statistics.median(times):.2f}", f"{cpu:.2f}", f"{load:.1f}")
        print(" ".join(c.ljust(w) for c, w in zip(cells, widths)))
    print(line)


if __name__ == "__main__":
    main()
