"""Cost of an op outside the step windows (DFTRACER_STEPS), against the same graph untraced and traced.

Run (pinned to one core, one torch thread, as in benchmarks/results_steps.rst)::

    DFTRACER_ENABLE=1 taskset -c 1 python3 benchmarks/bench_steps.py --rounds 60

One process, one compiled graph per level: blocks of calls alternate untraced
(``backend="eager"`` / ``"aot_eager"``), traced outside a window (the current step
deselected with ``set_steps``) and traced inside it, after a warm-up. Reported per
op: the median over rounds of (outside − untraced) and (inside − untraced), with
the interquartile range of the first (the noise). Times are CPU time of the
process (the trace writer thread included), as in bench_overhead.py.

The ``micro`` row isolates one op without torch: an interceptor around
``operator.neg`` against calling ``operator.neg`` directly, 200,000 calls per
block; its noise is a few ns where the torch workloads' is hundreds. It also
times the interceptor with no trace open (the path every traced graph takes
before ``initialize_log``): outside a window the interceptor takes that same
path, so the two should agree.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_overhead import Tool, clock_call_ns, ops_per_call, run, workload  # noqa: E402

OUTSIDE = "1000000000"  # a window no run reaches: the current step is outside it


def measure(wname, level, rounds, block_calls):
    from dftrace_dynamo import create_backend, set_steps

    fn, inputs, train, calls = workload(wname)
    calls = block_calls or calls
    n = ops_per_call(fn, inputs, level, train)
    base = torch.compile(fn, backend="eager" if level == "torch" else "aot_eager")
    traced = torch.compile(fn, backend=create_backend(level=level))
    untraced_call, traced_call = (lambda: run(base, inputs, train)), (lambda: run(traced, inputs, train))
    timer = Tool("timer", None)

    def timed(call, window):
        set_steps(window)
        return timer.block(call, calls)

    for _ in range(3):  # compile and warm up
        untraced_call()
        traced_call()
    outside, inside = [], []
    for _ in range(rounds):
        a = timed(untraced_call, None)
        b = timed(traced_call, OUTSIDE)
        c = timed(traced_call, None)
        outside.append((b - a) / calls / n)
        inside.append((c - a) / calls / n)
    set_steps(None)
    q1, med, q3 = statistics.quantiles(outside, n=4)
    return n, a / calls / 1e3, med, (q1, q3), statistics.median(inside)


def micro(rounds, trace_prefix, calls=200_000):
    """One interceptor around a C function (``operator.neg`` on an int), no torch: the per-op cost of
    the interceptor outside a window, inside it and with no trace open, against calling the function
    directly."""
    import operator

    from dftrace_dynamo import _core, set_steps
    from dftrace_dynamo.session import logger

    site = _core.intern_site("neg", "bench", {"graph": 0})
    icpt = _core.Interceptor(operator.neg, site, None)

    def block(f, window):
        set_steps(window)
        x = 3
        start = time.process_time_ns()
        for _ in range(calls):
            f(x)
        return time.process_time_ns() - start

    outside, inside, closed = [], [], []
    for _ in range(rounds):
        a = block(operator.neg, None)
        b = block(icpt, OUTSIDE)
        c = block(icpt, None)
        logger.finalize()
        d = block(icpt, None)
        logger.initialize_log(trace_prefix)
        outside.append((b - a) / calls)
        inside.append((c - a) / calls)
        closed.append((d - a) / calls)
    set_steps(None)
    q1, med, q3 = statistics.quantiles(outside, n=4)
    return a / calls, med, (q1, q3), statistics.median(inside), statistics.median(closed)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60, help="untraced/outside/inside block triples")
    parser.add_argument("--workloads", default="elem,mlp")
    parser.add_argument("--levels", default="torch,aten")
    parser.add_argument("--block-calls", type=int, help="calls per timed block (default: per workload)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from dftrace_dynamo.session import logger

    prefix = os.path.join(tempfile.mkdtemp(prefix="bench_steps_"), "bench")
    logger.initialize_log(prefix)
    print(f"perf_counter_ns() call: {clock_call_ns():.0f} ns")
    print(f"torch {torch.__version__}, affinity {sorted(os.sched_getaffinity(0))}, rounds {args.rounds}")
    header = (f"{'workload':<10} {'level':<6} {'ops/call':>8} {'base us/call':>12} {'outside ns/op':>13} "
              f"{'IQR ns/op':>12} {'inside ns/op':>12}")
    print(header)
    print("-" * len(header), flush=True)
    for wname in args.workloads.split(","):
        for level in args.levels.split(","):
            torch._dynamo.reset()
            n, base, out, (q1, q3), inside = measure(wname, level, args.rounds, args.block_calls)
            print(f"{wname:<10} {level:<6} {n:>8} {base:>12.1f} {out:>13.1f} {f'{q1:.1f}..{q3:.1f}':>12} "
                  f"{inside:>12.1f}", flush=True)
    base, out, (q1, q3), inside, closed = micro(args.rounds, prefix)
    print(f"{'micro':<10} {'-':<6} {1:>8} {base / 1e3:>12.3f} {out:>13.1f} {f'{q1:.1f}..{q3:.1f}':>12} "
          f"{inside:>12.1f}", flush=True)
    print(f"micro: interceptor with no trace open {closed:.1f} ns/op above the direct call "
          f"(outside a window: {out:.1f})", flush=True)
    logger.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
