"""Graph explorer: node ranges and the text view."""

import re

import pytest
import torch
import torch.nn as nn

from dftrace_dynamo.graphs.explore import Selection, render_explorer, select
from dftrace_dynamo.graphs.hybrid import trace_hybrid
from dftrace_dynamo.graphs.profile import profile_partitions


class Breaks(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        x = self.a(x)
        torch._dynamo.graph_break()
        return self.b(x).relu()


@pytest.mark.parametrize("kwargs,expected", [
    ({}, Selection(0, 19)),
    ({"start": 5}, Selection(5, 19)),
    ({"start": 5, "end": 8}, Selection(5, 8)),
    ({"end": 99}, Selection(0, 19)),
    ({"around": 10, "context": 2}, Selection(8, 12)),
    ({"around": 1, "context": 3}, Selection(0, 4)),
    ({"around": 19, "context": 3}, Selection(16, 19)),
    ({"max_nodes": 3}, Selection(0, 19)),  # applied to the nodes shown, by render_explorer
])
def test_select(kwargs, expected):
    assert select(20, **kwargs) == expected


@pytest.mark.parametrize("kwargs,message", [
    ({"start": 20}, "outside"),
    ({"start": -1}, "--start must be >= 0"),
    ({"start": 5, "end": 4}, "before"),
    ({"around": 20}, "outside"),
    ({"around": 3, "start": 1}, "cannot be combined"),
    ({"context": -1}, "context"),
    ({"max_nodes": 0}, "max-nodes"),
])
def test_select_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        select(20, **kwargs)


def explored(**kwargs):
    traced = trace_hybrid(Breaks(), (torch.randn(2, 4),), method="dynamo")
    profile = profile_partitions(traced.partitions, method=traced.method, graph_breaks=traced.graph_breaks)
    return traced, render_explorer(traced, profile, **{"show_params": True, **kwargs})


def numbers(text):
    """The node numbers listed; ``None`` for an unnumbered (parameter or buffer) input."""
    return [None if m == "-" else int(m) for m in re.findall(r"^(?:>>|  )\s*(\d+|-)\. ", text, re.M)]


def test_nodes_numbered_from_0_across_partitions_with_breaks():
    traced, text = explored()
    # parameters and buffers (a.weight, a.bias, b.weight, b.bias) are listed, unnumbered
    assert numbers(text) == [None, None, 0, 1, 2, None, None, 3, 4, 5, 6]
    assert "nodes:        7 (" in text and "4 parameter/buffer inputs, unnumbered" in text
    assert "Nodes 0..6 of 7" in text
    assert "graphs:       2, graph breaks: 1" in text
    assert "=== graph 0:" in text and "=== graph 1:" in text
    assert "graph_break" in text  # the reason Dynamo gave
    assert "torch.nn.functional.linear(x, a.weight, a.bias)" in text
    assert "module: a (Linear)" in text
    assert "FLOPs 64" in text  # 2 x 4 x 4 MACs


def test_around_marks_the_node():
    _, text = explored(around=3, context=1)
    assert numbers(text) == [2, None, None, 3, 4]  # b.weight and b.bias go with node 3, the next numbered
    _, folded = explored(around=3, context=1, show_params=False)
    assert numbers(folded) == [2, 3, 4]
    assert re.search(r"^>>\s+3\. ", text, re.M) and len(re.findall(r"^>>", text, re.M)) == 1
    assert "Nodes 2..4 of 7" in text


def test_max_nodes_counts_the_nodes_shown():
    _, text = explored(start=2, max_nodes=2, show_params=False)
    assert numbers(text) == [2, 3]
    _, text = explored(start=2, max_nodes=2)
    assert numbers(text) == [2, None]
    assert "Nodes 2..2 of 7" in text
