"""Evaluation where it happened: a step followed by evaluation ends where the training iteration's
work ended (at ``model.eval()``), not at the evaluation's first graph call. Ground truth: the
loop's own time marks and a known sleep between ``model.eval()`` and the first evaluation batch.

(An eager op recorded between ``model.eval()`` and the first evaluation graph call is written
before the step slice that ends earlier, and the writer stretches the step over it: eager op
events are not held with the step's held slices yet. The first test makes its batches before.)"""

import time

import pytest
import torch

from backend_support import MLP, ops, recording
from dftrace_dynamo import _core, create_backend

SLEEP_S = 0.03  # between model.eval() and the first evaluation forward (building the batches)


@pytest.mark.parametrize("loader", [False, True])
def test_a_step_followed_by_evaluation_ends_at_model_eval(tmp_path, loader):
    """``loader``: the evaluation's batches come from a validation DataLoader whose batch count is
    read after ``model.eval()``; else they are made before it."""
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, backend=create_backend())
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 16)), batch_size=4)
    ends, evals = [], []  # the training body's end before each evaluation; (model.eval() done, last forward end)
    with recording(tmp_path) as rec:
        for epoch in range(3):
            for _ in range(3):
                opt.zero_grad()
                compiled(torch.randn(4, 16)).sum().backward()
                opt.step()
            # no eager op after model.eval() (see above)
            batches = None if loader else [torch.randn(4, 16) for _ in range(2)]
            ends.append(_core.now_ns())
            model.eval()
            at = _core.now_ns()
            assert len(val) == 2
            time.sleep(SLEEP_S)
            with torch.no_grad():
                for x in batches or (x for (x,) in val):
                    compiled(x)
            evals.append((at, _core.now_ns()))
            model.train()
        events = rec.events()
    steps = sorted(ops(events, "step"), key=lambda e: e["ts"])
    slices = sorted(ops(events, "eval"), key=lambda e: e["ts"])
    assert len(steps) == 9 and len(slices) == 3
    for i, (end, (at, done)) in enumerate(zip(ends, evals)):
        before = steps[3 * i + 2]  # the last step of the epoch
        finish = before["ts"] + before["dur"]
        assert end / 1e3 - 1 <= finish <= at / 1e3 + 1, (i, finish - end / 1e3)  # not at the first forward
        e = slices[i]
        assert abs(e["ts"] - finish) <= 1 and e["ts"] + e["dur"] >= done / 1e3 - 1
        assert e["ts"] + e["dur"] - at / 1e3 >= SLEEP_S * 1e6  # the sleep after model.eval() is the evaluation's


def test_an_evaluation_that_runs_no_graph_is_an_eval_slice(tmp_path):
    """A trainer's evaluation of an uncompiled copy of the model (Hugging Face ``Trainer`` with
    ``torch_compile=True``): ``model.eval()``, eager forwards, ``model.train()``, no graph call."""
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, backend=create_backend())
    evals = []
    with recording(tmp_path) as rec:
        for epoch in range(3):
            for _ in range(3):
                model.train()  # at the top of every iteration, as the Trainer's training_step does
                opt.zero_grad()
                compiled(torch.randn(4, 16)).sum().backward()
                opt.step()
            at = _core.now_ns()
            model.eval()
            with torch.no_grad():
                model(torch.randn(4, 16))  # eager: no graph
            time.sleep(SLEEP_S)
            evals.append((at, _core.now_ns()))
        events = rec.events()
    steps = sorted(ops(events, "step"), key=lambda e: e["ts"])
    slices = sorted(ops(events, "eval"), key=lambda e: e["ts"])
    # the last evaluation ends the trace: it is an eval slice too (no model.train() after it)
    assert len(steps) == 9 and len(slices) == 3, ([s["name"] for s in steps], len(slices))
    for i, (e, (at, done)) in enumerate(zip(slices, evals)):
        assert at / 1e3 - 1 <= e["ts"] and e["dur"] >= SLEEP_S * 1e6
        if i < 2:
            assert e["ts"] + e["dur"] <= steps[3 * i + 3]["ts"] + 1  # the next step begins after it
        assert abs(steps[3 * i + 2]["ts"] + steps[3 * i + 2]["dur"] - e["ts"]) <= 1
