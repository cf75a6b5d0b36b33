"""Memory stays bounded whatever the program logs: ``--n`` distinct ``log_event`` names and ``--n``
distinct tag values (``update(step=i)`` before every intercepted op), all written.

Run::

    python3 benchmarks/bench_memory.py --n 10000000

A fresh interpreter (``--child``) records the events into a zstd trace, reading its RSS every
200,000 iterations (50 times at least); then the file is read back in blocks (it holds about 400 bytes of text an
iteration) and every name and step checked present, once, in order. Printed as JSON:
``num_events`` and ``dropped`` (finalize's), ``samples`` (memory counter events), ``collections``
(garbage collection slices: every iteration is in a step window),
``extra_mib`` (peak RSS over the RSS before the trace opened), ``growth_mib`` (peak RSS after the
first fifth over the RSS then: buffers and caches are full by then, so any growth after it is
per-name or per-tag memory kept, or, on a loaded machine, events the writer has not yet
written: ``--drain-every`` leaves only the former), ``names`` and ``steps`` (read back in order), ``seconds`` (the
child's wall time). ``tests/test_core_memory.py`` runs it at a size a test affords.
"""

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import zstandard

SAMPLE_EVERY = 200_000  # iterations between RSS reads (at most; 50 reads at least)


def child(logfile, n, drain_every):
    """Records ``n`` ops with distinct tags and ``n`` distinct names (waiting for the writer to
    drain every ``drain_every`` iterations, if not 0); prints the JSON of RSS and counts."""
    import psutil

    from dftrace_dynamo import _core
    from dftrace_dynamo.backend import Tags
    from dftrace_dynamo.session import logger
    tags = Tags()
    op = _core.Interceptor(abs, _core.intern_site("op", "dynamo"), tags.cell)
    log_event, update, t0 = logger.log_event, tags.update, logger.get_time()
    proc = psutil.Process()
    base = peak = proc.memory_info().rss
    settled, every = n // 5, max(1, min(SAMPLE_EVERY, n // 50))
    logger.initialize_log(logfile=logfile)
    for i in range(n + 1):
        if i % every == 0 or i == settled or i == n:
            rss = proc.memory_info().rss
            peak = max(peak, rss)
            if i == settled:
                at_settled = late_peak = rss
            elif i > settled:
                late_peak = max(late_peak, rss)
        if i == n:
            break
        update(step=i)
        op(i)
        log_event(f"name {i}", "user", t0 + 2 * i, 1)
        if drain_every and i % drain_every == 0:
            _core.flush()
    res = logger.finalize()
    from dftrace_dynamo.events import gc, memory  # its counter samples and collections are events too
    print(json.dumps({"extra_mib": (peak - base) / 2**20, "growth_mib": (late_peak - at_settled) / 2**20,
                      "samples": memory.samples, "collections": gc.slices, **res}))


def lines_of(path):
    """The decompressed lines, read in blocks of whole lines."""
    with open(path, "rb") as f:
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
        rest = b""
        while True:
            block = reader.read(1 << 24)
            if not block:
                break
            block = rest + block
            cut = block.rfind(b"\n") + 1
            yield block[:cut]
            rest = block[cut:]
        if rest:
            raise ValueError(f"{path}: a last line without its newline")


def read_back(path):
    """(names, steps, end record): the names and steps found in order, counted until the first out of order."""
    step_re = re.compile(rb'"name":"op".*"step":(\d+)')
    name_re = re.compile(rb'"name":"name (\d+)","cat":"user"')
    counts = {"names": (name_re, 0), "steps": (step_re, 0)}
    block = b""
    for block in lines_of(path):
        for key, (pattern, seen) in counts.items():
            got = list(map(int, pattern.findall(block)))
            if got != list(range(seen, seen + len(got))):
                raise ValueError(f"{key} out of order after {seen}: {got[:5]}...")
            counts[key] = (pattern, seen + len(got))
    end = json.loads(io.BytesIO(block).read().splitlines()[-2])
    return counts["names"][1], counts["steps"][1], end


def measure(n, directory, drain_every=0):
    """Runs the child for ``n`` and reads its file back; the JSON-ready result."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACER_")}
    env["DFTRACER_TRACE_COMPRESSION"] = "zstd"
    start = time.perf_counter()
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", os.path.join(directory, "mem"),
                          "--n", str(n), "--drain-every", str(drain_every)], capture_output=True, text=True, env=env, timeout=3600)
    seconds = time.perf_counter() - start
    if out.returncode != 0 or out.stderr:
        raise RuntimeError(f"the child failed ({out.returncode}): {out.stderr[-3000:]}")
    res = json.loads(out.stdout)
    (path,) = [os.path.join(directory, f) for f in os.listdir(directory) if ".pfw" in f]
    res["names"], res["steps"], end = read_back(path)
    res["end_num_events"] = end["args"]["num_events"] if end.get("name") == "end" else None
    res["seconds"] = round(seconds, 1)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000_000, help="distinct names and tag values (default 10 M)")
    ap.add_argument("--drain-every", type=int, default=0, metavar="K",
                    help="wait for the writer every K iterations: RSS then holds no backlog of events a "
                         "loaded machine's writer has not yet written, only what is kept (default 0: never)")
    ap.add_argument("--dir", help="where the trace goes (default: a temporary directory, removed)")
    ap.add_argument("--child", metavar="LOGFILE", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.n, a.drain_every)
    elif a.dir:
        print(json.dumps(measure(a.n, a.dir, a.drain_every)))
    else:
        with tempfile.TemporaryDirectory() as d:
            print(json.dumps(measure(a.n, d, a.drain_every)))


if __name__ == "__main__":
    main()
