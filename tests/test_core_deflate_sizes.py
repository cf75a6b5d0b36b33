"""How small the writer's own gzip encoder (csrc/deflate.c) makes what a real workload writes,
against a general deflate (zlib) of the same text: the lines of ops in module slices, whose
same-site line is a whole graph call back (out of deflate's window), and the aggregate record,
one long line of groups, sketch buckets and copied events. Every member still decodes to exactly
its text (test_core_deflate.roundtrip)."""

import hashlib
import json
import random
import zlib

from test_core_deflate import hinted_line, roundtrip, roundtrip_hinted


def _cls(text):
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def mlp_lines(calls, rnd):
    """bench_overhead's mlp with module slices: per call 100 ops (Linear and GELU in turn), each
    inside a slice of its own module (a name no other line has); lines of one graph call hold
    ~50 KB, so a site's last line is out of the window. The writer's hints: an op's fam is its
    name, a slice's cls its type."""
    lines, k, ts = [], 0, 1_796_203_077_000_000
    for _ in range(calls):
        for op in range(100):
            kind = ("linear", "Linear") if op % 2 == 0 else ("gelu", "GELU")
            ts += rnd.randrange(400, 9000)
            dur = f"{rnd.randrange(300, 6000)}.{rnd.randrange(1, 1000)}".rstrip("0")
            args = f',"graph":0,"node":"input_{op + 1}","module":"layers.{op}","grad_enabled":0,"phase":"inference"'
            lines.append(hinted_line(k, f'"function.{kind[0]}"', args, ts, dur))
            line, h = hinted_line(k + 1, f'"layers.{op}"', f',"module_type":"{kind[1]}","graph":0,"grad_enabled":0,'
                                  '"phase":"inference"', ts, f"{dur}{rnd.randrange(10)}")
            lines.append((line.replace(b'"cat":"dynamo"', b'"cat":"module"'), h + [_cls(kind[1])]))
            k += 2
    return lines


def test_ops_in_module_slices_near_a_general_deflate():
    """mlp's lines with module slices in members of ~4 calls: at most 1.2 times what zlib level 1
    makes of the same members (a general deflate searching every position), and a slice's line
    no bigger than an op's. Before its name and args were compared as a line is (the op lines'
    node and module names sent as literals, a slice against its type by the general path), they
    took 1.5 times zlib's."""
    rnd = random.Random(42)
    lines = mlp_lines(12, rnd)
    members = [lines[a:a + 800] for a in range(0, len(lines), 800)]
    ours = sum(roundtrip_hinted(*members))
    general = sum(len(zlib.compress(b"".join(line for line, _ in m), 1)) for m in members)
    assert ours <= 1.2 * general, (ours, general)
    ops = sum(roundtrip_hinted(*([p for p in m if len(p[1]) == 10] for m in members)))
    assert ours - ops <= ops * 1.02, (ours - ops, ops)  # the slices' share, the ops' share


def aggregate_record(groups, events, rnd):
    """An aggregate record line as the writer writes it (docs/format.rst): per group of an op
    its count, sums, min, max and sketch buckets of log-normal durations; copied graph-call
    events."""
    keys = [[1, 0, f"function.op{g % 7}", f"layers.{g}", "inference", 0, None, None] for g in range(groups)]
    rows = []
    for g in range(groups):
        durs = [int(rnd.lognormvariate(11, 0.8)) for _ in range(200)]
        buckets = {}
        for d in durs:
            b = int(27 * (d / 1000) ** 0.25)  # any bucket function: what matters is the spread
            buckets[b] = buckets.get(b, 0) + 1
        flat = [v for b in sorted(buckets) for v in (b, buckets[b])]
        rows.append([g, None, len(durs), sum(durs), min(durs), max(durs), 0,
                     round(sum(d * d for d in durs) / 1e6, 6), flat])
    copied = [{"id": 1000 + 203 * k, "name": "graph 2 inference", "cat": "dynamo_graph", "pid": 6962, "tid": 6962,
               "ts": 1_796_203_541_502_588 + rnd.randrange(10**6) * k, "dur": rnd.randrange(10**8) / 1000,
               "ph": "X", "args": {"hhash": "6773142abec9c34b", "graph": 2, "level": "torch", "nodes": 100,
                                   "grad_enabled": 0, "phase": "inference"}} for k in range(events)]
    args = {"hhash": "6773142abec9c34b", "covers": {"bytes": 123456, "crc32": 1, "text_bytes": 2, "text_crc32": 3},
            "version": 2, "writer": "c", "complete": True, "keys": keys, "apart": [], "groups": rows,
            "op_steps": [], "samples": [], "events": copied}
    line = {"id": 99, "name": "dftrace_aggregates", "cat": "dftracer", "pid": 6962, "tid": 0, "ph": "M", "args": args}
    return (json.dumps(line, separators=(",", ":")) + "\n").encode()


def test_an_aggregate_record_compresses_near_a_general_deflate():
    """A record of 200 groups and 300 copied events (~100 KB, rewritten at every checkpoint),
    alone in its member as after a flush, and after trace lines: at most 1.5 times zlib level 1's
    size. Before, with no earlier line like it, it went out as literals: no smaller than its
    text."""
    rnd = random.Random(7)
    record = aggregate_record(200, 300, rnd)
    events = b"".join(line for line, _ in mlp_lines(1, rnd)[:60])
    for text in (record, events + record):
        [size] = roundtrip(text)
        assert size <= 1.5 * len(zlib.compress(text, 1)), (len(text), size, len(zlib.compress(text, 1)))
    # a long line that repeats nothing still decodes exactly (matches are checked, none found)
    noise = bytes(rnd.randrange(256) for _ in range(70000)).replace(b"\n", b" ") + b"\n"
    roundtrip(noise, record + noise)
