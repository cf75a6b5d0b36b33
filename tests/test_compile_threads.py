"""Compiles running concurrently in threads: every compile Dynamo runs is a
compile event (Dynamo itself reports overlapping compiles only once)."""

import json

from subproc import run_py
from tracefile import read_events, traces

SCRIPT = """
    import collections, contextlib, json, threading
    import torch
    import torch._dynamo.callback as callback
    from dftrace_dynamo.backend import compile_events
    from dftrace_dynamo import create_backend, dftracer

    entered = collections.Counter()  # every compile Dynamo starts, whatever the thread
    original = callback.callback_handler.install_callbacks

    @contextlib.contextmanager
    def counting(trigger, compile_id):
        entered[trigger.name.lower()] += 1
        with original(trigger, compile_id):
            yield

    callback.callback_handler.install_callbacks = counting
    torch.set_num_threads(1)
    log = dftracer.initialize_log("t")
    barrier = threading.Barrier(8)

    def run(k):
        def fn(x):
            return (x * k).relu().sum()
        compiled = torch.compile(fn, backend=create_backend(level="aten"))
        x = torch.randn(4, requires_grad=True)
        barrier.wait()
        compiled(x).backward()

    with compile_events.collect() as records:
        threads = [threading.Thread(target=run, args=(k + 1,)) for k in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
    log.finalize()
    seen = collections.Counter(r["trigger"] for r in records if r["kind"] == "compile")
    print(json.dumps({"entered": entered, "seen": seen}))
"""


def test_every_concurrent_compile_is_recorded(tmp_path):
    p = run_py(SCRIPT, tmp_path)
    assert p.returncode == 0, p.stderr
    counts = json.loads(p.stdout.strip().splitlines()[-1])
    assert counts["entered"]["dynamo"] == 8 and counts["entered"].get("lazy_backward", 0) >= 1
    assert counts["seen"] == counts["entered"]
    (path,) = traces(tmp_path)
    compiles = [e for e in read_events(path) if e.get("cat") == "dynamo_compile" and e["name"].startswith(
        ("dynamo compile", "compile ("))]
    by_trigger = {}
    for e in compiles:
        by_trigger[e["args"]["trigger"]] = by_trigger.get(e["args"]["trigger"], 0) + 1
    assert by_trigger == counts["entered"]
    assert sum(1 for e in compiles if e["name"] == "compile (lazy_backward)") == counts["entered"]["lazy_backward"]
