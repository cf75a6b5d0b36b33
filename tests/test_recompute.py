"""Activation checkpointing: the ops that ``torch.utils.checkpoint`` runs again in backward carry
``recompute: true`` at both levels, no other op does, ``summary --by phase`` shows them apart,
the step view counts them in backward, and no number changes."""

import copy

import pytest
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import checkpoint

from backend_support import eager_ops, ops, recording
from dftrace_dynamo import create_backend
from dftrace_dynamo.traces.summary import summarize
from tracefile import read_events

ITERATIONS = 3
REFERENCE = {"torch": "eager", "aten": "aot_eager"}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Model(nn.Module):
    """Three identical blocks; only the first two are checkpointed."""

    CHECKPOINTED = ("blocks.0", "blocks.1")

    def __init__(self, use_reentrant):
        super().__init__()
        self.use_reentrant = use_reentrant
        self.inp = nn.Linear(8, 8)
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        x = self.inp(x)
        for i, block in enumerate(self.blocks):
            x = checkpoint(block, x, use_reentrant=self.use_reentrant) if i < 2 else block(x)
        return self.out(x).sum()


class Around(nn.Module):
    """Two blocks compiled on their own (one graph for both); eager code checkpoints the first."""

    CHECKPOINTED = ("blocks.0",)
    COMPILED = ("blocks.0", "blocks.1")

    def __init__(self, use_reentrant):
        super().__init__()
        self.use_reentrant = use_reentrant
        self.inp = nn.Linear(8, 8)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        x = checkpoint(self.blocks[0], self.inp(x), use_reentrant=self.use_reentrant)
        return self.out(self.blocks[1](x)).sum()


def train(model, backend, x, parts=()):
    """Losses and parameters after ITERATIONS optimizer steps of a copy of ``model``, compiled
    whole or, with ``parts``, those submodules of it."""
    model = copy.deepcopy(model)
    fn = model if backend is None or parts else torch.compile(model, backend=backend)
    for name in parts if backend is not None else ():
        model.set_submodule(name, torch.compile(model.get_submodule(name), backend=backend))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(ITERATIONS):
        opt.zero_grad()
        loss = fn(x)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses, [p.detach().clone() for p in model.parameters()]


def train_traced(model, level, x, recorder, parts=()):
    """Trains ``model`` traced; checks that eager and the untraced backend give the same numbers;
    returns the trace's path."""
    traced = train(model, create_backend(level=level), x, parts)
    path = recorder.path()  # the trace holds the traced run only
    for other in (train(model, None, x), train(model, REFERENCE[level], x, parts)):
        assert all(torch.equal(a, b) for a, b in zip(traced[0] + traced[1], other[0] + other[1]))
    return path


class _Calls(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(func)
        return func(*args, **(kwargs or {}))


def ops_per_block(x):
    """Ground truth from eager PyTorch: the torch-level ops one block call runs."""
    block = Block()
    with _Calls() as calls:
        block(x)
    return len(calls.calls)


def eager_reruns(model, x):
    """Ground truth from eager PyTorch: the paths of the blocks that checkpointing runs again
    during one backward."""
    model = copy.deepcopy(model)
    in_backward, rerun = [False], []
    for path, module in model.named_modules():
        if isinstance(module, Block):
            module.register_forward_pre_hook(lambda m, a, path=path: rerun.append(path) if in_backward[0] else None)
    loss = model(x)
    in_backward[0] = True
    loss.backward()
    return rerun


def within(path, roots):
    return any(path == r or path.startswith(r + ".") for r in roots)


@pytest.fixture
def recorder(tmp_path):
    with recording(tmp_path) as rec:
        yield rec


def spans(events, cat, suffix=""):
    return [(e["tid"], e["ts"], e["ts"] + e["dur"]) for e in events
            if e.get("ph") == "X" and e.get("cat") == cat and e["name"].endswith(suffix)]


def inside(e, slices):
    return any(tid == e["tid"] and start <= e["ts"] and e["ts"] + e["dur"] <= end for tid, start, end in slices)


def check_backward_and_phases(path, events, marked):
    """The step view counts the recompute under backward: each marked op is in a backward slice,
    outside every forward graph call; ``summary --by phase`` shows it as a phase of its own."""
    backward_slices, forward_graphs = spans(events, "backward"), spans(events, "dynamo_graph", " forward")
    assert all(inside(e, backward_slices) and not inside(e, forward_graphs) for e in marked)
    summary = summarize([path], ("phase",), top=None, include_warmup=True)
    rows = summary["steps"]["rows"]
    assert len(rows) == ITERATIONS
    for row in rows:
        recomputed = sum(e["dur"] for e in marked if e["args"]["step"] == row["step"])
        assert row["backward_us"] >= recomputed > 0
    phases = {r["key"]: r["count"] for r in summary["views"]["phase"]}
    assert phases["recompute"] == len(marked)
    for phase in ("forward", "backward"):  # the other phases count the other ops, the graphs' and eager
        assert phases.get(phase, 0) == sum(e["args"].get("phase") == phase and not e["args"].get("recompute")
                                           for e in ops(events) + eager_ops(events))


def traced_run(model_class, level, use_reentrant, recorder, parts=()):
    """The blocks eager checkpointing re-runs, and a traced training run of ``model_class``: its
    input, that list, the trace's path, its events and its op events."""
    torch.manual_seed(0)
    model, x = model_class(use_reentrant), torch.randn(4, 8)
    rerun = eager_reruns(model, x)
    path = train_traced(model, level, x, recorder, parts)
    events = read_events(path)
    return x, rerun, path, events, ops(events)


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("level", ["torch", "aten"])
def test_checkpointed_blocks_are_marked_recompute(level, use_reentrant, recorder):
    x, rerun, path, events, op_events = traced_run(Model, level, use_reentrant, recorder)
    assert sorted(rerun) == list(Model.CHECKPOINTED)
    marked = [e for e in op_events if e["args"].get("recompute")]
    assert all(e["args"]["recompute"] is True for e in marked)
    # ops outside the checkpointed blocks (the third block runs the very same ops) are never marked
    assert marked and all(within(e["args"]["module"], Model.CHECKPOINTED) for e in marked)
    if level == "torch":
        # eager checkpointing runs each checkpointed block again in backward: all of its ops
        assert len(marked) == ops_per_block(x) * len(rerun) * ITERATIONS
        assert sorted({e["args"]["module"].split(".fc")[0] for e in marked}) == sorted(rerun)
        first_runs = [e for e in op_events if e["args"].get("phase") == "forward"
                      and within(e["args"].get("module", ""), Model.CHECKPOINTED)]
        assert [e["name"] for e in first_runs] == [e["name"] for e in marked]  # same ops, run twice
    else:
        # the partitioner copies a forward node into the backward graph under its own name: the
        # backward ops that re-run forward ops of a checkpointed block are exactly the marked ones
        forward_nodes = {e["args"]["node"] for e in op_events if e["args"].get("phase") == "forward"}
        backward = [e for e in op_events if e["args"].get("phase") == "backward"]
        reruns = [e for e in backward if e["args"]["node"] in forward_nodes]
        assert [e["args"]["node"] for e in marked] == \
            [e["args"]["node"] for e in reruns if within(e["args"].get("module", ""), Model.CHECKPOINTED)]
        assert len(marked) % ITERATIONS == 0
        # the computation itself is recomputed, not only views: each checkpointed block's relu
        relus = [e["args"]["module"] for e in marked if e["name"] == "function.relu.default"]
        assert sorted(relus) == sorted(list(Model.CHECKPOINTED) * ITERATIONS)
    check_backward_and_phases(path, events, marked)


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("level", ["torch", "aten"])
def test_checkpoint_around_compiled_blocks_marks_their_second_run(level, use_reentrant, recorder):
    _, rerun, path, events, op_events = traced_run(Around, level, use_reentrant, recorder, Around.COMPILED)
    assert rerun == list(Around.CHECKPOINTED)
    graphs = [e for e in events if e.get("ph") == "X" and e.get("cat") == "dynamo_graph"]
    again = [g for g in graphs if g["name"].endswith(" recompute")]
    # each backward runs the checkpointed block's graph once more, as a backward-time graph call
    assert len(again) == len(rerun) * ITERATIONS
    assert all(g["args"]["phase"] == "backward" for g in again)
    marked = [e for e in op_events if e["args"].get("recompute")]
    assert all(e["args"]["recompute"] is True for e in marked)
    # exactly the ops of those calls are marked, and they are the ops of a forward call of the graph
    spans_again = [(g["tid"], g["ts"], g["ts"] + g["dur"]) for g in again]
    assert marked == [e for e in op_events if inside(e, spans_again)]
    forward = next((g["tid"], g["ts"], g["ts"] + g["dur"]) for g in graphs if g["name"].endswith(" forward"))
    first_run = [e["name"] for e in op_events if inside(e, [forward])]
    assert [e["name"] for e in marked] == first_run * len(again)
    check_backward_and_phases(path, events, marked)
