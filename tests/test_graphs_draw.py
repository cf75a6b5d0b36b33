"""Graph pictures with FxGraphDrawer: DOT output, several partitions, Graphviz missing or present."""

import os
import stat

import pytest
import torch
import torch.nn as nn

from dftrace_dynamo.graphs.draw import dot_graph, write_graph
from dftrace_dynamo.graphs.hybrid import trace_hybrid

pydot = pytest.importorskip("pydot")


class TwoGraphs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        x = self.a(x)
        torch._dynamo.graph_break()
        return x.relu()


def partitions():
    return trace_hybrid(TwoGraphs(), (torch.randn(2, 4),), method="dynamo").partitions


def test_one_cluster_per_partition():
    parts = partitions()
    assert len(parts) == 2
    graph = dot_graph(parts, "two")
    clusters = graph.get_subgraphs()
    assert [c.get_name() for c in clusters] == ["cluster_graph_0", "cluster_graph_1"]
    names = [n.get_name().strip('"') for c in clusters for n in c.get_nodes()]
    assert len(names) == len(set(names)) == sum(len(p.graph_module.graph.nodes) for p in parts)
    edges = sum(len(c.get_edges()) for c in clusters)
    assert edges == sum(len(n.users) for p in parts for n in p.graph_module.graph.nodes)


def test_dot_file_of_a_multi_input_model_parses(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = transformers.BertModel(transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100)).eval()
    kwargs = {"input_ids": torch.randint(0, 100, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    traced = trace_hybrid(model, (), kwargs)
    result = write_graph(traced.partitions, tmp_path / "bert.dot", name="bert")
    assert result.rendered and result.path == tmp_path / "bert.dot"
    (graph,) = pydot.graph_from_dot_file(str(result.path))
    labels = " ".join(n.get_attributes().get("label", "") for n in graph.get_nodes())
    assert "input_ids" in labels and "attention_mask" in labels
    assert "shape=(2, 8, 32)" in labels  # shapes come from ShapeProp


def test_missing_graphviz_writes_dot_and_explains(tmp_path, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    result = write_graph(partitions(), tmp_path / "out.svg")
    assert not result.rendered
    assert result.path == tmp_path / "out.dot" and result.path.exists()
    assert not (tmp_path / "out.svg").exists()
    assert "apt-get install graphviz" in result.message
    assert f"dot -Tsvg {tmp_path / 'out.dot'} -o {tmp_path / 'out.svg'}" in result.message


def test_renders_with_the_dot_program(tmp_path):
    # A stand-in for Graphviz: prints its input, so the "picture" is the DOT text.
    fake = tmp_path / "fake-dot"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do f="$a"; done\ncat "$f"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    result = write_graph(partitions(), tmp_path / "pic.png", dot_program=str(fake))
    assert result.rendered and result.path == tmp_path / "pic.png"
    assert result.path.read_text().startswith("digraph")


def test_unknown_format_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown picture format"):
        write_graph(partitions(), tmp_path / "x.jpg")
    assert not os.listdir(tmp_path)
