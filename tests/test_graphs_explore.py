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
    ({}, Selection(1, 20)),
    ({"start": 5}, Selection(5, 20)),
    ({"start": 5, "end": 8}, Selection(5, 8)),
    ({"end": 99}, Selection(1, 20)),
    ({"around": 10, "context": 2}, Selection(8, 12)),
    ({"around": 1, "context": 3}, Selection(1, 4)),
    ({"around": 20, "context": 3}, Selection(17, 20)),
    ({"max_nodes": 3}, Selection(1, 20)),  # applied to the nodes shown, by render_explorer
])
def test_select(kwargs, expected):
    assert select(20, **kwargs) == expected


@pytest.mark.parametrize("kwargs,message", [
    ({"start": 21}, "outside"),
    ({"start": 0}, "--start must be >= 1"),
    ({"start": 5, "end": 4}, "before"),
    ({"around": 21}, "outside"),
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
    return [int(m) for m in re.findall(r"^(?:>>|  )\s*(\d+)\. ", text, re.M)]


def test_all_nodes_numbered_across_partitions_with_breaks():
    traced, text = explored()
    total = sum(len(p.graph_module.graph.nodes) for p in traced.partitions)
    assert numbers(text) == list(range(1, total + 1))
    assert "graphs:       2, graph breaks: 1" in text
    assert "=== graph 0:" in text and "=== graph 1:" in text
    assert "graph_break" in text  # the reason Dynamo gave
    assert "torch.nn.functional.linear(x, a.weight, a.bias)" in text
    assert "module: a (Linear)" in text
    assert "FLOPs 64" in text  # 2 x 4 x 4 MACs


def test_around_marks_the_node():
    _, text = explored(around=3, context=1)
    assert numbers(text) == [2, 3, 4]
    _, folded = explored(around=3, context=1, show_params=False)
    assert numbers(folded) == [3, 4]  # node 2 is a.bias: folded, its number kept
    _, asked = explored(around=2, context=1, show_params=False)
    assert numbers(asked) == [2, 3]  # unless it is the node asked for
    assert re.search(r"^>>\s+3\. ", text, re.M)
    assert "Nodes 2..4 of" in text


def test_max_nodes_counts_the_nodes_shown():
    _, text = explored(start=2, max_nodes=2, show_params=False)
    assert numbers(text) == [3, 4]
    _, text = explored(start=2, max_nodes=2)
    assert numbers(text) == [2, 3]
