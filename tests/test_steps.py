"""Training steps in the trace: one ``step N`` slice per optimizer step (or explicit
mark), data / forward graph / backward / optimizer slices nested inside it in order,
``args.step`` on every event, and step windows (DFTRACER_STEPS, set_steps, run --steps)."""

import glob
import os

import pytest
import torch

import perfetto_tp
from backend_support import MLP, graphs, ops, recording, run_python
from scripts.clitools import assert_bad_input, cli
from dftrace_dynamo.session import config
from dftrace_dynamo import create_backend, set_steps, step, step_context
from tracefile import read_events, traces

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "steps_train.py")
PHASES = "('step','data','backward','optimizer','dynamo_graph')"
SLICES_SQL = (
    "select s.name, s.category as cat, s.ts, s.depth, p.name as parent, "
    "extract_arg(s.arg_set_id, 'args.step') as step from slice s left join slice p on s.parent_id = p.id "
    f"where s.category in {PHASES} order by s.ts, s.depth"
)


def train(tmp_path, steps, workers=0, env=None):
    """Runs the guide's loop in a fresh process; returns the path of its trace."""
    proc = run_python([SCRIPT, "--out", str(tmp_path / "tr"), "--steps", str(steps), "--workers", str(workers)],
                      tmp_path, env, timeout=900)
    assert "trained" in proc.stdout
    paths = [p for p in traces(tmp_path, "tr-*") if any(e.get("cat") == "step" for e in read_events(p))]
    assert len(paths) == 1, traces(tmp_path)  # DataLoader workers (if any) mark no steps
    return paths[0]


def slices(path):
    return perfetto_tp.rows(path, SLICES_SQL)


def assert_step_structure(path, n):
    """Exactly n step slices; in each, data, forward graph, backward (enclosing the backward
    graph) and Adam.step in that order; every slice and op carries its step's number."""
    assert perfetto_tp.error_stats(path) == []
    rows = slices(path)
    steps = [r for r in rows if r["cat"] == "step"]
    assert [(r["name"], r["depth"], r["step"]) for r in steps] == [(f"step {i}", 0, i) for i in range(n)]
    for i in range(n):
        inside = [r for r in rows if r["parent"] == f"step {i}"]
        assert all(r["step"] == i for r in inside)
        order = [r["name"] for r in inside if r["name"] not in ("Adam.zero_grad", "DataLoader.__iter__")]
        assert [o.split()[-1] if o.startswith("graph") else o for o in order] == \
            ["data", "forward", "backward", "Adam.step"], order
        assert "Adam.zero_grad" in [r["name"] for r in inside]
    backward_graphs = [r for r in rows if r["cat"] == "dynamo_graph" and r["name"].endswith("backward")]
    assert len(backward_graphs) == n and all(r["parent"] == "backward" for r in backward_graphs)
    events = read_events(path)
    optimizer = [e for e in events if e.get("cat") == "optimizer" and e["name"] == "Adam.step"]
    assert [e["args"]["optimizer"] for e in optimizer] == ["Adam"] * n
    return events


@pytest.mark.parametrize("workers", [0, 2])
def test_guide_training_loop_has_one_step_slice_per_optimizer_step(tmp_path, workers):
    events = assert_step_structure(train(tmp_path, 3, workers), 3)
    op_steps = [e["args"]["step"] for e in ops(events)]
    assert sorted(set(op_steps)) == [0, 1, 2]
    assert op_steps == sorted(op_steps)  # ops of step i are recorded during step i
    compiles = ops(events, "dynamo_compile")
    assert compiles and all(e["args"]["step"] == 0 for e in compiles)  # compiled in the first step


def test_step_window_records_ops_only_in_selected_steps(tmp_path):
    path = train(tmp_path, 6, env={"DFTRACER_STEPS": "2-3"})
    assert perfetto_tp.error_stats(path) == []
    events = read_events(path)
    assert [e["name"] for e in ops(events, "step")] == [f"step {i}" for i in range(6)]
    for cat in ("dynamo", "dynamo_graph", "data", "backward", "optimizer"):
        assert {e["args"]["step"] for e in ops(events, cat)} == {2, 3}, cat
    assert ops(events, "dynamo_compile")  # compile events are always recorded, here in step 0
    assert {e["args"]["step"] for e in ops(events, "dynamo_compile")} == {0}


@pytest.mark.parametrize("bad", ["x", "3-2", "1:2", "-1", "1-2:0", "1-:", "2-3,", "a-b", "1.5"])
def test_bad_step_windows_are_rejected_with_the_grammar(bad):
    cfg = config.load({"DFTRACER_STEPS": bad, "DFTRACER_ENABLE": "1"})
    assert cfg.enable is False
    assert cfg.error.startswith(f"DFTRACER_STEPS={bad!r} is not valid (accepted: comma-separated A-B, A, A- or A-B:K")
    with pytest.raises(ValueError, match="A-B:K"):
        set_steps(bad)


@pytest.mark.parametrize("spec, expected", [
    ("10-12,100-", [10, 11, 12] + list(range(100, 251))), ("0-:100", [0, 100, 200]), ("5", [5]),
    ("1-9:4", [1, 5, 9]), ("", list(range(251))),
])
def test_step_window_grammar(spec, expected):
    windows = config.parse_steps(spec)
    assert [n for n in range(251) if config.step_selected(windows, n)] == expected


def test_bad_step_window_turns_tracing_off_and_the_program_runs(tmp_path):
    proc = run_python([SCRIPT, "--steps", "1"], tmp_path, {"DFTRACER_ENABLE": "1", "DFTRACER_STEPS": "2-1",
                                                             "DFTRACER_LOG_FILE": str(tmp_path / "tr")})
    assert "trained" in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if "DFTRACER_STEPS" in line]
    assert lines == ["dftrace_dynamo: tracing is off: DFTRACER_STEPS='2-1' is not valid (accepted: comma-separated "
                     "A-B, A, A- or A-B:K (every K-th step), e.g. 10-12,100- or 0-:100; A <= B, K >= 1)"]
    assert traces(tmp_path) == []


def test_run_steps_option(tmp_path):
    p = cli("run", "--out", tmp_path, "--steps", "1-:2", SCRIPT, "--steps", "4", cwd=tmp_path, timeout=900)
    assert p.returncode == 0, p.stderr
    (path,) = glob.glob(str(tmp_path / "**" / "steps_train-*.pfw.gz"), recursive=True)
    events = read_events(path)
    assert [e["name"] for e in ops(events, "step")] == [f"step {i}" for i in range(4)]
    assert {e["args"]["step"] for e in ops(events)} == {1, 3}
    assert_bad_input(cli("run", "--steps", "x", SCRIPT, cwd=tmp_path), "--steps", "A-B:K")


@pytest.fixture
def rec(tmp_path):
    with recording(tmp_path) as recorder:
        yield recorder
        set_steps(None)


def test_inference_loop_with_explicit_steps(rec):
    """step_context() makes each block a step, step() ends one; Dynamo's update(step=) names it."""
    torch.manual_seed(0)
    backend = create_backend(level="torch")
    model = torch.compile(MLP().eval(), backend=backend)
    x = torch.randn(4, 16)
    with torch.no_grad():
        for _ in range(3):
            with step_context():
                model(x)
        backend.update(step=10)
        for _ in range(2):
            model(x)
            step()
    path = rec.path()
    assert perfetto_tp.error_stats(path) == []
    rows = slices(path)
    names = [r["name"] for r in rows if r["cat"] == "step"]
    assert names == ["step 0", "step 1", "step 2", "step 10", "step 11"]
    # each graph call inside its step; from the second call on, inside the compiled model's call
    # ("model", a module slice with eager ops on) in that step
    every = {r["id"]: r for r in perfetto_tp.rows(path, "select id, parent_id, name, category as cat from slice")}
    graph_rows = [r for r in rows if r["cat"] == "dynamo_graph"]
    parents = [every[r["parent_id"]] for r in every.values() if r["cat"] == "dynamo_graph"]
    assert [p["name"] for p in parents] == ["step 0"] + ["model"] * 4
    assert [every[p["parent_id"]]["name"] if p["cat"] == "module" else p["name"] for p in parents] == names
    assert [r["step"] for r in graph_rows] == [int(n.split()[1]) for n in names]
    events = read_events(path)
    assert [e["args"]["step"] for e in graphs(events)] == [0, 1, 2, 10, 11]
    assert all("step" not in e["args"] or isinstance(e["args"]["step"], int) for e in events)


def test_set_steps_with_stride_and_open_range(rec):
    torch.manual_seed(0)
    model = torch.compile(MLP(), backend=create_backend(level="torch"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 16)
    set_steps("0-4:2,7-")
    for _ in range(9):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    events = rec.events()
    assert [e["name"] for e in ops(events, "step")] == [f"step {i}" for i in range(9)]
    for cat in ("dynamo", "dynamo_graph", "backward", "optimizer"):
        assert {e["args"]["step"] for e in ops(events, cat)} == {0, 2, 4, 7, 8}, cat


def test_bert_training_step_nests_under_the_step_and_keeps_numerics(rec):
    tf = pytest.importorskip("transformers")
    import copy

    torch.manual_seed(0)
    cfg = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=100, max_position_embeddings=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = tf.BertModel(cfg)
    ids = torch.randint(0, 100, (2, 12))

    def train_step(m, backend):
        m = copy.deepcopy(m)
        fn = m if backend is None else torch.compile(m, backend=backend)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        out = fn(ids).last_hidden_state
        (out ** 2).sum().backward()
        grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in m.parameters()]
        opt.step()
        return out.detach(), grads

    eager, reference = train_step(model, None), train_step(model, "aot_eager")
    traced = train_step(model, create_backend(level="aten"))
    for other in (eager, reference):
        assert torch.equal(traced[0], other[0])
        assert all(torch.equal(a, b) for a, b in zip(traced[1], other[1]))
    path = rec.path()
    assert perfetto_tp.error_stats(path) == []
    rows = slices(path)
    # each run has its own optimizer, which joins the training's optimizers (the step rule): the
    # steps they share are numbered from 0, and our graphs sit in the last one
    steps = [r["name"] for r in rows if r["cat"] == "step"]
    assert steps == [f"step {n}" for n in range(len(steps))] and steps
    fwd = [r for r in rows if r["cat"] == "dynamo_graph" and r["name"].endswith("forward")]
    bwd = [r for r in rows if r["cat"] == "dynamo_graph" and r["name"].endswith("backward")]
    last = len(steps) - 1
    assert [(r["parent"], r["depth"], r["step"]) for r in fwd] == [(steps[-1], 1, last)]
    assert [(r["parent"], r["depth"], r["step"]) for r in bwd] == [("backward", 2, last)]
    # the deepest forward op of the graph: step > graph > the module slices of its nn.Module path > op
    # (the eager run's ops, eager ops, nest in its eager module slices under its step)
    deepest = perfetto_tp.rows(path, "select s.id from slice s join args a using(arg_set_id) "
                               "where s.category = 'dynamo' and a.key = 'args.phase' "
                               "and a.string_value = 'forward' and coalesce(extract_arg(s.arg_set_id, "
                               "'args.level'), '') != 'eager' order by s.depth desc limit 1")[0]["id"]
    chain = perfetto_tp.rows(path, f"select name, category from ancestor_slice({deepest}) order by depth")
    assert [r["category"] for r in chain[:2]] == ["step", "dynamo_graph"]
    modules = [r["name"] for r in chain[2:]]
    assert all(r["category"] == "module" for r in chain[2:]) and len(modules) >= 4
    assert all(inner.startswith(outer + ".") for outer, inner in zip(modules, modules[1:]))
    assert modules[0] == "encoder" and modules[1].startswith("encoder.layer.")
    assert any(m.endswith(".attention.self") for m in modules)


def test_a_failure_in_step_tracking_never_reaches_the_training_loop(rec, monkeypatch):
    import logging

    from dftrace_dynamo import _core
    from dftrace_dynamo.events import steps

    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    config.log.addHandler(handler)

    def broken(*args):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(_core, "step_slice", broken)
    torch.manual_seed(0)
    model = torch.compile(MLP(), backend=create_backend(level="torch"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 16)).sum().backward()
            opt.step()
        assert steps._state.broken
        events = rec.events()
    finally:
        steps._state.broken = False
        config.log.removeHandler(handler)
    assert not ops(events, "step")
    assert len(graphs(events)) == 3  # ops are still traced after step tracking stopped
    assert messages == ["step tracking is off: RuntimeError: disk on fire (the trace goes on without step slices)"]


def test_update_step_takes_any_integer_and_ignores_other_values(rec):
    import numpy as np

    backend = create_backend(level="torch")
    model = torch.compile(MLP(), backend=backend)
    x = torch.randn(4, 16)
    backend.update(step=np.int64(5))
    model(x)
    backend.update(step="five")  # ignored with a warning: the loop goes on
    model(x)
    backend.update(step=2**64)  # beyond the trace's int64 and the C core's step
    model(x)
    backend.update(step=torch.tensor(7))
    model(x)
    assert [e["args"]["step"] for e in graphs(rec.events())] == [5, 5, 5, 7]


def test_graph_call_runs_its_plain_graph_when_no_op_is_recorded(rec):
    from dftrace_dynamo import _core

    calls = []
    site = _core.intern_site("graph 99 forward", "dynamo_graph", {"graph": 99})
    call = _core.GraphCall(lambda x: calls.append("traced") or x, site, None, _core.PHASE_FORWARD,
                           lambda: True, lambda x: calls.append("plain") or x)
    call(1)
    _core.set_ops_on(False)  # outside the step windows
    try:
        assert not _core.ops_on()
        call(2)
    finally:
        _core.set_ops_on(True)
    events = rec.events()
    _core.set_ops_on(True)
    call(3)  # no trace open
    assert calls == ["traced", "plain", "plain"]
    assert [e["args"]["graph"] for e in graphs(events)] == [99]
    with pytest.raises(TypeError, match="plain must be callable"):
        _core.GraphCall(lambda x: x, site, None, _core.PHASE_FORWARD, lambda: True, 3)
