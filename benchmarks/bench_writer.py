"""Benchmark of the C trace writer (dftrace_dynamo._core) against a pure-Python
writer (orjson + gzip/zstandard), the recording cost on the calling thread, the
Interceptor overhead, the cost of log() (region/log_event) and the extra RSS
while writing many events.

Run on one core so that the writer thread and the recording thread compete as
they would on a busy machine:

    taskset -c 1 python3 benchmarks/bench_writer.py

Writer cost is measured as CPU time: process CPU minus the recording thread's
CPU over open()..close(), divided by the number of events. Recording costs are
thread CPU times of the calling thread (so the writer running on the same core
does not count), as the difference between a loop with a file open and the
same loop with no file open (or calling the target directly). Medians of
--reps runs are printed.
"""

import argparse
import gzip
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib

import orjson
import psutil
import zstandard

from dftrace_dynamo import _core

HHASH = "0123456789abcdef"
# Sites shaped like the backend's (sites.op_args): name, graph id, FX node, module.
NAMES = [
    "function.convolution.default", "function.relu.default", "function.addmm.default",
    "function.mm.default", "function.view.default", "function.t.default",
    "function.native_layer_norm.default", "function.gelu.default", "function.add.Tensor",
    "function.mul.Tensor", "function._softmax.default", "function.bmm.default",
    "function.sum.dim_IntList", "function.threshold_backward.default", "function.getitem",
    "function.clone.default",
]
MODULES = ["layers.0.attn", "layers.0.mlp", "head", "layers.1.attn"]


def cpu_self():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def make_events(n, seed=1):
    """Per-event (site index, start, end, flags, tags): ops of 0.3-40 µs with gaps."""
    rnd = random.Random(seed)
    t = time.time_ns()
    out = []
    for i in range(n):
        dur = int(rnd.lognormvariate(7.5, 1.2)) + 300
        out.append((i % len(NAMES), t, t + dur, 1 | (1 << 1), 1 + (i // 50000) % 4))
        t += dur + rnd.randrange(50, 2000)
    return out


def site_args(i, n):
    return {"graph": 0, "node": f"{n.split('.')[1]}_{i}", "module": MODULES[i % len(MODULES)]}


def sites():
    ids = []
    for i, n in enumerate(NAMES):
        ids.append(_core.intern_site(n, "dynamo", site_args(i, n)))
    tags = [0] + [_core.intern_tags({"step": 10 * e}) for e in range(4)]
    return ids, tags


def c_writer(events, comp, tmp):
    site_ids, tag_ids = sites()
    path = os.path.join(tmp, f"c{comp}-{time.perf_counter_ns()}.pfw")
    rec = _core.record
    recs = [(site_ids[s], a, b, f, tag_ids[t]) for s, a, b, f, t in events]
    cpu0, th0 = cpu_self(), time.thread_time()
    _core.open(path, comp, 16 << 20, b"", os.getpid(), HHASH)
    for r in recs:
        rec(*r)
    res = _core.close()
    cpu1, th1 = cpu_self(), time.thread_time()
    assert res["num_events"] == len(events) and res["dropped"] == 0, res
    writer_cpu = (cpu1 - cpu0) - (th1 - th0)
    size = os.path.getsize(path)
    os.remove(path)
    return {"ev_s": len(events) / writer_cpu, "b_ev": size / len(events)}


def py_writer(events, comp, tmp):
    """What a Python writer would do: a dict per event, orjson, compress in
    1 MiB members (gzip members / zstd frames)."""
    path = os.path.join(tmp, f"py{comp}-{time.perf_counter_ns()}.pfw")
    names = [(n, site_args(i, n)) for i, n in enumerate(NAMES)]
    tags = [{}] + [{"step": 10 * e} for e in range(4)]
    pid, tid = os.getpid(), threading.get_native_id()
    zc = zstandard.ZstdCompressor(level=1)
    c0 = time.thread_time()
    with open(path, "wb") as f:
        f.write(b"[\n")
        chunk, size = [], 0
        for i, (s, a, b, fl, t) in enumerate(events):
            name, sargs = names[s]
            line = orjson.dumps({
                "id": i + 1, "name": name, "cat": "dynamo", "pid": pid, "tid": tid,
                "ts": a // 1000, "dur": (b - a) / 1000, "ph": "X",
                "args": {"hhash": HHASH, **sargs, **tags[t], "grad_enabled": fl & 1,
                         "phase": "forward"},
            }) + b"\n"
            chunk.append(line)
            size += len(line)
            if size >= 1 << 20 or i == len(events) - 1:
                data = b"".join(chunk)
                if comp == 0:
                    f.write(data)
                elif comp == 1:
                    f.write(gzip.compress(data, compresslevel=1))
                else:
                    f.write(zc.compress(data))
                chunk, size = [], 0
    cpu = time.thread_time() - c0
    size = os.path.getsize(path)
    os.remove(path)
    return {"ev_s": len(events) / cpu, "b_ev": size / len(events)}


def loop_cost(f, args, n):
    t = time.thread_time_ns()
    for _ in range(n):
        f(*args)
    return (time.thread_time_ns() - t) / n


def recording_costs(tmp, n):
    site = _core.intern_site("aten.relu.default", "dynamo", {"level": 1})
    cell = _core.TagCell()
    ic = _core.Interceptor(abs, site, cell, name="abs")
    rec = _core.record
    out = {}
    out["direct"] = loop_cost(abs, (1,), n)
    out["icpt_closed"] = loop_cost(ic, (1,), n)
    out["record_closed"] = loop_cost(rec, (site, 1, 2), n)
    out["log_closed"] = loop_cost(_core.log, ("data", "region", 1, 2), n)
    path = os.path.join(tmp, f"r-{time.perf_counter_ns()}.pfw")
    _core.open(path, 2, 16 << 20, b"", os.getpid(), HHASH)
    out["icpt_open"] = loop_cost(ic, (1,), n)
    out["record_open"] = loop_cost(rec, (site, 1, 2), n)
    out["log_open"] = loop_cost(_core.log, ("data", "region", 1, 2), n)
    _core.close()
    os.remove(path)
    return out


def rss_run(tmp, n, comp):
    """Extra RSS (peak over the baseline before open()) while writing n events,
    in a fresh process so that no earlier ring or buffer is already resident."""
    code = f"""
import os, psutil, time
from dftrace_dynamo import _core
site = _core.intern_site("function.relu.default", "dynamo", {{"graph": 0, "node": "relu_1"}})
proc = psutil.Process()
path = os.path.join({tmp!r}, "rss-%d.pfw" % os.getpid())
rec = _core.record
t = time.time_ns()
base = peak = proc.memory_info().rss
_core.open(path, {comp}, 16 << 20, b"", os.getpid(), "0123456789abcdef")
for chunk in range({n} // 100_000):
    for i in range(100_000):
        rec(site, t, t + 700)
        t += 1000
    peak = max(peak, proc.memory_info().rss)
res = _core.close()
peak = max(peak, proc.memory_info().rss)
os.remove(path)
assert res["num_events"] == {n} // 100_000 * 100_000 and res["dropped"] == 0
print((peak - base) / 2**20)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rss-events", type=int, default=10_000_000)
    ap.add_argument("--loop", type=int, default=2_000_000)
    ap.add_argument("--modes", default="0,1,2",
                    help="compression modes to compare (0 plain, 1 gzip, 2 zstd, 3 gzip-general: libdeflate/zlib)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench_writer_")
    events = make_events(a.events)
    print(f"affinity={sorted(os.sched_getaffinity(0))} events={a.events} reps={a.reps}")
    print(f"{'writer':28} {'events/s (CPU)':>15} {'ns/event':>9} {'bytes/event':>12}", flush=True)
    modes = [int(m) for m in a.modes.split(",")]
    for comp, cname in ((0, "plain"), (1, "gzip"), (3, "gzip-general"), (2, "zstd-1")):
        if comp not in modes:
            continue
        # the Python baseline compresses with zlib level 1 for both gzip modes
        for kind, fn in (("C _core", c_writer), ("Python orjson", py_writer))[:1 if comp == 3 else 2]:
            rs = [fn(events, comp, tmp) for _ in range(a.reps)]
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            print(f"{kind + ' ' + cname:28} {med['ev_s'] / 1e6:13.2f} M {1e9 / med['ev_s']:9.0f} "
                  f"{med['b_ev']:12.2f}", flush=True)
    rc = [recording_costs(tmp, a.loop) for _ in range(max(a.reps, 5))]
    m = {k: statistics.median(r[k] for r in rc) for k in rc[0]}
    print(f"record(): {m['record_open']:.1f} ns open vs {m['record_closed']:.1f} ns closed "
          f"-> push cost {m['record_open'] - m['record_closed']:.1f} ns/event (thread CPU)")
    print(f"log() (region/log_event path): {m['log_open']:.1f} ns open vs {m['log_closed']:.1f} ns closed "
          f"-> {m['log_open'] - m['log_closed']:.1f} ns/event (thread CPU)")
    print(f"Interceptor(abs): {m['icpt_open']:.1f} ns open, {m['icpt_closed']:.1f} ns closed, "
          f"abs() direct {m['direct']:.1f} ns -> overhead {m['icpt_open'] - m['direct']:.1f} ns "
          f"per call (closed: {m['icpt_closed'] - m['direct']:.1f} ns)")
    if a.rss_events:
        for comp, cname in ((1, "gzip"), (2, "zstd-1")):
            if comp not in modes:
                continue
            print(f"extra RSS writing {a.rss_events / 1e6:.0f}M events ({cname}, 16 MiB buffer): "
                  f"{rss_run(tmp, a.rss_events, comp):.1f} MiB")
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
