"""Eager ops in training steps (DFTRACER_EAGER_OPS=1): an
uncompiled model with a known sleep in a known module, trained from a DataLoader, its gradients
clipped between backward and the optimizer step, then run without grad. The program takes its
own time marks around the forward, the clipping and the no-grad call."""

import json

import pytest

from backend_support import eager_ops, inside, ops, run_py
from tracefile import read_events, traces

SLEEP_S = 0.02
ITERS = 5
PROGRAM = f"""
import json, sys, time
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from dftrace_dynamo import _core, dftracer
from dftrace_dynamo.backend import tracer  # noqa: F401  (the backend: steps and eager ops)

class Sleeper(nn.Module):
    def forward(self, x):
        time.sleep({SLEEP_S})
        return x.relu()

log = dftracer.initialize_log(sys.argv[1], None, -1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), Sleeper(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(TensorDataset(torch.randn({ITERS} * 4, 8), torch.randn({ITERS} * 4, 1)), batch_size=4)
marks = []
for x, y in loader:
    opt.zero_grad()
    t0 = _core.now_ns()
    out = model(x)
    t1 = _core.now_ns()
    nn.functional.mse_loss(out, y).backward()
    c0 = _core.now_ns()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    c1 = _core.now_ns()
    opt.step()
    torch.ones(3).sum()  # after the step, before the next batch: the step's own
    marks.append([t0, t1, c0, c1])
n0 = _core.now_ns()
with torch.no_grad():
    model(x)
n1 = _core.now_ns()
log.finalize()
json.dump({{"marks": marks, "no_grad": [n0, n1]}}, open(sys.argv[2], "w"))
"""


def train(tmp, env=None):
    proc = run_py(PROGRAM.replace("sys.argv[1]", repr(str(tmp / "tr"))).replace("sys.argv[2]", repr(str(tmp / "m.json"))),
                  tmp, {"DFTRACER_EAGER_OPS": "1", **(env or {})}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (path,) = traces(tmp, "tr-*")
    return json.loads((tmp / "m.json").read_text()), read_events(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train(tmp_path_factory.mktemp("eager_steps"))


def within(e, start_ns, end_ns):
    """``e`` lies between two time marks of the program (the writer floors times to the µs)."""
    return start_ns // 1000 - 1 <= e["ts"] and e["ts"] + e["dur"] <= end_ns // 1000 + 1


def test_held_eager_ops_keep_their_times_and_nest_where_they_ran(trained):
    """From the second step on, the batch's collation, ``zero_grad`` and the eager forward run
    while the step before is complete and its end undecided (their events are held back): they
    keep their measured times, the collation nests in its data slice, the data and ``zero_grad``
    slices are the step's own children, the known sleep is in its module's slice."""
    result, events = trained
    steps = ops(events, "step")
    assert len(steps) == ITERS
    eager = eager_ops(events)
    for k, (t0, t1, _, _) in enumerate(result["marks"]):
        step = steps[k]
        mine = [e for e in eager if e["args"].get("step") == k]
        (data,) = [s for s in ops(events, "data") if s["name"] == "data" and s["args"]["step"] == k]
        (zero,) = [s for s in ops(events, "optimizer") if s["name"] == "SGD.zero_grad" and s["args"]["step"] == k]
        assert inside(data, step) and inside(zero, step)
        assert not any(inside(s, e) for e in mine for s in (data, zero)), k  # no op holds them
        collation = [e["name"] for e in mine if inside(e, data)]
        assert collation.count("aten::stack") == 2, (k, collation, data)
        assert all(inside(e, data) or e["ts"] >= data["ts"] + data["dur"] or e["ts"] + e["dur"] <= data["ts"]
                   for e in mine), k  # none straddles it
        (sleeper,) = [s for s in ops(events, "module") if s["args"].get("module_type") == "Sleeper"
                      and s["args"]["step"] == k and within(s, t0, t1)]
        assert sleeper["dur"] >= SLEEP_S * 1e6, (k, sleeper, t0, t1)
        forward = [e for e in mine if within(e, t0, t1)]
        assert [e["name"] for e in forward].count("aten::linear") == 2, (k, forward)
        assert [e["name"] for e in forward].count("aten::relu") == 1 and all(
            inside(e, sleeper) for e in forward if e["name"] == "aten::relu")


def test_eager_ops_carry_the_grad_mode_they_ran_in(trained):
    """The forward's ops ran with grad enabled (``grad_enabled`` 1, phase forward); the call
    under ``torch.no_grad()`` has ``grad_enabled`` 0 and phase inference, as a compiled graph's
    ops would."""
    result, events = trained
    eager = eager_ops(events)
    for t0, t1, _, _ in result["marks"]:
        forward = [e for e in eager if within(e, t0, t1) and e["name"] == "aten::linear"]
        assert len(forward) == 2 and all(e["args"].get("grad_enabled") == 1 and e["args"].get("phase") == "forward"
                                         for e in forward), forward
    n0, n1 = result["no_grad"]
    inference = [e for e in eager if within(e, n0, n1) and e["name"] == "aten::linear"]
    assert len(inference) == 2 and all(e["args"].get("grad_enabled") == 0 and e["args"].get("phase") == "inference"
                                       for e in inference), inference


def test_gradient_clipping_after_backward_is_not_forward(trained):
    """``clip_grad_norm_`` between backward and the optimizer step: its ops are recorded with
    phase optimizer (not the forward's), inside its own ``clip_grad_norm_`` optimizer slice, in
    no backward slice nor the optimizer's ``step``/``zero_grad``."""
    result, events = trained
    eager = eager_ops(events)
    clipping = [s for s in ops(events, "optimizer") if s["name"] == "clip_grad_norm_"]
    slices = ops(events, "backward") + [s for s in ops(events, "optimizer") if s["name"].startswith("SGD.")]
    for _, _, c0, c1 in result["marks"]:
        clip = [e for e in eager if within(e, c0, c1)]
        assert any("norm" in e["name"] for e in clip), clip
        assert all(e["args"].get("phase") == "optimizer" for e in clip), clip
        (own,) = [s for s in clipping if within(s, c0, c1)]
        assert all(inside(e, own) for e in clip), (own, clip)
        assert not any(inside(e, s) for e in clip for s in slices)


def test_step_windows_keep_only_their_steps_eager_ops(tmp_path):
    """With steps 2-3 selected, eager ops are those of steps 2 and 3 only: the op after step 1's
    optimizer step (before the next batch, while op-level events are already on for step 2) is
    step 1's and not recorded; steps 2 and 3 each have theirs."""
    _, events = train(tmp_path, {"DFTRACER_STEPS": "2-3"})
    eager = eager_ops(events)
    assert {e["args"].get("step") for e in eager} == {2, 3}
    assert sorted(e["args"]["step"] for e in eager if e["name"] == "aten::ones") == [2, 3]


def run_program(tmp, code):
    proc = run_py(code.replace("TRACE", repr(str(tmp / "tr"))), tmp, {"DFTRACER_EAGER_OPS": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (path,) = traces(tmp, "tr-*")
    return read_events(path)


def test_eager_ops_after_a_zero_grad_are_in_the_step_it_begins(tmp_path):
    """An evaluation at the top of the loop (nanoGPT), then iterations each named with
    ``update(step=...)``: the eager work after each ``zero_grad()`` is held with it (after the
    evaluation as after a complete step) and lands in the step it begins, under its name, never
    in the evaluation; the ``zero_grad`` slices keep their times (before that work)."""
    events = run_program(tmp_path, """
        import torch, torch.nn as nn
        from dftrace_dynamo import create_backend, dftracer
        log = dftracer.initialize_log(TRACE, None, -1)
        backend = create_backend()
        model = nn.Linear(8, 8)
        compiled = torch.compile(model, backend=backend)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with torch.no_grad():
            compiled(torch.full((4, 8), 2.0))
        for k in range(100, 103):
            backend.update(step=k)
            opt.zero_grad()
            torch.arange(3)  # each iteration's eager work after its zero_grad
            compiled(torch.randn(4, 8)).sum().backward()
            opt.step()
        log.finalize()
        """)
    eager = eager_ops(events)
    (ev,) = ops(events, "eval")
    assert not any(e["name"] == "aten::arange" for e in eager if inside(e, ev))
    steps = sorted(ops(events, "step"), key=lambda s: s["ts"])
    assert [s["name"] for s in steps] == ["step 100", "step 101", "step 102"]
    for s in steps:
        k = int(s["name"].split()[1])
        (arange,) = [e for e in eager if e["name"] == "aten::arange" and inside(e, s)]
        (zero,) = [e for e in ops(events, "optimizer") if e["name"] == "SGD.zero_grad" and inside(e, s)]
        assert arange["args"]["step"] == zero["args"]["step"] == k, (arange, zero)
        assert zero["ts"] + zero["dur"] <= arange["ts"] and zero["dur"] > 0.01, (zero, arange)

