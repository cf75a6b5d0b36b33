"""Where a traced op's cost goes on the elem workload, part by part, against the machine's floor.

    DFTRACER_ENABLE=1 taskset -c 1 python3 benchmarks/bench_op_floor.py [--rounds 150]

The elem workload's statements (``x * 1.0001``, ``+ 0.5``, ``torch.relu``, 100 times, 8x8
tensors, no grad) run as four functions that differ in one thing each, timed in paired
blocks (thread CPU time, median of the paired differences per op, with the IQR and the
median's 95 % interval):

- ``plain``: the statements as the ``eager`` backend's graph runs them (``*`` and ``+``
  inline in the bytecode, no call);
- ``called``: ``operator.mul``/``operator.add`` called instead, so every op is a call;
- ``traced, not recording``: each op through its own ``_core.Interceptor`` (called through
  its ``builtin``, as the backend's generated code calls it) while no op is recorded (the
  interceptor's own call layer and its one state test);
- ``traced``: the same, recording (two clock reads and one ring push per op).

Also printed: the cost of one ``rdtsc`` and one ``clock_gettime`` read in C on this core
(compiled here with ``cc``, as ``callgrind_costs.py`` does its helper), and of ``time.perf_counter_ns()`` from Python (the load).
The trace goes to a temporary directory.
"""

from __future__ import annotations

import argparse
import ctypes
import operator
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_overhead import ELEM_LAYERS, clock_call_ns, median_ci  # noqa: E402
from callgrind_costs import c_library  # noqa: E402

CLOCKS_C = r"""
#include <stdint.h>
#include <time.h>
#include <x86intrin.h>
static uint64_t mono(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000ull + t.tv_nsec; }
double rdtsc_ns(int n) { volatile uint64_t s = 0; uint64_t a = mono(); for (int i = 0; i < n; i++) s += __rdtsc(); return (double)(mono() - a) / n; }
double gettime_ns(int n) { volatile uint64_t s = 0; uint64_t a = mono(); for (int i = 0; i < n; i++) s += mono(); return (double)(mono() - a) / n; }
"""


def clock_reads(tmp):
    """(ns per rdtsc, ns per clock_gettime) read in a C loop, best of 5."""
    c = c_library(tmp, "clocks", CLOCKS_C, "-O2")
    c.rdtsc_ns.restype = c.gettime_ns.restype = ctypes.c_double
    return min(c.rdtsc_ns(1_000_000) for _ in range(5)), min(c.gettime_ns(1_000_000) for _ in range(5))


def variants():
    """The four functions of the docstring, each computing the elem workload."""
    from dftrace_dynamo import _core

    plain, called, traced = [], [], []
    scope = {"torch": torch, "mul": operator.mul, "add": operator.add}
    for i in range(ELEM_LAYERS):
        plain += ["m = x * 1.0001", "a = m + 0.5", "x = torch.relu(a)"]
        called += ["m = mul(x, 1.0001)", "a = add(m, 0.5)", "x = torch.relu(a)"]
        for name, target in (("mul", operator.mul), ("add", operator.add), ("relu", torch.relu)):
            # called as the backend's generated code calls it (instrument.direct_calls)
            scope[f"{name}_{i}"] = _core.Interceptor(target, _core.intern_site(name, "op"), None).builtin
        traced += [f"m = mul_{i}(x, 1.0001)", f"a = add_{i}(m, 0.5)", f"x = relu_{i}(a)"]
    fns = {}
    for name, lines in (("plain", plain), ("called", called), ("traced", traced)):
        exec(f"def {name}(x):\n    " + "\n    ".join(lines) + "\n    return x\n", scope)
        fns[name] = scope[name]
    return fns


def block(fn, x, calls):
    start = time.thread_time_ns()
    with torch.no_grad():
        for _ in range(calls):
            fn(x)
    return time.thread_time_ns() - start


def paired(a, b, x, rounds, calls):
    ops = calls * 3 * ELEM_LAYERS
    diffs = []
    for r in range(rounds):  # the pair's order flips every round: the second block must not gain
        t = {f: block(f, x, calls) for f in ((a, b) if r % 2 == 0 else (b, a))}
        diffs.append((t[b] - t[a]) / ops)
    q1, median, q3 = statistics.quantiles(diffs, n=4)
    low, high = median_ci(diffs)
    return f"{median:6.1f} ns/op (IQR {q1:.1f}..{q3:.1f}; median's 95% CI {low:.1f}..{high:.1f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--calls", type=int, default=20, help="calls per timed block")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import dftrace_dynamo
    from dftrace_dynamo import _core

    with tempfile.TemporaryDirectory() as tmp:
        dftrace_dynamo.initialize_log(os.path.join(tmp, "floor"))
        if not _core.is_open():
            sys.exit("no trace open: run with DFTRACER_ENABLE=1")
        rdtsc, gettime = clock_reads(tmp)
        fns, x = variants(), torch.randn(8, 8)
        for _ in range(5):
            for fn in fns.values():
                block(fn, x, args.calls)
        print(f"torch {torch.__version__}, affinity {sorted(os.sched_getaffinity(0))}, rounds {args.rounds}, "
              f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        print(f"perf_counter_ns() call {clock_call_ns():.0f} ns; in C: rdtsc {rdtsc:.1f} ns, "
              f"clock_gettime {gettime:.1f} ns")
        rows = [("a call instead of an inline operator", "plain", "called", True),
                ("interceptor, recording", "called", "traced", True),
                ("all of it: traced against plain", "plain", "traced", True),
                ("interceptor, not recording", "called", "traced", False)]
        for label, a, b, recording in rows:
            _core.set_ops_on(recording)
            print(f"  {label:40s} {paired(fns[a], fns[b], x, args.rounds, args.calls)}")
        _core.set_ops_on(True)
        dftrace_dynamo.finalize()


if __name__ == "__main__":
    main()
