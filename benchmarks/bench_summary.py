"""Wall time, CPU time and peak memory of ``dftrace-dynamo summary`` and ``diff`` on large
traces, end to end (the command as a user runs it: interpreter start, the scan, all views),
and the full scan's own rate (events per CPU second).

    python benchmarks/bench_summary.py [--ops 10000000] [--repeat 3] [--dir DIR] [--only NAME]
    python benchmarks/bench_summary.py --only "20 rank" --stages [--cores 2]

Traces are synthetic and cached in DIR. Without steps (tests/scripts/tracegen.py:
the documented layout, ~245 bytes per op event, graph and compile events around
them): one gzip file, the same events as 8 rank files, one zstd file. With
steps (tests/scripts/stepgen.py, written by the C writer: step slices holding
data, forward graph with module slices and ops, backward, optimizer; --ops
events in all): summary with the step view, diff of two such traces (the
second with an injected cost), and ``summary --source events`` of the same
number of events as 20 rank files of one run. Prints an RST table (best and
median wall time, CPU time of the command, its peak resident memory, load
average), then, per variant, the scan alone in this process (the files into the
event table) as CPU seconds and lines (events) read per CPU second, and
the cost of one ``time.perf_counter_ns()`` call (the machine's load shows in it).

``--stages``: instead, ``summary --source events`` of each variant's files in this process, the
CPU seconds of each stage (the scan into the event table, the op views, the rank view's rows,
the rank analysis, the rest) taken per thread from ``/proc/self/task`` (sampled every 20 ms, so
threads that end are counted), and the wall time the stage would take on ``--cores`` free cores:
its CPU over the cores, or its busiest thread's CPU when that is more (the work of one thread
cannot be split). Wall time measured on a loaded machine says nothing; this does not depend on
the load (beyond the noise the load puts in CPU seconds themselves).
"""
import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
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


def rank_traces(ops, directory, files):
    """``files`` stepgen rank files of one run, about ``ops`` events in all (cached)."""
    steps = max(ops // files // (8 * STEP_LAYERS + 7), 2)
    paths = [os.path.join(directory, f"ranks-{ops}-of{files}-rank{r}.pfw.gz") for r in range(files)]
    gen = os.path.join(os.path.dirname(tracegen.__file__), "stepgen.py")
    for rank, path in enumerate(paths):
        if not os.path.exists(path):
            print(f"writing {path}", file=sys.stderr)
            env = dict(os.environ, DFTRACER_ENABLE="1", DFTRACER_RUN_ID=f"bench{ops}")
            written = subprocess.run([sys.executable, gen, os.path.join(directory, f"partial-r{rank}"), "--steps",
                                      str(steps), "--layers", str(STEP_LAYERS), "--rank", str(rank), "--rng",
                                      str(rank)], env=env, capture_output=True, text=True, check=True).stdout.strip()
            os.rename(written, path)
    return paths


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
        "20 rank files, gzip (--source events)": (["summary", "--source", "events"],
                                                  lambda: rank_traces(ops, directory, 20)),
    }
    return {name: (command, make()) for name, (command, make) in makers.items() if not only or only in name}


def run(command, paths):
    """(wall seconds, CPU seconds, peak resident memory in MiB) of one summary or diff."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        p = subprocess.Popen([*CLI, *command, "--format", "json", *paths], stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)  # this child's own resource use
        wall = time.perf_counter() - start
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            err.seek(0)
            raise SystemExit(err.read().decode())
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def scan_rate(paths):
    """(CPU seconds, table rows) of the scan alone in this process: the files into the event
    table (``events._load``), without the queries that follow it."""
    import duckdb

    from dftrace_dynamo.traces import events

    con = duckdb.connect()
    con.execute("SET preserve_insertion_order = false")  # as events.load
    try:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.process_time()  # every thread of this process: the reader's and DuckDB's
            events._load(con, paths, range(len(paths)), None, None, tmp)
            cpu = time.process_time() - start
        return cpu, con.execute("SELECT count(*) FROM ev").fetchone()[0]
    finally:
        con.close()


def lines_of(paths):
    """The lines (events, ``[``, ``]``) of the files: what the scan reads."""
    from dftrace_dynamo.traces import reader

    return sum(1 for p in paths for _ in reader.Lines(p))


def timer_cost_ns(n=200_000):
    t0 = time.perf_counter_ns()
    for _ in range(n):
        time.perf_counter_ns()
    return (time.perf_counter_ns() - t0) / n


class Stages:
    """CPU seconds per stage and per thread of this process (see ``--stages``)."""

    def __init__(self):
        import threading

        self.tick, self.seen, self.marks, self.lock = os.sysconf("SC_CLK_TCK"), {}, [], threading.Lock()
        threading.Thread(target=self._sampler, daemon=True).start()

    def _sample(self):
        for t in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{t}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # the thread ended
                continue
            self.seen[int(t)] = (int(fields[11]) + int(fields[12])) / self.tick  # utime + stime

    def _sampler(self):
        while True:
            with self.lock:
                self._sample()
            time.sleep(0.02)

    def mark(self, label):
        """Ends the stage named ``label`` (the time since the last mark)."""
        with self.lock:
            self._sample()
            self.marks.append((label, dict(self.seen)))

    def wrap(self, module, name, label):
        """Marks the start and end of each call of ``module.name`` as stage ``label``."""
        function = getattr(module, name)

        @functools.wraps(function)
        def wrapped(*args, **kwargs):
            self.mark("the rest")
            try:
                return function(*args, **kwargs)
            finally:
                self.mark(label)
        setattr(module, name, wrapped)

    def table(self, cores):
        """{stage: (CPU s, busiest thread's CPU s, projected wall s on ``cores`` cores)}."""
        out = {}
        for (_, a), (label, b) in zip(self.marks, self.marks[1:]):
            used = [b[t] - a.get(t, 0) for t in b]
            cpu, busiest = sum(used), max(used)
            row = out.setdefault(label, [0.0, 0.0, 0.0])
            row[0] += cpu
            row[1] = max(row[1], busiest)
            row[2] += max(cpu / cores, busiest)
        return out


def stages(paths, cores):
    """:class:`Stages` of ``summary --source events`` of ``paths`` in this process."""
    from dftrace_dynamo.traces import events, partials, ranks, summary

    s = Stages()
    for module, name, label in ((events, "_load", "scan into the event table"), (partials, "_groups", "op views"),
                                (ranks, "rows", "rank view's rows"), (ranks, "analyse", "rank analysis")):
        s.wrap(module, name, label)
    s.mark("start")
    summary.summarize(paths, source="events")
    s.mark("the rest")
    return s.table(cores)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=10_000_000, help="op events per variant")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join("/tmp", "dftrace-bench-summary"))
    ap.add_argument("--only", metavar="TEXT", help="only the variants whose name holds TEXT")
    ap.add_argument("--stages", action="store_true", help="CPU per stage of summary --source events, in process")
    ap.add_argument("--cores", type=int, default=2, help="with --stages: the cores of the projected wall time")
    a = ap.parse_args()
    if a.stages:
        for name, (_, paths) in variants(a.ops, a.dir, a.only).items():
            load = os.getloadavg()[0]
            rows = [(stage, f"{cpu:.2f}", f"{busiest:.2f}", f"{wall:.2f}")
                    for stage, (cpu, busiest, wall) in stages(paths, a.cores).items()]
            rows.append(("total", f"{sum(float(r[1]) for r in rows):.2f}", "",
                         f"{sum(float(r[3]) for r in rows):.2f}"))
            print(f"\n{name}: CPU per stage, 1-minute load {load:.1f}\n")
            table(("stage", "CPU s", "busiest thread CPU s", f"projected wall s on {a.cores} cores"), rows)
        return
    rows, scans = [], []
    for name, (command, paths) in variants(a.ops, a.dir, a.only).items():
        size = sum(os.path.getsize(p) for p in paths) / 2**20
        load = os.getloadavg()[0]
        runs = [run(command, paths) for _ in range(a.repeat)]
        walls = [w for w, _, _ in runs]
        rows.append((name, f"{size:,.0f} MiB", f"{min(walls):.2f}", f"{statistics.median(walls):.2f}",
                     f"{min(c for _, c, _ in runs):.2f}", f"{max(m for _, _, m in runs):,.0f}", f"{load:.1f}"))
        print(rows[-1], file=sys.stderr)
        (cpu, kept), lines = min(scan_rate(paths) for _ in range(a.repeat)), lines_of(paths)
        scans.append((name, f"{lines:,}", f"{kept:,}", f"{cpu:.2f}", f"{lines / cpu / 1e6:.2f}",
                      f"{timer_cost_ns():.0f}"))
        print(scans[-1], file=sys.stderr)
    print(f"{a.ops:,} events per trace, {os.cpu_count()} CPUs, {a.repeat} runs each\n")
    table(("trace", "size", "best wall s", "median wall s", "CPU s", "peak MiB", "load avg"), rows)
    print("\nThe scan alone (the files into the event table, in this process, best of the runs):\n")
    table(("trace", "lines read", "table rows", "scan CPU s", "M lines/CPU s", "perf_counter_ns() ns"), scans)


def table(head, rows):
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = " ".join("=" * w for w in widths)
    print(line)
    for r in [head, None, *rows]:
        print(line if r is None else " ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    print(line)


if __name__ == "__main__":
    main()
