"""The phase of eager ops around the optimizer: ``optimizer`` inside an optimizer's ``step()``
and the optimizer-side slices (``zero_grad``, gradient clipping, a scheduler's step), ``forward``
and ``backward`` inside an optimizer closure, none for user code between backward and the
optimizer. The program takes its own time marks around each part."""

import json

import pytest

from backend_support import eager_ops, run_py
from tracefile import read_events, traces

ITERS = 4
PROGRAM = f"""
import json, sys
import torch, torch.nn as nn
from dftrace_dynamo import _core, dftracer
from dftrace_dynamo.backend import tracer  # noqa: F401  (the backend: steps and eager ops)

now = _core.now_ns
log = dftracer.initialize_log(sys.argv[1], None, -1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
x, y = torch.randn(16, 8), torch.randn(16, 1)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
sched = torch.optim.lr_scheduler.StepLR(opt, 2)


def forward_backward(m, zero_grad):
    zero_grad()
    m["f0"] = now()
    loss = nn.functional.mse_loss(model(x), y)
    m["b0"] = now()
    loss.backward()
    return loss


plain = []
for _ in range({ITERS}):
    m = {{"z0": now()}}
    forward_backward(m, opt.zero_grad)
    m["u0"] = now()
    norms = torch.stack([p.grad.norm() for p in model.parameters()]).sum()  # the user's own code
    m["c0"] = now()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    m["s0"] = now()
    opt.step()
    sched.step()
    m["s1"] = now()
    plain.append(m)

closure_opt = torch.optim.Adam(model.parameters(), lr=0.01)
closed = []
for _ in range({ITERS}):
    m = {{}}
    def closure():
        m["in0"] = now()
        loss = forward_backward(m, closure_opt.zero_grad)
        m["in1"] = now()
        return loss
    m["s0"] = now()
    closure_opt.step(closure)
    m["s1"] = now()
    closed.append(m)
log.finalize()
json.dump({{"plain": plain, "closed": closed}}, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("phases")
    code = PROGRAM.replace("sys.argv[1]", repr(str(tmp / "tr"))).replace("sys.argv[2]", repr(str(tmp / "m.json")))
    proc = run_py(code, tmp, {"DFTRACER_EAGER_OPS": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (path,) = traces(tmp, "tr-*")
    return json.loads((tmp / "m.json").read_text()), path, eager_ops(read_events(path))


def between(ops, t0, t1):
    return [e for e in ops if t0 <= e["ts"] * 1000 and (e["ts"] + e["dur"]) * 1000 <= t1]


def phases(ops):
    return {e["args"].get("phase") for e in ops}


def test_optimizer_work_is_phase_optimizer(trained):
    """zero_grad, clipping, the optimizer's and the scheduler's step: phase optimizer; the forward
    and loss: forward; the user's code after backward: no phase."""
    marks, _, ops = trained
    for m in marks["plain"][1:]:
        for a, b, want in (("z0", "f0", {"optimizer"}), ("f0", "b0", {"forward"}), ("u0", "c0", {None}),
                           ("c0", "s0", {"optimizer"}), ("s0", "s1", {"optimizer"})):
            got = between(ops, m[a], m[b])
            if a != "z0":  # zero_grad() setting grads to None runs no op
                assert got, (a, b)
            assert phases(got) <= want, (a, b, [(e["name"], e["args"].get("phase")) for e in got])
        assert any(e["name"].startswith("aten::addcdiv") for e in between(ops, m["s0"], m["s1"]))


def test_an_optimizer_closure_keeps_its_forward_and_backward(trained):
    """Adam.step(closure): the closure's forward and backward keep their phases; the update before
    and after the closure is optimizer work."""
    marks, _, ops = trained
    for m in marks["closed"][1:]:
        assert phases(between(ops, m["f0"], m["b0"])) == {"forward"}
        assert "backward" in phases(between(ops, m["b0"], m["in1"]))
        update = between(ops, m["in1"], m["s1"])
        assert update and phases(update) == {"optimizer"}, [(e["name"], e["args"].get("phase")) for e in update]
        assert phases(between(ops, m["s0"], m["in0"])) <= {"optimizer"}


def test_summary_by_phase_counts_the_optimizer_phase(trained):
    """``summary --by phase``, from the aggregates and from the events: an ``optimizer`` row with
    exactly the events of that phase, and no ``(none)`` row larger than the ops with no phase."""
    from dftrace_dynamo.traces.summary import summarize

    _, path, ops = trained
    want = sum(e["args"].get("phase") == "optimizer" for e in ops)
    none = sum("phase" not in e["args"] for e in ops)
    assert want > 0
    for source in ("aggregates", "events"):
        rows = {r["key"]: r for r in summarize([path], ("phase",), top=None, include_warmup=True,
                                               source=source)["views"]["phase"]}
        assert rows["optimizer"]["count"] == want, (source, rows)
        assert rows.get("(none)", {"count": 0})["count"] == none, (source, rows)
