"""Eager ops carry the path of the eager module they ran in (an ``nn.LSTM`` Dynamo skips after a
graph break, a loss module outside the compiled model, two eager models each with a ``main``),
sit in that module's slice, and carry the step of the compiled events around them. Ground truth:
the program's own time marks around each known module call, and torch.profiler's count of the
same program's top-level ops per iteration and module (tests/scripts/eager_modules.py)."""

import collections
import json
import os
import textwrap

import pytest

from backend_support import eager_ops, inside, ops, run_py, run_python
from scripts.eager_modules import ITERS
from tracefile import read_events, traces

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "eager_modules.py")
EAGER = {"DFTRACER_EAGER_OPS": "1"}


def run(tmp_path, shape, *mode):
    out = tmp_path / f"{shape}-{'trace' if mode else 'profile'}.json"
    run_python([SCRIPT, shape, str(out), *mode], tmp_path, EAGER, timeout=600)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """The ``break`` program traced, and its torch.profiler truth."""
    tmp = tmp_path_factory.mktemp("break")
    result = run(tmp, "break", "--trace", str(tmp / "tr"))
    (path,) = traces(tmp, "tr-*")
    return result, read_events(path), run(tmp, "break")


def eager(events):
    return eager_ops(events)


def marked(e, marks):
    """The marked module calls (who) whose time marks hold ``e``."""
    return {who for _, who, start, end in marks if start / 1e3 <= e["ts"] and e["ts"] + e["dur"] <= end / 1e3 + 1}


def test_each_eager_op_carries_the_module_it_ran_in(broken):
    """Every forward eager op inside a marked call of main.lstm, main.l2 or the loss module carries
    that module's path; no eager op outside them does (but main's own, after its graph break);
    the same program's losses as untraced."""
    result, events, truth = broken
    assert result["losses"] == truth["losses"]
    forward = [e for e in eager(events) if e["args"].get("phase") == "forward" and e["args"]["step"] >= 1]
    assert forward
    for e in forward:
        (who,) = marked(e, result["marks"]) or {None}
        if who is None:  # outside the marked calls: the loop, or main's own code after its graph break
            assert e["args"].get("module") in (None, "main"), e
        else:
            assert e["args"].get("module") == who, e
    seen = {e["args"].get("module") for e in forward}
    assert {"main.lstm", "main.l2", "criterion"} <= seen, seen
    assert {e["name"] for e in forward if e["args"].get("module") == "main.lstm"} >= {"aten::lstm"}


def test_eager_op_counts_per_step_and_module_equal_torch_profiler(broken):
    """Per steady step and eager module, the eager op events equal torch.profiler's top-level ops
    of that iteration inside that module's marked call. (Ops in no module are left out: the
    profile's compiled graphs run their ops eagerly, ``backend="eager"``.)"""
    result, events, truth = broken
    counts = [collections.Counter() for _ in range(ITERS)]
    for e in eager(events):
        if e["args"].get("module") not in (None, "main"):  # main: its own code, no marked call
            counts[e["args"]["step"]][e["args"]["module"]] += 1
    for k in range(1, ITERS - 1):  # step 0 compiles; the last also holds what ran after the loop
        want = {m: n for m, n in truth["ops"][k].items() if m}
        assert dict(counts[k]) == want, (k, dict(counts[k]), truth["ops"][k])


def test_eager_ops_nest_in_their_module_slice_and_step(broken):
    """Each eager op with a module lies in a module slice of that path (no graph: an eager call),
    which lies in the marked call; its step is the step slice's that holds it, the same as the
    compiled graph calls of that iteration."""
    result, events, _ = broken
    slices = [e for e in events if e.get("cat") == "module" and "graph" not in e["args"]]
    steps = {e["args"]["step"]: e for e in events if e.get("cat") == "step"}
    graph_steps = collections.defaultdict(set)
    for g in ops(events, "dynamo_graph"):
        (k,) = [n for n, s in steps.items() if inside(g, s)]
        graph_steps[k].add(g["args"]["step"])
    checked = 0
    for e in eager(events):
        module = e["args"].get("module")
        (k,) = [n for n, s in steps.items() if inside(e, s)] or [None]
        assert e["args"].get("step") == k, e
        if module is None or k == 0:
            continue
        holders = [s for s in slices if s["name"] == module and inside(e, s)]
        assert len(holders) == 1, (e, module)
        assert marked(holders[0], result["marks"]) == ({module} if module != "main" else set())
        assert graph_steps[k] == {k}
        checked += 1
    assert checked >= 3 * (ITERS - 1)
    types = {(s["name"], s["args"]["module_type"]) for s in slices}
    assert {("main.lstm", "LSTM"), ("main.l2", "Linear"), ("criterion", "MSELoss")} <= types, types


def test_two_eager_models_with_a_main_child_never_share_paths(tmp_path):
    """netG and netD (never compiled) each hold a ``main`` Sequential: the eager ops inside netG's
    marked calls and those inside netD's have disjoint paths, each path names one module type,
    and every forward op of the models is in its iteration's step."""
    result = run(tmp_path, "gan", "--trace", str(tmp_path / "tr"))
    (path,) = traces(tmp_path, "tr-*")
    events = read_events(path)
    paths = collections.defaultdict(set)
    for e in eager(events):
        if e["args"].get("phase") == "forward" and e["args"].get("module"):
            (who,) = marked(e, result["marks"])
            paths[who].add(e["args"]["module"])
    assert paths["netG"] and paths["netD"] and not paths["netG"] & paths["netD"], paths
    types = collections.defaultdict(set)
    for s in events:
        if s.get("cat") == "module":
            types[s["name"]].add(s["args"]["module_type"])
    assert all(len(t) == 1 for t in types.values()), types
    for i, who, start, end in result["marks"]:
        held = [e for e in eager(events) if start / 1e3 <= e["ts"] and e["ts"] + e["dur"] <= end / 1e3 + 1]
        assert held and {e["args"]["step"] for e in held} == {i}, (i, who)


def test_eager_ops_are_recorded_in_the_step_windows_only(tmp_path):
    """DFTRACER_STEPS=1: the eager ops of the next iteration's start, kept back until its step
    is known (the ``gan`` loop's forwards come before any graph or backward), are dropped with
    that step; step 1's forwards are there. (Step 0's tail after its last forward is recorded,
    as for compiled graphs: op events go on once the step is complete and the next one is in a
    window.)"""
    out = tmp_path / "gan.json"
    run_python([SCRIPT, "gan", str(out), "--trace", str(tmp_path / "tr")], tmp_path,
               {**EAGER, "DFTRACER_STEPS": "1"}, timeout=600)
    (path,) = traces(tmp_path, "tr-*")
    events = read_events(path)
    last_step0 = max(end for i, _, _, end in json.loads(out.read_text())["marks"] if i == 0) / 1e3
    steps = {e["args"]["step"] for e in eager(events)}
    assert 1 in steps and not steps & {2, 3}, steps
    assert all(e["ts"] >= last_step0 for e in eager(events) if e["args"]["step"] == 0)
    forward = {e["args"].get("module") for e in eager(events) if e["args"]["step"] == 1}
    assert {"main.0", "netD.main.0"} <= forward, forward


def test_a_dynamo_reset_during_the_trace_keeps_graphs_whole(tmp_path):
    """``torch._dynamo.reset()`` after the trace opened (it clears Dynamo's callbacks) and a model
    compiled after it: each call is one graph with all of the model's ops and their module paths
    (the module hooks stay out of the graphs Dynamo compiles), its compile records no eager op."""
    code = textwrap.dedent(f"""
        import torch, torch.nn as nn
        from dftrace_dynamo import dftracer
        from dftrace_dynamo.backend import tracer
        dftracer.initialize_log({str(tmp_path / "tr")!r}, None, -1)
        torch._dynamo.reset()
        model = torch.compile(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), backend="dftrace")
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(2, 4))
        dftracer.finalize()
    """)
    run_py(code, tmp_path, EAGER)
    (path,) = traces(tmp_path, "tr-*")
    events = read_events(path)
    calls = ops(events, "dynamo_graph")
    assert len(calls) == 3, [g["name"] for g in calls]
    in_graphs = ops(events)
    assert {e["args"].get("module") for e in in_graphs} == {"0", "1", "2"}
    compiles = ops(events, "dynamo_compile")
    assert not [e for e in eager(events) if any(inside(e, c) for c in compiles)]
