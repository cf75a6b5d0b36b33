"""Synthetic training-loop traces with step structure, written by the real C
writer (``_core``) in the documented vocabulary: per step a ``step N`` slice
(cat ``step``) holding ``data``, the forward graph slice with module slices and
op events inside, ``backward`` holding the backward graph and its ops, and the
optimizer's ``Adam.step``/``Adam.zero_grad``; every event carries
``args.step``. Step 0 compiles (Dynamo frame compile, backend, lazy backward
compile); options add a recompile, graph breaks, an injected cost and jitter.

    python tests/scripts/stepgen.py PREFIX --steps 20 [--layers 4] [--slow 3-5:20]
        [--recompile-at N] [--graph-break] [--jitter PCT] [--seed|--rng S] [--rank R] [--sleep-ms MS]
        [--clock-offset-ns NS]

Prints the path of the trace written (``PREFIX-<host hash>-<pid>.pfw.gz``).
"""

import argparse
import os
import random
import sys
import time

MS = 1_000_000
# (op name, duration ns) per layer, forward and backward; module "layers.<i>"
FORWARD_OPS = [("function.t.default", 900), ("function.addmm.default", 14_000), ("function.relu.default", 2_100)]
BACKWARD_OPS = [("function.threshold_backward.default", 2_600), ("function.mm.default", 12_700),
                ("function.sum.dim_IntList", 1_800)]
SLOW_MODULE = 1  # the layer whose relu gets the injected cost


class Loop:
    """Writes the events of one process's training loop through ``_core``."""

    def __init__(self, core, args):
        self.core, self.a = core, args
        self.rng = random.Random(args.seed)
        self.t = core.now_ns() + MS
        self.node = 0

    def log(self, name, cat, start, end, **args):
        self.core.log(name, cat, start, end, args)

    def dur(self, ns):
        """``ns`` with the step-to-step jitter applied."""
        return max(1, int(ns * (1 + self.rng.uniform(-1, 1) * self.a.jitter / 100)))

    def graph(self, step, phase, ops, extra_ns=0):
        """A graph slice with one module slice per layer holding its ops."""
        start = self.t
        self.t += 2_000
        for layer in range(self.a.layers):
            module, m_start = f"layers.{layer}", self.t
            for node, (name, ns) in enumerate(ops):
                self.t += 500
                cost = self.dur(ns)
                if layer == SLOW_MODULE and name == "function.relu.default":
                    cost += extra_ns
                self.log(name, "dynamo", self.t, self.t + cost, graph=0, node=f"{name.split('.')[1]}_{node}",
                         module=module, grad_enabled=int(phase == "forward"), phase=phase, step=step)
                self.t += cost
            self.t += 300
            self.log(module, "module", m_start, self.t, module_type="Linear", graph=0, phase=phase, step=step)
        self.t += 2_000
        self.log(f"graph 0 {phase}", "dynamo_graph", start, self.t, graph=0, phase=phase, step=step)

    def compile(self, step, name, ms, **args):
        start = self.t
        self.t += ms * MS
        self.log(name, "dynamo_compile", start, self.t, step=step, **args)

    def step(self, n):
        a, step_start = self.a, self.t
        location = "train.py:42"
        self.t += self.dur(200_000)
        start = self.t
        self.t += self.dur(a.data_us * 1000)
        self.log("data", "data", start, self.t, step=n)
        if n == 0 or n == a.recompile_at:
            if n:
                self.log("recompile", "dynamo_compile", self.t, self.t, kind="recompile", step=n,
                         reason="tensor 'x' size mismatch at index 0. expected 8, actual 4",
                         frame="forward", location=location, compile_id="0/1")
            c_start = self.t
            self.t += 1000
            if a.graph_break and n == 0:
                self.log("graph break", "dynamo_compile", self.t, self.t, kind="graph_break", step=n,
                         reason="Unsupported: builtin print", location="train.py:57", frame="forward",
                         compile_id="0/0")
            self.compile(n, "backend graph 0", 40, kind="backend", graph=0, level="aten")
            self.log("dynamo compile forward", "dynamo_compile", c_start, self.t, kind="compile", step=n,
                     frame="forward", location=location, compile_id=f"0/{int(n > 0)}", trigger="dynamo",
                     graph_breaks=int(a.graph_break and n == 0))
        slow = a.slow_ms * MS if a.slow_from <= n <= a.slow_to else 0
        self.graph(n, "forward", FORWARD_OPS, slow)
        self.t += self.dur(150_000)  # loss, Python between the phases
        start = self.t
        self.t += 5_000
        if n == 0:
            self.compile(n, "compile (lazy_backward)", 30, kind="compile", trigger="lazy_backward")
        self.graph(n, "backward", BACKWARD_OPS)
        self.t += 5_000
        self.log("backward", "backward", start, self.t, step=n)
        start = self.t
        self.t += self.dur(a.optimizer_us * 1000)
        self.log("Adam.step", "optimizer", start, self.t, optimizer="Adam", step=n)
        start = self.t
        self.t += self.dur(20_000)
        self.log("Adam.zero_grad", "optimizer", start, self.t, optimizer="Adam", step=n)
        self.t += self.dur(100_000)
        self.log(f"step {n}", "step", step_start, self.t, step=n)


def parse_range(text):
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=4, help="modules per graph (3 ops each, forward and backward)")
    ap.add_argument("--slow", default="", metavar="A-B:MS", help="add MS ms to layers.1's relu in steps A..B")
    ap.add_argument("--recompile-at", type=int, default=-1, metavar="N", help="a recompile in step N")
    ap.add_argument("--graph-break", action="store_true", help="a graph break in step 0's compile")
    ap.add_argument("--jitter", type=float, default=2.0, metavar="PCT", help="random +-PCT%% on durations")
    ap.add_argument("--data-us", type=int, default=3000)
    ap.add_argument("--optimizer-us", type=int, default=800)
    ap.add_argument("--seed", "--rng", dest="seed", type=int, default=0, help="the random durations' start state")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--sleep-ms", type=int, default=0, help="real time between steps (the writer's checkpoints)")
    ap.add_argument("--clock-offset-ns", type=int, metavar="NS",
                    help="a clock record (events/clock.py): rank R's clock R*NS ns from rank 0's, error 1 µs")
    a = ap.parse_args()
    steps, _, ms = a.slow.partition(":")
    a.slow_from, a.slow_to = parse_range(steps) if steps else (1, 0)
    a.slow_ms = int(ms or 0)
    if a.rank is not None:
        os.environ["RANK"] = str(a.rank)
    from dftrace_dynamo import _core
    from dftrace_dynamo.session import logger

    logger.initialize_log(a.prefix)
    path = _core.path()
    if path is None:
        sys.exit("stepgen: tracing is off (DFTRACER_ENABLE=0?)")
    if a.clock_offset_ns is not None:
        now = _core.now_ns()
        _core.log("clock", "dftracer", now, now, {"rank": a.rank or 0, "clock_offset_ns": (a.rank or 0) * a.clock_offset_ns,
                                                  "clock_error_ns": 1000}, timed=True)
    loop = Loop(_core, a)
    for n in range(a.steps):
        loop.step(n)
        time.sleep(a.sleep_ms / 1000)
    logger.finalize()
    print(path)


if __name__ == "__main__":
    main()
