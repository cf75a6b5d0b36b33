"""Cost of level="inductor" against the same model compiled with plain Inductor.

Each case compiles the model twice in this process (``backend="dftrace",
options={"level": "inductor"}`` and ``backend="inductor"``), then times blocks of
calls alternating between the two; the overhead is the median of the paired
per-call differences over the median plain time. Cases: BERT-base and GPT-2 small
inference (transformers configs, random weights), a small residual model (``resnet``:
6 blocks of LayerNorm, Linear(128, 256), GELU, Linear(256, 128), batch 32, inference:
about 25 kernel calls per forward, 30 rounds of 10 calls), a small training step (MLP,
forward + backward + SGD), and a kernel-bound chain of tiny matmuls (per-kernel
cost = paired difference / kernel calls per call). Compile time: first call of
each backend with Inductor's caches off, alternating, median ratio. ``--cases
resnet,control`` also times plain Inductor against a second compilation of itself,
the method's own noise, and the traced model with its op recording off.

Run pinned to one core, as in results_inductor.rst:
    DFTRACER_LOG_FILE=/tmp/bench_inductor/t taskset -c 1 python benchmarks/bench_inductor.py
"""

import argparse
import copy
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

import dftrace_dynamo
from dftrace_dynamo import _core

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_overhead import clock_call_ns, time_block, transformer  # noqa: E402


CLOCKS = {"process": time.process_time_ns, "thread": time.thread_time_ns}
clock_ns = CLOCKS["process"]  # --timer


def paired(traced, plain, call_args, blocks, per_block):
    """Median per-call (traced - plain) and median plain, in ns of process CPU time (the
    trace writer thread included; other jobs on a shared machine delay us but do not add),
    or with ``--timer thread`` of the calling thread alone (the writer's work left out)."""
    diffs, base = [], []
    for f in (traced, plain):  # warm up
        for _ in range(3):
            f(*call_args)
    for b in range(blocks):
        t = {}
        for name, f in (("t", traced), ("p", plain)) if b % 2 == 0 else (("p", plain), ("t", traced)):
            t[name] = time_block(lambda: f(*call_args), per_block, clock_ns) / per_block
        diffs.append(t["t"] - t["p"])
        base.append(t["p"])
    return statistics.median(diffs), statistics.median(base)


def compile_pair(model):
    # one model for both: two copies' weights sit at different addresses, which alone moved
    # the plain time of the residual model by several percent between copies
    return (torch.compile(model, backend="dftrace", options={"level": "inductor"}),
            torch.compile(model, backend="inductor"))


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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--chain", type=int, default=200)
    p.add_argument("--cases", default="bert,gpt2,resnet,train,kernel,compile")
    p.add_argument("--timer", choices=sorted(CLOCKS), default="process")
    p.add_argument("--rounds", type=int, default=30, help="resnet: paired rounds of 10 calls")
    args = p.parse_args()
    global clock_ns
    clock_ns = CLOCKS[args.timer]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dftrace_dynamo.initialize_log(os.environ.get("DFTRACER_LOG_FILE", "/tmp/bench_inductor/trace"))
    cases = args.cases.split(",")
    # how loaded the machine is: one perf_counter_ns() call costs about 50 ns on this machine idle
    clock = clock_call_ns(100_000)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch}, seq {args.seq}, "
          f"{args.timer} CPU time, perf_counter_ns() {clock:.0f} ns")
    with torch.no_grad():
        for kind in ("bert", "gpt2"):
            if kind in cases:
                model, ids = transformer(kind, args.batch, args.seq)
                traced, plain = compile_pair(model)
                d, base = paired(traced, plain, (ids,), args.blocks, 3)
                print(f"{kind} inference: plain {base / 1e6:.2f} ms/call, overhead {d / 1e3:+.1f} us "
                      f"({100 * d / base:+.2f}%)")
        if "resnet" in cases:
            model = nn.Sequential(*(Residual() for _ in range(6)))
            traced, plain = compile_pair(model)
            x = torch.randn(32, 128)
            d, base = paired(traced, plain, (x,), args.rounds, 10)
            print(f"residual model (6 blocks, batch 32): plain {base / 1e3:.1f} us/call, overhead "
                  f"{d / 1e3:+.2f} us ({100 * d / base:+.2f}%)")
            if "control" in cases:
                _core.set_ops_on(False)  # the traced code without its events
                d, base = paired(traced, plain, (x,), args.rounds, 10)
                _core.set_ops_on(True)
                print(f"residual model, op recording off: {d / 1e3:+.2f} us ({100 * d / base:+.2f}%)")  # the method's own noise: plain Inductor against a second compilation
                # of it (an option set to its default value makes Dynamo compile the model anew)
                again = torch.compile(model, backend="inductor", options={"epilogue_fusion": True})
                d, base = paired(again, plain, (x,), args.rounds, 10)
                print(f"residual model, plain against plain compiled again: {d / 1e3:+.2f} us "
                      f"({100 * d / base:+.2f}%)")
        if "kernel" in cases:
            chain = Chain(args.chain)
            traced, plain = compile_pair(chain)
            x = torch.randn(4, 4)
            d, base = paired(traced, plain, (x,), args.blocks * 20, 2)
            print(f"kernel-bound chain ({args.chain} extern_kernels.mm per call): plain {base / 1e3:.1f} us/call, "
                  f"{d / args.chain:+.1f} ns per kernel call")
    if "train" in cases:
        model = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))
        other = copy.deepcopy(model)
        traced = step_fn(torch.compile(model, backend="dftrace", options={"level": "inductor"}), model.parameters())
        plain = step_fn(torch.compile(other, backend="inductor"), other.parameters())
        x = torch.randn(64, 256)
        d, base = paired(traced, plain, (x,), args.blocks, 20)
        print(f"training step (MLP 256, batch 64): plain {base / 1e3:.1f} us/step, overhead {d / 1e3:+.2f} us "
              f"({100 * d / base:+.2f}%)")
    if "compile" in cases:
        def make():
            return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                                 nn.Linear(8 * 14 * 14, 10))

        ratio = compile_time(make, torch.randn(2, 3, 16, 16), 5)
        print(f"compile time (CNN forward+backward graphs, caches off): traced/plain = {ratio:.3f} "
              f"({100 * (ratio - 1):+.1f}%)")
    dftrace_dynamo.finalize()


if __name__ == "__main__":
    main()
