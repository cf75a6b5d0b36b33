"""FX nodes that compute nothing (a ``getitem`` picking an output of a multi-output op, a
``getattr`` on a result record) are not op events; indexing a tensor is one. The ground truth is
the graph the test compiles itself with a plain backend."""

import torch
import torch.nn as nn
from torch._dynamo.backends.common import aot_autograd

from backend_support import ops as all_ops
from backend_support import fresh_dynamo, rec  # noqa: F401 (fixtures)
from dftrace_dynamo import create_backend


class Picks(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.conv = nn.Conv2d(1, 2, 3, padding=1)

    def forward(self, x):
        h = self.fc(x)
        top = torch.topk(h, 3, dim=1)  # a result record: .values picks
        a, b = h.chunk(2, dim=1)  # a tuple of tensors: two picks
        pooled, where = nn.functional.max_pool2d(self.conv(h.view(-1, 1, 2, 4)), 2, return_indices=True)
        return top.values.sum() + (a * b).sum() + h[:, 0].sum() + pooled.sum() + where.float().sum()


def ops(events):
    """The op events of the compiled graphs (not the eager ops around them)."""
    return [e for e in all_ops(events) if e["args"].get("level") != "eager"]


def run(backend, calls=2):
    model, x = Picks(), torch.randn(4, 8)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(calls):
            compiled(x)


def test_aten_ops_are_the_graphs_aten_nodes(rec, tmp_path):
    captured = []

    def keep(gm, example_inputs):
        captured.append([n for n in gm.graph.nodes if isinstance(n.target, torch._ops.OpOverload)])
        return gm.forward

    run(aot_autograd(fw_compiler=keep))  # the ground truth: the ATen graph's compute nodes
    (nodes,) = captured
    torch._dynamo.reset()
    run(create_backend(level="aten"))
    events = ops(rec.events())
    assert len(events) == 2 * len(nodes)
    assert sorted(e["args"]["node"] for e in events) == sorted(2 * [n.name for n in nodes])
    assert not [e for e in events if e["name"] in ("function.getitem", "function.getattr")]


def test_torch_level_keeps_tensor_indexing_only(rec):
    captured = []

    def keep(gm, example_inputs):
        captured.append(gm)
        return gm.forward

    run(keep)
    (gm,) = captured
    picks = [n for n in gm.graph.nodes if n.op == "call_function" and n.target.__name__ in ("getitem", "getattr")]
    assert len(picks) >= 4  # chunk's two, max_pool2d's two, topk's values, and h[:, 0]
    torch._dynamo.reset()
    run(create_backend(level="torch"))
    events = ops(rec.events())
    indexed = [e for e in events if e["name"] == "function.getitem"]
    assert len(indexed) == 2  # h[:, 0] on each call: a view of a tensor, computed
    assert not [e for e in events if e["name"] == "function.getattr"]
    assert len(events) == 2 * (len([n for n in gm.graph.nodes if n.op.startswith("call_")]) - len(picks) + 1)
