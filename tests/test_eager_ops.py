"""Eager ops (outside compiled graphs) and optimizer internals are op events, checked against
torch.profiler's own count of the same program's top-level ops (tests/scripts/eager_ops.py)."""

import json
import os
import statistics
import textwrap

import pytest

import perfetto_tp

from backend_support import eager_ops, inside, ops, run_py, run_python
from scripts.eager_ops import ITERS, SLEEP_S
from tracefile import read_events, traces

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "eager_ops.py")
EAGER = {"DFTRACER_EAGER_OPS": "1"}


def run(tmp_path, shape, *mode, env=None):
    out = tmp_path / f"{shape}-{mode[0].strip('-') if mode else 'plain'}.json"
    run_python([SCRIPT, shape, str(out), *mode], tmp_path, {**EAGER, **(env or {})}, timeout=600)
    return json.loads(out.read_text())


def traced(tmp_path, shape, env=None):
    result = run(tmp_path, shape, "--trace", str(tmp_path / "tr"), env=env)
    (path,) = traces(tmp_path, "tr-*")
    return result, read_events(path)


def eager(events):
    return eager_ops(events)


def per_step(events):
    counts = [0] * ITERS
    for e in eager(events):
        counts[e["args"]["step"]] += 1
    return counts


@pytest.mark.parametrize("shape", ["lstm", "accum", "two_opt"])
def test_eager_ops_match_profiler_per_step(tmp_path, shape):
    """Every step's eager op events equal torch.profiler's top-level ops of that iteration
    (±2 %), the optimizers' foreach ops sit in their Adam.step slices, numerics are untouched."""
    truth = run(tmp_path, shape, "--profile")
    result, events = traced(tmp_path, shape)
    assert result["losses"] == truth["losses"] and result["params"] == truth["params"]
    counts = per_step(events)
    for k in range(1, ITERS - 1):  # step 0 and the last also hold what ran before and after the loop
        assert abs(counts[k] - truth["ops"][k]) <= 0.02 * truth["ops"][k], (k, counts, truth["ops"])
    adam = [s for s in ops(events, "optimizer") if s["name"] == "Adam.step"]
    assert len(adam) == ITERS * (2 if shape == "two_opt" else 1)
    for k in range(1, ITERS):
        held = [e for e in eager(events) if e["args"]["step"] == k and any(inside(e, s) for s in adam)]
        assert abs(len(held) - truth["adam_ops"][k]) <= 0.02 * truth["adam_ops"][k], (k, len(held), truth)
        assert any(e["name"].startswith("aten::_foreach_") for e in held)
        assert all(e["args"].get("phase") == "optimizer" for e in held)
    backward = [e for e in eager(events) if e["args"].get("phase") == "backward"]
    assert any(e["name"] == "aten::mkldnn_rnn_layer_backward" or "lstm" in e["name"] for e in backward) or backward


def test_known_sleep_is_the_custom_op_event(tmp_path):
    """The module that sleeps SLEEP_S inside its custom op: one eager event per forward holds it,
    each as long as the op's own measure of its call, and typically not much longer (one call
    can lose a scheduler slice to other processes between the event's clock and the op's)."""
    result, events = traced(tmp_path, "lstm")
    sleeps = [e for e in eager(events) if e["name"] == "eagertest::sleep"]
    assert len(sleeps) == ITERS == len(result["slept_ns"])
    over = []
    for e, slept in zip(sorted(sleeps, key=lambda e: e["ts"]), result["slept_ns"]):
        assert SLEEP_S * 1e6 <= slept / 1e3 <= e["dur"] + 1, (e, slept)
        assert e["args"].get("phase") == "forward"
        over.append(e["dur"] - slept / 1e3)
    assert statistics.median(over) <= 5000, over


def test_graph_break_eager_lstm_and_loss_are_recorded_once(tmp_path):
    """A compiled model with a graph break and an eager LSTM, the loss outside: the LSTM's and
    the loss's ops are eager events, no eager event lies inside a compiled graph's event,
    Dynamo's compiles record none, and numerics equal the untraced run."""
    plain = run(tmp_path, "graph_break")
    result, events = traced(tmp_path, "graph_break")
    assert result["losses"] == plain["losses"] and result["params"] == plain["params"]
    graph_calls = ops(events, "dynamo_graph")
    assert graph_calls
    ev = eager(events)
    assert not [e for e in ev if any(inside(e, g) for g in graph_calls)]
    for k in range(1, ITERS):
        names = {e["name"] for e in ev if e["args"]["step"] == k}
        assert {"aten::lstm", "aten::pow", "aten::mean"} <= names, names
        # the sleeping custom op after the LSTM is compiled: one event per step, the graph's
        sleeps = [e for e in ops(events) if "sleep" in e["name"] and e["args"].get("step") == k]
        assert len(sleeps) == 1 and sleeps[0]["args"].get("level") != "eager", sleeps
        assert "aten::addmm" not in {e["name"] for e in ev if e["args"]["step"] == k
                                     and e["args"].get("phase") == "forward"}
    compiles = [c for c in ops(events, "dynamo_compile")]
    assert not [e for e in ev if any(inside(e, c) for c in compiles)]
    assert len({per_step(events)[k] for k in range(1, ITERS - 1)}) == 1  # the last: also after the loop


def test_switch_turns_eager_ops_off(tmp_path):
    """DFTRACER_EAGER_OPS=1 and the variable unset (the default) record eager ops; =0 records none."""
    for value in ("1", "0", None):
        for p in traces(tmp_path, "tr-*"):
            os.remove(p)
        env = {} if value is None else {"DFTRACER_EAGER_OPS": value}  # (run() would set it)
        run_python([SCRIPT, "lstm", str(tmp_path / "out.json"), "--trace", str(tmp_path / "tr")], tmp_path, env,
                   timeout=600)
        (path,) = traces(tmp_path, "tr-*")
        events = read_events(path)
        assert ops(events, "optimizer")
        assert bool(eager(events)) == (value != "0")


def test_compiled_optimizer_step_is_a_graph_not_eager_ops(tmp_path):
    """torch.compile(opt.step): its ops are the graph's op events, none is recorded again as eager."""
    code = textwrap.dedent(f"""
        import torch
        from dftrace_dynamo import dftracer
        from dftrace_dynamo.backend import tracer
        dftracer.initialize_log({str(tmp_path / "tr")!r}, None, -1)
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=True)
        step = torch.compile(opt.step, backend="dftrace")
        for i in range({ITERS}):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            step()
        dftracer.finalize()
    """)
    run_py(code, tmp_path, EAGER)
    (path,) = traces(tmp_path, "tr-*")
    events = read_events(path)
    graph_calls = ops(events, "dynamo_graph")
    steady = [e for e in eager(events) if 0 < e["args"]["step"] < ITERS - 1]
    assert steady and graph_calls  # the forward, loss and backward ran eagerly
    assert not [e for e in steady if e["name"].startswith("aten::_foreach_")]
    in_graphs = [e for e in ops(events) if 0 < e["args"].get("step", -1) < ITERS - 1 and any(inside(e, g) for g in graph_calls)]
    assert in_graphs


def test_user_profiler_runs_and_eager_ops_resume_after_it(tmp_path):
    """A torch.profiler the program starts gets torch's observers (its ops are all there); the
    steps after it have their eager op events again."""
    code = textwrap.dedent(f"""
        import torch
        from dftrace_dynamo import dftracer
        from dftrace_dynamo.backend import tracer
        dftracer.initialize_log({str(tmp_path / "tr")!r}, None, -1)
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def iteration():
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        iteration(); iteration()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            iteration()
        print("PROFILED", sum(e.name == "aten::linear" for e in prof.events()))
        iteration(); iteration()
        dftracer.finalize()
    """)
    out = run_py(code, tmp_path, EAGER)
    assert "PROFILED 1" in out.stdout, out.stdout
    (path,) = traces(tmp_path, "tr-*")
    linear = [e for e in eager(read_events(path)) if e["name"] == "aten::linear"]
    assert len(linear) == 4, linear  # five iterations, one of them profiled


def test_more_held_eager_ops_than_the_buffer_holds_keep_their_nesting(tmp_path):
    """Eager ops after zero_grad wait until the step's start is known (held): 70,000 of them (more
    than the writer's placement stack holds, 65,536) are all in their step, which begins at its
    zero_grad, and the trace nests (Perfetto reports no error)."""
    n = 70_000
    code = textwrap.dedent(f"""
        import torch
        from dftrace_dynamo import dftracer
        dftracer.initialize_log({str(tmp_path / "tr")!r}, None, -1)
        model = torch.compile(torch.nn.Linear(4, 1), backend="dftrace")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.zeros(1)
        for i in range(3):
            opt.zero_grad()
            if i == 1:
                for _ in range({n}):
                    x.neg_()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        dftracer.finalize()
    """)
    run_py(code, tmp_path, EAGER)
    (path,) = traces(tmp_path, "tr-*")
    events = read_events(path)
    negs = [e for e in eager(events) if e["name"] == "aten::neg_"]
    (step,) = [e for e in ops(events, "step") if e["args"]["step"] == 1]
    (zero_grad,) = [e for e in ops(events, "optimizer") if e["name"] == "SGD.zero_grad" and e["args"]["step"] == 1]
    assert len(negs) == n
    assert abs(step["ts"] - zero_grad["ts"]) <= 1, (step, zero_grad)
    assert all(e["args"]["step"] == 1 and inside(e, step) and e["ts"] >= zero_grad["ts"] + zero_grad["dur"]
               for e in negs)
    assert perfetto_tp.error_stats(path) == []
