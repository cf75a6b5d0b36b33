"""Cost of level="inductor" against the same model compiled with plain Inductor.

Each case compiles one model twice in a worker process (``backend="dftrace",
options={"level": "inductor"}`` and ``backend="inductor"``), then times blocks of
calls alternating between the two; a worker's overhead is the median of the paired
per-call differences over the median plain time. The first model Dynamo compiles in
a process ran 2-4 % slower than the second in every run (15 % on a training step),
the same code compiled twice included, so half the workers compile the traced model
first and half the plain one (``--processes`` of each); the result is the mean of the two orders'
means with its standard error, and half their difference is printed as the order's effect.

Cases: BERT-base and GPT-2 small inference (transformers configs, random weights), a
small residual model (``resnet``: 6 blocks of LayerNorm, Linear(128, 256), GELU,
Linear(256, 128), batch 32, inference: about 25 kernel calls per forward, ``--rounds``
paired rounds of 10 calls; also timed with the traced model's op recording off), plain
Inductor against a second compilation of itself on that model (``control``: the
method's own noise) and against itself with provenance tracking on (``provenance``:
what ``level="inductor"`` compiles with), a small training step (MLP, forward + backward + SGD), and a
kernel-bound chain of tiny matmuls (per-kernel cost = paired difference / kernel calls
per call). Compile time: first call of each backend with Inductor's caches off,
alternating, median ratio.

Run pinned to one core, as in results_inductor.rst:
    DFTRACER_LOG_FILE=/tmp/bench_inductor/t taskset -c 1 python benchmarks/bench_inductor.py
"""

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn

import dftrace_dynamo
from dftrace_dynamo import _core

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_overhead import CLOCKS, clock_call_ns, time_block, transformer  # noqa: E402


clock_ns = CLOCKS["process"]  # --timer


def paired(traced, plain, call_args, blocks, per_block):
    """Median per-call (traced - plain) and median plain, in ns of process CPU time (the
    trace writer thread included; other jobs on a shared machine delay us but do not add),
    or with ``--timer thread`` of the calling thread alone (the writer's work left out).
    Both must be compiled (called) already."""
    diffs, base = [], []
    for b in range(blocks):
        t = {}
        for name, f in (("t", traced), ("p", plain)) if b % 2 == 0 else (("p", plain), ("t", traced)):
            t[name] = time_block(lambda: f(*call_args), per_block, clock_ns) / per_block
        diffs.append(t["t"] - t["p"])
        base.append(t["p"])
    return statistics.median(diffs), statistics.median(base)


class Chain(nn.Module):
    """n tiny matmuls Inductor cannot fuse: one extern_kernels.mm each."""

    def __init__(self, n):
        super().__init__()
        self.w = nn.ParameterList(nn.Parameter(torch.randn(4, 4) / 2) for _ in range(n))

    def forward(self, x):
        for w in self.w:
            x = x @ w
        return x


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.up, self.act, self.down = nn.LayerNorm(128), nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 128)

    def forward(self, x):
        return x + self.down(self.act(self.up(self.norm(x))))


def step_fn(compiled, params):
    opt = torch.optim.SGD(params, lr=1e-3)

    def step(x):
        opt.zero_grad(set_to_none=True)
        compiled(x).sum().backward()
        opt.step()

    return step


def compile_time(make, inputs, repeats):
    from torch._inductor import config as inductor_config

    ratios = []
    with inductor_config.patch(force_disable_caches=True):
        for r in range(repeats):
            times = {}
            for backend in (("dftrace", "inductor") if r % 2 == 0 else ("inductor", "dftrace")):
                torch._dynamo.reset()
                opts = {"level": "inductor"} if backend == "dftrace" else None
                f = torch.compile(make(), backend=backend, options=opts)
                start = time.perf_counter()
                f(inputs).sum().backward()  # forward and backward graphs
                times[backend] = time.perf_counter() - start
            ratios.append(times["dftrace"] / times["inductor"])
    return statistics.median(ratios)


PAIRS = ("bert", "gpt2", "resnet", "control", "provenance", "kernel", "train")
# plain Inductor against itself compiled again, as the traced model is (an option set to its
# default value makes Dynamo compile the model anew: the method's own noise), and against
# itself with the provenance tracking level="inductor" switches on
PLAIN_AGAIN = {"control": ("plain again", {"epilogue_fusion": True}),
               "provenance": ("plain, tracking on", {"trace.provenance_tracking_level": 1})}


def pair_case(case, traced_first, args):
    """One process's measurement of ``case``: the traced and the plain model compiled in
    the given order, then timed paired. Returns {quantity: (median difference, median plain)}
    in ns per call (per kernel call for ``kernel``)."""
    def run(first, second, call):
        for f in (first, second) if traced_first else (second, first):
            for _ in range(3):
                call(f)

    def inference(model, x, blocks, per_block):
        # one model for both: two copies' weights sit at different addresses
        label, options = PLAIN_AGAIN.get(case, ("traced", None))
        if options:
            traced = torch.compile(model, backend="inductor", options=options)
        else:
            traced = torch.compile(model, backend="dftrace", options={"level": "inductor"})
        plain = torch.compile(model, backend="inductor")
        run(traced, plain, lambda f: f(x))
        out = {label: paired(traced, plain, (x,), blocks, per_block)}
        if case == "resnet":
            _core.set_ops_on(False)  # the traced code without its events
            out["recording off"] = paired(traced, plain, (x,), blocks, per_block)
            _core.set_ops_on(True)
        return out

    with torch.no_grad():
        if case in ("bert", "gpt2"):
            model, ids = transformer(case, args.batch, args.seq)
            return inference(model, ids, args.blocks, 3)
        if case in ("resnet", *PLAIN_AGAIN):
            model = nn.Sequential(*(Residual() for _ in range(6)))
            return inference(model, torch.randn(32, 128), args.rounds, 10)
        if case == "kernel":
            d, base = inference(Chain(args.chain), torch.randn(4, 4), args.blocks * 20, 2)["traced"]
            return {"traced": (d / args.chain, base)}
    model = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))
    other = copy.deepcopy(model)
    traced = step_fn(torch.compile(model, backend="dftrace", options={"level": "inductor"}), model.parameters())
    plain = step_fn(torch.compile(other, backend="inductor"), other.parameters())
    x = torch.randn(64, 256)
    run(traced, plain, lambda f: f(x))
    return {"traced": paired(traced, plain, (x,), args.blocks, 20)}


def balanced(case, args):
    """Runs ``case`` in ``2 * args.processes`` worker processes, half compiling the traced
    model first; prints each and the order-balanced result: the mean of the two orders'
    means, with its standard error; half their difference is the order's effect."""
    runs = {}
    for i in range(2 * args.processes):
        order = "traced-first" if i % 2 == 0 else "plain-first"
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", f"{case}:{order}", "--timer", args.timer,
               "--rounds", str(args.rounds), "--blocks", str(args.blocks), "--chain", str(args.chain),
               "--batch", str(args.batch), "--seq", str(args.seq)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"{case} ({order}) failed: " + "\n".join(proc.stderr.strip().splitlines()[-5:]))
        res = json.loads(proc.stdout.splitlines()[-1])
        for quantity, (d, base) in res.items():
            runs.setdefault(quantity, {}).setdefault(order, []).append((d, base))
    for quantity, by_order in runs.items():
        means, var = [], 0.0
        for order, values in by_order.items():  # overhead in % of plain, or ns per kernel call
            rel = [d if case == "kernel" else 100 * d / base for d, base in values]
            means.append(statistics.fmean(rel))
            var += statistics.variance(rel) / len(rel) / 4 if len(rel) > 1 else float("nan")
            print(f"  {case} {quantity}, {order}: " + " ".join(f"{v:+.2f}" for v in rel))
        plain_us = statistics.median(base for values in by_order.values() for _, base in values) / 1e3
        unit = "ns per kernel call" if case == "kernel" else "%"
        print(f"{case} {quantity}: {statistics.fmean(means):+.2f} {unit} order-balanced, standard error "
              f"{var ** 0.5:.2f} (order effect ±{abs(means[0] - means[1]) / 2:.2f}), plain {plain_us:.1f} us/call")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--chain", type=int, default=200)
    p.add_argument("--cases", default="bert,gpt2,resnet,train,kernel,compile")
    p.add_argument("--timer", choices=sorted(CLOCKS), default="process")
    p.add_argument("--rounds", type=int, default=300, help="resnet, control, provenance: paired rounds of 10 calls")
    p.add_argument("--processes", type=int, default=2, help="worker processes per compile order and case")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # CASE:ORDER, one measurement as JSON
    args = p.parse_args()
    if min(args.rounds, args.blocks, args.processes, args.chain, args.batch, args.seq) < 1:
        p.error("--rounds, --blocks, --processes, --chain, --batch and --seq take positive integers")
    global clock_ns
    clock_ns = CLOCKS[args.timer]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    trace = os.environ.get("DFTRACER_LOG_FILE", "/tmp/bench_inductor/trace")
    if args.worker:
        case, order = args.worker.split(":")
        dftrace_dynamo.initialize_log(f"{trace}-{case}-{os.getpid()}")
        print(json.dumps(pair_case(case, order == "traced-first", args)))
        dftrace_dynamo.finalize()
        return
    cases = args.cases.split(",")
    unknown = set(cases) - set(PAIRS) - {"compile"}
    if unknown:
        p.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    # how loaded the machine is: one perf_counter_ns() call costs about 50 ns on this machine idle
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch}, seq {args.seq}, "
          f"{args.timer} CPU time, perf_counter_ns() {clock_call_ns(100_000):.0f} ns, "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    for case in PAIRS:
        if case in cases:
            balanced(case, args)
    if "compile" in cases:
        def make():
            return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                                 nn.Linear(8 * 14 * 14, 10))

        dftrace_dynamo.initialize_log(trace)
        ratio = compile_time(make, torch.randn(2, 3, 16, 16), 5)
        print(f"compile time (CNN forward+backward graphs, caches off): traced/plain = {ratio:.3f} "
              f"({100 * (ratio - 1):+.1f}%)")
        dftrace_dynamo.finalize()


if __name__ == "__main__":
    main()
