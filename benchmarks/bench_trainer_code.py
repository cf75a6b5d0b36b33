"""What a trainer call costs with its ``trainer`` slice: Lightning's ``Profiler.profile`` (every hook
and loop stage runs in one) and a Hugging Face ``Trainer`` method (``floating_point_ops``), each
called in a loop inside a traced step, with the tracer's patch and without it, in paired blocks
(A, B, A, B ...) in one process. Prints the median per-call cost of each and the paired difference.

    taskset -c 1 python benchmarks/bench_trainer_code.py [--calls 20000] [--blocks 9]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

torch.set_num_threads(1)
os.environ.setdefault("DFTRACER_ENABLE", "1")
os.environ.setdefault("DFTRACER_LOG_FILE", os.path.join(tempfile.mkdtemp(prefix="bench-trainer-"), "trace"))

import dftrace_dynamo  # noqa: E402
from dftrace_dynamo.backend import tracer  # noqa: E402,F401 (the step and trainer hooks)
from dftrace_dynamo.events import trainers  # noqa: E402
from dftrace_dynamo.session import hooks  # noqa: E402
from lightning.pytorch.profilers import PassThroughProfiler  # noqa: E402
from transformers import Trainer  # noqa: E402


def per_call_ns(fn, calls):
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--blocks", type=int, default=9)
    a = ap.parse_args()
    dftrace_dynamo.initialize_log()
    profiler = PassThroughProfiler()
    fake = type("T", (), {"model": None})()  # floating_point_ops: 0 without a model's own count

    def lightning_action():
        with profiler.profile("[Callback]Bench.on_train_batch_end"):
            pass

    def hf_method():
        Trainer.floating_point_ops(fake, {})

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    f = torch.compile(model, backend="dftrace")
    f(torch.ones(2, 4)).sum().backward()  # a step in progress: the slices are recorded in it
    names = [n for _, _, n in trainers._NAMES if hooks.installed(n)]
    results = {"lightning": ([], []), "hf": ([], [])}
    for _ in range(a.blocks):
        for on in (True, False):
            for name in names:
                (hooks.install_one if on else hooks.remove_one)(name)
            for key, fn in (("lightning", lightning_action), ("hf", hf_method)):
                per_call_ns(fn, a.calls // 10)  # warm
                results[key][0 if on else 1].append(per_call_ns(fn, a.calls))
    opt.step()
    dftrace_dynamo.finalize()
    clock = min(-(time.perf_counter_ns() - time.perf_counter_ns()) for _ in range(1000))
    print(f"perf_counter_ns() cost: {clock} ns; {a.blocks} paired blocks of {a.calls} calls; python {sys.version.split()[0]}")
    for key, (traced, plain) in results.items():
        diffs = [t - p for t, p in zip(traced, plain)]
        print(f"{key:10s} plain {statistics.median(plain):8.0f} ns/call  traced {statistics.median(traced):8.0f}"
              f"  paired difference median {statistics.median(diffs):6.0f} ns (min {min(diffs):.0f},"
              f" max {max(diffs):.0f})")


if __name__ == "__main__":
    main()
