"""Two builds of dftrace_dynamo on the same workloads in one run: per-op and per-module-call cost.

Run (pinned to one core, as in benchmarks/results_overhead.rst)::

    taskset -c 1 python3 benchmarks/bench_compare.py --baseline 887cdda

The baseline revision is exported with ``git archive`` into a temporary directory and
its C extension built there (``setup.py build_ext --inplace``); the candidate is this
working tree as built (``--candidate REV`` builds another revision the same way). Each
build runs in its own worker process (``PYTHONPATH`` pointing at its ``src``) that
compiles every workload three ways: traced by our backend, untraced
(``backend="eager"`` at torch level, ``"aot_eager"`` at ATen level) and, where the build
has module slices, traced with them off. The driver then asks the two workers for one
round at a time, alternating which build goes first (A B, B A, ...); in a round a worker
times one block of each variant, in alternating order too. Both workers sit on the same
core (the affinity is inherited); the one not asked waits on its pipe.

Per build and round: ``per op`` = (traced − untraced) per call / ops per call, ``per
module call`` = (slices on − slices off) per call / module calls (slices) per call.
Ops are the instrumented ops, not the module-slice boundary calls; boundaries are
counted whether they are calls of their own or folded into an op's interceptor
(``bench_modules.graph_counts``). The
report gives, for each build, the median of these over rounds with their IQR (how much
one round varies) and the distribution-free 95 % interval of the median (how well the
median is known: a target is met only where that interval lies below it), and for the
candidate minus the baseline the same of the paired per-round differences. Times
are CPU time of the worker process (``time.process_time_ns``: the trace writer thread
included, other processes not), or with ``--timer thread`` of its calling thread alone
(what the user's thread pays; the writer's work is then left out). The ``perf_counter_ns()`` cost and the load average
are printed with every run: they say how loaded the machine was.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_modules import graph_counts  # noqa: E402
from bench_overhead import CLOCKS, clock_call_ns, median_ci, run, time_block, workload  # noqa: E402


# ---- builds ------------------------------------------------------------------------------------

def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], check=True, capture_output=True, text=True).stdout.strip()


def build(rev, tmp):
    """Exports ``rev`` into ``tmp`` and builds its extension there; returns its ``src`` directory."""
    dest = os.path.join(tmp, rev.replace("/", "_"))
    os.makedirs(dest)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=dest, check=True,
                   capture_output=True)
    return os.path.join(dest, "src")


def describe(rev):
    if rev is None:
        dirty = " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no", "--", "csrc",
                                                "src") else ""
        return f"working tree (HEAD {git('rev-parse', '--short=9', 'HEAD')}{dirty})"
    return f"{git('rev-parse', '--short=9', rev)} ({git('log', '-1', '--format=%s', rev)[:60]})"


# ---- worker (runs inside one build) ---------------------------------------------------------------

class Worker:
    """Compiles the workloads with this process's build and times rounds of blocks."""

    def __init__(self, keys, trace_dir):
        import torch

        import dftrace_dynamo

        torch.set_num_threads(1)
        dftrace_dynamo.initialize_log(os.path.join(trace_dir, "bench"))
        self.cases = {}
        for key in keys:
            wname, level = key.split("/")
            fn, inputs, train, calls = workload(wname)
            self.cases[key] = self._prepare(fn, inputs, train, level) + (calls,)

    @staticmethod
    def _compile(fn, backend):
        import torch

        return torch.compile(copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn, backend=backend)

    def _prepare(self, fn, inputs, train, level):
        from dftrace_dynamo import create_backend

        try:
            from dftrace_dynamo.session import config
        except ImportError:  # builds before the package was grouped into session/, backend/...
            from dftrace_dynamo import config

        graphs = []

        def on_graph(gm, example_inputs, info):
            if info["level"] == level:
                graphs.append(gm)

        def counted(slices):
            saved = config.get()
            if slices is not None:
                config._config = dataclasses.replace(saved, module_slices=slices)
            try:
                f = self._compile(fn, create_backend(level=level, on_graph=on_graph))
                graphs.clear()
                run(f, inputs, train)  # instruments during the first call
            finally:
                config._config = saved
            return (f, *graph_counts([n for gm in graphs for n in gm.graph.nodes]))

        variants = {"base": self._compile(fn, "eager" if level == "torch" else "aot_eager")}
        has_slices = any(f.name == "module_slices" for f in dataclasses.fields(config.get()))
        variants["traced"], ops, boundaries, mods = counted(True if has_slices else None)
        if has_slices and mods:
            variants["noslices"], *_ = counted(False)
        calls = {k: (lambda f=f: run(f, inputs, train)) for k, f in variants.items()}
        for _ in range(3):  # warm up
            for call in calls.values():
                call()
        return calls, {"ops": ops, "boundaries": boundaries, "mods": mods, "variants": sorted(calls)}

    def info(self):
        return {key: counts for key, (_, counts, _) in self.cases.items()}

    def round(self, key, block_calls, flip, timer):
        calls, _, default_calls = self.cases[key]
        n = block_calls or default_calls
        clock = CLOCKS[timer]
        return {name: time_block(calls[name], n, clock) / n for name in sorted(calls, reverse=flip)}


def worker_main():
    worker = None
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "init":
            worker = Worker(cmd["keys"], cmd["trace_dir"])
            reply = {"info": worker.info()}
        elif cmd["op"] == "round":
            reply = worker.round(cmd["key"], cmd["block_calls"], cmd["flip"], cmd["timer"])
        elif cmd["op"] == "clock":
            reply = {"clock": clock_call_ns()}
        else:
            break
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


class Child:
    def __init__(self, name, src, keys, trace_dir):
        env = dict(os.environ, PYTHONPATH=src, DFTRACER_ENABLE="1", DFTRACER_DISABLE_IO="1")
        env.pop("DFTRACER_MODULE_SLICES", None)
        self.name = name
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=trace_dir)
        self.info = self.ask(op="init", keys=keys, trace_dir=trace_dir)["info"]

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"the {self.name} worker failed (see its traceback above)")
        return json.loads(line)

    def close(self):
        self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
        self.proc.stdin.close()
        self.proc.wait()


# ---- driver ---------------------------------------------------------------------------------------

def stats(values):
    q1, med, q3 = statistics.quantiles(values, n=4)
    return statistics.median(values), q1, q3


def fmt(values, unit="ns"):
    if not values:
        return "-"
    med, q1, q3 = stats(values)
    low, high = median_ci(values)
    return f"{med:7.1f} {unit} (IQR {q1:.1f}..{q3:.1f}; median's 95% CI {low:.1f}..{high:.1f})"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", help="git revision of the baseline build (required)")
    p.add_argument("--candidate", help="git revision of the candidate (default: this working tree as built)")
    p.add_argument("--workloads", default="elem,mlp")
    p.add_argument("--levels", default="torch,aten")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--block-calls", type=int, help="calls per timed block (default: per workload)")
    p.add_argument("--timer", choices=sorted(CLOCKS), default="process",
                   help="CPU time of the worker process (the trace writer thread included, the default) or of "
                        "its calling thread only")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    if not args.baseline:
        p.error("--baseline REV is required")
    import torch

    tmp = tempfile.mkdtemp(prefix="bench_compare_")
    keys = [f"{w}/{lv}" for w in args.workloads.split(",") for lv in args.levels.split(",")]
    print(f"baseline  A: {describe(args.baseline)}")
    print(f"candidate B: {describe(args.candidate)}")
    srcs = {"A": build(args.baseline, tmp),
            "B": build(args.candidate, tmp) if args.candidate else os.path.join(ROOT, "src")}
    affinity = sorted(os.sched_getaffinity(0))
    print(f"torch {torch.__version__}, affinity {affinity}, rounds {args.rounds}, {args.timer} CPU time, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if len(affinity) > 1:
        print("warning: not pinned to one core (run under taskset -c 1)")
    children = {}
    for name in ("A", "B"):
        trace_dir = os.path.join(tmp, f"trace_{name}")
        os.makedirs(trace_dir)
        children[name] = Child(name, srcs[name], keys, trace_dir)
    clocks = [clock_call_ns()]
    per_op = {k: {"A": [], "B": [], "d": []} for k in keys}
    per_span = {k: {"A": [], "B": [], "d": []} for k in keys}
    for r in range(args.rounds):
        for key in keys:
            order = ("A", "B") if r % 2 == 0 else ("B", "A")
            res = {name: children[name].ask(op="round", key=key, block_calls=args.block_calls, flip=r % 4 >= 2,
                                            timer=args.timer)
                   for name in order}
            ops = {n: children[n].info[key]["ops"] for n in "AB"}
            mods = {n: children[n].info[key]["mods"] for n in "AB"}
            op_cost = {n: (res[n]["traced"] - res[n]["base"]) / ops[n] for n in "AB"}
            for n in "AB":
                per_op[key][n].append(op_cost[n])
            per_op[key]["d"].append(op_cost["B"] - op_cost["A"])
            span_cost = {n: (res[n]["traced"] - res[n]["noslices"]) / mods[n] for n in "AB" if "noslices" in res[n]}
            for n, v in span_cost.items():
                per_span[key][n].append(v)
            if len(span_cost) == 2:
                per_span[key]["d"].append(span_cost["B"] - span_cost["A"])
        if r % 10 == 9:
            clocks.append(clock_call_ns())
    for child in children.values():
        child.close()
    print(f"perf_counter_ns() call: {min(clocks):.0f}..{max(clocks):.0f} ns over the run (68-72 ns idle); "
          f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for key in keys:
        ia, ib = children["A"].info[key], children["B"].info[key]
        print(f"\n{key}: ops/call A {ia['ops']} B {ib['ops']}, module calls/call A {ia['mods']} B {ib['mods']}, "
              f"module boundaries/call A {ia['boundaries']} B {ib['boundaries']}")
        print(f"  per op         A {fmt(per_op[key]['A'])}   B {fmt(per_op[key]['B'])}")
        print(f"  per op B - A     {fmt(per_op[key]['d'])}")
        if per_span[key]["A"] or per_span[key]["B"]:
            print(f"  per module call A {fmt(per_span[key]['A'])}   B {fmt(per_span[key]['B'])}")
            if per_span[key]["d"]:
                print(f"  per module call B - A {fmt(per_span[key]['d'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
