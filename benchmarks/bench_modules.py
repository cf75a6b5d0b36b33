"""Cost of module slices: the same traced graph with DFTRACER_MODULE_SLICES on versus off.

Run (pinned to one core, one torch thread, as in benchmarks/results_modules.rst)::

    DFTRACER_ENABLE=1 DFTRACER_DISABLE_IO=1 taskset -c 1 python3 benchmarks/bench_modules.py --rounds 30

Each workload and level is measured in a fresh process, with the workloads, the timed
blocks and the pairing of ``bench_overhead.py``: the workload is compiled twice with
our backend, once with module slices off (A) and once on (B), both recording to the
same trace; blocks of calls alternate A, B, B, A, A, B... after a warm-up (each round a
pair, its order flipped every round). ``ns/op`` is the median of the paired differences
divided by the ops executed per call (IQR: the noise), ``ratio`` the median of B/A,
``ns/mod`` the same difference per module call (one module slice; ``mod/call`` of them
per call) with the distribution-free 95 % interval of that median. Transformers get a
third of the rounds. Every measurement runs twice, compiling slices off first
(``first`` off) and on first: the first model Dynamo compiles in a process can run
slower than the second (2-15 % in ``bench_inductor.py``), so the two rows' mean is the
figure, half their difference the order's effect. Times are CPU time of the process
(the trace writer's formatting of the slices' events included), or with ``--timer
thread`` of the calling thread alone.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_overhead import (CLOCKS, clock_call_ns, measure_in_child, median_ci, ops_per_call, run,  # noqa: E402
                            time_block, workload)

LEVELS = ("torch", "aten")


def graph_counts(nodes):
    """``(ops, boundaries, module calls)`` among these graph nodes, for any build: module-slice
    boundary calls (``_core.boundary`` partials; ``_core.span`` partials in older builds) are
    not ops; a boundary folded into an op's interceptor (``Interceptor.boundary``) is both an
    op and a boundary. Module calls: the slices the boundaries close."""
    from dftrace_dynamo import _core

    boundary, span = getattr(_core, "boundary", None), getattr(_core, "span", None)
    ops = boundaries = closed = 0
    for n in nodes:
        if n.op != "call_function":
            continue
        fn = getattr(n.target, "func", None)
        if fn is not None and (fn is boundary or fn is span):
            boundaries += 1
            closed += len(n.args) - 1 if fn is boundary else len(n.args) // 2  # (opened, *sites) / (start, site)*
            continue
        ops += 1
        folded = getattr(n.target, "boundary", None) if isinstance(n.target, _core.Interceptor) else None
        if folded:
            boundaries += 1
            closed += len(folded[1])
    return ops, boundaries, closed


def compile_with_slices(fn, inputs, train, level, slices):
    """``fn`` compiled by our backend with module slices on or off; returns it and the
    number of module calls (slices) one call of it records."""
    from dftrace_dynamo.session import config
    from dftrace_dynamo import create_backend

    graphs = []
    # the switch is read when a graph is instrumented, i.e. during the first call
    saved = config.get()
    config._config = dataclasses.replace(saved, module_slices=slices)
    try:
        backend = create_backend(level=level, on_graph=lambda gm, example_inputs, info: graphs.append(gm))
        compiled = torch.compile(copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn, backend=backend)
        run(compiled, inputs, train)
    finally:
        config._config = saved
    return compiled, graph_counts([n for gm in graphs for n in gm.graph.nodes])[2]


def span_call_ns(n=20_000, repeats=21):
    """Cost of one boundary call that closes a slice and opens the next (the most common
    kind), recording, in a tight loop; min over repeats, so bursts of load drop out."""
    import functools

    from dftrace_dynamo import _core

    site = _core.intern_site("bench.module", "module", {"module_type": "Bench", "graph": -1})
    span = functools.partial(_core.boundary, _core.TagCell())  # as modules.span_function builds it
    best = None
    for _ in range(repeats):
        span(1)
        begin = time.perf_counter_ns()
        for _ in range(n):
            span(1, site)
        elapsed = (time.perf_counter_ns() - begin) / n
        span(0, site)
        _core.flush()  # stay far from a full buffer: the loop must not wait for the writer
        best = elapsed if best is None else min(best, elapsed)
    return best


def measure_pair(wname, level, rounds, block_calls, on_first, clock):
    fn, inputs, train, default_calls = workload(wname)
    block_calls = block_calls or default_calls
    n = ops_per_call(fn, inputs, level, train)
    compiled = {slices: compile_with_slices(fn, inputs, train, level, slices)
                for slices in ((True, False) if on_first else (False, True))}
    (off, _), (on, mods) = compiled[False], compiled[True]
    call_a, call_b = (lambda: run(off, inputs, train)), (lambda: run(on, inputs, train))
    for _ in range(3):  # warm up both
        call_a()
        call_b()
    diffs, ratios = [], []
    for r in range(rounds):
        t = {}
        for name, call in (("a", call_a), ("b", call_b)) if r % 2 == 0 else (("b", call_b), ("a", call_a)):
            t[name] = time_block(call, block_calls, clock)  # alternating order: whichever runs second gains nothing
        a, b = t["a"], t["b"]
        diffs.append((b - a) / block_calls)
        ratios.append(b / a)
    q1, median, q3 = statistics.quantiles(diffs, n=4)
    low, high = median_ci(diffs)
    per_mod = f"{median / mods:.0f} [{low / mods:.0f}, {high / mods:.0f}]" if mods else "-"
    print(f"{wname:<10} {level:<6} {'on' if on_first else 'off':<5} {n:>8} {mods:>9} {a / block_calls / 1e3:>12.1f} "
          f"{median / n:>7.1f} "
          f"{q1 / n:>7.1f}..{q3 / n:<7.1f} {per_mod:>18} {statistics.median(ratios):>7.4f}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="A,B block pairs per measurement")
    parser.add_argument("--workloads", default="elem,mlp,mlp_train,bert,gpt2")
    parser.add_argument("--levels", default=",".join(LEVELS))
    parser.add_argument("--block-calls", type=int, help="calls per timed block (default: per workload)")
    parser.add_argument("--span-call", action="store_true", help="also time one boundary call in a tight loop")
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "LEVEL"), help=argparse.SUPPRESS)
    parser.add_argument("--on-first", action="store_true", help=argparse.SUPPRESS)  # compile slices on first
    parser.add_argument("--timer", choices=sorted(CLOCKS), default="process",
                        help="CPU time of the process (the trace writer included) or of the calling thread")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.one:
        from dftrace_dynamo.session import logger

        logger.initialize_log(os.path.join(tempfile.mkdtemp(prefix="bench_modules_"), "bench"))
        wname, level = args.one
        rounds = args.rounds if wname in ("elem", "mlp", "mlp_train") else max(5, args.rounds // 3)
        measure_pair(wname, level, rounds, args.block_calls, args.on_first, CLOCKS[args.timer])
        return 0
    print(f"perf_counter_ns() call: {clock_call_ns():.0f} ns")
    if args.span_call:
        from dftrace_dynamo.session import logger

        logger.initialize_log(os.path.join(tempfile.mkdtemp(prefix="bench_modules_"), "span"))
        print(f"boundary call (close one slice, open the next), recording: {span_call_ns():.0f} ns")
        logger.finalize()
    print(f"torch {torch.__version__}, affinity {sorted(os.sched_getaffinity(0))}, rounds {args.rounds}, "
          f"{args.timer} CPU time, load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    header = (f"{'workload':<10} {'level':<6} {'first':<5} {'ops/call':>8} {'mod/call':>9} {'off us/call':>12} {'ns/op':>7} "
              f"{'IQR ns/op':>16} {'ns/mod [95% CI]':>18} {'ratio':>7}")
    print(header)
    print("-" * len(header))
    passed = [f"--rounds={args.rounds}", f"--timer={args.timer}"] + ([f"--block-calls={args.block_calls}"] if args.block_calls else [])
    for wname in args.workloads.split(","):
        for level in args.levels.split(","):
            if wname == "mlp_train" and level == "torch":
                continue  # its backward runs in eager autograd: no module slices there
            for first in ([], ["--on-first"]):  # which one Dynamo compiles first: see the docstring
                print(measure_in_child(__file__, wname, level, passed + first, 6), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
