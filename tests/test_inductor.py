"""level="inductor": one kernel event per kernel call of Inductor's generated code, with
provenance, numerics equal to plain Inductor, traced the same from the FX graph cache,
summarised by kernel, and accepted by Perfetto and dftracer_validate.

The models are compiled in two subprocesses sharing one TORCHINDUCTOR_CACHE_DIR (the
second one loads every graph from the FX graph cache); module-scoped, as Inductor
compiles are slow."""

import collections
import contextlib
import copy
import json
import os
import textwrap

import pytest

import perfetto_tp
from backend_support import eager_ops, graphs, ops, run_py, run_python
from backend_support import fresh_dynamo, rec  # noqa: F401 (fixtures)
from tracefile import dftracer_validate, read_events, traces

SCRIPT = __file__.rsplit("/", 1)[0] + "/scripts/inductor_models.py"


def _run(tmp, name, cache):
    out = tmp / name
    out.mkdir()
    run_python([SCRIPT, str(out / "trace"), str(out / "result.json")], cwd=str(tmp), timeout=1500,
               env={"DFTRACER_ENABLE": "1", "TORCHINDUCTOR_CACHE_DIR": str(cache),
                    "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"})
    (path,) = traces(out)
    with open(out / "result.json") as f:
        return path, json.load(f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inductor")
    return _run(tmp, "first", tmp / "cache"), _run(tmp, "second", tmp / "cache")


def kernels(events):
    return ops(events, "kernel")


def per_call(events):
    """{graph slice id: Counter of kernel names inside it} (kernels nested by time, same thread)."""
    out = {}
    slices = graphs(events)
    for k in kernels(events):
        (g,) = [g for g in slices if g["tid"] == k["tid"] and g["ts"] <= k["ts"]
                and k["ts"] + k["dur"] <= g["ts"] + g["dur"] + 1e-3 and g["args"]["graph"] == k["args"]["graph"]]
        out.setdefault(g["id"], (g, collections.Counter()))[1][k["name"]] += 1
    return out


def expected_calls(result, model):
    """A Counter of kernel calls per graph the generated code of ``model`` has."""
    return [collections.Counter(g["calls"]) for g in result["models"][model]]


def test_every_kernel_call_is_one_event_nested_in_its_graph(runs):
    (path, result), _ = runs
    events = read_events(path)
    calls = per_call(events)
    assert kernels(events) and all(calls.values())
    for model in ("cnn", "bert", "mlp_pair"):
        for want in expected_calls(result, model):
            assert [c for g, c in calls.values() if c == want], (model, want)
    # every graph slice holds exactly the calls of one generated graph
    wanted = [dict(c) for m in result["models"] for c in expected_calls(result, m)]
    assert all(dict(c) in wanted for _, c in calls.values())
    # CNN: two training steps (forward + backward) and one inference call
    phases = collections.Counter(g["args"]["phase"] for g in graphs(events))
    assert phases["forward"] >= 2 and phases["backward"] >= 2 and phases["inference"] >= 1
    kinds = {k["args"]["kernel_type"] for k in kernels(events)}
    assert {"cpp", "extern", "fallback"} <= kinds
    for k in kernels(events):
        assert k["args"]["phase"] in ("forward", "backward", "inference")


def test_two_graphs_sharing_one_generated_module_keep_their_own_events(runs):
    (path, result), _ = runs
    a, b = result["models"]["mlp_pair"]
    assert a["cache_key"] == b["cache_key"] and a["calls"] == b["calls"]  # one generated module
    events = read_events(path)
    # per_call already checks that each kernel event lies in a slice of its own graph
    slices = [g for g, calls in per_call(events).values() if dict(calls) == a["calls"]]
    per_graph = collections.Counter(g["args"]["graph"] for g in slices)
    assert sorted(per_graph.values()) == [1, 2]  # first function called once, second twice


def test_provenance_names_real_aten_ops(runs):
    import torch

    (path, _), _ = runs
    ks = kernels(read_events(path))
    with_ops = [k for k in ks if k["args"]["aten_ops"]]
    assert len(with_ops) >= 0.9 * len(ks)
    for k in with_ops:
        for op in k["args"]["aten_ops"]:
            ns, name = op.split(".", 1)
            assert hasattr(getattr(torch.ops, ns), name), op
        assert k["args"]["source_nodes"]
    convs = [k for k in ks if k["name"] == "extern_kernels.convolution"]
    assert convs and all(k["args"]["aten_ops"] == ["aten.convolution"] and k["args"]["module"] == "conv"
                         for k in convs)
    assert any(k["args"].get("module", "").startswith("encoder.layer.") for k in ks)


KERNEL_CHAINS_SQL = """
select s.name, extract_arg(s.arg_set_id, 'args.module') module, extract_arg(s.arg_set_id, 'args.phase') phase,
       (select group_concat(category || ':' || name, '|') from (select * from ancestor_slice(s.id) order by depth)) chain
from slice s where s.category = 'kernel'
"""


def test_kernels_nest_in_the_module_slices_of_their_fused_ops(runs):
    (path, _), _ = runs
    assert perfetto_tp.error_stats(path) == []
    rows = perfetto_tp.rows(path, KERNEL_CHAINS_SQL)
    assert len(rows) == len(kernels(read_events(path)))
    depths = collections.Counter()
    for r in rows:
        chain = r["chain"].split("|")
        graph = next(i for i, a in enumerate(chain) if a.startswith("dynamo_graph:"))
        mods = [a.removeprefix("module:") for a in chain[graph + 1:]]
        assert all(a != m for a, m in zip(chain[graph + 1:], mods)), r  # only module slices in between
        # in the slice of its module, inside those of the calls enclosing it; none without one
        assert mods[-1:] == ([r["module"]] if r["module"] else []), r
        # paths are relative to the compiled root, which is named by its variable or class
        paths = mods[1:] if mods[:1] == ["model"] else mods
        assert all(inner.startswith(outer + ".") for outer, inner in zip(paths, paths[1:])), r
        depths[len(mods)] += 1
    assert depths[0] and depths[1] and max(depths) >= 3  # BERT: encoder.layer.<i>.attention...
    conv = [r for r in rows if r["name"] == "extern_kernels.convolution"]
    assert conv and all(r["chain"].endswith("|module:conv") for r in conv)
    # backward kernels nest under the forward module they differentiate
    assert any(r["phase"] == "backward" and r["module"] == "fc" for r in rows)


@pytest.mark.parametrize("fold", [False, True], ids=["calls", "folded"])
def test_kernel_module_slices_follow_the_straight_line_code(fold):
    """The same boundaries, whether calls of their own or folded into the interceptor of the
    kernel call statement they precede."""
    import ast

    from dftrace_dynamo.backend import inductor

    source = """
        def call(args):
            a = _dft_k0(1)
            with ctx():
                _dft_k1(a)
                _dft_k2(a)
            for _ in range(2):
                _dft_k3(a)
            _dft_k4(a)
            return a
    """
    call_def = ast.parse(textwrap.dedent(source)).body[0]
    a, b = ("ka", "a", "A"), ("kb", "a.b", "B")
    folds = {} if fold else None
    assert inductor.add_spans(call_def, [(a,), (a, b), (a,), (a,), ()], graph_id=0, folds=folds) == 3
    log = []

    def span(*args):
        log.append(("span", args))

    def kernel(i):
        def call(x):
            if fold and i in folds:
                opened, closed = folds[i]
                span(opened, *closed)
            log.append(i)
            return x
        return call

    namespace = {"ctx": contextlib.nullcontext, "_dft_span": span}
    namespace.update({f"_dft_k{i}": kernel(i) for i in range(5)})
    exec(compile(ast.fix_missing_locations(ast.Module(body=[call_def], type_ignores=[])), "<call>", "exec"),
         namespace)
    namespace["call"](None)
    site_a, site_b = log[8][1][1], log[4][1][1]
    assert site_a != site_b
    # a with body continues the sequence around it; a loop body opens and closes its own
    # (slices opened, sites of those closed, innermost first)
    assert log == [("span", (1,)), 0, ("span", (1,)), 1, ("span", (0, site_b)), 2,
                   ("span", (1,)), 3, ("span", (0, site_a)), ("span", (1,)), 3, ("span", (0, site_a)),
                   ("span", (0, site_a)), 4]
    if fold:  # every boundary before a kernel call; the one after the loop body's last stays a call
        assert sorted(folds) == [0, 1, 2, 3, 4] and ast.unparse(call_def).count("_dft_span(") == 1


def test_numerics_equal_plain_inductor(runs):
    (_, result), _ = runs
    assert result["cnn_equal"] and result["bert_equal"]


def test_fx_graph_cache_hit_in_a_fresh_process_is_traced_the_same(runs):
    (first, r1), (second, r2) = runs
    assert r2["fxgraph_cache_hit"] >= len([g for m in r2["models"].values() for g in m]) > 0
    assert r1["models"] == r2["models"]

    def static(path):
        return sorted(json.dumps([k["name"], {a: v for a, v in k["args"].items() if a != "hhash"}],
                                 sort_keys=True) for k in kernels(read_events(path)))

    assert static(first) == static(second)


def test_summary_kernel_view_consistent_with_graph_slices(runs):
    from dftrace_dynamo.traces.summary import summarize

    (path, _), _ = runs
    result = summarize([path], ["kernel", "module", "phase"], top=1000)
    rows = result["views"]["kernel"]
    events = read_events(path)
    ks = kernels(events)
    assert {r["key"] for r in rows} == {k["name"] for k in ks}
    assert sum(r["count"] for r in rows) == len(ks)
    total = sum(r["total_us"] for r in rows)
    assert total == pytest.approx(sum(k["dur"] for k in ks))
    assert 0 < total <= result["graph_time_us"]
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    conv = next(r for r in rows if r["key"] == "extern_kernels.convolution")
    assert conv["fused_ops"] == "aten.convolution"
    keys = {r["key"] for r in result["views"]["phase"]}
    # eager ops (on by default): phase optimizer in an optimizer's work, none ("(none)") between
    # backward and the optimizer outside its slices; every graph op has its phase
    assert keys - {"(none)", "optimizer"} == {"forward", "backward", "inference"}
    for key, phase in (("(none)", None), ("optimizer", "optimizer")):
        assert (key in keys) == any(e["args"].get("phase") == phase for e in eager_ops(events)), key
    assert all("phase" in e["args"] for e in ops(events))
    assert "conv" in {r["key"] for r in result["views"]["module"]}


def test_trace_loads_in_perfetto_and_dftracer_validate(runs):
    (path, _), _ = runs
    assert perfetto_tp.error_stats(path) == []
    dftracer_validate(path)


def test_run_level_inductor_traces_kernels_with_metadata_and_guards_cpp_wrapper(tmp_path):
    """run --level inductor, with DFTRACER_INC_METADATA=1 and module slices off."""
    from scripts.clitools import cli

    script = os.path.join(os.path.dirname(SCRIPT), "compile_inductor.py")
    p = cli("run", "--out", tmp_path, "--compile-all", "--level", "inductor", script, timeout=1200,
            env={"DFTRACER_INC_METADATA": "1", "DFTRACER_MODULE_SLICES": "0",
                 "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")})
    assert p.returncode == 0, p.stderr
    assert p.stdout == "close True\n"
    # the C++ wrapper cannot be intercepted: one warning, its graph calls still recorded
    assert "kernels are not traced, only the graph call" in p.stderr
    (path,) = traces(tmp_path, "*/*.pfw*")  # in the run's own directory
    events = read_events(path)
    first, second = sorted(graphs(events), key=lambda g: g["ts"])
    assert first["args"]["level"] == "inductor" and first["args"]["kernels"] == 3
    assert "kernels" not in second["args"]
    ks = kernels(events)
    assert [k["name"] for k in ks].count("extern_kernels.addmm") == 2
    assert all(k["args"]["phase"] == "inference" and k["args"]["grad_enabled"] == 0 for k in ks)
    assert not [e for e in events if e.get("cat") == "module"]  # DFTRACER_MODULE_SLICES=0
    mm = next(k for k in ks if k["args"].get("module") == "0")
    assert mm["name"] == "extern_kernels.addmm" and mm["args"]["flops"] == 2 * 4 * 16 * 8
    assert mm["args"]["bytes"] > 0


def test_bad_level_option_is_one_clear_error():
    import torch

    from dftrace_dynamo import create_backend

    torch._dynamo.reset()
    with pytest.raises(ValueError, match="level='fused' is not valid"):
        create_backend(level="fused")
    with pytest.raises(Exception, match="level='fused' is not valid"):
        torch.compile(lambda x: x + 1, backend="dftrace", options={"level": "fused"})(torch.ones(2))
    torch._dynamo.reset()


def test_torch_cond_branch_kernels_are_traced_with_their_own_provenance(rec):
    """Inductor generates each torch.cond branch as a function of its own, before call: its
    kernels are traced too, and provenance pairs each call site with the comment above it
    (not with the first comment naming the same kernel, which is a branch's)."""
    import torch

    from dftrace_dynamo import create_backend

    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            y = torch.cond(x.sum() > 0, lambda x: self.a(x).relu(), lambda x: self.b(x).sigmoid(), (x,))
            z = self.a(y)  # Dynamo names nodes after their variables
            z2 = self.b(z)
            return z2

    torch.manual_seed(0)
    model = Branchy()
    traced = torch.compile(model, backend=create_backend(level="inductor"))
    x = torch.randn(2, 4).abs()
    with torch.no_grad():
        outs = [traced(x), traced(-x)]
        torch._dynamo.reset()
        plain = torch.compile(model, backend="inductor")
        assert all(torch.equal(o, plain(v)) for o, v in zip(outs, (x, -x)))
    events = read_events(rec.path())
    first, second = sorted(graphs(events), key=lambda g: g["ts"])
    assert first["args"]["kernels"] == 7  # 3 in call, 2 per branch

    def inside(g):
        return [(k["name"], k["args"].get("module"), k["args"]["source_nodes"]) for k in kernels(events)
                if g["ts"] <= k["ts"] <= g["ts"] + g["dur"]]

    true_branch, false_branch = inside(first), inside(second)
    assert [n for n, *_ in true_branch] == ["cpp_fused_gt_sum_0", "extern_kernels.addmm", "cpp_fused_gt_relu_1",
                                            "extern_kernels.addmm", "extern_kernels.addmm"]
    assert true_branch[1][1] == "a" and false_branch[1][1] == "b"
    assert "sigmoid" in false_branch[2][0]
    # call's own addmms: each its own comment's nodes (the k-th handle naming addmm in the
    # source would be a branch's, whose nodes share names with call's first addmm)
    assert true_branch[3:] == [("extern_kernels.addmm", "a", ["z"]), ("extern_kernels.addmm", "b", ["z2"])]
    assert false_branch[3:] == true_branch[3:]


def test_with_no_op_recorded_graphs_run_the_code_inductor_generated(rec):
    """Outside the step windows (no op recorded) each graph calls the ``call`` function
    Inductor generated, with no interceptor in front of its kernels, as plain Inductor
    does; inside, the traced copy. Both compute plain Inductor's numbers."""
    import gc

    import torch

    from dftrace_dynamo import _core, create_backend

    def graph_calls():
        return {id(o): o for o in gc.get_objects() if type(o) is _core.GraphCall}

    def intercepted(fn):
        return [k for k, v in getattr(fn, "__func__", fn).__globals__.items() if isinstance(v, _core.Interceptor)]

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    twin = copy.deepcopy(model)
    x = torch.randn(4, 8)
    before = graph_calls()
    traced = torch.compile(model, backend=create_backend(level="inductor"))
    outs = [traced(x)]
    outs[0].sum().backward()
    new = [c for k, c in graph_calls().items() if k not in before]
    assert len(new) == 2  # forward and backward
    for call in new:
        assert getattr(call.plain, "__name__", None) == "call" and not intercepted(call.plain)
        assert intercepted(call.fn) and call.fn is not call.plain
    _core.set_ops_on(False)  # as outside the step windows
    try:
        outs.append(traced(x))
        outs[1].sum().backward()
    finally:
        _core.set_ops_on(True)
    events = rec.events()
    assert len(graphs(events)) == 2 and {g["args"]["phase"] for g in graphs(events)} == {"forward", "backward"}
    assert len(kernels(events)) == sum(g["args"]["kernels"] for g in graphs(events)) > 0  # one call's
    plain = torch.compile(twin, backend="inductor")
    want = [plain(x)]
    want[0].sum().backward()
    want.append(plain(x))
    want[1].sum().backward()
    assert all(torch.equal(o, w) for o, w in zip(outs, want))
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), twin.parameters()))


NESTED = """
import sys
import torch
sys.path.insert(0, {tests!r})
from test_backend_modules import Nested
import dftrace_dynamo
from dftrace_dynamo import create_backend

dftrace_dynamo.initialize_log("trace")
torch.manual_seed(0)
model = torch.compile(Nested(), backend=create_backend(level="inductor"))
for _ in range(2):
    model(torch.randn(4, 8)).sum().backward()
dftrace_dynamo.finalize()
"""


def test_a_kernel_a_post_grad_pass_made_names_its_module_as_from_the_cache(tmp_path):
    """The backward addmm Inductor's pattern matcher makes of the twice-called block's weight
    gradients (mm + the accumulating add) has no module stack of its own: compiled afresh, it
    names the block as when the same graph is loaded from the FX graph cache."""
    found = []
    for run in ("cold", "cached"):
        cwd = tmp_path / run
        cwd.mkdir()
        run_py(NESTED.format(tests=os.path.dirname(os.path.abspath(__file__))), cwd, timeout=600,
               env={"DFTRACER_ENABLE": "1", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
                    "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"})
        (path,) = traces(cwd)
        found.append(sorted({(k["name"], k["args"]["phase"], k["args"].get("module"))
                             for k in kernels(read_events(path))}))
    cold, cached = found
    assert ("extern_kernels.addmm", "backward", "twice.block.0") in cold
    assert cold == cached
