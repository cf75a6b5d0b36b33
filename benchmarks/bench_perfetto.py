"""Perfetto's protobuf output (``convert --format perfetto``) against the JSON: bytes per event,
convert speed, and the largest trace the trace processor loads in each format.

    python benchmarks/bench_perfetto.py [--steps 600] [--layers 8] [--repeat 5]
    python benchmarks/bench_perfetto.py --callgrind [--events 5000] [--steps 150]
    python benchmarks/bench_perfetto.py --capacity [--cap-mb 512] [--start 250000] [--no-args]

The trace is a step-structured training loop written by the real C writer
(tests/scripts/stepgen.py: per step data, forward/backward graphs with module slices and 3 ops
per layer, optimizer; every event with 6-7 arguments).

Sizes: the JSON is ``merge``'s output (events only: the per-file aggregate records left out), the
protobuf ``convert --format perfetto``'s; gzip at level 6. Speed (median of ``--repeat`` runs,
each timed with ``perf_counter_ns``): reading the events only (the JSON parse every converter
pays), the whole convert, and the encoding of the same slices into packets by this module's
encoder and by the ``perfetto`` package's messages (``TracePacket`` built field by field,
``SerializeToString``).

``--callgrind``: the same four, as instructions per event (callgrind, which the load of a shared
machine does not move): each counted on N and 2N events, the difference divided by N.

``--capacity``: one step of the trace, as JSON lines and as protobuf packets, repeated until N
events and streamed into the WASM trace processor under Node (benchmarks/tp_capacity.mjs, no
file on disk); the largest trace of each format that loads is found by doubling from
``--start`` and then bisection (to 5%). The engine's memory is capped (``--cap-mb``; a growth
past the cap fails as one past WASM32's 4 GiB does) so that each probe takes seconds, not the
~15 minutes a 16 M-event JSON takes to load on the shared machine.
"""

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import orjson

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from bench_scale import timer_cost_ns  # noqa: E402

from callgrind_costs import helper, read_dumps  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests"))
import perfetto_tp  # noqa: E402  the tests' trace processor: where Perfetto's WASM build is

from dftrace_dynamo.traces import perfetto_proto  # noqa: E402
from dftrace_dynamo.traces.merge import merge  # noqa: E402
from dftrace_dynamo.traces.reader import EventLines  # noqa: E402
from dftrace_dynamo.traces.writer import TraceWriter  # noqa: E402

STEPGEN = os.path.join(ROOT, "tests", "scripts", "stepgen.py")
CAPACITY = os.path.join(ROOT, "benchmarks", "tp_capacity.mjs")


def stepgen(directory, steps, layers):
    env = dict(os.environ, DFTRACER_ENABLE="1")
    out = subprocess.run([sys.executable, STEPGEN, os.path.join(directory, "job"), "--steps", str(steps),
                          "--layers", str(layers)], capture_output=True, text=True, check=True, env=env)
    return out.stdout.strip()


def median_ns(fn, repeat):
    runs = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        fn()
        runs.append(time.perf_counter_ns() - start)
    return statistics.median(runs), min(runs)


def encode_hand(slices):
    seq = perfetto_proto.Sequence(1, 1)
    for order, (start, end, ev) in enumerate(slices):
        seq.add_slice(start, end, order, ev)
    seq.events.sort()
    out = bytearray()
    seq.encode(seq.events[0][0], out.extend)
    return out


def encode_messages(pb, slices):
    """The same slices as packets built with the package's messages (begin and end each)."""
    names, cats, keys, strings, out = {}, {}, {}, {}, []

    def iid(table, text):
        return table.setdefault(text, len(table) + 1)

    for start, end, ev in sorted(slices, key=lambda s: (s[0], -s[1])):
        p = pb.TracePacket()
        p.timestamp, p.trusted_packet_sequence_id = start, 1
        e = p.track_event
        e.type, e.name_iid = pb.TrackEvent.TYPE_SLICE_BEGIN, iid(names, ev["name"])
        e.category_iids.append(iid(cats, ev["cat"]))
        for k, v in ev["args"].items():
            a = e.debug_annotations.add()
            a.name_iid = iid(keys, k)
            if isinstance(v, str):
                a.string_value_iid = iid(strings, v)
            elif isinstance(v, bool):
                a.bool_value = v
            elif isinstance(v, int):
                a.int_value = v
            else:
                a.double_value = v
        out.append(p.SerializeToString())
        p = pb.TracePacket()
        p.timestamp, p.trusted_packet_sequence_id = end, 1
        p.track_event.type = pb.TrackEvent.TYPE_SLICE_END
        out.append(p.SerializeToString())
    return b"".join(out)


def sizes_and_speed(a, work):
    src = stepgen(work, a.steps, a.layers)
    js, proto = os.path.join(work, "events.pfw"), os.path.join(work, "t.perfetto-trace")
    merge([src], js)
    events, _ = perfetto_proto.write_perfetto([src], proto)
    slices = [(round(e["ts"] * 1000), round(e["ts"] * 1000) + round(e["dur"] * 1000), e)
              for _, _, e in EventLines(src) if e.get("ph") == "X" and e.get("cat") != "dftracer"]
    print(f"trace: stepgen --steps {a.steps} --layers {a.layers}: {events:,} events ({len(slices):,} slices)")
    print(f"{'':12} {'bytes':>12} {'B/event':>8} {'gzip B':>12} {'gz B/ev':>8}")
    sizes = {}
    for label, path in (("JSON", js), ("protobuf", proto)):
        data = open(path, "rb").read()
        gz = len(gzip.compress(data, 6))
        sizes[label] = len(data), gz
        print(f"{label:12} {len(data):12,} {len(data) / events:8.1f} {gz:12,} {gz / events:8.1f}")
    print(f"protobuf / JSON: {sizes['protobuf'][0] / sizes['JSON'][0]:.3f} uncompressed, "
          f"{sizes['protobuf'][1] / sizes['JSON'][1]:.3f} gzip")

    pb = perfetto_proto.load_pb2()
    print(f"\nspeed, median (min) of {a.repeat}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"perf_counter_ns() costs {timer_cost_ns():.0f} ns")

    def convert():
        os.unlink(proto)
        perfetto_proto.write_perfetto([src], proto)

    cases = (("read the events only", events, lambda: sum(1 for _ in EventLines(src))),
             ("convert --format perfetto", events, convert),
             ("encode slices: this module", len(slices), lambda: encode_hand(slices)),
             ("encode slices: pb2 messages", len(slices), lambda: encode_messages(pb, slices)))
    for label, n, fn in cases:
        med, best = median_ns(fn, a.repeat)
        print(f"{label:30} {med / n:8.0f} ns/event ({best / n:6.0f})  {n / med * 1e9:12,.0f} events/s")


# --- instructions, by callgrind -----------------------------------------------------------------

SECTIONS = ("read the events only", "convert --format perfetto", "encode slices: this module",
            "encode slices: pb2 messages")


def counted_sections(a, work):
    """Under callgrind (--inner): each section once uncounted, then counted on n and 2n events."""
    cg = helper(work)
    src = stepgen(work, a.steps, a.layers)
    lines = [(raw, ev) for _, raw, ev in EventLines(src) if ev.get("cat") != "dftracer"]
    n = a.events
    files = {}
    for k in (n, 2 * n):
        files[k] = os.path.join(work, f"part{k}.pfw")
        with TraceWriter(files[k]) as w:
            for raw, _ in lines[:k]:
                w.write(raw)
    slices = [(round(e["ts"] * 1000), round(e["ts"] * 1000) + round(e["dur"] * 1000), e)
              for _, e in lines if e.get("ph") == "X"]
    pb = perfetto_proto.load_pb2()

    def convert(k):
        out = os.path.join(work, f"out{k}.perfetto-trace")
        if os.path.exists(out):
            os.unlink(out)
        perfetto_proto.write_perfetto([files[k]], out)

    bodies = (lambda k: sum(1 for _ in EventLines(files[k])), convert, lambda k: encode_hand(slices[:k]),
              lambda k: encode_messages(pb, slices[:k]))
    cg.cg_start()
    for label, body in zip(SECTIONS, bodies):
        body(n)
        for k in (n, 2 * n):
            cg.cg_zero()
            body(k)
            cg.cg_dump(f"dft:{SECTIONS.index(label)}:{k}".encode())
    print("META done=1")


def instructions(a, work):
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={work}/callgrind.out.%p",
           sys.executable, os.path.abspath(__file__), "--callgrind", "--inner", "--events", str(a.events),
           "--steps", str(a.steps), "--layers", str(a.layers)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(p.stderr[-3000:])
    dumps = read_dumps(work)
    n = a.events
    print(f"instructions per event (callgrind; the difference of {n:,} and {2 * n:,} events, divided by {n:,}):")
    for i, label in enumerate(SECTIONS):
        one, two = (sum(d.total for d in dumps[f"{i}:{k}"].values()) for k in (n, 2 * n))
        print(f"  {label:30} {(two - one) / n:10,.0f}")


# --- capacity -----------------------------------------------------------------------------------

def blocks(work, layers, args=True):
    """One step of a stepgen trace (``args``: with its arguments) as a JSON template and as
    protobuf head and block bytes."""
    src = stepgen(work, 8, layers)
    evs = [e for _, _, e in EventLines(src) if e.get("ph") == "X" and (e.get("args") or {}).get("step") == 5]
    evs = evs if args else [{k: v for k, v in e.items() if k != "args"} for e in evs]
    step = next(e for e in evs if e.get("cat") == "step")
    t0, end = step["ts"], step["ts"] + step["dur"]
    step_us = int(end - t0) + 1
    template = []
    for e in evs:
        text = orjson.dumps(dict(e, ts=0)).decode()
        before, after = text.split('"ts":0', 1)
        template.append([before + '"ts":', e["ts"] - t0, after])
    json_block = os.path.join(work, "block.json")
    with open(json_block, "w") as f:
        json.dump({"events": template, "step_us": step_us}, f)
    head = os.path.join(work, "head.bin")
    w = perfetto_proto.Writer(head)
    seq = perfetto_proto.Sequence(1, w.uuid())
    process = w.uuid()
    w.track(process, process={"pid": 1, "process_name": "bench"})
    w.track(seq.track, thread={"pid": 1, "tid": 1, "thread_name": "main"})
    for order, e in enumerate(evs):
        start = round((e["ts"] - t0) * 1000)
        seq.add_slice(start, start + round(e["dur"] * 1000), order, e)
    seq.events.sort()
    w.header(seq, 0)
    w.close()
    block = os.path.join(work, "block.bin")
    with open(block, "wb") as f:
        seq.encode(0, f.write)  # incremental times: each copy starts where the previous one ended
    return json_block, head, block, len(evs)


def probe(args):
    start = time.perf_counter()
    p = subprocess.run(["node", "--max-old-space-size=2048", CAPACITY, *map(str, args)],
                       capture_output=True, text=True, timeout=1800)
    line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "{}"
    try:
        r = json.loads(line)
    except json.JSONDecodeError:
        r = {}
    r.setdefault("ok", False)
    r.setdefault("error", (p.stderr.strip().splitlines() or ["node exited " + str(p.returncode)])[-1][:200])
    r["wall_s"] = time.perf_counter() - start
    return r


def largest(load, start, top):
    """The largest N (to 5%) for which ``load(N)`` holds: doubling from ``start``, then bisection."""
    good, bad, n = 0, None, start
    while bad is None and n <= top:
        if load(n):
            good, n = n, n * 2
        else:
            bad = n
    while bad is not None and bad - good > 0.05 * bad:
        mid = (good + bad) // 2
        if load(mid):
            good = mid
        else:
            bad = mid
    return good, bad


def capacity(a, work):
    json_block, head, block, per = blocks(work, a.layers, not a.no_args)
    os.environ.update(perfetto_tp._env(), TP_CAP_MB=str(a.cap_mb), TP_TURBOFAN="1")
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    cap = f"WASM memory capped at {a.cap_mb} MiB" if a.cap_mb else "4 GiB WASM address space"
    print(f"capacity: one step = {per} slices ({'no' if a.no_args else '6-7'} arguments each), repeated; Perfetto v52 WASM "
          f"(tests/perfetto/tp.mjs) under Node {node}, {cap}")
    found = {}
    for fmt in ("json", "proto"):
        def load(n, fmt=fmt):
            r = probe(["json", json_block, n] if fmt == "json" else ["proto", head, block, per, n])
            ok = r["ok"] and r.get("slices", 0) >= n
            print(f"  {fmt:5} {n:>12,} events: {'loaded' if ok else 'failed'}, peak {r.get('peak_mb') or 0:6.0f} MiB, "
                  f"{r['wall_s']:4.0f} s" + ("" if ok else f" ({(r.get('error') or '').splitlines()[0][:60]})"),
                  flush=True)
            return ok
        found[fmt] = largest(load, a.start, a.max)
        good, bad = found[fmt]
        print(f"largest {fmt} loaded: {good:,} events" + (f" (fails at {bad:,})" if bad else " (none failed)"))
    print(f"protobuf / JSON events loaded: {found['proto'][0] / max(found['json'][0], 1):.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--capacity", action="store_true", help="find the largest trace the trace processor loads")
    ap.add_argument("--callgrind", action="store_true", help="instructions per event instead of times")
    ap.add_argument("--events", type=int, default=5000, help="--callgrind: events of the smaller section")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=250_000, help="--capacity: events of the first probe")
    ap.add_argument("--max", type=int, default=256_000_000, help="--capacity: events of the largest probe")
    ap.add_argument("--no-args", action="store_true", help="--capacity: the events without their arguments")
    ap.add_argument("--cap-mb", type=int, default=512,
                    help="--capacity: cap on the engine's WASM memory (0: none, the 4 GiB of WASM32; hours here)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        if a.capacity:
            capacity(a, work)
        elif a.callgrind:
            (counted_sections if a.inner else instructions)(a, work)
        else:
            sizes_and_speed(a, work)


if __name__ == "__main__":
    main()
