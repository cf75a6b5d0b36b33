"""Synthetic traces in the documented dftrace_dynamo layout, for the CLI tests
and the summary benchmark (stands in for the C writer; same fields, same
metadata, graph events enclosing op events, compile events, ``end`` event).

    python tests/scripts/tracegen.py OUT.pfw.gz --ops 100000 [--pid N] [--rank R]
"""

import argparse
import json

from dftrace_dynamo.traces.writer import TraceWriter

HHASH = "f9ff883caaf21863"
# (op name, module path, duration in ns): one forward graph of a small MLP.
FORWARD = [
    ("function.t.default", "layers.0", 900),
    ("function.addmm.default", "layers.0", 14250),
    ("function.relu.default", "layers.1", 2100),
    ("function.t.default", "layers.2", 850),
    ("function.addmm.default", "layers.2", 6400),
    ("function._log_softmax.default", "", 3300),
]
BACKWARD = [
    ("function._log_softmax_backward_data.default", "", 3900),
    ("function.mm.default", "layers.2", 5100),
    ("function.threshold_backward.default", "layers.1", 2600),
    ("function.mm.default", "layers.0", 12700),
    ("function.sum.dim_IntList", "layers.0", 1800),
]


def _line(obj):
    return json.dumps(obj, separators=(",", ":")).encode()


def events(ops, pid, tid=None, rank=None, start_us=1_760_934_170_000_000):
    """Yields JSON lines (bytes): metadata, then steps until ``ops`` op events."""
    tid = pid if tid is None else tid
    ident = iter(range(1, 1 << 62))
    pname = f"rank{rank}:train" if rank is not None else "python"

    def meta(name, value):
        return _line({"id": next(ident), "name": name, "cat": "dftracer", "pid": pid, "tid": tid,
                      "ph": "M", "args": {"hhash": HHASH, "name": value, "value": "0" * 16}})

    yield meta("HH", "node001")
    yield meta("process_name", pname)
    yield meta("thread_name", "MainThread")
    yield _line({"id": next(ident), "name": "start", "cat": "dftracer", "pid": pid, "tid": tid,
                 "ts": start_us, "dur": 0, "ph": "X", "args": {"hhash": HHASH, "ppid": 1}})
    t_ns = start_us * 1000 + 1000
    yield _line({"id": next(ident), "name": "compile graph 0", "cat": "dynamo_compile", "pid": pid,
                 "tid": tid, "ts": t_ns // 1000, "dur": 250000, "ph": "X",
                 "args": {"hhash": HHASH, "graph": 0}})
    t_ns += 251_000_000
    head = '{"id":%d,"name":"%s","cat":"dynamo","pid":%d,"tid":%d,"ts":%d,"dur":%d.%03d,"ph":"X","args":{"hhash":"%s"'
    done, step = 0, 0
    while done < ops:
        for phase, graph_ops, grad in (("forward", FORWARD, 1), ("backward", BACKWARD, 0)):
            if done == ops:
                break
            g_start = t_ns = (t_ns // 1000 + 1) * 1000
            for node, (name, module, dur) in enumerate(graph_ops):
                if done == ops:
                    break
                t_ns = (t_ns // 1000 + 1) * 1000  # whole-µs starts, as the C writer places them
                yield (head % (next(ident), name, pid, tid, t_ns // 1000, dur // 1000, dur % 1000, HHASH)
                       + ',"graph":0,"node":"%s_%d","module":"%s","grad_enabled":%d,"phase":"%s","step":%d}}'
                       % (name.split(".")[1], node, module, grad, phase, step)).encode()
                t_ns += dur
                done += 1
            g_dur = t_ns - g_start + 500
            yield (head.replace('"dynamo"', '"dynamo_graph"')
                   % (next(ident), f"graph 0 {phase}", pid, tid, g_start // 1000, g_dur // 1000, g_dur % 1000, HHASH)
                   + ',"graph":0,"phase":"%s"}}' % phase).encode()
            t_ns += 1000
        step += 1
    yield _line({"id": next(ident), "name": "end", "cat": "dftracer", "pid": pid, "tid": tid,
                 "ts": t_ns // 1000 + 1, "dur": 0, "ph": "X",
                 "args": {"hhash": HHASH, "num_events": done, "dropped": 0}})


def write(path, ops, pid=4242, tid=None, rank=None):
    """Writes a trace file."""
    with TraceWriter(path) as w:
        for line in events(ops, pid, tid, rank):
            w.write(line)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--pid", type=int, default=4242)
    ap.add_argument("--rank", type=int)
    a = ap.parse_args()
    write(a.out, a.ops, a.pid, rank=a.rank)


if __name__ == "__main__":
    main()
