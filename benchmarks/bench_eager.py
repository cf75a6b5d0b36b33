"""Cost of eager-op events next to torch.profiler's, per eager op, on the same eager workload.

The workload is one training iteration of a small eager model (Linear, LSTM, Linear, the loss
outside the model, ``loss.backward()``, Adam with ``foreach=True``; CPU, one thread): about
100 top-level ATen ops per iteration, forward, backward and optimizer. Three ways, in one
process, on the same model:

* ``plain``: no trace file, no profiler;
* ``dftrace``: a trace file open (``DFTRACER_ENABLE=1``), eager-op events recorded (``DFTRACER_EAGER_OPS=1``)
  with their module paths and the eager modules' slices;
* ``dftrace no paths``: the same without the global module hooks (no module paths or slices);
* ``profiler``: ``torch.profiler.profile(activities=[CPU], record_shapes=False)`` running
  around the iterations (its collection only);
* ``profiler+stop``: the same, with its ``stop()`` (the events it builds) counted, as the
  trace writer's thread is counted for ``dftrace``.

``compiled``: a compiled MLP (``backend="dftrace"``, 9 ops per call, inference) traced with
eager-op events on and with them off (``DFTRACER_EAGER_OPS=0``'s state): what they add to a
compiled graph's ops.

Two measures::

    python benchmarks/bench_eager.py time [--rounds 15] [--iters 40]
    python benchmarks/bench_eager.py callgrind [--iters 20]

``time``: paired blocks of ``--iters`` iterations, the ways in turn, ``perf_counter_ns``
around each block; the median over rounds of each way's extra ns per eager op over
``plain`` (each round's difference, paired). ``callgrind``: the script again under
``valgrind --tool=callgrind`` (benchmarks/callgrind_costs.py's client requests), N and 2N
iterations per way, the difference per iteration over all threads (the trace writer's and
the profiler's included), divided by the eager ops per iteration. Results:
benchmarks/results_eager.rst.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def workload():
    import torch
    import torch.nn as nn

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.lstm, self.l2 = nn.Linear(16, 16), nn.LSTM(16, 16), nn.Linear(16, 1)

        def forward(self, x):
            y, _ = self.lstm(self.l1(x).relu())
            return self.l2(y)

    model = Model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    x, y = torch.randn(4, 2, 16), torch.randn(4, 2, 1)

    def iteration():
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()

    return iteration


def compiled_workload():
    import torch
    import torch.nn as nn

    model = torch.compile(nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16), nn.GELU(),
                                        nn.Linear(16, 4)), backend="dftrace")
    x = torch.randn(2, 16)

    def call():
        with torch.no_grad():
            model(x)

    return call


class Ways:
    """Switches between the ways in one process (the trace file stays open)."""

    def __init__(self, trace_dir):
        import torch

        from dftrace_dynamo import dftracer
        from dftrace_dynamo.backend import tracer  # noqa: F401  (the eager-op hooks)
        from dftrace_dynamo.events import eager

        self.torch, self.eager = torch, eager
        self.log = dftracer.initialize_log(os.path.join(trace_dir, "bench"), None, -1)
        self.iteration, self.call = workload(), compiled_workload()
        for _ in range(3):
            self.iteration(), self.call()
        self.ops_per_iteration = self.count()

    def count(self):
        from dftrace_dynamo import _core

        seen = _core.eager_stats()["seen"]
        self.iteration()
        return _core.eager_stats()["seen"] - seen

    def profiler(self):
        prof = self.torch.profiler.profile(activities=[self.torch.profiler.ProfilerActivity.CPU],
                                           record_shapes=False)
        prof.start()
        return prof

    def run(self, way, n):
        """ns of n iterations of the way (``profiler``: a profiler already running;
        ``profiler+stop``: started here and stopped with the events it builds)."""
        fn = self.call if way.startswith("compiled") else self.iteration
        if way in ("plain", "compiled off"):
            self.eager._stop()
        elif way.endswith("no paths"):
            self.eager._modules_off()
        try:
            prof = self.profiler() if way == "profiler+stop" else None
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            t1 = time.perf_counter_ns()
            if prof is not None:
                prof.stop()
        finally:
            if way in ("plain", "compiled off"):
                self.eager._start()
            elif way.endswith("no paths"):
                self.eager._modules_on()
        return t1 - t0


WAYS = ("plain", "dftrace", "dftrace no paths", "profiler", "profiler+stop")
COMPILED = ("compiled on", "compiled off", "compiled no paths")


def label(way):
    return way.replace(" ", "_").replace("+", "_")


def measure_time(args):
    with tempfile.TemporaryDirectory() as tmp:
        ways = Ways(tmp)
        n = ways.ops_per_iteration
        extra = {w: [] for w in WAYS[1:]}
        plain_ns = []
        for r in range(args.rounds):
            order = WAYS if r % 2 == 0 else WAYS[::-1]
            ns = {}
            for w in order:
                prof = ways.profiler() if w == "profiler" else None
                ns[w] = ways.run(w, args.iters) / args.iters
                if prof is not None:
                    prof.stop()
            plain_ns.append(ns["plain"])
            for w in WAYS[1:]:
                extra[w].append((ns[w] - ns["plain"]) / n)
        ways.log.finalize()
    print(f"eager ops per iteration: {n}; plain: {statistics.median(plain_ns) / 1e3:.1f} µs per iteration")
    for w in WAYS[1:]:
        q = statistics.quantiles(extra[w], n=4)
        print(f"  {w:15s} +{statistics.median(extra[w]):8.0f} ns per eager op (quartiles {q[0]:.0f} .. {q[2]:.0f})")


def inner(args):
    sys.path.insert(0, HERE)
    import callgrind_costs as cc

    cg = cc.helper(args.tmp)
    with tempfile.TemporaryDirectory() as tmp:
        ways = Ways(tmp)
        print(f"META ops={ways.ops_per_iteration}")
        cg.cg_start()
        for way in (*COMPILED, *WAYS):
            prof = ways.profiler() if way == "profiler" else None
            cc.section(cg, label(way), lambda k, way=way: ways.run(way, k), args.iters)
            if prof is not None:
                prof.stop()
        cg.cg_stop()
        ways.log.finalize()


def measure_callgrind(args):
    sys.path.insert(0, HERE)
    import callgrind_costs as cc

    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--instr-atstart=no",
               f"--callgrind-out-file={tmp}/callgrind.out.%p", sys.executable, os.path.abspath(__file__),
               "callgrind", "--inner", "--tmp", tmp, "--iters", str(args.iters)]
        env = dict(os.environ, DFTRACER_ENABLE="1", DFTRACER_EAGER_OPS="1", ATEN_CPU_CAPABILITY="avx2",
                   PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        meta = next((ln for ln in proc.stdout.splitlines() if ln.startswith("META ")), None)
        if proc.returncode != 0 or meta is None:
            sys.exit(f"callgrind run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        n = int(meta.split("=")[1])
        dumps = cc.read_dumps(tmp)

    def per_iteration(way, main):
        """instructions per iteration: of the calling thread (main) or of all threads"""
        def total(reps):
            return sum(d.total for t, d in dumps[f"{label(way)}:{reps}"].items() if t == 1 or not main)
        return (total(2 * args.iters) - total(args.iters)) / args.iters

    per = {w: per_iteration(w, False) for w in (*WAYS, *COMPILED)}
    main_thread = {w: per_iteration(w, True) for w in WAYS}
    print(f"eager ops per iteration: {n}; plain: {per['plain']:.0f} instructions per iteration (all threads)")
    print("extra instructions per eager op:      all threads   calling thread")
    for w in WAYS[1:]:
        print(f"  {w:15s} {(per[w] - per['plain']) / n:18.0f} {(main_thread[w] - main_thread['plain']) / n:16.0f}")
    print(f"compiled MLP (9 ops per call): eager-op events on {per['compiled on']:.0f}, off "
          f"{per['compiled off']:.0f} instructions per call: {per['compiled on'] - per['compiled off']:+.0f} "
          f"({per['compiled no paths'] - per['compiled off']:+.0f} without the module paths)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("measure", choices=("time", "callgrind"))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.inner:
        inner(args)
    elif args.measure == "time":
        os.environ.setdefault("DFTRACER_ENABLE", "1")
        os.environ.setdefault("DFTRACER_EAGER_OPS", "1")
        measure_time(args)
    else:
        measure_callgrind(args)


if __name__ == "__main__":
    main()
