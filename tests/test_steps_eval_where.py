"""Evaluation where it happened (issue 36, point 6), on loops of two shapes the suite had not
held: nanoGPT's, which evaluates at the top of every ``EVERY``-th iteration, the first time before
any optimizer step; DCGAN's, which samples its generator with grad enabled after both optimizers
stepped. Ground truth: the loop's own time marks around each iteration, evaluation and sample,
and a known sleep in each."""

import time

import pytest
import torch
import torch.nn as nn

from backend_support import MLP, inside, ops, recording
from dftrace_dynamo import _core, create_backend

SLEEP_S = 0.02  # in each iteration, evaluation and sample: well above a shared machine's noise
TOL_US = 5000  # where a slice may end after the mark the loop takes just before (a quarter of a sleep)


def slices(events, cat):
    return sorted(ops(events, cat), key=lambda e: e["ts"])


def end(e):
    return e["ts"] + e["dur"]


def test_nanogpt_evaluates_before_the_first_optimizer_step_apart_from_the_steps(tmp_path):
    """``model.eval()``, ``no_grad`` evaluation over a few batches, ``model.train()`` at the top of
    iterations 0, 3 and 6; the first one runs before any training graph and optimizer step: an
    ``eval`` slice too, not part of step 0. Each step ends where its iteration did (the next
    iteration's forward, or the ``model.eval()`` of the evaluation after it)."""
    model = MLP()
    compiled = torch.compile(model, backend=create_backend())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    iters, every = 7, 3
    iterations, evaluations = [], []  # (start, end) ns of each
    with recording(tmp_path) as rec:
        for it in range(iters):
            if it % every == 0:
                start = _core.now_ns()
                model.eval()
                time.sleep(SLEEP_S)  # fetching the batches: the evaluation's, before its first graph call
                with torch.no_grad():
                    for _ in range(2):
                        compiled(torch.randn(8, 16))
                model.train()
                evaluations.append((start, _core.now_ns()))
            x = torch.randn(8, 16)
            start = _core.now_ns()
            compiled(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            time.sleep(SLEEP_S)
            iterations.append((start, _core.now_ns()))
        events = rec.events()
    steps, evals = slices(events, "step"), slices(events, "eval")
    assert [s["name"] for s in steps] == [f"step {i}" for i in range(iters)]
    assert len(evals) == len(evaluations) == 3
    for e, (start, done) in zip(evals, evaluations):
        # the first begins where the trace did, just before its start mark
        assert start / 1e3 - TOL_US <= e["ts"] and done / 1e3 <= end(e) <= done / 1e3 + TOL_US, (e, start, done)
        assert e["dur"] >= SLEEP_S * 1e6
    for i, (s, (start, done)) in enumerate(zip(steps, iterations)):
        if i:  # step 0 begins where the evaluation before it ended (the trace's start without one)
            assert abs(s["ts"] - start / 1e3) <= TOL_US, (i, s["ts"] - start / 1e3)
        if i < iters - 1:  # the last step ends at its last optimizer call
            assert done / 1e3 <= end(s) <= done / 1e3 + TOL_US, (i, end(s) - done / 1e3)
        assert not any(inside(e, s) for e in evals)
    # the evaluation's graph calls are in the eval slices, and no training one is
    calls = ops(events, "dynamo_graph")
    for e in evals:
        assert any(inside(c, e) for c in calls)
        assert all(c.get("args", {}).get("step") is None for c in calls if inside(c, e))


def _dcgan(n, sample_every, twins):
    """DCGAN's loop (a DataLoader, D's step, then G's, both compiled) sampling G with grad enabled
    from fixed noise after both optimizers stepped, as PyTorch's example does before saving the
    samples; returns the marks (start, end) of each iteration and of each sample. ``twins``: D and
    G of one structure (Dynamo may share a graph between them)."""
    backend = create_backend()
    width = 16 if twins else 8
    net_d = nn.Sequential(nn.Linear(16, 16), nn.LeakyReLU(0.2), nn.Linear(16, 16 if twins else 1))
    net_g = nn.Sequential(nn.Linear(width, 16), nn.LeakyReLU(0.2), nn.Linear(16, 16))
    d = torch.compile(net_d, backend=backend)
    d = (lambda x, d=d: d(x).mean(1, keepdim=True)) if twins else d
    g = torch.compile(net_g, backend=backend)
    opt_d = torch.optim.Adam(net_d.parameters(), lr=2e-4)
    opt_g = torch.optim.Adam(net_g.parameters(), lr=2e-4)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8 * n, 16)), batch_size=8)
    fixed_noise = torch.randn(4, width)
    bce = nn.BCEWithLogitsLoss()
    iterations, samples = [], []
    start = _core.now_ns()
    for i, (real,) in enumerate(loader):
        net_d.zero_grad()
        err_real = bce(d(real), torch.ones(8, 1))
        err_real.backward()
        fake = g(torch.randn(8, width))
        err_fake = bce(d(fake.detach()), torch.zeros(8, 1))
        err_fake.backward()
        opt_d.step()
        net_g.zero_grad()
        bce(d(fake), torch.ones(8, 1)).backward()
        opt_g.step()
        if i % sample_every == 1:
            at = _core.now_ns()
            fake = g(fixed_noise)  # with grad: the example saves these images
            time.sleep(SLEEP_S)
            samples.append((at, _core.now_ns()))
        else:
            time.sleep(SLEEP_S)
        iterations.append((start, _core.now_ns()))
        start = iterations[-1][1]  # the next iteration's batch is fetched from here
    return iterations, samples


@pytest.mark.parametrize("twins", [False, True])
def test_dcgan_samples_with_grad_after_both_steps_in_their_iteration(tmp_path, twins):
    """The generator's forward with grad after both optimizer steps is its iteration's, not the
    start of the next step: one step per iteration, each ending where its iteration did and holding
    its sample."""
    n = 7
    with recording(tmp_path) as rec:
        iterations, samples = _dcgan(n, 3, twins)
        events = rec.events()
    steps = slices(events, "step")
    assert [s["name"] for s in steps] == [f"step {i}" for i in range(n)]
    assert not ops(events, "eval")
    for i, (s, (start, done)) in enumerate(zip(steps, iterations)):
        if i < n - 1:  # the last step ends at its last optimizer call
            assert done / 1e3 - 1 <= end(s) <= done / 1e3 + TOL_US, (i, end(s) - done / 1e3)
        if i:
            assert abs(s["ts"] - start / 1e3) <= TOL_US, (i, s["ts"] - start / 1e3)
    assert len(samples) == 2
    for i, (at, done) in zip((1, 4), samples):
        s = steps[i]
        assert s["ts"] <= at / 1e3 and done / 1e3 <= end(s), (i, at / 1e3 - s["ts"], end(s) - done / 1e3)
        # the sample's graph call is in its iteration's step
        (call,) = [c for c in ops(events, "dynamo_graph") if at / 1e3 <= c["ts"] <= done / 1e3]
        assert inside(call, s) and call["args"].get("step") == i, call


def test_an_inference_loop_marked_with_step_keeps_its_steps(tmp_path):
    """Forwards without grad from the trace's start are an evaluation until something says
    otherwise: a mark that ends such an evaluation before any training work ends step 0 of an
    inference loop (its marked steps stay steps, no eval slice)."""
    from dftrace_dynamo import step

    model = torch.compile(MLP().eval(), backend=create_backend())
    marks = []
    with recording(tmp_path) as rec:
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(4, 16))
                time.sleep(SLEEP_S)
                step()
                marks.append(_core.now_ns())
        events = rec.events()
    steps = slices(events, "step")
    assert [s["name"] for s in steps] == ["step 0", "step 1", "step 2"] and not ops(events, "eval")
    for s, mark in zip(steps, marks):
        assert mark / 1e3 - TOL_US <= end(s) <= mark / 1e3
    calls = ops(events, "dynamo_graph")
    assert len(calls) == 3 and all(inside(c, s) for c, s in zip(sorted(calls, key=lambda c: c["ts"]), steps))


def test_an_evaluation_before_the_first_step_context_block_is_an_eval_slice(tmp_path):
    """A warm-up pass without grad before the first ``step_context`` block is no step (time before
    a block belongs to none): an ``eval`` slice, and the blocks are steps 0, 1."""
    from dftrace_dynamo import step_context

    model = torch.compile(MLP().eval(), backend=create_backend())
    with recording(tmp_path) as rec:
        with torch.no_grad():
            model(torch.randn(4, 16))
            for _ in range(2):
                with step_context():
                    model(torch.randn(4, 16))
        events = rec.events()
    assert [s["name"] for s in slices(events, "step")] == ["step 0", "step 1"]
    assert len(ops(events, "eval")) == 1
