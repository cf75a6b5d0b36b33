"""Module slices: op events sit in ``module`` slices of the nn.Module calls that issued them,
nested by hierarchy, in forward and backward, at both levels, exactly (the real Perfetto
trace processor loads them with zero error stats), and switched off by DFTRACER_MODULE_SLICES=0."""

import copy
import dataclasses
import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import perfetto_tp
from backend_support import Recorder, executed_nodes, ops, run_py
from backend_support import fresh_dynamo, rec  # noqa: F401 (fixtures)
from dftrace_dynamo import _core, create_backend
from dftrace_dynamo.session import config
from dftrace_dynamo.backend import inductor, modules
from tracefile import dftracer_validate, read_events, traces


# every op and module slice with its module arg and the names of the slices enclosing it
CHAINS_SQL = """
select s.name, s.category cat, s.depth, extract_arg(s.arg_set_id, 'args.module') module,
       extract_arg(s.arg_set_id, 'args.phase') phase, extract_arg(s.arg_set_id, 'args.module_type') module_type,
       extract_arg(s.arg_set_id, 'args.failed') failed, extract_arg(s.arg_set_id, 'args.level') level,
       (select group_concat(name, '|') from (select name from ancestor_slice(s.id) order by depth)) chain
from slice s where s.category in ('dynamo', 'kernel', 'module') order by s.ts, s.depth
"""


def chains(path):
    """Perfetto's view of ``path`` (which must load with zero error stats): one dict per op,
    kernel or module slice of a compiled graph, with ``modules``, the module slices between its
    graph slice and it. Outside graphs are only eager ops and eager modules' slices."""
    assert perfetto_tp.error_stats(path) == []
    result = []
    for row in perfetto_tp.rows(path, CHAINS_SQL):
        chain = (row.pop("chain") or "").split("|")
        graph = next((i for i, name in enumerate(chain) if name.startswith("graph ")), None)
        if graph is None:
            assert row["level"] == "eager" or row["cat"] == "module", row
            continue
        result.append(dict(row, graph=chain[graph], modules=chain[graph + 1:], rel_depth=len(chain) - graph))
    return result


def assert_nested_by_module(rows):
    """Each op sits in the slice of its own module, inside the slices of the calls enclosing
    that one (each a dotted prefix of the next), inside its graph; an op without a module
    sits directly in its graph."""
    op_rows = [r for r in rows if r["cat"] in ("dynamo", "kernel")]
    assert op_rows
    for r in op_rows:
        if r["module"] is None:
            assert r["modules"] == [], r
        else:
            assert r["modules"] and r["modules"][-1] == r["module"], r
        assert all(inner.startswith(outer + ".") for outer, inner in zip(r["modules"], r["modules"][1:])), r


class ConvNet(nn.Module):
    """The network of pydftracer's training-loop guide, on 1×12×12 images."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.conv2 = nn.Conv2d(4, 8, 3)
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def test_boundaries_form_a_stack_over_the_op_sequence():
    a, ax, ay = ("ka", "a", "A"), ("kax", "a.x", "X"), ("kay", "a.y", "Y")
    a1, a1x = ("ka@1", "a", "A"), ("kax@1", "a.x", "X")
    b = ("kb", "b", "B")
    stacks = [(a, ax), (a, ax), (a, ay), (b,), (a, ax), (), (a1, a1x)]
    assert modules.boundaries(stacks) == [
        (0, [], [a, ax]),
        (2, [ax], [ay]),
        (3, [ay, a], [b]),  # innermost closed first
        (4, [b], [a, ax]),  # a's ops interleaved with b's: a second slice of a
        (5, [ax, a], []),  # an op without a module sits in no slice
        (6, [], [a1, a1x]),  # a second call of the same module: its own slices
        (7, [a1x, a1], []),
    ]
    assert modules.boundaries([(), ()]) == []


def test_span_records_closed_slices_with_graph_context_and_tags(tmp_path):
    site = _core.intern_site("enc.layer", "module", {"module_type": "Layer", "graph": 7})
    cell = _core.TagCell()
    assert _core.span(cell) == 0  # no file open: nothing is recorded, a start of 0
    rec = Recorder(tmp_path)
    try:
        cell.id = _core.intern_tags({"name": "run"})
        start = _core.span(cell)
        assert start > 0
        assert _core.span(cell, True, 0, site) >= start  # opened while nothing was recorded: skipped
        assert _core.span(cell, True, start, site) >= start
        assert _core.span(cell, False, start, site, start, site) >= start
        with pytest.raises(TypeError):
            _core.span(cell, True, start)
        with pytest.raises(TypeError):
            _core.span(cell, True)
        with pytest.raises(TypeError):
            _core.span(object())
        with pytest.raises(ValueError, match="unknown site"):
            _core.span(None, True, start, 10 ** 9)
    finally:
        path = rec.path()
    events = [e for e in read_events(path) if e.get("cat") == "module"]
    assert len(events) == 3
    for e in events:
        assert e["name"] == "enc.layer"
        assert e["args"]["module_type"] == "Layer" and e["args"]["graph"] == 7 and e["args"]["name"] == "run"
    # the grad mode given, as a forward graph call of that mode would have it
    assert [(e["args"]["grad_enabled"], e["args"]["phase"]) for e in events] == [
        (1, "forward"), (0, "inference"), (0, "inference")]


def test_boundary_keeps_open_slices_on_a_stack_per_thread(tmp_path):
    import threading

    cell = _core.TagCell()
    a, b, c, t = (_core.intern_site(name, "module", {"module_type": "M", "graph": 8}) for name in "abct")
    _core.boundary(cell, 1)  # opened while nothing is recorded: never recorded
    rec = Recorder(tmp_path)
    try:
        _core.boundary(cell, 0, t)
        _core.boundary(cell, 2)  # a, then b inside it
        _core.boundary(cell, 1, b)  # b closed, c opened
        worker = threading.Thread(target=lambda: (_core.boundary(cell, 1), _core.boundary(cell, 0, t),
                                                  _core.boundary(cell, 0, t)))
        worker.start()
        worker.join()  # its own stack: one slice t, then nothing open
        assert _core.boundary(cell, 0, c, a) is None
        _core.boundary(cell, 0, t)  # nothing open
        with pytest.raises(TypeError):
            _core.boundary(cell)
        with pytest.raises(TypeError):
            _core.boundary(object(), 0)
        with pytest.raises(ValueError, match="unknown site"):
            _core.boundary(None, 1, 10 ** 9)
    finally:
        path = rec.path()
    events = [e for e in read_events(path) if e.get("cat") == "module"]
    assert [e["name"] for e in events] == ["t", "b", "c", "a"]  # completion order
    (worker_t, b_, c_, a_) = events
    assert worker_t["tid"] != a_["tid"] == b_["tid"] == c_["tid"]
    assert a_["ts"] == b_["ts"] and b_["ts"] + b_["dur"] <= c_["ts"]
    # closed by one call: shown ending together, within the µs the writer's placement allows
    # (ends stay within a µs of the measured end; a parent never ends before its child)
    assert 0 <= (a_["ts"] + a_["dur"]) - (c_["ts"] + c_["dur"]) < 1


def raising_graph_events(tmp_path, graph, graph_id):
    """The events of ``graph`` (which raises) run by a GraphCall twice, recording and then not,
    inside a slice ``outer`` opened before and closed after; checks that the graphs left no
    slice open (``outer`` closed the one opened before them, around the recorded graph)."""
    cell = _core.TagCell()
    site = _core.intern_site("outer", "module", {"module_type": "M", "graph": graph_id})
    gsite = _core.intern_site(f"graph {graph_id} forward", "dynamo_graph", {"graph": graph_id})
    call = _core.GraphCall(lambda: graph(cell), gsite, cell, _core.PHASE_FORWARD, lambda: True)
    rec = Recorder(tmp_path)
    try:
        _core.boundary(cell, 1)  # a slice open around the graph calls
        with pytest.raises(IndexError):
            call()
        _core.set_ops_on(False)
        with pytest.raises(IndexError):
            call()  # not recording: the graph runs as is
        _core.set_ops_on(True)
        _core.boundary(cell, 0, site)  # closes that slice, not one the graphs left open
    finally:
        _core.set_ops_on(True)
        path = rec.path()
    events = [e for e in read_events(path) if e.get("cat") in ("module", "dynamo", "dynamo_graph")]
    (outer,) = [e for e in events if e["name"] == "outer"]
    (graph_event,) = [e for e in events if e["name"] == f"graph {graph_id} forward"]
    assert outer["ts"] <= graph_event["ts"] and graph_event["ts"] + graph_event["dur"] <= outer["ts"] + outer["dur"]
    return [e for e in events if e is not graph_event]


def test_a_raising_graph_leaves_no_slice_open(tmp_path):
    def graph(cell):
        _core.boundary(cell, 2)
        raise IndexError("op failed")

    assert [e["name"] for e in raising_graph_events(tmp_path, graph, 9)] == ["outer"]


def test_an_op_raising_after_a_folded_boundary_leaves_no_slice_open(tmp_path):
    inner = _core.intern_site("inner", "module", {"module_type": "M", "graph": 10})
    op = _core.intern_site("op", "dynamo", {"node": "n"})

    def fail():
        raise IndexError("op failed")

    def graph(cell):
        _core.Interceptor(abs, op, cell, boundary=(2, ()))(-1)  # opens two slices, then runs abs
        _core.Interceptor(fail, op, cell, boundary=(1, (inner,)))()  # closes one, opens one, raises

    events = raising_graph_events(tmp_path, graph, 10)
    assert [e["name"] for e in events] == ["op", "inner", "op", "outer"]
    first_op, inner_slice, failed_op, _ = events
    assert "failed" not in first_op["args"] and failed_op["args"]["failed"] == 1
    assert inner_slice["ts"] <= first_op["ts"] and first_op["ts"] + first_op["dur"] <= inner_slice["ts"] + inner_slice["dur"]
    assert inner_slice["ts"] + inner_slice["dur"] <= failed_op["ts"]


def test_a_folded_boundary_keeps_the_stack_while_nothing_is_recorded(tmp_path):
    cell = _core.TagCell()
    outer, inner = (_core.intern_site(name, "module", {"module_type": "M", "graph": 11}) for name in ("outer", "inner"))
    op = _core.intern_site("op", "dynamo", {"node": "n"})
    opens = _core.Interceptor(abs, op, cell, boundary=(2, ()))
    closes = _core.Interceptor(abs, op, cell, boundary=(0, (inner, inner)))
    rec = Recorder(tmp_path)
    try:
        _core.boundary(cell, 1)  # outer
        _core.set_ops_on(False)
        opens(-1)  # two slices opened while nothing is recorded
        _core.set_ops_on(True)
        closes(-1)  # closes those two: never recorded
        _core.boundary(cell, 0, outer)
    finally:
        _core.set_ops_on(True)
        path = rec.path()
    assert [e["name"] for e in read_events(path) if e.get("cat") in ("module", "dynamo")] == ["op", "outer"]


class Nested(nn.Module):
    """Modules inside modules, one called twice, and ops of the root module between them."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8), nn.GELU()))
        self.twice = Twice()
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        x = torch.relu(self.enc(x))
        return self.head(self.twice(x) * 2)


@pytest.mark.parametrize("level", ["aten", "torch", "inductor"])
def test_folded_boundaries_record_the_slices_of_boundary_calls(tmp_path, monkeypatch, level):
    """Boundaries folded into the interceptors of the ops (kernel calls) after them give the same
    slices, nested the same way around the same ops, as the same plan made of boundary calls only."""
    import torch._inductor.config as inductor_config

    add_spans, add_kernel_spans = modules.add_spans, inductor.add_spans

    def traced(fold):
        torch._dynamo.reset()
        graphs, kernel_folds = [], {}

        def add_kernel_spans_folding(call_def, stacks, graph_id, hooked=True, folds=None):
            slices = add_kernel_spans(call_def, stacks, graph_id, hooked, folds if fold else None)
            kernel_folds.update(folds if fold else {})
            return slices

        monkeypatch.setattr(modules, "add_spans", functools.partial(add_spans, fold=fold))
        monkeypatch.setattr(inductor, "add_spans", add_kernel_spans_folding)
        rec = Recorder(tmp_path / f"fold{fold}")
        torch.manual_seed(0)
        backend = create_backend(level=level, on_graph=lambda gm, example_inputs, info: graphs.append(gm))
        # both runs compile afresh: a graph loaded from the FX graph cache may name other modules
        with inductor_config.patch(fx_graph_cache=False):
            torch.compile(Nested(), backend=backend)(torch.randn(2, 8)).sum().backward()
        rows = chains(rec.path())
        nodes = [n for gm in graphs for n in gm.graph.nodes]
        folded = sum(modules.boundary_of(n) is not None and not modules.is_span(n) for n in nodes) + len(kernel_folds)
        return [{k: v for k, v in r.items() if k != "graph"} for r in rows], folded  # graph ids differ

    (rows, folded), (plain_rows, plain_folded) = traced(True), traced(False)
    assert folded > 0 and plain_folded == 0
    assert_nested_by_module(rows)
    assert rows == plain_rows
    forward = [r["name"] for r in rows if r["cat"] == "module" and r["phase"] == "forward"]
    expected = ["enc", "enc.0", "enc.1", "enc.1.0", "enc.1.1", "twice", "twice.block", "twice.block.0",
                "twice.block.1", "twice.block", "twice.block.0", "twice.block.1", "head"]
    if level != "inductor":  # whose kernels fuse ops of several modules
        assert forward[:len(expected)] == expected  # then, at ATen level, ops AOTAutograd moved after head
        assert set(forward[len(expected):]) <= set(expected) and (level == "aten" or len(forward) == len(expected))


def test_convnet_training_has_module_slices_in_forward_and_backward(rec):
    torch.manual_seed(0)
    model = ConvNet()
    compiled = torch.compile(model, backend=create_backend(level="aten"))
    optimizer = torch.optim.Adam(model.parameters())
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(3):
        x, y = torch.randn(4, 1, 12, 12), torch.randint(0, 10, (4,))
        optimizer.zero_grad()
        loss_fn(compiled(x), y).backward()
        optimizer.step()
    rows = chains(rec.path())
    assert_nested_by_module(rows)
    slices = [r for r in rows if r["cat"] == "module"]
    for phase in ("forward", "backward"):
        names = [r["name"] for r in slices if r["phase"] == phase]
        assert set(names) == {"conv1", "conv2", "fc1", "fc2"}, phase
        assert all(names.count(n) >= 3 for n in set(names))  # every step
    assert {r["name"]: r["module_type"] for r in slices} == {
        "conv1": "Conv2d", "conv2": "Conv2d", "fc1": "Linear", "fc2": "Linear"}
    assert all(r["modules"] == [] and r["rel_depth"] == 1 for r in slices)  # top-level modules: in the graph
    def modules_of(name, phase):
        return {tuple(r["modules"]) for r in rows if r["name"] == name and r["phase"] == phase}

    assert modules_of("function.convolution.default", "forward") == {("conv1",), ("conv2",)}
    assert modules_of("function.convolution_backward.default", "backward") == {("conv1",), ("conv2",)}
    assert modules_of("function.addmm.default", "forward") == {("fc1",), ("fc2",)}
    assert modules_of("function.relu.default", "forward") == {()}  # the model's own op: in the graph


def bert_for_classification():
    tf = pytest.importorskip("transformers")
    cfg = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=100, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, num_labels=3)
    return tf.BertForSequenceClassification(cfg).train()


def train_step(model, backend, ids, labels):
    """Loss and gradients of one training step of a copy of ``model``."""
    model = copy.deepcopy(model)
    fn = model if backend is None else torch.compile(model, backend=backend)
    loss = fn(ids, labels=labels).loss
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


QUERY = "bert.encoder.layer.{}.attention.self.query"


@pytest.mark.parametrize("level", ["aten", "torch"])
def test_bert_training_step_nests_graph_bert_encoder_layer_attention_op(rec, level):
    torch.manual_seed(0)
    model = bert_for_classification()
    ids, labels = torch.randint(0, 100, (2, 12)), torch.tensor([0, 2])
    eager_loss, eager_grads = train_step(model, None, ids, labels)
    loss, grads = train_step(model, create_backend(level=level), ids, labels)
    assert torch.equal(loss, eager_loss)
    assert all((g is None and e is None) or torch.equal(g, e) for g, e in zip(grads, eager_grads))

    rows = chains(rec.path())
    assert_nested_by_module(rows)
    layer0 = ["bert", "bert.encoder", "bert.encoder.layer.0", "bert.encoder.layer.0.attention",
              "bert.encoder.layer.0.attention.self", QUERY.format(0)]
    matmul = "function.addmm.default" if level == "aten" else "function.linear"
    query_ops = [r for r in rows if r["cat"] == "dynamo" and r["name"] == matmul and r["module"] == QUERY.format(0)]
    assert len(query_ops) == 1
    # graph → bert → encoder → layer.0 → attention → self → query → op
    assert query_ops[0]["modules"] == layer0 and query_ops[0]["rel_depth"] == 7
    phases = {"aten": {"forward", "backward"}, "torch": {"forward"}}[level]  # torch level: eager backward
    for phase in phases:
        names = {r["name"] for r in rows if r["cat"] == "module" and r["phase"] == phase}
        assert {*layer0, QUERY.format(1), "bert.encoder.layer.1.output.dense", "classifier"} <= names, phase
    types = {r["name"]: r["module_type"] for r in rows if r["cat"] == "module"}
    assert types["bert"] == "BertModel" and types["bert.encoder.layer.1"] == "BertLayer"
    if level == "aten":
        # backward ops are in the slices of the module whose forward they differentiate
        grads_of_query = [r for r in rows if r["cat"] == "dynamo" and r["phase"] == "backward"
                          and r["module"] == QUERY.format(1)]
        assert grads_of_query and all(r["modules"][:3] == ["bert", "bert.encoder", "bert.encoder.layer.1"]
                                      for r in grads_of_query)


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())

    def forward(self, x):
        return self.block(self.block(x))


@pytest.mark.parametrize("level", ["aten", "torch"])
def test_a_module_called_twice_gets_two_slices(rec, level):
    compiled = torch.compile(Twice(), backend=create_backend(level=level))
    compiled(torch.randn(2, 8)).sum().backward()
    rows = chains(rec.path())
    assert_nested_by_module(rows)
    forward = [r for r in rows if r["cat"] == "module" and r["phase"] == "forward"]
    assert [r["name"] for r in forward] == ["block", "block.0", "block.1"] * 2
    if level == "aten":
        backward = [r["name"] for r in rows if r["cat"] == "module" and r["phase"] == "backward"]
        assert backward.count("block") >= 2 and backward.count("block.0") >= 2


def _stack(*frames):
    """An nn_module_stack as Dynamo writes it: call key -> (source path, module type)."""
    return {key: (f"L['self'].{path}", nn.Module) for key, path in frames}


def test_interleaved_module_ops_still_nest_exactly(rec):
    """A hand-built graph whose ops alternate between modules (as partitioning can leave them)."""
    a, ax, ay, b = ("ka", "a"), ("kax", "a.x"), ("kay", "a.y"), ("kb", "b")
    graph = torch.fx.Graph()
    value = graph.placeholder("x")
    plan = [(torch.sin, (a, ax)), (torch.cos, (b,)), (torch.neg, (a, ax)), (torch.exp, (a, ay)),
            (torch.abs, ()), (torch.tanh, (a, ax)), (torch.relu, (b,)), (torch.sigmoid, (a,))]
    for fn, frames in plan:
        value = graph.call_function(fn, (value,))
        if frames:
            value.meta["nn_module_stack"] = _stack(*frames)
    graph.output((value,))
    gm = torch.fx.GraphModule(nn.Module(), graph)
    x = torch.randn(4)
    expected = gm(x)[0]
    compiled = create_backend(level="torch")(gm, [x])
    assert len(executed_nodes(gm)) == len(plan)
    assert torch.equal(compiled(x)[0], expected)

    rows = chains(rec.path())
    assert_nested_by_module(rows)
    assert [(r["name"], r["modules"]) for r in rows if r["cat"] == "dynamo"] == [
        (f"function.{fn.__name__}", [p for _, p in frames]) for fn, frames in plan]
    assert [r["name"] for r in rows if r["cat"] == "module"] == ["a", "a.x", "b", "a", "a.x", "a.y", "a", "a.x",
                                                                 "b", "a"]


def test_module_slices_switched_off_keep_the_module_arg(rec, monkeypatch):
    monkeypatch.setattr(config, "_config", dataclasses.replace(config.get(), module_slices=False))
    compiled = torch.compile(Twice(), backend=create_backend(level="aten"))
    compiled(torch.randn(2, 8)).sum().backward()
    events = read_events(rec.path())
    assert [e for e in events if e.get("cat") == "module"] == []
    assert {e["args"].get("module") for e in ops(events)} >= {"block.0", "block.1"}


def test_module_slices_variable(tmp_path):
    assert config.load({}).module_slices is True
    assert config.load({"DFTRACER_MODULE_SLICES": "0"}).module_slices is False
    bad = config.load({"DFTRACER_MODULE_SLICES": "off"})
    assert bad.enable is False and "DFTRACER_MODULE_SLICES='off'" in bad.error and "0 or 1" in bad.error
    code = """
        import torch
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        torch.compile(m, backend="dftrace")(torch.randn(2, 4))
    """
    # nn.Sequential compiled itself: Dynamo records its call, named by its class
    for value, expected in (("0", set()), ("1", {"sequential", "0", "1"})):
        out = tmp_path / value
        out.mkdir()
        run_py(code, out, {"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": str(out / "t"),
                           "DFTRACER_MODULE_SLICES": value}, timeout=180)
        (path,) = traces(out, "t-*.pfw.gz")
        events = read_events(path)
        assert {e["name"] for e in events if e.get("cat") == "module"} == expected
        assert {e["args"]["module"] for e in ops(events) if "module" in e["args"]} == {"0", "1"}


class Picker(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x, idx):
        return torch.index_select(self.lin(x), 0, idx)


class WithPicker(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(3, 3)
        self.pick = Picker()

    def forward(self, x, idx):
        return self.pick(self.pre(x), idx)


@pytest.mark.parametrize("level", ["aten", "torch"])
def test_an_op_raising_inside_a_module_leaves_no_partial_slice(rec, level):
    compiled = torch.compile(WithPicker(), backend=create_backend(level=level))
    x = torch.randn(4, 3)
    compiled(x, torch.tensor([1, 2]))
    with pytest.raises((IndexError, RuntimeError)):
        compiled(x, torch.tensor([1, 9]))
    rows = chains(rec.path())  # loads with zero error stats
    (failed,) = [r for r in rows if r["failed"] == 1]
    assert failed["module"] == "pick" and failed["modules"] == []  # its slice was still open: not recorded
    assert_nested_by_module([r for r in rows if r is not failed])
    # the failing call records the slices closed before the error (pick.lin), not pick
    assert [r["name"] for r in rows if r["cat"] == "module"] == ["pre", "pick", "pick.lin"] + ["pre", "pick.lin"]


def test_dftracer_validate_accepts_module_slices(rec):
    compiled = torch.compile(Twice(), backend=create_backend(level="aten"))
    compiled(torch.randn(2, 8)).sum().backward()
    path = rec.path()
    assert any(e.get("cat") == "module" for e in read_events(path))
    dftracer_validate(path)


def test_a_root_module_reached_through_a_variable_is_named_by_it(rec):
    def train_step(model, x):
        return model(x).sum()

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    torch.compile(train_step, backend=create_backend(level="torch"))(model, torch.randn(2, 4))
    rows = chains(rec.path())
    assert [(r["name"], r["module"], r["modules"]) for r in rows if r["cat"] == "dynamo"] == [
        ("function.linear", "0", ["model", "0"]), ("function.relu", "1", ["model", "1"]), ("method.sum", None, [])]
    assert {r["name"]: r["module_type"] for r in rows if r["cat"] == "module"} == {
        "model": "Sequential", "0": "Linear", "1": "ReLU"}
