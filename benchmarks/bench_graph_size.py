"""Per-op cost of tracing as graphs grow: elementwise graphs of 300, 3,000 and 30,000 ops.

Run (benchmarks/results_graph_size.rst)::

    python3 benchmarks/bench_graph_size.py --callgrind --warm 60 --lines 10 --functions 15
    taskset -c 1 python3 benchmarks/bench_graph_size.py --rounds 400
    taskset -c 1 python3 benchmarks/bench_graph_size.py --rounds 400 --against norecord

Each size is ``bench_overhead.elem_of`` (``relu(x * 1.0001 + 0.5)`` per layer, 8x8 input),
traced by FX (Dynamo's tracing of 30,000 ops takes minutes; it gives the same graph), and run
two ways in one process: plain (the GraphModule, what the ``eager`` backend runs) and through
our backend at ``level="torch"`` writing a trace file, each called 10 times first (CPython
specialises a function's bytecode from its 8th call on).

``--callgrind``: instructions and simulated cache misses (callgrind ``--cache-sim=yes``, this
machine's L1s and its 1 MiB L2 as the last level; no hardware prefetcher is simulated, and
software prefetches count nothing) per op of the calling thread, traced minus plain, from
sections of N and 2N calls (N = 3,000 ops' worth, at least one call) differenced; glibc
malloc's own counts are shown apart (its consolidations are lumpy: a few per section, each
hundreds of thousands of instructions). ``--lines K`` lists the K lines of csrc/ that count most,
``--functions K`` the K functions (the interpreter's and torch's too) whose counts differ most.

Timing (the default): pairs of blocks of calls (about 30,000 ops each), A B, then B A, and so
on; the figure is the median of the paired differences B - A per op, with its 95% confidence
interval (order statistics) and the differences' interquartile range, timed by
the calling thread's CPU time (``time.thread_time_ns``: the writer thread and other processes
are not in it). A is the plain graph, or with ``--against`` the same graph traced another way.
Eager-op events are off (``DFTRACER_EAGER_OPS=0``): the plain graph's ops, run outside any
graph of ours, would be recorded as eager ops, which is not the plain graph.
Also printed: what one ``time.perf_counter_ns()`` costs (a measure of the machine's state),
the load, and the ring counters of ``_core.stats()`` over the traced blocks (``ring_waits``: a
push found the ring full; ``ring_kicks``: pushes that found it past half full and woke the
writer).

``--variant`` (B, or what callgrind measures): ``norecord`` runs the traced graph with op
recording off (``_core.set_ops_on(False)``: the call path alone); ``unchained`` undoes
``_core.chain`` (no op prefetches the next one's objects); ``object`` also calls the
Interceptor objects rather than their built-in functions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_overhead import elem_of  # noqa: E402
from bench_summary import timer_cost_ns  # noqa: E402

BLOCK_OPS = 30_000  # ops per timed block
CG_OPS = 3_000  # ops per callgrind section of N calls (at least one call)
RING_COUNTERS = ("recorded", "ring_waits", "ring_kicks")
WARM = 10  # calls before measuring (--warm): CPython specialises a function's bytecode from its 8th call on


def _code_globals(traced):
    """The globals of the instrumented graph's generated code, under the backend's wrappers."""
    while not hasattr(traced, "__globals__"):  # Recomputing, GraphCall, bound forward
        traced = getattr(traced, "call", None) or getattr(traced, "fn", None) or traced.__func__
    return traced.__globals__


def build(ops, variant):
    """(plain, traced) GraphModules of an elem graph of ``ops`` ops."""
    from dftrace_dynamo import _core, create_backend

    fn = elem_of(ops // 3)
    x = torch.randn(8, 8)
    plain = torch.fx.symbolic_trace(fn)
    traced = create_backend(level="torch")(torch.fx.symbolic_trace(fn), [x])
    if variant in ("object", "unchained"):  # undo (part of) instrument.direct_calls
        ns = _code_globals(traced)
        for name, value in list(ns.items()):
            if type(getattr(value, "__self__", None)) is _core.Interceptor:
                _core.chain([value, value])  # each its own next: nothing ahead
                if variant == "object":
                    ns[name] = value.__self__
    return plain, traced, x


def pin_writer(core):
    """Pins the trace writer's thread to ``core`` (by its name, which it gives itself once started)."""
    for _ in range(100):
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == "dftrace-writer":
                    os.sched_setaffinity(int(tid), {core})
                    return
        time.sleep(0.01)
    sys.exit("no dftrace-writer thread to pin")


def paired(a, b, calls, rounds, before=(None, None)):
    """Per-call differences b - a over ``rounds`` pairs of blocks, ns. The order alternates (A B,
    B A, ...) so that what a block leaves behind (the writer's drain on the shared core, the
    allocator's state) falls on both sides alike. ``before``: what runs before each A and each B
    block, untimed."""
    clock = time.thread_time_ns
    setup = {a: before[0], b: before[1]}

    def block(fn):
        if setup[fn]:
            setup[fn]()
        t0 = clock()
        for _ in range(calls):
            fn()
        return clock() - t0

    diffs = []
    for r in range(rounds):
        if r % 2:
            tb, ta = block(b), block(a)
        else:
            ta, tb = block(a), block(b)
        diffs.append((tb - ta) / calls)
    return diffs


def measure(ops, rounds, variant, against="plain", warm=WARM):
    from dftrace_dynamo import _core

    plain, traced, x = build(ops, variant)
    before = (None, None)
    if against == "norecord":  # A: the same graph object, op recording off
        plain, before = traced, (lambda: _core.set_ops_on(False), lambda: _core.set_ops_on(True))
    elif against != "plain":  # A: the same graph traced another way
        plain = build(ops, against)[1]
    calls = max(1, BLOCK_OPS // ops)
    with torch.no_grad():
        for _ in range(warm):
            plain(x)
            traced(x)
        _core.set_ops_on(variant != "norecord")
        _core.flush()
        s0 = _core.stats()
        diffs = paired(lambda: plain(x), lambda: traced(x), calls, rounds, before)
        s1 = _core.stats()
        _core.set_ops_on(True)
    per_op = sorted(d / ops for d in diffs)
    q1, med, q3 = statistics.quantiles(per_op, n=4)
    # the median's 95% confidence interval from order statistics (binomial, distribution-free)
    k = max(0, int(len(per_op) / 2 - 0.98 * len(per_op) ** 0.5))
    ci = (per_op[k], per_op[len(per_op) - 1 - k])
    base = []
    clock = time.thread_time_ns
    with torch.no_grad():
        for _ in range(5):
            if before[0]:
                before[0]()
            t0 = clock()
            for _ in range(calls):
                plain(x)
            base.append((clock() - t0) / calls / ops)
        _core.set_ops_on(True)
    counts = {k: s1.get(k, 0) - s0.get(k, 0) for k in RING_COUNTERS}
    return med, ci, q1, q3, statistics.median(base), counts


# ---- --callgrind: instructions and simulated cache misses per op ------------------------------

def cg_inner(args):
    """Under callgrind: plain and traced sections of N and 2N calls (dumped), ring counters."""
    import callgrind_costs as cc
    import dftrace_dynamo
    from dftrace_dynamo import _core

    cg = cc.helper(args.tmp)
    dftrace_dynamo.initialize_log(os.path.join(args.tmp, "graph_size"))
    ops = args.ops[0]
    plain, traced, x = build(ops, args.variant)
    n = max(1, CG_OPS // ops)
    with torch.no_grad():
        for _ in range(args.warm):
            plain(x)
            traced(x)
        _core.flush()
        s0 = _core.stats()
        cg.cg_start()
        for label, f in (("base", plain), ("traced", traced)):
            cc.section(cg, label, lambda reps, f=f: [f(x) for _ in range(reps)], n, _core.flush)
        cg.cg_stop()
        s1 = _core.stats()
    print(f"META ops={ops} calls={n} " + " ".join(f"{k}={s1.get(k, 0) - s0.get(k, 0)}" for k in RING_COUNTERS))
    dftrace_dynamo.finalize()


def cg_row(dumps, n, ops, lines=0, functions=0):
    """Per op, traced - plain (plain's own in brackets), by what callgrind counts."""
    import callgrind_costs as cc

    row = []
    for what in ("instructions", "D1 misses", "L2 data misses"):
        per = {}
        for lab in ("base", "traced"):  # glibc malloc's consolidations are lumpy: left out (shown apart)
            a, b = (dumps[f"{lab}:{k}"][1].of(what) for k in (n, 2 * n))
            pa, pb = cc.parts(a), cc.parts(b)
            per[lab] = ((b.total - a.total - pb["libc malloc"] + pa["libc malloc"]) / (n * ops),
                        (pb["libc malloc"] - pa["libc malloc"]) / (n * ops))
        ours = cc.differ(dumps, n, ops, "by_line", what)
        csrc = sum(v for k, v in ours.items() if "csrc" in k[0])
        row.append(f"{what} {per['traced'][0] - per['base'][0]:+.1f} [{per['base'][0]:.1f}] "
                   f"(csrc {csrc:.2f}, malloc {per['traced'][1] - per['base'][1]:+.1f})")
        if lines:
            cc.print_top({k: v for k, v in ours.items() if "csrc" in k[0]}, lines)
        if functions:
            cc.print_top(cc.differ(dumps, n, ops, "by_fn", what), functions)
    return row


def cg_report(argv, args):
    """Runs cg_inner under callgrind for each size; per op, traced - plain, calling thread."""
    import callgrind_costs as cc

    print(f"callgrind {' '.join(cc.CACHE_SIM)} ({cc.CACHES}); per op, calling thread, traced - plain "
          f"(plain's own in brackets), sections of N and 2N calls differenced")
    for ops in args.ops:
        tmp = tempfile.mkdtemp(prefix="graph_size_cg_")
        cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--instr-atstart=no", *cc.CACHE_SIM,
               f"--callgrind-out-file={tmp}/callgrind.out.%p", sys.executable, os.path.abspath(__file__),
               "--ops", str(ops), "--variant", args.variant, "--warm", str(args.warm), "--inner", "--tmp", tmp]
        env = dict(os.environ, DFTRACER_ENABLE="1", DFTRACER_EAGER_OPS="0", ATEN_CPU_CAPABILITY="avx2")
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        meta = next((ln for ln in proc.stdout.splitlines() if ln.startswith("META ")), None)
        if proc.returncode != 0 or meta is None:
            sys.exit(f"callgrind run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        meta = {k: int(v) for k, v in (kv.split("=") for kv in meta.split()[1:])}
        row = cg_row(cc.read_dumps(tmp), meta["calls"], ops, args.lines, args.functions)
        print(f"{ops:>6} ops, N={meta['calls']}: " + "; ".join(row) + "; " +
              " ".join(f"{k}={meta[k]}" for k in RING_COUNTERS) + f" ({time.time() - t0:.0f} s)", flush=True)


def over_processes(argv, args):
    """Runs this script's timing in ``args.processes`` processes in turn; per size, every process's
    median B - A and the median over them, and per process each size's figure minus its 300-op one."""
    rest = [a for i, a in enumerate(argv) if a != "--processes" and (i == 0 or argv[i - 1] != "--processes")]
    rest = [a for a in rest if not a.startswith("--processes=")]
    per = []
    for i in range(args.processes):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), *rest], capture_output=True, text=True,
                             check=True).stdout
        print("".join(ln + "\n" for ln in out.splitlines() if not ln.startswith("RESULT ")), end="", flush=True)
        per.append({int(ops): float(med) for _, ops, med in (ln.split() for ln in out.splitlines()
                                                             if ln.startswith("RESULT "))})
    first = args.ops[0]
    print(f"over {args.processes} processes, B-A ns/op: median of the processes' medians "
          f"[their range]; each process's figure minus its {first}-op one, median [range]")
    for ops in args.ops:
        meds = sorted(p[ops] for p in per)
        steps = sorted(p[ops] - p[first] for p in per)
        print(f"{ops:>7} {statistics.median(meds):>8.1f} [{meds[0]:.1f}, {meds[-1]:.1f}]   "
              f"{statistics.median(steps):>+8.1f} [{steps[0]:+.1f}, {steps[-1]:+.1f}]", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", type=int, nargs="+", default=[300, 3000, 30000])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--variant", choices=["record", "norecord", "object", "unchained"], default="record")
    p.add_argument("--against", choices=["plain", "norecord", "unchained", "object"], default="plain",
                   help="timing: the A side of the pairs, the plain graph or the same graph traced as that variant "
                        "(norecord: the B graph itself, op recording off during A's blocks)")
    p.add_argument("--callgrind", action="store_true",
                   help="count instructions and simulated cache misses per op under callgrind instead of timing")
    p.add_argument("--lines", type=int, default=0, metavar="K",
                   help="--callgrind: also list the K lines of csrc/ whose counts differ most")
    p.add_argument("--writer-core", type=int, metavar="CPU",
                   help="timing: pin the trace writer's thread to this CPU (default: it shares the caller's)")
    p.add_argument("--warm", type=int, default=WARM, help=f"calls of each graph before measuring (default {WARM})")
    p.add_argument("--functions", type=int, default=0, metavar="K",
                   help="--callgrind: also list the K functions (any code) whose counts differ most")
    p.add_argument("--processes", type=int, default=1, metavar="P",
                   help="timing: run the whole measurement in P processes one after another, then the median "
                        "over processes of each size's median (a process's memory layout moves every size's "
                        "figure by more than the sizes differ)")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.inner:
        return cg_inner(args)
    if args.callgrind:
        return cg_report(argv if argv is not None else sys.argv[1:], args)
    if args.processes > 1:
        return over_processes(argv if argv is not None else sys.argv[1:], args)
    import dftrace_dynamo

    os.environ["DFTRACER_EAGER_OPS"] = "0"  # else the plain graph's ops are recorded as eager ops
    with tempfile.TemporaryDirectory() as tmp:
        dftrace_dynamo.initialize_log(os.path.join(tmp, "graph_size"))
        if args.writer_core is not None:
            pin_writer(args.writer_core)
        print(f"perf_counter_ns() costs {timer_cost_ns():.0f} ns; variant {args.variant}; "
              f"affinity {sorted(os.sched_getaffinity(0))}, writer {args.writer_core}; load {os.getloadavg()[0]:.2f}")
        print(f"{'ops':>7} {'B-A ns/op':>10} {'95% CI':>17} {'IQR':>17} {'A ns/op':>10}  ring counters (B)  "
              f"[A: {args.against}, B: {args.variant}]")
        for ops in args.ops:
            med, ci, q1, q3, base, counts = measure(ops, args.rounds, args.variant, args.against, args.warm)
            print(f"{ops:>7} {med:>10.1f} {f'{ci[0]:.1f}..{ci[1]:.1f}':>17} {f'{q1:.1f}..{q3:.1f}':>17} "
                  f"{base:>10.1f}  {counts}", flush=True)
            print(f"RESULT {ops} {med}")
        dftrace_dynamo.finalize()


if __name__ == "__main__":
    main()
