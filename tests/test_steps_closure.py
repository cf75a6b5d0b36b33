"""Closure loops (``optimizer.step(closure)``: LBFGS, SAM, Lightning's default): every step has its
optimizer slice, the first one too when the trace opens inside it (at the closure's first
compile). Ground truth: the loop's own time marks around each ``optimizer.step()``."""

import json
import os

from backend_support import inside, ops, run_py
from tracefile import read_events, traces

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")

LOOP = f"""
import json, sys, time
sys.path.insert(0, {SCRIPTS!r})
from loops import lbfgs_closure
from dftrace_dynamo import _core

opt, closure = lbfgs_closure()

marks = []
for _ in range(4):
    start = _core.now_ns()
    opt.step(closure)
    marks.append((start, _core.now_ns()))
    time.sleep(0.01)
json.dump(marks, open("marks.json", "w"))
"""


def test_every_step_of_a_closure_loop_has_its_optimizer_slice_when_the_trace_opens_inside_it(tmp_path):
    # DFTRACER_ENABLE: the trace opens lazily, at the first compile, inside the first optimizer step
    run_py(LOOP, tmp_path, {"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": str(tmp_path / "tr")})
    (path,) = traces(tmp_path, "tr-*")
    events = read_events(path)
    marks = [(a / 1e3, b / 1e3) for a, b in json.loads((tmp_path / "marks.json").read_text())]
    steps = sorted(ops(events, "step"), key=lambda e: e["ts"])
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(4)]
    lbfgs = sorted((e for e in ops(events, "optimizer") if e["name"] == "LBFGS.step"), key=lambda e: e["ts"])
    assert len(lbfgs) == 4
    for s, e, (start, end) in zip(steps, lbfgs, marks, strict=True):
        assert inside(e, s)
        assert start - 1 <= e["ts"] and e["ts"] + e["dur"] <= end + 1
        assert e["dur"] >= 0.9 * (end - start) - 50  # the optimizer's step, its closure inside
        forwards = [g for g in ops(events, "dynamo_graph") if g["name"].endswith("forward")]
        assert [g for g in forwards if start <= g["ts"] <= end] and all(inside(g, e) for g in forwards
                                                                        if start <= g["ts"] <= end)
