"""Interceptor and GraphCall: results, exceptions and arguments pass through
unchanged; events carry the graph context; references are managed."""

import gc
import sys
import weakref

import pytest

from dftrace_dynamo import _core
from test_core_format import HHASH, closed_core, events, open_trace, read_objects  # noqa: F401 (closed_core: autouse fixture)


@pytest.fixture
def site():
    return _core.intern_site("op", "dynamo", {"node": "n"})


def recorded(tmp_path, fn):
    """Runs fn() with a file open; returns (fn's result, the events written)."""
    path = open_trace(tmp_path, 0, name=f"t{id(fn)}")
    try:
        out = fn()
    finally:
        _core.close()
    return out, events(read_objects(path))


def test_call_passes_args_kwargs_and_result(tmp_path, site):
    sentinel = object()

    def target(*args, **kwargs):
        return sentinel, args, kwargs

    ic = _core.Interceptor(target, site, _core.TagCell())
    (res, args, kwargs), ev = recorded(tmp_path, lambda: ic(1, "a", x=2, y=None))
    assert res is sentinel and args == (1, "a") and kwargs == {"x": 2, "y": None}
    assert len(ev) == 1 and ev[0]["name"] == "op" and "failed" not in ev[0]["args"]
    assert ev[0]["args"] == {"hhash": HHASH, "node": "n", "grad_enabled": 0}
    # no file open: still a plain call
    assert ic(5)[1] == (5,)


def test_exception_passes_through_and_is_recorded(tmp_path, site):
    err = KeyError("boom")

    def target():
        raise err

    ic = _core.Interceptor(target, site, None)

    def run():
        with pytest.raises(KeyError) as info:
            ic()
        return info.value

    caught, ev = recorded(tmp_path, run)
    assert caught is err
    assert ev[0]["args"]["failed"] == 1


def test_method_mode(tmp_path, site):
    lst = [3, 1, 2]
    sort = _core.Interceptor("sort", site, None, mode=_core.METHOD)
    split = _core.Interceptor("split", site, None, mode=_core.METHOD, name="split")
    out, ev = recorded(tmp_path, lambda: (sort(lst, reverse=True), split("a b c", maxsplit=1)))
    assert out == (None, ["a", "b c"]) and lst == [3, 2, 1]
    assert len(ev) == 2
    assert split.__name__ == "split" and split.target == "split"
    with pytest.raises(TypeError):
        sort()
    with pytest.raises(AttributeError):
        sort(1)
    with pytest.raises(TypeError):
        _core.Interceptor(len, site, None, mode=_core.METHOD)


def test_names_and_attributes(site):
    ic = _core.Interceptor(abs, site, None, name="relu_wrapped")
    assert ic.__name__ == ic.__qualname__ == "relu_wrapped"
    assert ic.__module__ == "dftrace_dynamo._core"
    assert ic.target is abs and ic.site == site
    assert _core.Interceptor(abs, site, None).__name__ == "abs"
    ic.__module__ = "m"
    assert ic.__module__ == "m"
    with pytest.raises(ValueError):
        _core.Interceptor(abs, 0, None)
    with pytest.raises(ValueError):
        _core.Interceptor(abs, site, None, mode=5)
    with pytest.raises(TypeError):
        _core.Interceptor(abs, site, object())


def test_tags_read_on_every_event(tmp_path, site):
    cell = _core.TagCell()
    ic = _core.Interceptor(abs, site, cell)
    t1 = _core.intern_tags({"step": 1})
    t2 = _core.intern_tags({"step": 2})

    def run():
        ic(1)
        cell.id = t1
        ic(1)
        cell.id = t2
        ic(1)

    _, ev = recorded(tmp_path, run)
    assert [e["args"].get("step") for e in ev] == [None, 1, 2]
    with pytest.raises(ValueError):
        cell.id = 10**6
    assert _core.TagCell(t1).id == t1


def test_graphcall_context_and_enclosing_event(tmp_path, site):
    gsite = _core.intern_site("graph 0 forward", "dynamo_graph")
    op = _core.Interceptor(abs, site, None)
    inherit_calls = []
    grad_states = iter([True, False, True])

    def grad_fn():
        inherit_calls.append(1)
        return next(grad_states)

    def graph(args):
        assert isinstance(args, list)
        args.append(op(-1))
        return args

    g = _core.GraphCall(graph, gsite, None, _core.PHASE_FORWARD, grad_fn)
    bwd = _core.GraphCall(graph, gsite, None, _core.PHASE_BACKWARD, grad_fn)

    def run():
        a = g([])
        b = g([])
        c = bwd([])
        op(-1)  # outside any graph: no context
        return a, b, c

    out, ev = recorded(tmp_path, run)
    assert out == ([1], [1], [1]) and len(inherit_calls) == 3
    got = [(e["name"], e["args"]["grad_enabled"], e["args"].get("phase")) for e in ev]
    assert got == [
        ("op", 1, "forward"), ("graph 0 forward", 1, "forward"),
        ("op", 0, "inference"), ("graph 0 forward", 0, "inference"),
        ("op", 1, "backward"), ("graph 0 forward", 1, "backward"),
        ("op", 0, None),
    ]
    for k in (0, 2, 4):  # each graph event encloses its op
        o, gr = ev[k], ev[k + 1]
        assert gr["ts"] <= o["ts"] and o["ts"] + o["dur"] <= gr["ts"] + gr["dur"]


def test_grad_override(tmp_path, site):
    on = _core.Interceptor(abs, site, None, grad=_core.GRAD_ON)
    off = _core.Interceptor(abs, site, None, grad=_core.GRAD_OFF)
    g = _core.GraphCall(lambda: (on(1), off(1)), site, None, _core.PHASE_BACKWARD, lambda: False)
    _, ev = recorded(tmp_path, g)
    assert [(e["args"]["grad_enabled"], e["args"]["phase"]) for e in ev[:2]] == [(1, "backward"), (0, "backward")]


def test_graphcall_exception_restores_context(tmp_path, site):
    op = _core.Interceptor(abs, site, None)

    def boom():
        raise ValueError("x")

    g = _core.GraphCall(boom, site, None, _core.PHASE_FORWARD, lambda: True)

    def run():
        with pytest.raises(ValueError):
            g()
        op(1)

    _, ev = recorded(tmp_path, run)
    assert ev[0]["args"]["failed"] == 1 and ev[0]["args"]["phase"] == "forward"
    assert ev[1]["args"] == {"hhash": HHASH, "node": "n", "grad_enabled": 0}


def test_constant_grad_and_probe_only_while_armed(tmp_path, site):
    probed = []
    op = _core.Interceptor(abs, site, None)
    g = _core.GraphCall(lambda: op(1), site, None, _core.PHASE_FORWARD, False, probe=probed.append)

    def run():
        g()  # inside a training step: no probe call
        _core.set_forward_probe(True)
        try:
            g()
        finally:
            _core.set_forward_probe(False)
        g()

    _, ev = recorded(tmp_path, run)
    assert probed == [False]
    # grad_fn=False: a forward graph without grad records as inference, and so do its ops
    assert [(e["args"]["grad_enabled"], e["args"].get("phase")) for e in ev] == [(0, "inference")] * 6
    with pytest.raises(TypeError, match="probe must be callable"):
        _core.GraphCall(lambda: 1, site, None, _core.PHASE_FORWARD, True, probe=3)


def test_grad_fn_error_propagates(tmp_path, site):
    def bad():
        raise RuntimeError("grad")

    g = _core.GraphCall(lambda: 1, site, None, _core.PHASE_FORWARD, bad)

    def run():
        with pytest.raises(RuntimeError, match="grad"):
            g()

    _, ev = recorded(tmp_path, run)
    assert ev == []


def test_no_reference_leaks(tmp_path, site):
    arg, res = object(), object()
    ic = _core.Interceptor(lambda a: res, site, _core.TagCell())
    g = _core.GraphCall(lambda a: ic(a), site, None, 1, lambda: True)
    before = sys.getrefcount(arg), sys.getrefcount(res)

    def run():
        for _ in range(1000):
            g(arg)
            with pytest.raises(TypeError):
                ic()

    recorded(tmp_path, run)
    assert (sys.getrefcount(arg), sys.getrefcount(res)) == before


def test_cycles_are_collected(site):
    class Holder:
        def __call__(self):
            return 1

    h = Holder()
    h.ic = _core.Interceptor(h, site, None)
    h.gc = _core.GraphCall(h, site, None, 1, h)
    ref = weakref.ref(h)
    del h
    gc.collect()
    assert ref() is None


def test_operator_targets_behave_like_the_operator(tmp_path, site):
    import operator

    add = _core.Interceptor(operator.add, site, None)
    getitem = _core.Interceptor(operator.getitem, site, None)
    iadd = _core.Interceptor(operator.iadd, site, None)

    def run():
        items = [1]
        assert iadd(items, [2]) is items and items == [1, 2]  # in place, same object
        with pytest.raises(TypeError, match="unsupported operand"):
            add(1, "a")
        with pytest.raises(TypeError):  # arity errors come from operator.add itself
            add(1, 2, 3)
        return add(2, 3), add("a", "b"), getitem((4, 5), 1), getitem({"k": 6}, "k")

    out, ev = recorded(tmp_path, run)
    assert out == (5, "ab", 5, 6)
    assert [("failed" in e["args"]) for e in ev] == [False, True, True, False, False, False, False]


def test_graphcall_takes_attributes(site):
    call = _core.GraphCall(lambda args: args, site, None, _core.PHASE_FORWARD, lambda: True)
    call._boxed_call = True
    assert call._boxed_call is True and call.__dict__ == {"_boxed_call": True}


def test_boundary_argument_is_checked(site):
    for bad, error, match in [((1,), TypeError, "boundary must be"), (1, TypeError, "boundary must be"),
                              (("1", ()), TypeError, "boundary must be"), ((1, 2), TypeError, "sequence of ints"),
                              ((1, ("x",)), TypeError, "site ids are ints"), ((0, ()), ValueError, "no slice"),
                              ((-1, ()), ValueError, "0 to 65536"), ((1 << 17, ()), ValueError, "0 to 65536"),
                              ((1, (10 ** 9,)), ValueError, "unknown site"), ((1, (-2,)), ValueError, "unknown site")]:
        with pytest.raises(error, match=match):
            _core.Interceptor(abs, site, None, boundary=bad)
    with pytest.raises(TypeError):  # keyword only
        _core.Interceptor(abs, site, None, 0, 0, "name", (1, ()))
    assert _core.Interceptor(abs, site, None, boundary=(2, [site])).boundary == (2, (site,))
    assert _core.Interceptor(abs, site, None).boundary is _core.Interceptor(abs, site, None, boundary=None).boundary is None


def test_boundary_before_each_kind_of_call(tmp_path, site):
    """A boundary folded into a call, an operator and a method interceptor: the slices it closes
    end before the op, those it opens start with it; results and errors pass through."""
    import operator

    a, b = (_core.intern_site(name, "module", {"module_type": "M"}) for name in "ab")
    add = _core.Interceptor(operator.add, site, None, boundary=(1, ()))  # opens a
    upper = _core.Interceptor("upper", site, None, _core.METHOD, boundary=(1, (a,)))  # closes a, opens b
    call = _core.Interceptor(abs, site, None, boundary=(0, (b,)))  # closes b

    def run():
        out = add(2, 3), upper("x"), call(-4)
        with pytest.raises(TypeError):
            add(1, 2, 3)  # not two arguments: a plain call of operator.add, after the boundary
        with pytest.raises(TypeError, match="needs the object"):
            upper()
        _core.boundary(None, 0, b)  # what the last failed call opened
        return out

    out, ev = recorded(tmp_path, run)
    assert out == (5, "X", 4)
    assert [(e["name"], "failed" in e["args"]) for e in ev] == [
        ("op", False), ("a", False), ("op", False), ("b", False), ("op", False), ("op", True), ("a", False),
        ("op", True), ("b", False)]
    op_add, slice_a, op_upper, slice_b, op_abs = ev[:5]
    assert slice_a["ts"] <= op_add["ts"] and slice_a["ts"] + slice_a["dur"] <= op_upper["ts"]
    assert slice_b["ts"] <= op_upper["ts"] and slice_b["ts"] + slice_b["dur"] <= op_abs["ts"]


@pytest.mark.parametrize("bound", [False, True], ids=["plain", "boundary"])
def test_builtin_calls_the_interceptor(tmp_path, site, bound):
    """``Interceptor.builtin`` (what generated code calls) is a built-in function bound to the
    interceptor: each kind (call, operator, method) passes results, kwargs and errors through
    and records the same events as calling the interceptor itself."""
    import operator
    import types

    a = _core.intern_site("a", "module", {"module_type": "M"})
    cell = _core.TagCell()
    tags = _core.intern_tags({"k": 7})

    def make(target, mode=_core.CALL):
        return _core.Interceptor(target, site, cell, mode, boundary=(1, (a,)) if bound else None)

    def target(*args, **kwargs):
        if kwargs.get("fail"):
            raise KeyError("boom")
        return args, kwargs

    ics = make(target), make(operator.add), make("upper", _core.METHOD)
    for ic in ics:
        b = ic.builtin
        assert type(b) is types.BuiltinFunctionType and b.__self__ is ic and b.__module__ == ic.__module__
        assert b is not ic.builtin  # a new one each time, all calling the same interceptor

    def run(call):
        fn, add, upper = (call(ic) for ic in ics)
        out = [fn(1, x=2), add(2, 3), add([1], [2]), upper("x"), upper("y")]
        with pytest.raises(KeyError):
            fn(fail=True)
        with pytest.raises(TypeError):
            add(1, 2, 3)  # not two arguments: a plain call of operator.add, which raises
        with pytest.raises(TypeError, match="needs the object"):
            upper()
        return out

    def both():
        _core.boundary(None, 1)  # an open slice for the first boundary to close
        cell.id = tags
        return run(lambda ic: ic), run(lambda ic: ic.builtin)

    (direct, via_builtin), ev = recorded(tmp_path, both)
    assert direct == via_builtin == [((1,), {"x": 2}), 5, [1, 2], "X", "Y"]
    shapes = [(e["name"], e["args"].get("k"), "failed" in e["args"]) for e in ev]
    assert shapes[:len(shapes) // 2] == shapes[len(shapes) // 2:]
    ops = [s for s in shapes if s[0] == "op"]
    assert len(ops) == 2 * 8 and all(k == 7 for _, k, _ in ops)
    assert [f for _, _, f in ops[:8]] == [False] * 5 + [True] * 3
    assert sum(name == "a" for name, _, _ in shapes) == (16 if bound else 0)


def test_chain_links_each_call_to_the_next(tmp_path, site):
    """chain(): each interceptor (or its built-in) prefetches the next one's memory; calls and
    events are unchanged, and a next one freed since costs nothing (only its address was kept)."""
    import operator

    ics = [_core.Interceptor(operator.add, site, None), _core.Interceptor(abs, site, None),
           _core.Interceptor("upper", site, None, _core.METHOD)]
    assert [ic.ahead for ic in ics] == [None] * 3
    calls = [ics[0].builtin, ics[1], ics[2].builtin]
    _core.chain(calls)
    assert [ic.ahead for ic in ics] == [id(calls[1]), id(calls[2]), None]
    with pytest.raises(TypeError, match="interceptors"):
        _core.chain([ics[0], abs])
    with pytest.raises(TypeError):
        _core.chain(5)
    last = _core.Interceptor(abs, site, None)
    _core.chain([ics[1], last])
    del last
    gc.collect()

    def run():
        return calls[0](2, 3), ics[1](-4), calls[2]("x")

    out, ev = recorded(tmp_path, run)
    assert out == (5, 4, "X") and [e["name"] for e in ev] == ["op"] * 3

