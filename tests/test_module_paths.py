"""Module paths are the user's ``named_modules()`` paths after graph breaks and in nested compiled
submodules, and a module's slice holds the time spent eagerly inside its call (code between its
graphs, a ``torch.compiler.disable``'d call)."""

import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from backend_support import Enc, ops
from backend_support import fresh_dynamo, rec  # noqa: F401 (fixtures)
from dftrace_dynamo import _core, create_backend

SLEEPS = []  # (start, end) of each disabled call, ns on the trace's clock: the ground truth


@torch.compiler.disable
def slow_io(x):
    start = _core.now_ns()
    time.sleep(0.02)
    SLEEPS.append((start, _core.now_ns()))
    return x


class Slow(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        x = slow_io(self.fc(x))  # a graph break, and 20 ms outside any graph
        return F.relu(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.slow = Slow()
        self.b = nn.Linear(8, 2)

    def forward(self, x):
        return self.b(self.slow(self.a(x)))  # self.b is on Dynamo's stack across the break


def train(model, level, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, backend=create_backend(level=level))
    for _ in range(steps):
        opt.zero_grad()
        compiled(torch.randn(4, 8)).sum().backward()
        opt.step()


def within(inner, outer):
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


@pytest.mark.parametrize("level", ["torch", "aten"])
def test_paths_after_a_graph_break_and_eager_time_in_the_module(rec, level):
    SLEEPS.clear()
    train(Net(), level)
    events = rec.events()
    forward = [e for e in ops(events) if e["args"].get("phase") == "forward"]
    by_op = {}
    for e in forward:
        by_op.setdefault(e["name"].split(".")[1], set()).add(e["args"].get("module"))
    assert by_op["linear" if level == "torch" else "addmm"] == {"a", "slow.fc", "b"}
    assert by_op["relu"] == {"slow"}  # F.relu in Slow.forward, after the break
    modules = [e for e in events if e.get("cat") == "module"]
    # compiled: the compiled model's call, named by the variable that holds it (eager ops on)
    assert {e["name"] for e in modules} == {"compiled", "a", "slow", "slow.fc", "b"}
    assert not any("___" in str(e["args"].get("module")) or "L__" in str(e["args"].get("module")) for e in events)
    # one slice per call of Slow, around its graphs and the 20 ms between them (from the call
    # after the one that compiled it: its hooks go in while that call runs)
    slow = sorted((e for e in modules if e["name"] == "slow" and e["args"].get("phase") != "backward"),
                  key=lambda e: e["ts"])
    assert len(slow) == len(SLEEPS) - 1 == 2
    for e, (start, end) in zip(slow, SLEEPS[1:]):
        assert e["ts"] <= start / 1000 and end / 1000 <= e["ts"] + e["dur"]
        assert e["dur"] >= (end - start) / 1000
        assert (e["args"]["grad_enabled"], e["args"]["phase"]) == (1, "forward")  # trained with grad
    for e in forward:
        if e["args"].get("module", "").startswith("slow") and e["args"]["step"] >= 1:
            assert any(within(e, s) for s in slow), e


class Outer(nn.Module):
    def __init__(self, backend):
        super().__init__()
        self.enc = torch.compile(Enc(), backend=backend)  # compiled itself, inside a compiled model
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(self.enc(x))


@pytest.mark.parametrize("level", ["torch", "aten"])
def test_nested_compiled_submodules_have_their_paths_in_the_model(rec, level):
    backend = create_backend(level=level)
    compiled = torch.compile(Outer(backend), backend=backend)
    for _ in range(2):
        compiled(torch.randn(2, 4)).sum().backward()
    events = rec.events()
    assert {e["args"].get("module") for e in ops(events)} == {"enc", "enc.fc", "head"}
    # compiled: the compiled model's call, named by the variable that holds it (eager ops on)
    assert {e["name"] for e in events if e.get("cat") == "module"} == {"compiled", "enc", "enc.fc", "head"}


class EagerOuter(nn.Module):
    def __init__(self, backend):
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.enc = torch.compile(Enc(), backend=backend)  # the only compiled part of an eager model

    def forward(self, x):
        return self.enc(self.pre(x))


@pytest.mark.parametrize("level", ["torch", "aten"])
def test_a_compiled_submodule_of_an_eager_model_has_its_path_in_the_model(rec, level):
    model = EagerOuter(create_backend(level=level))
    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()
    events = rec.events()
    assert {e["args"].get("module") for e in ops(events)} == {"enc", "enc.fc"}
    names = [e["name"] for e in events if e.get("cat") == "module"]
    # enc: from its hooks (the second call on), or backward; model and pre: eager modules (eager ops on)
    assert set(names) == {"model", "pre", "enc", "enc.fc"}


@pytest.mark.parametrize("level", ["torch", "aten"])
def test_a_module_slice_around_eager_code_has_the_grad_mode_of_its_call(rec, level):
    SLEEPS.clear()
    compiled = torch.compile(Net(), backend=create_backend(level=level))
    compiled(torch.randn(4, 8)).sum().backward()  # compiles; the hooks go in during this call
    with torch.no_grad():
        compiled(torch.randn(4, 8))
    compiled(torch.randn(4, 8)).sum().backward()
    slices = sorted((e for e in rec.events() if e.get("cat") == "module" and e["name"] == "slow"
                     and e["args"].get("phase") != "backward"), key=lambda e: e["ts"])
    assert [(e["args"]["grad_enabled"], e["args"]["phase"]) for e in slices] == [(0, "inference"), (1, "forward")]
    for e, (start, end) in zip(slices, SLEEPS[1:]):
        assert e["ts"] <= start / 1000 and end / 1000 <= e["ts"] + e["dur"]


class SlowNamedS(nn.Module):
    """Slow, with its receiver named ``s`` (as ``self`` is only a convention)."""

    def __init__(s):
        super().__init__()
        s.fc = nn.Linear(8, 8)

    def forward(s, x):
        x = slow_io(s.fc(x))
        return F.relu(x)


class NetNamedS(nn.Module):
    def __init__(s):
        super().__init__()
        s.a, s.slow, s.b = nn.Linear(8, 8), SlowNamedS(), nn.Linear(8, 2)

    def forward(s, x):
        return s.b(s.slow(s.a(x)))


@pytest.mark.parametrize("level", ["torch", "aten"])
def test_a_receiver_not_named_self_gets_the_same_slices(rec, level):
    SLEEPS.clear()
    train(NetNamedS(), level)
    modules = [e for e in rec.events() if e.get("cat") == "module"]
    assert {e["name"] for e in modules} == {"compiled", "a", "slow", "slow.fc", "b"}
    slow = sorted((e for e in modules if e["name"] == "slow" and e["args"].get("phase") != "backward"),
                  key=lambda e: e["ts"])
    assert len(slow) == len(SLEEPS) - 1 == 2
    for e, (start, end) in zip(slow, SLEEPS[1:]):
        assert e["ts"] <= start / 1000 and end / 1000 <= e["ts"] + e["dur"]
