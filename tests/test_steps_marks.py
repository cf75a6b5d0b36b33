"""Step marks and evaluation: a mark (``dftrace_dynamo.step()``) during an evaluation ends it, what
was held back before it stays in the evaluation, and from it on marks alone end steps; an
evaluation after a marked training step (between epochs, after the last one) is an ``eval`` slice,
not part of a step, whether the loop marks with ``step()`` or ``step_context``."""

import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from backend_support import MLP, inside, ops
from backend_support import fresh_dynamo, rec  # noqa: F401 (fixtures)
from dftrace_dynamo import _core, create_backend, step, step_context


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


@pytest.mark.parametrize("marking", ["step", "step_context"])
def test_an_evaluation_after_a_marked_step_is_apart_from_the_steps(rec, marking):
    torch.manual_seed(0)
    model = MLP()
    compiled = torch.compile(model, backend=create_backend(level="torch"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    iterations, evals, forwards_done = [], [], []  # the loop's own clock (the trace's)
    starts = []  # each step's and evaluation's start, in order

    def train():
        start = _core.now_ns()
        starts.append(start)
        opt.zero_grad()
        loss = compiled(torch.randn(4, 16)).sum()
        forwards_done.append(_core.now_ns())  # training work runs: any evaluation before it has ended
        loss.backward()
        opt.step()
        time.sleep(0.005)
        slept = _core.now_ns()
        if marking == "step":
            step()
        iterations.append((slept, start))

    def evaluate():
        start = _core.now_ns()
        starts.append(start)
        with torch.no_grad():
            for _ in range(3):
                compiled(torch.randn(4, 16))
                time.sleep(0.01)
        evals.append((start, _core.now_ns()))

    for _ in range(2):  # epochs
        for _ in range(3):
            if marking == "step":
                train()
            else:
                with step_context():
                    train()
        evaluate()
    events = rec.events()
    closed = _core.now_ns()
    steps = sorted(ops(events, "step"), key=lambda e: e["ts"])
    assert [s["name"] for s in steps] == [f"step {i}" for i in range(6)]  # no step for the evaluations
    slices = sorted(ops(events, "eval"), key=lambda e: e["ts"])
    assert len(slices) == 2
    # each evaluation, from the last mark to its end: before the next training forward (the first
    # epoch's) or the trace's close (the last one's), however late the loop got there
    for e, (start, end), bound in zip(slices, evals, [forwards_done[3], closed]):
        assert e["ts"] <= start / 1e3 and end / 1e3 - 1 <= e["ts"] + e["dur"] <= bound / 1e3
    # each step ends at its mark: after its work, before what comes next begins; it began before
    # its training forward ran
    for s, (slept, start), fwd in zip(steps, iterations, forwards_done):
        later = min(t for t in starts + [closed] if t > start)
        assert slept / 1e3 - 1 <= s["ts"] + s["dur"] <= later / 1e3 and s["ts"] <= fwd / 1e3
    forwards = [g for g in ops(events, "dynamo_graph") if g["args"].get("phase") == "inference"]
    assert len(forwards) == 6 and all("step" not in g["args"] for g in forwards)
    assert all(any(inside(g, e) for e in slices) for g in forwards)
    assert all(any(inside(g, s) for s in steps) for g in ops(events, "dynamo_graph") if g not in forwards)


@pytest.mark.parametrize("marking", ["step", "step_context"])
def test_what_runs_after_the_last_mark_is_written(rec, marking):
    model = MLP()
    compiled = torch.compile(model, backend=create_backend(level="torch"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(2):
        if marking == "step":
            compiled(torch.randn(4, 16)).sum().backward()
            opt.step()
            step()
        else:
            with step_context():
                compiled(torch.randn(4, 16)).sum().backward()
                opt.step()
    opt.zero_grad()  # held back after the mark until it is known what it begins, then the trace closes
    events = rec.events()
    assert [e["name"] for e in ops(events, "optimizer")] == ["SGD.step", "SGD.step", "SGD.zero_grad"]
    steps = [s["name"] for s in sorted(ops(events, "step"), key=lambda e: e["ts"])]
    assert steps == (["step 0", "step 1", "step 2"] if marking == "step" else ["step 0", "step 1"])


def test_a_generators_samples_after_a_mark_at_the_top_of_the_loop_begin_the_step(rec):
    """``step()`` at the top of a GAN's loop, then the generator's samples under ``no_grad`` and
    the critic's ``zero_grad()``: the samples are the step's start, not an evaluation."""
    g, d = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU()), MLP()
    cg, cd = (torch.compile(m, backend=create_backend(level="torch")) for m in (g, d))
    opt_g, opt_d = torch.optim.SGD(g.parameters(), lr=0.01), torch.optim.SGD(d.parameters(), lr=0.01)
    for _ in range(4):
        step()
        with torch.no_grad():
            fake = cg(torch.randn(4, 8))
        opt_d.zero_grad()
        cd(fake).mean().backward()
        opt_d.step()
        opt_g.zero_grad()
        cd(cg(torch.randn(4, 8))).mean().backward()
        opt_g.step()
    events = rec.events()
    steps = sorted(ops(events, "step"), key=lambda e: e["ts"])
    assert [s["name"] for s in steps] == [f"step {i}" for i in range(5)]
    assert not ops(events, "eval")
    samples = sorted((g for g in ops(events, "dynamo_graph") if g["args"].get("phase") == "inference"),
                     key=lambda e: e["ts"])
    assert len(samples) == 4 and all(any(inside(g, s) for s in steps) for g in samples)
