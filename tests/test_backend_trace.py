"""What the tracing backend writes: one event per executed node inside its graph event,
names, args (graph, node, module, grad_enabled, phase, tags), compile-side events, and
the cases that must keep working (no_grad, exceptions, threads, several models)."""

import dataclasses
import io
import threading

import pytest
import torch

import perfetto_tp
from tracefile import read_events, traces
from backend_support import CNN, MLP, compile_records, eager_ops, executed_nodes, graphs, ops, run_py
from backend_support import fresh_dynamo, rec  # noqa: F401 (fixtures)
from scripts.clitools import summary_json
from dftrace_dynamo import Dynamo, create_backend
from dftrace_dynamo.backend import compile_events
from dftrace_dynamo.session import config


def capture(level="torch", **kw):
    """A backend that also keeps every captured graph (after instrumentation) with its info."""
    seen = []
    backend = create_backend(level=level, on_graph=lambda gm, ex, info: seen.append((gm, info)), **kw)
    return backend, seen


def test_torch_level_one_event_per_executed_node_nested_in_graph_event(rec):
    torch.manual_seed(0)
    model = MLP()
    backend, seen = capture("torch")
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(8, 16)
    for _ in range(3):
        compiled(x)
    path = rec.path()
    events = read_events(path)
    (gm, info), = seen
    assert info["stage"] == "dynamo" and info["phase"] == "forward" and info["frame"] == "forward"
    nodes = {n.name for n in executed_nodes(gm)}
    op_events = ops(events)
    assert len(op_events) == 3 * len(nodes)
    assert {e["args"]["node"] for e in op_events} == nodes
    assert {e["name"] for e in op_events} == {"function.linear", "function.gelu"}
    assert {e["args"].get("module") for e in op_events} == {"layers.0", "layers.2", "layers.4", "head",
                                                           "layers.1", "layers.3", "layers.5"}
    assert all(e["args"]["grad_enabled"] == 1 and e["args"]["phase"] == "forward" for e in op_events)
    gid = info["graph_id"]
    assert [e["name"] for e in graphs(events)] == [f"graph {gid} forward"] * 3
    assert all(e["args"]["graph"] == gid for e in op_events)

    assert perfetto_tp.error_stats(path) == []
    nested = perfetto_tp.rows(path, (
        "select p.name parent, s.depth depth, count(*) n from slice s join slice p on s.parent_id = p.id "
        "where s.category in ('dynamo', 'module') group by p.name, s.depth"))
    # each op sits in the slice of its module (layers.N inside layers), module slices in the graph's;
    # the second and third graph calls one deeper, in the compiled model's call (eager ops on; the
    # first call compiles and has none)
    def rows(depth, calls):
        return [{"parent": f"graph {gid} forward", "depth": depth, "n": calls * 2},
                {"parent": "head", "depth": depth + 1, "n": calls},
                {"parent": "layers", "depth": depth + 1, "n": calls * 6},
                *({"parent": f"layers.{i}", "depth": depth + 2, "n": calls} for i in range(6))]
    key = lambda r: (r["parent"], r["depth"])  # noqa: E731
    assert sorted(nested, key=key) == sorted(rows(1, 1) + rows(2, 2), key=key)


@pytest.mark.parametrize("level", ["torch", "aten"])
def test_generated_code_calls_each_interceptor_through_its_builtin(rec, level):
    """A graph's generated code calls every node's interceptor as a built-in function bound to it
    (``Interceptor.builtin``: CPython calls its C function directly), chained in calling order
    (``_core.chain``), and its forward is the generated one from the start, not a stub that
    generates it and calls the module again."""
    import types

    from dftrace_dynamo import _core

    torch.manual_seed(0)
    backend, seen = capture(level)
    model = MLP()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(8, 16)
    compiled(x).sum().backward()
    seen = [(gm, info) for gm, info in seen if info["level"] == level]  # at ATen level: not Dynamo's graph
    assert len(seen) == (1 if level == "torch" else 2)
    for gm, _ in seen:
        code = type(gm).forward.__code__
        assert "real_recompile" not in code.co_names
        namespace = type(gm).forward.__globals__
        called = {id(v.__self__): v for v in namespace.values()
                  if isinstance(getattr(v, "__self__", None), _core.Interceptor)}
        targets = [n.target for n in executed_nodes(gm)]
        assert targets and all(type(t) is _core.Interceptor for t in targets)
        assert {id(t) for t in targets} == set(called)
        assert all(type(v) is types.BuiltinFunctionType for v in called.values())
        assert not any(type(v) is _core.Interceptor for v in namespace.values())
        # chained in the order the code calls them: each call prefetches the next one's objects
        order = list(called.values())
        assert [b.__self__.ahead for b in order] == [id(b) for b in order[1:]] + [None]
    assert len(ops(read_events(rec.path()))) == sum(len(executed_nodes(gm)) for gm, _ in seen)
    torch.testing.assert_close(compiled(x), model(x))


def test_aten_level_labels_forward_and_backward_with_modules(rec):
    torch.manual_seed(0)
    model = CNN().train()
    backend, seen = capture("aten")
    out = torch.compile(model, backend=backend)(torch.randn(2, 3, 8, 8))
    out.sum().backward()
    events = rec.events()
    by_phase = {info["phase"]: gm for gm, info in seen if info["stage"] == "aot"}
    assert set(by_phase) == {"forward", "backward"}
    times = {(info["stage"], info["phase"]): info["compile_time_s"] for _, info in seen}
    assert times[("dynamo", "forward")] > 0 and times[("aot", "forward")] > 0 and times[("aot", "backward")] is None
    for phase, gm in by_phase.items():
        evs = [e for e in ops(events) if e["args"]["phase"] == phase]
        assert len(evs) == len(executed_nodes(gm))
        assert {e["args"]["grad_enabled"] for e in evs} == {1 if phase == "forward" else 0}
    names = {e["name"]: e["args"] for e in ops(events)}
    assert names["function.convolution.default"]["module"] == "conv"
    # backward ops are attributed to the module whose forward produced them
    assert names["function.convolution_backward.default"]["module"] == "conv"
    assert names["function.convolution_backward.default"]["phase"] == "backward"
    assert "function._native_batch_norm_legit_functional.default" in names
    gid = seen[0][1]["graph_id"]
    assert sorted(e["name"] for e in graphs(events)) == [f"graph {gid} backward", f"graph {gid} forward"]


@pytest.mark.parametrize("level", ["torch", "aten"])
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_no_grad_and_inference_mode_record_inference_with_grad_off(rec, level, mode):
    model = MLP()
    compiled = torch.compile(model, backend=create_backend(level=level))
    with mode():
        compiled(torch.randn(4, 16))
    events = rec.events()
    assert ops(events)
    assert {(e["args"]["phase"], e["args"]["grad_enabled"]) for e in ops(events) + graphs(events)} == {("inference", 0)}
    assert graphs(events)[0]["name"].endswith(" inference")


def test_grad_mode_switched_inside_the_graph_is_recorded_per_op(rec):
    def fn(x):
        y = x * 3
        with torch.no_grad():
            z = y + 1
        return y.sum() + z.sum()

    torch.compile(fn, backend=create_backend(level="torch"))(torch.randn(4, requires_grad=True))
    grad_of = {e["args"]["node"]: e["args"]["grad_enabled"] for e in ops(rec.events())}
    assert grad_of["y"] == 1 and grad_of["z"] == 0 and grad_of["add_1"] == 1


@pytest.mark.parametrize("level", ["torch", "aten"])
def test_exception_in_an_op_propagates_and_its_event_is_failed(rec, level):
    def fn(x, idx):
        return torch.index_select(x * 2, 0, idx)

    compiled = torch.compile(fn, backend=create_backend(level=level))
    x = torch.randn(4, 3)
    assert torch.equal(compiled(x, torch.tensor([1, 2])), fn(x, torch.tensor([1, 2])))
    with pytest.raises((IndexError, RuntimeError)) as caught:
        compiled(x, torch.tensor([1, 9]))
    with pytest.raises(type(caught.value)):
        fn(x, torch.tensor([1, 9]))
    events = rec.events()
    failed = [e for e in events if e.get("args", {}).get("failed") == 1]
    assert {e["cat"] for e in failed} == {"dynamo", "dynamo_graph"}
    assert [e["name"] for e in failed if e["cat"] == "dynamo"] == [
        "function.index_select" if level == "torch" else "function.index_select.default"]


def test_tags_follow_update_without_recompiling(rec):
    tracer = Dynamo(name="mlp", epoch=0, step=0, level="torch")
    compiled = tracer.compile(MLP())
    x = torch.randn(2, 16)
    compiled(x)
    frames_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    tracer.update(epoch=1, step=7)
    compiled(x)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames_before
    tags = [(e["args"]["name"], e["args"]["epoch"], e["args"]["step"]) for e in graphs(rec.events())]
    assert tags == [("mlp", 0, 0), ("mlp", 1, 7)]


def test_graph_breaks_are_reported_with_reason_and_location(rec):
    def fn(x):
        x = x.relu()
        print("side effect")  # graph break
        return x + 1

    break_line = fn.__code__.co_firstlineno + 2
    with compile_events.collect() as records:
        torch.compile(fn, backend=create_backend(level="torch"))(torch.randn(3))
    breaks = [r for r in records if r["kind"] == "graph_break"]
    assert len(breaks) == 1
    assert "print" in breaks[0]["reason"]
    assert breaks[0]["location"] == f"{__file__}:{break_line}"
    compiles = [r for r in records if r["kind"] == "compile"]
    assert [c["frame"] for c in compiles][0] == "fn" and compiles[0]["graph_breaks"] == 1
    assert compiles[0]["end_ns"] > compiles[0]["start_ns"]
    events = rec.events()
    (event,) = [e for e in compile_records(events) if e["name"] == "graph break"]
    assert event["args"]["location"] == breaks[0]["location"]
    assert len(graphs(events)) == 2  # one graph on each side of the break


class LSTMClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm, self.fc = torch.nn.LSTM(8, 8, batch_first=True), torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(self.lstm(x)[0][:, -1])  # Dynamo gives up on this frame: it runs eagerly


def test_a_frame_dynamo_gives_up_on_is_a_graph_break_with_no_graph(rec):
    """A graph break Dynamo cannot resume from (here an LSTM, as allow_rnn is off) makes it run
    the whole frame eagerly; torch lists no graph break. The trace says why, and compiled
    nothing."""
    model, x = LSTMClassifier(), torch.randn(2, 5, 8)
    with compile_events.collect() as records:
        out = torch.compile(model, backend=create_backend(level="torch"))(x)
    torch.testing.assert_close(out, model(x))
    (brk,) = [r for r in records if r["kind"] == "graph_break"]
    assert brk["reason"].startswith("the frame runs eagerly, in no graph: Attempted to wrap RNN")
    assert brk["location"] == f"{__file__}:{LSTMClassifier.forward.__code__.co_firstlineno + 1}"
    (compile_,) = [r for r in records if r["kind"] == "compile"]
    assert compile_["graph_breaks"] == 1 and compile_["reason"] == brk["reason"]
    path = rec.path()
    events = read_events(path)
    assert not graphs(events)
    result, _ = summary_json(path)
    assert result["compile"]["graphs_compiled"] == 0
    eager = eager_ops(events)  # the frame's ops ran eagerly: its ops are eager op events, no graph's
    assert "aten::lstm" in {e["name"] for e in eager}
    assert (result["processes"], result["op_events"]) == (1, len(eager))
    assert [b["reason"] for b in result["compile"]["graph_breaks"]] == [brk["reason"]]


def test_a_frame_compiled_into_no_graph_counts_none(rec):
    """Dynamo compiles a frame and hands the backend no graph (it returns its input; FSDP2's
    modules, whose hooks Dynamo skips, do the same): no graph compiled, not one per frame."""
    def same(x):
        return x

    x = torch.ones(3)
    assert torch.equal(torch.compile(same, backend=create_backend(level="torch"))(x), x)
    result, _ = summary_json(rec.path())
    assert len(result["compile"]["compiles"]) == 1 and result["compile"]["graphs_compiled"] == 0, result["compile"]


NO_GRAPH = """
    import torch
    lstm = torch.compile(torch.nn.LSTM(8, 8, batch_first=True), backend="dftrace")
    print(lstm(torch.randn(2, 5, 8))[0].shape)
"""


@pytest.mark.parametrize("enable", ["1", None])
def test_a_lazy_trace_that_no_graph_opens_says_why_at_exit(tmp_path, enable):
    """DFTRACER_ENABLE=1 opens the trace at the backend's first graph; when Dynamo hands it none
    (it ran the whole model eagerly), no file is written and one line at exit says why. Without
    DFTRACER_ENABLE nothing was asked for, and nothing is said."""
    env = {"DFTRACER_LOG_FILE": str(tmp_path / "t"), **({"DFTRACER_ENABLE": enable} if enable else {})}
    p = run_py(NO_GRAPH, tmp_path, env=env)
    assert p.returncode == 0 and "torch.Size([2, 5, 8])" in p.stdout, p.stderr
    assert traces(tmp_path) == []
    lines = [line for line in p.stderr.splitlines() if line.startswith("dftrace_dynamo:")]
    if enable:
        (line,) = lines
        assert line.startswith("dftrace_dynamo: DFTRACER_ENABLE=1 but no trace was written: Dynamo compiled 1 "
                               "frame(s) and handed no graph to the dftrace backend; first graph break at ")
        assert line.endswith(": Attempted to wrap RNN, GRU, or LSTM")
    else:
        assert lines == []


def test_recompiles_are_reported_with_the_failed_guard(rec):
    def fn(x, n):
        return x * n

    compiled = torch.compile(fn, backend=create_backend(level="torch"))
    with compile_events.collect() as records:
        compiled(torch.randn(3), 2)
        compiled(torch.randn(3), 3)
    (recompile,) = [r for r in records if r["kind"] == "recompile"]
    assert recompile["reason"] == "n == 2"
    assert recompile["frame"] == "fn" and recompile["location"] == f"{__file__}:{fn.__code__.co_firstlineno}"
    assert [e["args"]["reason"] for e in compile_records(rec.events()) if e["name"] == "recompile"] == ["n == 2"]


def test_compile_event_listener_api():
    got = []
    compile_events.add_listener(got.append)
    try:
        torch.compile(lambda x: x + 1, backend=create_backend(level="torch"))(torch.ones(2))
    finally:
        compile_events.remove_listener(got.append)
    kinds = [r["kind"] for r in got]
    assert kinds.count("compile") == 1 and "instrument" in kinds and "backend" in kinds
    torch.compile(lambda x: x + 2, backend=create_backend(level="torch"))(torch.ones(2))
    assert len(got) == len(kinds)  # removed: nothing more arrives


def test_dynamic_shapes_trace_every_size(rec):
    compiled = torch.compile(MLP(), backend=create_backend(level="aten"), dynamic=True)
    model_out = []
    for batch in (2, 5, 9):
        model_out.append(compiled(torch.randn(batch, 16)).shape[0])
    assert model_out == [2, 5, 9]
    assert len(graphs(rec.events())) == 3


@pytest.mark.parametrize("level", ["torch", "aten"])
def test_threads_each_get_complete_nested_events(rec, level):
    model = MLP()
    backend, seen = capture(level)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(4, 16)
    compiled(x)
    errors = []

    def work():
        try:
            for _ in range(20):
                compiled(x)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, name=f"worker{i}") for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    path = rec.path()
    events = read_events(path)
    per_call = len(executed_nodes(seen[-1][0]))  # the graph that runs: Dynamo's, or AOT's forward
    tids = {e["tid"] for e in graphs(events)}
    assert len(tids) == 4
    for tid in tids:
        assert len([e for e in ops(events) if e["tid"] == tid]) == per_call * len(
            [e for e in graphs(events) if e["tid"] == tid])
    assert perfetto_tp.error_stats(path) == []
    assert perfetto_tp.rows(path, (
        "select count(*) n from slice s join ancestor_slice(s.id) g where s.category = 'dynamo' "
        "and g.depth = 0 and g.category = 'dynamo_graph'")) == [{"n": per_call * 61}]


def test_several_compiled_models_get_their_own_graphs(rec):
    a = torch.compile(MLP(), backend=create_backend(level="torch", name="a"))
    b = torch.compile(CNN().eval(), backend=create_backend(level="aten", name="b"))
    a(torch.randn(2, 16))
    b(torch.randn(1, 3, 8, 8))
    a(torch.randn(2, 16))
    events = graphs(rec.events())
    assert [(e["args"]["name"], e["args"]["level"]) for e in events] == [("a", "torch"), ("b", "aten"), ("a", "torch")]
    assert events[0]["args"]["graph"] == events[2]["args"]["graph"] != events[1]["args"]["graph"]


@pytest.mark.parametrize("level", ["torch", "aten"])
def test_a_saved_compiled_model_loads_and_traces_with_its_tags(rec, level):
    """``torch.save`` of a compiled model pickles its backend (as with the built-in backends):
    the copy computes the same, and its graphs are traced with the backend's tags."""
    model = torch.compile(MLP(), backend=create_backend(level=level, name="saved", epoch=3))
    x = torch.randn(2, 16)
    expected = model(x)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert torch.equal(loaded(x), expected)
    events = graphs(rec.events())
    assert [(e["args"]["name"], e["args"]["epoch"]) for e in events] == [("saved", 3)] * 2
    assert events[0]["args"]["graph"] != events[1]["args"]["graph"]  # the copy compiles its own


def test_inner_backend_gets_graph_events_and_compile_time_only(rec):
    model = MLP()
    x = torch.randn(3, 16)
    out = torch.compile(model, backend=create_backend(inner="aot_eager"))(x)
    assert torch.equal(out, torch.compile(model, backend="aot_eager")(x))
    events = rec.events()
    assert ops(events) == []
    (graph,) = graphs(events)
    assert graph["args"]["inner"] == "aot_eager" and graph["args"]["phase"] == "forward"
    (backend_event,) = [e for e in compile_records(events) if e["name"].startswith("backend graph")]
    assert backend_event["args"]["inner"] == "aot_eager" and backend_event["dur"] > 0


def test_backend_registered_by_name_without_importing_the_package(tmp_path):
    run_py("import torch; torch.compile(lambda x: x.sin() + 1, backend='dftrace')(torch.randn(3))", tmp_path,
           {"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": str(tmp_path / "t")}, timeout=120)
    (path,) = traces(tmp_path, "t-*.pfw.gz")
    assert {e["name"] for e in ops(read_events(path))} == {"function.sin.default", "function.add.Tensor"}


def test_metadata_adds_static_shapes_flops_and_source(rec, monkeypatch):
    monkeypatch.setattr(config, "_config", dataclasses.replace(config.get(), inc_metadata=True))
    lin = torch.nn.Linear(16, 32)
    torch.compile(lambda x: lin(x).relu(), backend=create_backend(level="aten"))(torch.randn(8, 16))
    path = rec.path()
    args = {e["name"]: e["args"] for e in ops(read_events(path))}
    addmm = args["function.addmm.default"]
    assert addmm["input_shapes"] == [[32], [8, 16], [16, 32]] and addmm["output_shapes"] == [[8, 32]]
    assert addmm["input_dtypes"] == ["float32"] * 3 and addmm["op_type"] == "call_function"
    assert addmm["flops"] == 2 * 8 * 16 * 32
    assert addmm["bytes"] == 4 * (32 + 8 * 16 + 16 * 32 + 8 * 32)
    assert addmm["source"].startswith(__file__ + ":")
    assert args["function.relu.default"]["flops"] == 0
    assert perfetto_tp.error_stats(path) == []  # list args load (Perfetto flattens them)
    assert perfetto_tp.rows(path, "select display_value v from args where key = 'args.input_shapes[1][0]'") == [
        {"v": "8"}]


def test_metadata_flops_at_torch_level(rec, monkeypatch):
    monkeypatch.setattr(config, "_config", dataclasses.replace(config.get(), inc_metadata=True))
    lin = torch.nn.Linear(16, 32)
    torch.compile(lambda x: torch.matmul(lin(x), lin.weight), backend=create_backend(level="torch"))(
        torch.randn(8, 16))
    args = {e["name"]: e["args"] for e in ops(rec.events())}
    assert args["function.linear"]["flops"] == 2 * 8 * 16 * 32
    assert args["function.matmul"]["flops"] == 2 * 8 * 32 * 16
    assert args["function.linear"]["module_type"] == "Linear" and args["function.linear"]["module"] == "lin"


def test_disabled_backend_and_decorator_leave_code_untouched(rec):
    gm = torch.fx.symbolic_trace(MLP())
    assert create_backend(enable=False)(gm, [torch.randn(2, 16)]) == gm.forward
    assert "dft_" not in gm.code
    traced = torch.fx.symbolic_trace(MLP())
    compiled = create_backend(level="torch")(traced, [torch.randn(2, 16)])
    assert "dft_layers_0(x)" in traced.code  # call_module nodes call the submodule object
    compiled(torch.randn(2, 16))
    assert [e["name"] for e in ops(rec.events())][:2] == ["layers.0", "layers.1"]

    def fn(x):
        return x + 1

    assert Dynamo(enable=False).compile(fn) is fn
    assert Dynamo(enable=False).compile()(fn) is fn


def test_dftracer_enable_0_returns_functions_untouched(tmp_path):
    proc = run_py("""
        import torch
        from dftrace_dynamo import dynamo, tracer_backend
        def fn(x):
            return x + 1
        assert dynamo.compile(fn) is fn
        assert dynamo.compile(level="torch")(fn) is fn
        gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
        assert tracer_backend(gm, [torch.randn(1, 2)]) == gm.forward and "dft_" not in gm.code
        print("untouched")
    """, tmp_path, env={"DFTRACER_ENABLE": "0"})
    assert "untouched" in proc.stdout


def test_decorator_forms_on_methods_and_functions(rec):
    from dftrace_dynamo import dynamo

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        @dynamo.compile
        def forward(self, x):
            return self.fc(x).relu()

    @dynamo.compile(level="torch")
    def plain(x):
        return x.cos()

    @dynamo.compile()
    def bare(x):
        return x.sin()

    net, x = Net(), torch.randn(2, 4)
    assert torch.equal(net(x), torch.relu(net.fc(x)))
    assert torch.equal(plain(x), x.cos()) and torch.equal(bare(x), x.sin())
    names = {e["name"] for e in ops(rec.events())}
    assert {"function.addmm.default", "method.cos", "function.sin.default"} <= names
