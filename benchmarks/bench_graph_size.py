"""Per-op cost of tracing as graphs grow: elementwise graphs of 300, 3,000 and 30,000 ops.

Run (benchmarks/results_graph_size.rst)::

    python3 benchmarks/bench_graph_size.py --callgrind --lines 6
    taskset -c 1 python3 benchmarks/bench_graph_size.py --rounds 20
    taskset -c 1 python3 benchmarks/bench_graph_size.py --rounds 20 --against unchained

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
hundreds of thousands of instructions). ``--lines K`` lists the K lines of csrc/ that count most.

Timing (the default): blocks of calls (about 30,000 ops each) alternate A, B, A, B; the figure
is the median of the paired differences B - A per op, with their interquartile range, timed by
the calling thread's CPU time (``time.thread_time_ns``: the writer thread and other processes
are not in it). A is the plain graph, or with ``--against`` the same graph traced another way.
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
WARM = 10  # calls before measuring: CPython specialises a function's bytecode from its 8th call on


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


def paired(a, b, calls, rounds):
    """Per-call differences b - a over ``rounds`` pairs of blocks (A, B, A, B...), ns."""
    clock = time.thread_time_ns
    diffs = []
    for r in range(rounds):
        t0 = clock()
        for _ in range(calls):
            a()
        t1 = clock()
        for _ in range(calls):
            b()
        t2 = clock()
        diffs.append(((t2 - t1) - (t1 - t0)) / calls)
    return diffs


def measure(ops, rounds, variant, against="plain"):
    from dftrace_dynamo import _core

    plain, traced, x = build(ops, variant)
    if against != "plain":  # A: the same graph traced another way
        plain = build(ops, against)[1]
    calls = max(1, BLOCK_OPS // ops)
    with torch.no_grad():
        for _ in range(WARM):
            plain(x)
            traced(x)
        _core.set_ops_on(variant != "norecord")
        _core.flush()
        s0 = _core.stats()
        diffs = paired(lambda: plain(x), lambda: traced(x), calls, rounds)
        s1 = _core.stats()
        _core.set_ops_on(True)
    per_op = sorted(d / ops for d in diffs)
    q1, med, q3 = statistics.quantiles(per_op, n=4)
    base = []
    clock = time.thread_time_ns
    with torch.no_grad():
        for _ in range(5):
            t0 = clock()
            for _ in range(calls):
                plain(x)
            base.append((clock() - t0) / calls / ops)
    counts = {k: s1.get(k, 0) - s0.get(k, 0) for k in RING_COUNTERS}
    return med, q1, q3, statistics.median(base), counts


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
        for _ in range(WARM):
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


def cg_row(dumps, n, ops, lines=0):
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
               "--ops", str(ops), "--variant", args.variant, "--inner", "--tmp", tmp]
        env = dict(os.environ, DFTRACER_ENABLE="1", ATEN_CPU_CAPABILITY="avx2")
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        meta = next((ln for ln in proc.stdout.splitlines() if ln.startswith("META ")), None)
        if proc.returncode != 0 or meta is None:
            sys.exit(f"callgrind run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        meta = {k: int(v) for k, v in (kv.split("=") for kv in meta.split()[1:])}
        row = cg_row(cc.read_dumps(tmp), meta["calls"], ops, args.lines)
        print(f"{ops:>6} ops, N={meta['calls']}: " + "; ".join(row) + "; " +
              " ".join(f"{k}={meta[k]}" for k in RING_COUNTERS) + f" ({time.time() - t0:.0f} s)", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", type=int, nargs="+", default=[300, 3000, 30000])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--variant", choices=["record", "norecord", "object", "unchained"], default="record")
    p.add_argument("--against", choices=["plain", "unchained", "object"], default="plain",
                   help="timing: the A side of the pairs, the plain graph or the same graph traced as that variant")
    p.add_argument("--callgrind", action="store_true",
                   help="count instructions and simulated cache misses per op under callgrind instead of timing")
    p.add_argument("--lines", type=int, default=0, metavar="K",
                   help="--callgrind: also list the K lines of csrc/ whose counts differ most")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.inner:
        return cg_inner(args)
    if args.callgrind:
        return cg_report(argv if argv is not None else sys.argv[1:], args)
    import dftrace_dynamo

    with tempfile.TemporaryDirectory() as tmp:
        dftrace_dynamo.initialize_log(os.path.join(tmp, "graph_size"))
        print(f"perf_counter_ns() costs {timer_cost_ns():.0f} ns; variant {args.variant}; "
              f"affinity {sorted(os.sched_getaffinity(0))}; load {os.getloadavg()[0]:.2f}")
        print(f"{'ops':>7} {'B-A ns/op':>19} {'IQR':>15} {'A ns/op':>12}  ring counters (B)  "
              f"[A: {args.against}, B: {args.variant}]")
        for ops in args.ops:
            med, q1, q3, base, counts = measure(ops, args.rounds, args.variant, args.against)
            print(f"{ops:>7} {med:>19.1f} {f'{q1:.1f}..{q3:.1f}':>15} {base:>12.1f}  {counts}", flush=True)
        dftrace_dynamo.finalize()


if __name__ == "__main__":
    main()
