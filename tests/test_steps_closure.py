"""Closure loops (``optimizer.step(closure)``: LBFGS, SAM, Lightning's default): every step has its
optimizer slice, the first one too when the trace opens inside it (at the closure's first
compile). Ground truth: the loop's own time marks around each ``optimizer.step()``."""

import json
import os
import shutil

import pytest

from backend_support import eager_ops, inside, ops, run_py
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
    opt.step(lambda: (time.sleep(0.02), closure())[1])  # steps of 40 ms or more: load's few ms are noise
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
        # from the call on, a busy machine's pause allowed for: the trace opens (first compile) after 20 ms
        assert e["ts"] <= start + 15000
        # the optimizer's step, its closure inside (a slice opened late, at the trace's opening, would
        # miss the compile's hundreds of ms); a busy machine's pause between mark and slice is allowed for
        assert e["dur"] >= 0.9 * (end - start) - 5000
        forwards = [g for g in ops(events, "dynamo_graph") if g["name"].endswith("forward")]
        assert [g for g in forwards if start <= g["ts"] <= end] and all(inside(g, e) for g in forwards
                                                                        if start <= g["ts"] <= end)


# Phases nest, each millisecond counted once: the closure's forward and backward are forward and
# backward, the optimizer's part is its own time. Ground truth: time marks around each
# optimizer.step(closure), the closure's calls counted and a known sleep in its backward (a hook
# on the loss, so inside the backward event), 5 ms per call.
SLEEP_S = 0.005
PHASES = f"""
import json, sys, time
import torch
sys.path.insert(0, {SCRIPTS!r})
from loops import mlp
from dftrace_dynamo import _core, initialize_log
from dftrace_dynamo.backend import create_backend

log = initialize_log("tr")
marks = []
if sys.argv[1] == "closure":
    model = torch.compile(mlp(), backend=create_backend())
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    calls = [0]

    def closure():  # as loops.lbfgs_closure's, with a known sleep in its backward
        calls[0] += 1
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.register_hook(lambda grad: (time.sleep({SLEEP_S}), grad)[1])
        loss.backward()
        return loss

    for _ in range(8):
        calls[0] = 0
        start = _core.now_ns()
        opt.step(closure)
        marks.append((start, _core.now_ns(), calls[0]))
        time.sleep(0.01)
else:  # plain, or with a compiled optimizer step
    model = torch.compile(mlp(), backend=create_backend())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    step = torch.compile(opt.step, backend=create_backend()) if sys.argv[1] == "compiled" else opt.step
    for _ in range(8):
        opt.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        step()
        time.sleep(0.01)
log.finalize()
json.dump(marks, open("marks.json", "w"))
"""
PART_KEYS = ("data_us", "forward_us", "backward_us", "optimizer_us", "gc_us", "trainer_us", "other_us")
ROUNDING_US = 1.0  # per part


def _phases(tmp_path, kind):
    run_py(PHASES.replace("sys.argv[1]", repr(kind)), tmp_path)
    (path,) = traces(tmp_path, "tr-*")
    marks = [(a / 1e3, b / 1e3, n) for a, b, n in json.loads((tmp_path / "marks.json").read_text())]
    return path, marks


@pytest.fixture(scope="module")
def closure_run(tmp_path_factory):
    """The closure loop's trace and marks, run once for the tests below."""
    return _phases(tmp_path_factory.mktemp("closure"), "closure")


def _steady_rows(path, source, expect=None):
    from dftrace_dynamo.traces.summary import summarize
    result = summarize([path], views=("step",), top=None, source=source)
    assert result["scan"]["source"] == (expect or ("events" if source == "events" else "aggregates"))
    rows = [r for r in result["steps"]["rows"] if r["recorded"] and not r["warmup"]]
    assert len(rows) >= 6
    return rows


def test_a_closure_loops_phases_are_the_same_from_every_source(closure_run, tmp_path):
    """The writer's record (version 2), a record made from the events (version 1) and the events
    give the same parts; a version 1 record made before the nested parts were kept is not read."""
    from dftrace_dynamo.traces import aggregates
    path, _ = closure_run
    events = _steady_rows(path, "events")
    assert _steady_rows(path, "auto") == events
    computed = str(shutil.copy(path, tmp_path / "computed.pfw.gz"))
    aggregates.write(computed)
    assert _steady_rows(computed, "auto") == events
    stale = str(shutil.copy(path, tmp_path / "stale.pfw.gz"))
    record = aggregates.compute(stale)
    del record["nested_parts"]
    record["parts"] = [r for r in record["parts"] if r[3] < 12]
    aggregates.write(stale, record)
    assert _steady_rows(stale, "auto", expect="events") == events


def _adds_up(row):
    assert all(row[k] >= 0 for k in PART_KEYS), row
    assert abs(sum(row[k] for k in PART_KEYS) - row["wall_us"]) <= ROUNDING_US * len(PART_KEYS), row


def test_a_closure_loops_phases_add_up_to_the_wall_time_each_millisecond_once(closure_run):
    path, marks = closure_run
    events = read_events(path)
    steps = {e["args"]["step"]: e for e in ops(events, "step")}
    for source in ("auto", "events"):
        for row in _steady_rows(path, source):
            _adds_up(row)
            step = steps[row["step"]]
            # (a closure loop's step slice begins at the optimizer's pre-hook, inside the marks)
            start, end, calls = next(m for m in marks if m[0] - 1 <= step["ts"] <= m[1] + 1)
            assert calls >= 1
            marked = end - start
            # everything of the closure ran inside the marked optimizer step, each part once
            assert row["forward_us"] + row["backward_us"] + row["optimizer_us"] <= marked + 3 * ROUNDING_US, row
            # the known sleep is backward time, and not optimizer time as well
            assert row["backward_us"] >= calls * SLEEP_S * 1e6, row
            assert 0 < row["optimizer_us"] <= marked - row["forward_us"] - row["backward_us"] + 3 * ROUNDING_US
            assert row["optimizer_us"] <= marked - calls * SLEEP_S * 1e6, row


@pytest.mark.parametrize("kind", ["plain", "compiled"])
def test_a_loops_phases_are_the_sums_of_its_slices(tmp_path, kind):
    """Without a closure every part is the sum of its slices, as before; a compiled optimizer
    step's graph call (phase inference, inside the optimizer's slice) is optimizer time only."""
    path, _ = _phases(tmp_path, kind)
    events = read_events(path)
    opt_graphs = [g for g in ops(events, "dynamo_graph") if any(inside(g, o) for o in ops(events, "optimizer"))]
    assert bool(opt_graphs) == (kind == "compiled")
    assert all(g["args"]["phase"] == "inference" for g in opt_graphs)

    def total(cat, keep=lambda e: True):
        out = {}
        for e in ops(events, cat):
            if keep(e) and e.get("args", {}).get("step") is not None:
                out[e["args"]["step"]] = out.get(e["args"]["step"], 0) + e["dur"]
        return out

    # the forward: forward graph calls, and the eager ops and eager module slices of phase forward or
    # inference (the loss outside the model) that no other phase's slice or forward event holds
    others = ops(events, "backward") + ops(events, "optimizer") + ops(events, "data")
    fwd = [e for e in ops(events, "dynamo_graph") if e["args"].get("phase") != "backward" and e not in opt_graphs]
    fwd += [e for e in eager_ops(events) + ops(events, "module") if "graph" not in e["args"]
            and e["args"].get("phase") in ("forward", "inference")]
    fwd = [e for e in fwd if not any(inside(e, o) for o in others)
           and not any(o is not e and inside(e, o) for o in fwd)]
    forward = {}
    for e in fwd:
        if e["args"].get("step") is not None:
            forward[e["args"]["step"]] = forward.get(e["args"]["step"], 0) + e["dur"]
    backward, optimizer = total("backward"), total("optimizer")
    assert optimizer and backward and forward
    for source in ("auto", "events"):
        for row in _steady_rows(path, source):
            _adds_up(row)
            s = row["step"]
            assert row["forward_us"] == pytest.approx(forward.get(s, 0), abs=1e-3)
            assert row["backward_us"] == pytest.approx(backward.get(s, 0), abs=1e-3)
            assert row["optimizer_us"] == pytest.approx(optimizer.get(s, 0), abs=1e-3)
