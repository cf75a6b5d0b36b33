"""A step mark (``dftrace_dynamo.step()``) during an evaluation: it ends the evaluation, what was
held back before it stays in the evaluation, and from it on marks alone end steps."""

import torch
from torch.utils.data import DataLoader, TensorDataset

from backend_support import MLP, ops
from backend_support import fresh_dynamo, rec  # noqa: F401 (fixtures)
from dftrace_dynamo import create_backend, step


def test_a_mark_during_an_evaluation_ends_it_and_marks_alone_end_later_steps(rec):
    torch.manual_seed(0)
    model = MLP()
    compiled = torch.compile(model, backend=create_backend(level="torch"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(8, 16)), batch_size=4)

    def train():
        opt.zero_grad()
        compiled(torch.randn(4, 16)).sum().backward()
        opt.step()

    train()  # step 0 is complete: the evaluation's graph call begins an eval slice
    with torch.no_grad():
        compiled(torch.randn(4, 16))
        next(iter(loader))  # before the mark: the evaluation's
        step()
    for _ in range(3):  # no optimizer step ends a step any more: one step until close
        train()
    events = rec.events()
    assert [s["name"] for s in sorted(ops(events, "step"), key=lambda e: e["ts"])] == ["step 0", "step 1"]
    (ev,) = ops(events, "eval")
    held = [e for e in ops(events, "data") if ev["ts"] <= e["ts"] <= ev["ts"] + ev["dur"]]
    assert sorted(e["name"] for e in held) == ["DataLoader.__iter__", "data"]
    assert all(e["ts"] + e["dur"] <= ev["ts"] + ev["dur"] and "step" not in e["args"] for e in held), held
