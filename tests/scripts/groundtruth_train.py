"""A small training loop that writes, next to its trace, the wall-clock marks
(``time.time_ns``, the clock the trace's epoch timeline follows) taken around
each thing the tracer records: every ``next()`` on the DataLoader, each compiled
graph, a known 20 ms sleep between two graphs, ``backward()``,
``zero_grad()`` and ``optimizer.step()``. tests/groundtruth.py compares them
with the trace, event by event.

    python groundtruth_train.py MARKS_JSON --open {before,after,lazy,run,decorator} [--steps N]
        [--thread-compiles N] [--ddp [--shift-rank1-ns NS]] [--wall-step-after N]
        [--collect-after-ms MS]
"""
import argparse
import ctypes
import gc
import json
import os
import threading
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

import wallclock

ap = argparse.ArgumentParser()
ap.add_argument("marks")
ap.add_argument("--open", required=True, choices=("before", "after", "lazy", "run", "decorator"))
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--thread-compiles", type=int, default=0,
                help="another thread compiles this many new functions while this one trains")
ap.add_argument("--ddp", action="store_true", help="torchrun worker: gloo process group, DDP model")
ap.add_argument("--shift-rank1-ns", type=int, default=0,
                help="rank 1's trace clock runs this far off (as on another host); its marks do not")
ap.add_argument("--wall-step-after", type=int, default=-1,
                help="after this step the wall clock steps 50 ms forward (the wall_step shim must be "
                     "LD_PRELOADed) and the loop sleeps 0.6 s, two writer wakes")
ap.add_argument("--collect-after-ms", type=float, default=0,
                help="after the loop, sleep this long, then collect garbage (marked as 'collect', step -1)")
a = ap.parse_args()
if a.shift_rank1_ns and os.environ.get("RANK") == "1":  # read when the tracer's core loads
    os.environ["DFTRACER_TEST_CLOCK_SHIFT_NS"] = str(a.shift_rank1_ns)

marks = []  # (label, step, t0_ns, t1_ns)
watch = wallclock.Watch()


def mark(label, step, t0):
    marks.append((label, step, t0, time.time_ns()))
    watch()


if a.ddp:
    import torch.distributed as dist

    dist.init_process_group("gloo")

if a.open == "before":
    from dftrace_dynamo import dftracer

    dftracer.initialize_log(os.environ["GT_LOG"])


def backend():
    if a.open == "run":  # dftrace-dynamo run --compile-all routes torch.compile through the tracer
        return "inductor"
    return "dftrace"


torch.manual_seed(0)
first = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
second = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
params = [*first.parameters(), *second.parameters()]
if a.open == "decorator":
    from dftrace_dynamo import dynamo

    f1, f2 = dynamo.compile(first), dynamo.compile(second)
else:
    f1, f2 = torch.compile(first, backend=backend()), torch.compile(second, backend=backend())
if a.ddp:  # DDP around the compiled module: a compiled DDP module gives Dynamo no graph (gloo, CPU)
    f1 = nn.parallel.DistributedDataParallel(f1)
opt = torch.optim.SGD(params, lr=0.01)
loader = DataLoader(TensorDataset(torch.randn(a.steps * 8, 32), torch.randn(a.steps * 8, 4)), batch_size=8)


def compile_many(n):
    for i in range(n):
        def fn(x, k=i):
            return torch.sin(x) * k + torch.cos(x)
        fn.__code__ = fn.__code__.replace(co_name=f"thread_fn_{i}")  # a new code object: a new compile
        torch.compile(fn, backend=backend())(torch.randn(4))


helper = threading.Thread(target=compile_many, args=(a.thread_compiles,), name="compiler")


def one_step(step, it):
    t = time.time_ns()
    x, y = next(it)
    mark("data", step, t)
    t = time.time_ns()
    opt.zero_grad()
    mark("zero_grad", step, t)
    t = time.time_ns()
    h = f1(x)
    mark("graph1", step, t)
    t = time.time_ns()
    time.sleep(0.02)
    mark("sleep", step, t)
    t = time.time_ns()
    loss = ((f2(h) - y) ** 2).mean()
    mark("graph2", step, t)
    t = time.time_ns()
    loss.backward()
    mark("backward", step, t)
    t = time.time_ns()
    opt.step()
    mark("optimizer", step, t)


it = iter(loader)
if a.open == "after":  # first step compiles untraced
    one_step(-1, it)
    from dftrace_dynamo import dftracer

    dftracer.initialize_log(os.environ["GT_LOG"])
    a.steps -= 1
if a.thread_compiles:
    helper.start()
for step in range(a.steps):
    one_step(step, it)
    if step == a.wall_step_after:
        ctypes.CDLL(None).wall_step(ctypes.c_long(50_000_000))
        watch.reset()
        time.sleep(0.6)
if a.thread_compiles:
    helper.join()
if a.collect_after_ms:
    time.sleep(a.collect_after_ms / 1e3)
    t = time.time_ns()
    gc.collect()
    mark("collect", -1, t)
with open(f"{a.marks}.{os.environ['RANK']}" if a.ddp else a.marks, "w") as f:
    json.dump({"marks": marks, "rank": int(os.environ.get("RANK", 0)), "wall_steps": watch.steps}, f)
if a.ddp:
    dist.destroy_process_group()
