"""Instructions per traced op, per module call and per written event, counted by callgrind.

Instruction counts do not move with the load of a shared machine, so these figures can be
re-taken anywhere (benchmarks/results_overhead.rst, results_writer.rst)::

    python3 benchmarks/callgrind_costs.py ops --workload elem --level torch
    python3 benchmarks/callgrind_costs.py ops --workload mlp --level aten --slices
    python3 benchmarks/callgrind_costs.py writer --compression 1
    python3 benchmarks/callgrind_costs.py ops --level inductor
    python3 benchmarks/callgrind_costs.py ops --level inductor --model resnet --functions 25
    python3 benchmarks/callgrind_costs.py ops --level inductor --model resnet --cache-sim --no-record

The script re-runs itself under ``valgrind --tool=callgrind --separate-threads=yes
--instr-atstart=no``: compiling and warming up run uninstrumented; a small helper
(callgrind's client requests, compiled here with ``cc``) switches counting on, zeroes
and dumps the counters around each measured section. Each section runs twice, N and 2N
times, and the figures are the differences divided by N, per thread: the calling
thread and the trace writer thread (``dftrace-writer``) separately.

``ops``: blocks of calls of the traced graph and of its untraced baseline
(``backend="eager"`` at torch level, ``"aot_eager"`` at ATen level); the extra
instructions per op of the calling thread, split by where they run (the interceptor
in csrc/callwrap.c, the window check, the clock and the ring push inlined from
csrc/core.h, module boundary calls in csrc/span.c, the interpreter, torch), and the
writer thread's instructions and bytes per event. ``--slices`` compares module slices
on against off instead (both traced): the cost per module call (one module slice;
the boundaries folded into interceptors count in csrc/callwrap.c and core.h).

The writer thread's figure is its count from the first section to the last flush over
every event it wrote meanwhile (``_core.stats()["written"]``: the base sections' events
with ``--slices``, memory samples, gc events); its bytes per event are the file's growth
over the traced sections' events. Both hold what the writer does per second of wall
time rather than per event (a member at least every second, an aggregate checkpoint at
most every three seconds and at least every minute, docs/format.rst), which callgrind's
~50x slowdown spreads over fewer events than a native run: the report counts the members
and checkpoint records written in the window, and gives the records' instructions apart (the
inclusive cost of dft_agg_write, their formatting, and of put_record, their encoding) and the
rest per event.

At ``--level inductor`` the sections call a chain of small matmuls (bench_inductor.py's
kernel case, one extern ``mm`` kernel each) compiled with ``backend="dftrace",
options={"level": "inductor"}`` and with plain ``backend="inductor"``: the calling thread's
cost per kernel call. ``--model resnet`` calls bench_inductor.py's residual model instead
(6 blocks of LayerNorm, Linear(128, 256), GELU, Linear(256, 128), batch 32, inference;
one model compiled both ways, as there): the extra instructions per forward call, also
as a share of plain Inductor's, and the writer thread's per forward call. ``--no-record``
switches op recording off for the traced sections (``_core.set_ops_on(False)``): what
tracing costs when it records nothing. ``--functions K`` also lists the K functions whose
own instructions differ most (both threads' sections, calling thread).

``--cache-sim`` adds callgrind's cache and branch simulation (``--cache-sim=yes
--branch-sim=yes``, this machine's per-core caches with the 1 MiB L2 as the last level): D1,
L2 and I1 misses and mispredicted branches per unit, traced minus plain, calling thread, by
part (with ``--functions K``: by function, and the lines of csrc/ that differ). The simulated
cache is one, shared by the threads as valgrind runs them (on one core, as under ``taskset``).
Misses depend on addresses: parts outside csrc/ (a kernel's .so, torch) move by up to ~130 misses
per forward call between runs of the same code; the lines of csrc/ are the stable part.

``--ops K``: an elem graph of K ops (3 per layer) instead of --workload, traced by FX rather than
Dynamo (the same graph; Dynamo takes minutes over 30,000 ops), at level torch: the per-op cost as
graphs grow; the report also counts the ring waits of the traced sections (``_core.stats()``'s
``ring_waits``: a producer found its ring full and waited for the writer).

Eager op events (``DFTRACER_EAGER_OPS``) are off in the measured process unless ``--eager-ops``: the
baseline's ops run outside compiled graphs, so with them on it is no untraced baseline; with
``--eager-ops`` its ops are eager op events, and the writer's figure is over both kinds.

``writer``: ``_core.record`` of events shaped like the backend's op events, then a
flush: the writer thread's instructions per event and the bytes per event in the file.
"""

from __future__ import annotations

import argparse
import collections
import copy
import ctypes
import dataclasses
import glob
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SRC = [os.path.join(ROOT, "src")]  # the build measured (--src)

HELPER_C = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
void cg_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
"""


def c_library(tmp, name, source, opt="-O1"):
    """ctypes handle on ``source`` (C) compiled with ``cc`` into ``tmp``."""
    src, lib = os.path.join(tmp, f"{name}.c"), os.path.join(tmp, f"{name}.so")
    with open(src, "w") as f:
        f.write(source)
    subprocess.run(["cc", opt, "-shared", "-fPIC", src, "-o", lib], check=True)
    return ctypes.CDLL(lib)


def helper(tmp):
    """ctypes handle on the client-request helper (no-ops outside valgrind)."""
    return c_library(tmp, "cg", HELPER_C)


# ---- reading callgrind output ------------------------------------------------------------

_POS = re.compile(r"^(\+|-|\*)?(\d*)((?:\s+\d+)+)")

# --cache-sim: what the report shows, as sums of callgrind's events (with --cache-sim=yes
# --branch-sim=yes); the first, Ir, is the instruction count every other mode reads
EVENTS = {"instructions": ("Ir",), "D1 misses": ("D1mr", "D1mw"), "L2 data misses": ("DLmr", "DLmw"),
          "I1 misses": ("I1mr",), "L2 instr misses": ("ILmr",), "mispredicted branches": ("Bcm", "Bim")}


@dataclasses.dataclass
class Dump:
    thread: int
    label: str
    total: int
    by_line: dict  # (file, line) -> self cost
    by_obj: dict   # shared object -> self cost
    by_fn: dict    # function -> self cost
    events: tuple = ("Ir",)  # callgrind's events; the dicts above hold the first
    costs: dict = None       # event -> (total, by_line, by_obj, by_fn) of each
    called: dict = None      # function -> inclusive cost of the calls it made (first event)

    def inclusive(self, name):
        """Cost of the functions called ``name`` (any compiler suffix: .constprop.0, .isra.0) and of
        every call they made."""
        return sum(v for table in (self.by_fn, self.called or {}) for k, v in table.items() if k.split(".")[0] == name)

    def of(self, what):
        """This dump's cost in ``what`` (a key of EVENTS): the sum of its events."""
        names = [e for e in EVENTS[what] if e in self.costs]
        if not names:
            sys.exit(f"no {what} in the callgrind output (events: {' '.join(self.events)})")
        total, by_line, by_obj, by_fn = 0, collections.Counter(), collections.Counter(), collections.Counter()
        for e in names:
            t, bl, bo, bf = self.costs[e]
            total += t
            by_line.update(bl)
            by_obj.update(bo)
            by_fn.update(bf)
        return Dump(self.thread, self.label, total, dict(by_line), dict(by_obj), dict(by_fn))


def read_dump(path):
    """Self cost per (source file, line), object and function of one callgrind output file,
    for each of its events."""
    names = {"fl": {}, "fn": {}, "ob": {}}
    events = ["Ir"]
    by_line, by_obj, by_fn, called = ({} for _ in range(4))  # key -> [cost per event]
    label, thread, totals = "", 0, []
    fl = fi = ob = fn = ""
    line = 0
    skip_next = False  # the cost line after calls= is the callee's inclusive cost

    def add(table, key, costs):
        row = table.get(key)
        if row is None:
            table[key] = row = [0] * len(events)
        for i, c in enumerate(costs):
            row[i] += c

    with open(path) as f:
        for raw in f:
            s = raw.rstrip("\n")
            if not s:
                continue
            key, _, val = s.partition("=")
            if key in ("fl", "fi", "fe", "fn", "ob", "cfl", "cfi", "cfn", "cob"):
                m = re.match(r"\((\d+)\)(?: (.*))?", val)
                kind = {"fi": "fl", "fe": "fl", "cfl": "fl", "cfi": "fl", "cob": "ob", "cfn": "fn"}.get(key, key)
                if m:
                    if m.group(2) is not None:
                        names[kind][m.group(1)] = m.group(2)
                    name = names[kind].get(m.group(1), "?")
                else:
                    name = val
                if key == "fl":
                    fl = fi = name
                elif key in ("fi", "fe"):
                    fi = name
                elif key == "ob":
                    ob = name
                elif key == "fn":
                    fi, fn = fl, name
                continue
            if key == "calls":
                skip_next = True
                continue
            if s.startswith("events:"):
                events = s.split()[1:]
                continue
            if s.startswith("desc: Trigger:"):
                label = s.split("Trigger:", 1)[1].strip()
                continue
            if s.startswith("thread:"):
                thread = int(s.split()[1])
                continue
            if s.startswith("summary:") or s.startswith("totals:"):
                totals = [int(v) for v in s.split()[1:]]
                continue
            m = _POS.match(s)
            if not m:
                continue
            sign, num, costs = m.group(1), m.group(2), [int(v) for v in m.group(3).split()]
            if sign == "+":
                line += int(num)
            elif sign == "-":
                line -= int(num)
            elif sign != "*":
                line = int(num)
            if skip_next:  # the inclusive cost of a call made from fn
                skip_next = False
                add(called, fn, costs)
                continue
            add(by_line, (fi, line), costs)
            add(by_obj, os.path.basename(ob), costs)
            add(by_fn, fn, costs)
    totals += [0] * (len(events) - len(totals))
    costs = {e: (totals[i], {k: v[i] for k, v in by_line.items()}, {k: v[i] for k, v in by_obj.items()},
                 {k: v[i] for k, v in by_fn.items()}) for i, e in enumerate(events)}
    return Dump(thread, label, totals[0] if totals else 0, *costs[events[0]][1:], tuple(events), costs,
                {k: v[0] for k, v in called.items()})


def read_dumps(out_dir):
    """Section label ("base:20", "traced:40", "end" for the program's end) -> {thread -> Dump}."""
    dumps = collections.defaultdict(dict)
    for path in glob.glob(os.path.join(out_dir, "callgrind.out.*")):
        d = read_dump(path)
        label = d.label.split("dft:", 1)[1] if "dft:" in d.label else "end" if "termination" in d.label else None
        if label:
            dumps[label][d.thread] = d
    return dumps


def _inline_ranges(path):
    """(first line, last line, name) of each function in a C file, by brace matching."""
    ranges, name, depth, first, body = [], None, 0, 0, False
    head = re.compile(r"^(?:static\s+)?(?:inline\s+)?[\w\s\*]+?\b(\w+)\(")
    with open(path) as f:
        for no, text in enumerate(f, 1):
            if depth == 0:
                m = head.match(text)
                if m:
                    name, first = m.group(1), no
                if text.rstrip().endswith(";"):  # a declaration
                    name = None
            depth += text.count("{") - text.count("}")
            body = body or (name is not None and "{" in text)
            if body and depth == 0:
                ranges.append((first, no, name))
                name, body = None, False
    return ranges


# what each inlined helper of csrc/core.h is, in the report
PART = {"dft_ops_recording": "window check", "dft_now": "clock", "dft_tick": "clock", "dft_tsc_to_ns": "clock",
        "dft_mono": "clock",
        "dft_push": "ring push", "dft_ring_put": "ring push", "dft_is_open": "ring push",
        "dft_boundary": "slice stack"}


def parts(d: Dump):
    """Self instructions of one dump by part of the hot path."""
    core_h = _inline_ranges(os.path.join(SRC[0], "..", "csrc", "core.h"))
    out = collections.Counter()
    for (fname, line), cost in d.by_line.items():
        base = os.path.basename(fname)
        if base == "core.h":
            fn = next((n for a, b, n in core_h if a <= line <= b), "?")
            out[PART.get(fn, "core.h " + fn)] += cost
        elif base == "malloc.c":
            out["libc malloc"] += cost
            continue
        elif base in ("callwrap.c", "span.c", "ring.c", "clock.c", "module.c", "steps.c", "writer.c", "json.c",
                      "sink.c", "deflate.c", "aggregates.c"):
            out["csrc/" + base] += cost
        elif base in ("emmintrin.h", "wmmintrin.h"):  # SSE2 / carry-less multiply, inlined in deflate.c
            out["csrc/deflate.c"] += cost
    for obj, cost in d.by_obj.items():
        if obj.startswith("_core"):
            continue
        out[_obj_kind(obj)] += cost
    out["libc"] -= out["libc malloc"]
    return out


def _obj_kind(obj):
    if obj.startswith("libpython") or obj == "python3.11" or obj.startswith("python"):
        return "interpreter"
    if "torch" in obj or obj.startswith("libc10") or obj.startswith("libgomp"):
        return "torch"
    if obj.startswith("libdeflate"):
        return "libdeflate"
    if obj.startswith("libz"):
        return "zlib/zstd"
    if obj.startswith("libc") or obj.startswith("ld-linux") or obj.startswith("libm"):
        return "libc"
    return "other (" + obj + ")"


def writer_thread(by_thread):
    """The writer thread's Dump among one dump's threads: not the main thread (1), and the one
    that spent the most in writer.c."""
    def in_writer(d):
        return sum(c for (f, _), c in d.by_line.items() if os.path.basename(f) == "writer.c")

    others = [d for t, d in by_thread.items() if t != 1]
    return max(others, key=in_writer, default=None)


# ---- measured sections (run under valgrind) -------------------------------------------------

def section(cg, label, body, n, flush=None, path=None, written=None):
    """Runs body(n) and body(2n) in counted sections; returns the file growth of each and, with
    written (a function: events written so far), the events written in each."""
    # once uncounted first: what runs once per section on its first runs (quickening,
    # specializing, the allocator's growth) would otherwise count in the first section only
    body(n)
    if flush:
        flush()
    grown, events = [], []
    for reps in (n, 2 * n):
        size0 = os.path.getsize(path) if path else 0
        written0 = written() if written else 0
        cg.cg_zero()
        body(reps)
        if flush:
            flush()
        cg.cg_dump(f"dft:{label}:{reps}".encode())
        grown.append((os.path.getsize(path) if path else 0) - size0)
        events.append((written() if written else 0) - written0)
    return (grown, events) if written else grown


def run_ops(args, cg, tmp):
    import torch

    sys.path.insert(0, HERE)
    from bench_overhead import ops_per_call, run, workload  # noqa: E402
    from bench_modules import compile_with_slices  # noqa: E402

    import dftrace_dynamo
    from dftrace_dynamo import _core, create_backend

    torch.set_num_threads(1)
    dftrace_dynamo.initialize_log(os.path.join(tmp, "cg"))
    if args.level == "inductor":
        import bench_inductor  # noqa: E402

        torch.manual_seed(0)
        train, spans = False, 0
        if args.model == "resnet":  # bench_inductor's resnet case: per forward call
            fn = torch.nn.Sequential(*(bench_inductor.Residual() for _ in range(6)))
            inputs, n_ops = (torch.randn(32, 128),), 1
            # one model compiled both ways, as bench_inductor's inference cases do
            traced = torch.compile(fn, backend="dftrace", options={"level": "inductor"})
            base = torch.compile(fn, backend="inductor")
        else:  # its kernel case: one extern mm kernel per matmul
            fn, inputs, n_ops = bench_inductor.Chain(args.chain), (torch.randn(4, 4),), args.chain
            base = torch.compile(copy.deepcopy(fn), backend="inductor")
            traced = torch.compile(fn, backend="dftrace", options={"level": "inductor"})
    else:
        fn, inputs, train, _ = workload(args.workload)
        if args.ops:  # an elem graph of that size (bench_overhead.elem_of)
            from bench_overhead import elem_of  # noqa: E402

            fn = elem_of(args.ops // 3)
        n_ops = args.ops or ops_per_call(fn, inputs, args.level, train)
        if args.ops:
            # FX's tracer, not Dynamo's (whose tracing of 30,000 ops takes minutes natively): the graph
            # Dynamo would give, as the eager backend runs it and as our backend instruments it
            base = torch.fx.symbolic_trace(fn)
            traced = create_backend(level=args.level)(torch.fx.symbolic_trace(fn), list(inputs))
            spans = 0
        elif args.slices:
            base, _ = compile_with_slices(fn, inputs, train, args.level, False)
            traced, spans = compile_with_slices(fn, inputs, train, args.level, True)
        else:
            base = torch.compile(fn, backend="eager" if args.level == "torch" else "aot_eager")
            traced = torch.compile(fn, backend=create_backend(level=args.level))
            spans = 0
    for _ in range(3):
        run(base, inputs, train)
        run(traced, inputs, train)
    _core.flush()
    path = _core.path()
    recorded = _core.stats()["recorded"]

    def body(f):
        return lambda reps: [run(f, inputs, train) for _ in range(reps)]

    def written():
        return _core.stats()["written"]

    start, written0 = os.path.getsize(path), written()
    cg.cg_start()
    section(cg, "base", body(base), args.calls, _core.flush, path)
    before, waits = _core.stats()["recorded"], _core.stats()["ring_waits"]
    _core.set_ops_on(not args.no_record)
    grown, counted = section(cg, "traced", body(traced), args.calls, _core.flush, path, written)
    _core.set_ops_on(True)
    events = (_core.stats()["recorded"] - before) / (4 * args.calls)  # events per call, over N (uncounted) + N + 2N calls
    # every event the writer thread wrote while counted: the base sections' too (with --slices they
    # are traced, slices off), the process's own (memory samples, gc)
    in_window = written() - written0
    cg.cg_stop()  # all threads: the writer thread's count ends with the last flush, close() left out
    end = os.path.getsize(path)
    dftrace_dynamo.finalize()
    waits = _core.stats()["ring_waits"] - waits
    print(f"META ops={n_ops} spans={spans} events={events} bytes={sum(grown) / sum(counted)} "
          f"written={in_window} start={start} end={end} recorded_before={recorded} ring_waits={waits}")


def run_writer(args, cg, tmp):
    sys.path.insert(0, HERE)
    from bench_writer import HHASH, make_events, sites  # noqa: E402

    from dftrace_dynamo import _core

    site_ids, tag_ids = sites()
    recs = [(site_ids[s], a, b, f, tag_ids[t]) for s, a, b, f, t in make_events(2000 + args.events)]
    path = os.path.join(tmp, "w.pfw")
    _core.open(path, args.compression, 16 << 20, b"", os.getpid(), HHASH)
    rec = _core.record
    for r in recs[:2000]:  # warm up: first member, thread name, placement stack
        rec(*r)
    _core.flush()
    size0 = os.path.getsize(path)
    cg.cg_start()  # the writer thread counts from here to its end (close() included)
    for r in recs[2000:]:
        rec(*r)
    _core.flush()
    size = os.path.getsize(path) - size0
    _core.close()
    print(f"META events={args.events} bytes={size}")


# ---- driver -----------------------------------------------------------------------------------

def diff_parts(a: Dump, b: Dump, per):
    """Instructions of b minus a, divided by per: in total and by part."""
    pa, pb = parts(a), parts(b)
    return (b.total - a.total) / per, {k: (pb.get(k, 0) - pa.get(k, 0)) / per for k in pb.keys() | pa.keys()}


def print_parts(by_part, minimum=0.5, indent=4):
    for k, v in sorted(by_part.items(), key=lambda kv: -kv[1]):
        if abs(v) >= minimum:
            print(f"{' ' * indent}{k:<28} {v:>8.1f}")


# --cache-sim: this machine's per-core caches (lscpu: 32 KiB 8-way L1s, 1 MiB 8-way L2), the L2
# as callgrind's last level: the model's weights (1.5 MiB) do not fit in it, while the shared
# L3 (32 MiB) would hold everything and show no misses
CACHES = "I1 32 KiB 8-way, D1 32 KiB 8-way, L2 1 MiB 8-way, 64 B lines"
CACHE_SIM = ["--cache-sim=yes", "--branch-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", "--LL=1048576,8,64"]


def valgrind(argv, tmp, extra, options=()):
    """Runs this script's inner part under callgrind (with these extra valgrind options); its
    META line as a dict, and its dumps."""
    cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--instr-atstart=no", *options,
           f"--callgrind-out-file={tmp}/callgrind.out.%p", sys.executable, os.path.abspath(__file__),
           *argv, *extra, "--inner", "--tmp", tmp]
    if os.path.exists(os.path.join(tmp, "meta.txt")):  # --dumps: read a finished run again
        with open(os.path.join(tmp, "meta.txt")) as f:
            meta = f.read()
        return {k: float(v) for k, v in (kv.split("=") for kv in meta.split()[1:])}, read_dumps(tmp)
    env = dict(os.environ, DFTRACER_ENABLE="1", PYTHONPATH=os.pathsep.join(
        [SRC[0], os.environ.get("PYTHONPATH", "")]))
    if "--eager-ops" not in argv:  # the untraced baseline's ops run outside compiled graphs
        env["DFTRACER_EAGER_OPS"] = "0"
    # valgrind runs no AVX-512: Inductor's C++ kernels (and their cache entries) are built for AVX2
    env.setdefault("ATEN_CPU_CAPABILITY", "avx2")
    env.setdefault("TORCHINDUCTOR_CPP_MARCH", "x86-64-v3")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    meta = next((ln for ln in proc.stdout.splitlines() if ln.startswith("META ")), None)
    if proc.returncode != 0 or meta is None:
        sys.exit(f"callgrind run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with open(os.path.join(tmp, "meta.txt"), "w") as f:
        f.write(meta)
    return {k: float(v) for k, v in (kv.split("=") for kv in meta.split()[1:])}, read_dumps(tmp)


def report_ops(argv, args):
    tmp = args.dumps or tempfile.mkdtemp(prefix="callgrind_costs_")
    meta, dumps = valgrind(argv, tmp, [], CACHE_SIM if args.cache_sim else [])
    ops, spans, events = meta["ops"], meta["spans"], meta["events"]
    n = args.calls
    base, base_parts = diff_parts(dumps[f"base:{n}"][1], dumps[f"base:{2 * n}"][1], n)
    traced, traced_parts = diff_parts(dumps[f"traced:{n}"][1], dumps[f"traced:{2 * n}"][1], n)
    what = "module slices on vs off" if args.slices else "traced vs untraced"
    what += ", op recording off" if args.no_record else ""
    model = args.level == "inductor" and args.model == "resnet"
    unit, per = ("module call", spans) if args.slices else (
        "forward call" if model else "kernel call" if args.level == "inductor" else "op", ops)
    name = ("residual model (6 blocks, batch 32)" if model else f"chain of {args.chain} matmuls"
            if args.level == "inductor" else args.workload)
    print(f"{name} at level {args.level}, {what}: {'' if model else f'{ops:.0f} ops/call, '}"
          f"{spans:.0f} module calls/call, {events:.0f} events/call, N={n} calls")
    if model:
        print(f"calling thread: {traced - base:.0f} instructions per forward call "
              f"({100 * (traced - base) / base:+.2f} % of plain Inductor's {base:.0f}), by part:")
    else:
        print(f"calling thread: {(traced - base) / per:.0f} instructions per {unit} "
              f"(untraced{', slices off' if args.slices else ''}: {base / ops:.0f} per op), by part:")
    by_part = {k: (traced_parts.get(k, 0) - base_parts.get(k, 0)) / per for k in traced_parts.keys() | base_parts.keys()}
    print_parts(by_part)
    if args.functions:
        print(f"  the {args.functions} functions whose own instructions differ most, per {unit}:")
        print_top(differ(dumps, n, per, "by_fn"), args.functions)
    ours = sum(v for k, v in by_part.items() if k.startswith("csrc") or k in PART.values())
    print(f"  in _core: {ours:.0f}; without libc malloc (the allocator's state differs between runs: noise): "
          f"{(traced - base) / per - by_part.get('libc malloc', 0):.0f}")
    w = writer_thread(dumps["end"])
    if w is not None and meta.get("written"):
        # the writer thread is not zeroed by the sections (a client request zeroes and dumps the
        # calling thread only): its count runs from the first section to the last flush, over
        # every event written meanwhile (base sections, memory samples and gc events included)
        members, records = window_members(glob.glob(os.path.join(tmp, "cg-*.pfw*")),
                                          meta.get("start"), meta.get("end"))
        print(f"writer thread: {w.total / meta['written']:.0f} instructions per event ({meta['written']:.0f} events "
              f"written from the first section to the last flush: {members} members, {records} checkpoint "
              f"records; `writer` gives the steady figure), {meta['bytes']:.1f} bytes per event (the traced "
              f"sections' file growth over their events)"
              + (f"; {w.total / (4 * n):.0f} per forward call" if model else ""))
        # a checkpoint record falls at most every three seconds and at least every minute of wall
        # time, which callgrind stretches ~50x: its formatting (dft_agg_write and what it calls) and
        # encoding (put_record) apart, and the rest per event
        rec = w.inclusive("dft_agg_write") + w.inclusive("put_record")
        if records and records != "?":
            print(f"  of it the {records} checkpoint records: {rec / records:,.0f} instructions each, "
                  f"{rec / meta['written']:.0f} per event; the rest (events, members): "
                  f"{(w.total - rec) / meta['written']:.0f} per event")
    print(f"ring waits (a producer found its ring full) in the traced sections: {meta.get('ring_waits', 0):.0f}")
    if args.cache_sim:
        report_misses(dumps, n, per, unit, args.functions)


def window_members(paths, start, end):
    """(gzip members, aggregate checkpoint records) in the bytes [start, end) of the trace file:
    what the writer did per second of wall time rather than per event, which callgrind's
    slowdown multiplies."""
    import zlib

    if len(paths) != 1 or start is None:
        return "?", "?"
    with open(paths[0], "rb") as f:
        f.seek(int(start))
        data = f.read(int(end) - int(start))
    members = records = 0
    while data[:2] == b"\x1f\x8b":
        d = zlib.decompressobj(31)
        records += d.decompress(data).count(b'"name":"dftrace_aggregates"')
        data, members = d.unused_data, members + 1
    return members, records


def differ(dumps, n, per, table, what="instructions"):
    """Traced minus plain self cost in what (a key of EVENTS) per unit, by key of a Dump table
    (by_fn, by_line), calling thread."""
    out = collections.Counter()
    for d, sign in ((f"traced:{2 * n}", 1), (f"traced:{n}", -1), (f"base:{2 * n}", -1), (f"base:{n}", 1)):
        for key, cost in getattr(dumps[d][1].of(what), table).items():
            out[key] += sign * cost / (n * per)
    return out


def print_top(by_key, k):
    for key, v in sorted(by_key.items(), key=lambda kv: -abs(kv[1]))[:k]:
        if isinstance(key, tuple):
            key = f"{os.path.basename(key[0])}:{key[1]}"
        print(f"    {v:>9.1f}  {key}")


def report_misses(dumps, n, per, unit, functions):
    """--cache-sim: the calling thread's cache misses and mispredicted branches per unit,
    traced minus plain, by part; with functions, the functions and the lines of csrc/ that
    differ most."""
    print(f"cache simulation (calling thread; callgrind's caches: {CACHES}), per {unit}:")
    for what in list(EVENTS)[1:]:
        base, base_parts = diff_parts(*(dumps[f"base:{k}"][1].of(what) for k in (n, 2 * n)), n)
        traced, traced_parts = diff_parts(*(dumps[f"traced:{k}"][1].of(what) for k in (n, 2 * n)), n)
        print(f"  {what}: plain {base / per:.1f}, traced - plain {(traced - base) / per:+.1f}, by part:")
        print_parts({k: (traced_parts.get(k, 0) - base_parts.get(k, 0)) / per
                     for k in traced_parts.keys() | base_parts.keys()}, minimum=1, indent=6)
        if functions:
            print(f"    the {functions} functions that differ most:")
            print_top(differ(dumps, n, per, "by_fn", what), functions)
            ours = {k: v for k, v in differ(dumps, n, per, "by_line", what).items()
                    if os.path.basename(k[0]).endswith((".c", ".h")) and "csrc" in k[0]}
            if ours:
                print(f"    the lines of csrc/ that differ most:")
                print_top(ours, functions)


def report_writer(argv, args):
    names = {0: "plain", 1: "gzip", 2: "zstd", 3: "gzip-general"}
    runs = [valgrind(argv, tempfile.mkdtemp(prefix="callgrind_costs_"), ["--events", str(k * args.events)])
            for k in (1, 2)]
    (m1, d1), (m2, d2) = runs
    events = m2["events"] - m1["events"]
    total, by_part = diff_parts(writer_thread(d1["end"]), writer_thread(d2["end"]), events)
    print(f"writer thread, {names[args.compression]}: {total:.0f} instructions per event, "
          f"{(m2['bytes'] - m1['bytes']) / events:.1f} bytes per event in the file (N={args.events:.0f} vs 2N events)")
    print_parts(by_part)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("ops", "writer"))
    p.add_argument("--workload", default="elem", help="ops: a bench_overhead workload (elem, mlp)")
    p.add_argument("--level", default="torch", choices=("torch", "aten", "inductor"),
                   help="ops: inductor measures a chain of --chain small matmuls (bench_inductor.py's kernel "
                        "case) against plain backend='inductor', per kernel call; --workload is unused there")
    p.add_argument("--chain", type=int, default=24, help="ops at level inductor: matmuls (kernels) per call")
    p.add_argument("--model", default="chain", choices=("chain", "resnet"),
                   help="ops at level inductor: the chain of --chain matmuls (per kernel call) or bench_inductor.py's "
                        "residual model (per forward call)")
    p.add_argument("--no-record", action="store_true",
                   help="ops: the traced sections run with op recording off (_core.set_ops_on(False))")
    p.add_argument("--functions", type=int, default=0, metavar="K",
                   help="ops: also list the K functions whose own instructions differ most (calling thread)")
    p.add_argument("--cache-sim", action="store_true",
                   help="ops: also simulate the caches and branch predictor (callgrind --cache-sim=yes "
                        "--branch-sim=yes, L2-sized last level): D1, L2 and I1 misses and mispredicted "
                        "branches per unit, traced minus plain, by part (--functions K: and by function, "
                        "and the lines of csrc/)")
    p.add_argument("--ops", type=int, default=0,
                   help="ops: an elem graph of this many ops (3 per layer, traced by FX) instead of --workload, "
                        "level torch: per-op cost as graphs grow (300 is elem's size)")
    p.add_argument("--slices", action="store_true", help="ops: module slices on vs off instead of traced vs untraced")
    p.add_argument("--eager-ops", action="store_true",
                   help="ops: eager op events on (the default of DFTRACER_EAGER_OPS): the baseline's ops are "
                        "recorded as eager ops, the writer's figure is over both kinds of event")
    p.add_argument("--calls", type=int, default=20, help="ops: N, calls per section (N and 2N are differenced)")
    p.add_argument("--events", type=float, default=100000, help="writer: N events (N and 2N are differenced)")
    p.add_argument("--compression", type=int, default=1,
                   help="writer: 0 plain, 1 gzip (default), 2 zstd, 3 gzip with libdeflate/zlib (gzip-general)")
    p.add_argument("--src", help="the src directory of another build to measure (e.g. one bench_compare built)")
    p.add_argument("--dumps", help="ops: report a finished run again from its output directory")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    if args.src:
        SRC[0] = os.path.abspath(args.src)
    if args.inner:
        args.events = int(args.events)
        cg = helper(args.tmp)
        (run_ops if args.what == "ops" else run_writer)(args, cg, args.tmp)
        return 0
    start = time.time()
    (report_ops if args.what == "ops" else report_writer)(argv, args)
    print(f"(callgrind {time.time() - start:.0f} s, output in {args.dumps or tempfile.gettempdir()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
