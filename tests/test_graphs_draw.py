"""Graph pictures: DOT text, folded parameters, module level, Graphviz missing, present or complaining."""

import os
import re
import shutil
import stat

import pytest
import torch
import torch.nn as nn

from dftrace_dynamo.graphs.draw import LABEL_WIDTH, dot_source, write_graph
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


def parsed(source):
    (graph,) = pydot.graph_from_dot_data(source)
    return graph


def labels(graph):
    nodes = graph.get_nodes() + [n for sub in graph.get_subgraphs() for n in sub.get_nodes()]
    return {n.get_name().strip('"'): n.get_attributes().get("label", "").strip('"') for n in nodes
            if n.get_name() not in ("node", "edge", "graph")}


def test_one_cluster_per_partition_with_parameters_folded():
    parts = partitions()
    assert len(parts) == 2
    graph = parsed(dot_source(parts, "two"))
    clusters = graph.get_subgraphs()
    assert [c.get_name() for c in clusters] == ["cluster_graph_0", "cluster_graph_1"]
    names = labels(graph)
    weights = [m.name for p in parts for m in p.inputs if m.kind == "parameter"]
    assert len(weights) == 2  # a.weight, a.bias: no box of their own
    assert len(names) == sum(len(p.graph_module.graph.nodes) for p in parts) - len(weights)
    (linear,) = [text for text in names.values() if "torch.nn.functional.linear" in text]
    # readable name, target, module, the folded weight shapes and the output shape
    assert linear.split("\\n") == ["x", "torch.nn.functional.linear", "a", "weights 4x4, 4", "2x4"]
    assert not any("l_self" in text or "L_self" in text for text in names.values())


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu())


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("method", ["fx", "dynamo"])
def test_module_level_drawing_has_one_box_per_module(method):
    traced = trace_hybrid(Stack(), (torch.randn(2, 8),), method=method)
    graph = parsed(dot_source(traced.partitions, "stack", depth=2))
    boxes = [text.split("\\n") for text in labels(graph).values()]
    modules = sorted(lines[0] for lines in boxes if lines[0].startswith("layers."))
    assert modules == ["layers.0", "layers.1", "layers.2"]
    assert all(lines[1:3] == ["Block", "3 ops"] for lines in boxes  # linear, relu, linear
               if lines[0].startswith("layers."))
    assert len(boxes) == 3 + 2  # the modules, the input and the output
    edges = {(e.get_source().strip('"'), e.get_destination().strip('"')) for e in graph.get_edges()}
    assert ("m_layers_0", "m_layers_1") in edges and ("m_layers_1", "m_layers_2") in edges


def test_missing_graphviz_writes_dot_and_explains(tmp_path, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    result = write_graph(partitions(), tmp_path / "out.svg")
    assert not result.rendered
    assert result.path == tmp_path / "out.dot" and result.path.exists()
    assert not (tmp_path / "out.svg").exists()
    assert "apt-get install graphviz" in result.message
    assert f"dot -Tsvg {tmp_path / 'out.dot'} -o {tmp_path / 'out.svg'}" in result.message


def fake_dot(tmp_path, stderr=""):
    """A stand-in for Graphviz: copies its input to the -o file and prints ``stderr``."""
    fake = tmp_path / "fake-dot"
    fake.write_text('#!/bin/sh\nin="$2"; out="$4"\ncat "$in" > "$out"\n'
                    + (f"echo '{stderr}' >&2\n" if stderr else ""))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return str(fake)


def test_renders_with_the_dot_program(tmp_path):
    result = write_graph(partitions(), tmp_path / "pic.svg", dot_program=fake_dot(tmp_path))
    assert result.rendered and result.path == tmp_path / "pic.svg"
    assert result.path.read_text().startswith("digraph")
    assert result.warnings == []


def test_graphviz_warnings_are_passed_on_and_a_shrunk_png_is_reported(tmp_path):
    warning = "Warning: graph is too large for cairo-renderer bitmaps. Scaling by 0.386 to fit"
    result = write_graph(partitions(), tmp_path / "pic.png", dot_program=fake_dot(tmp_path, warning))
    assert result.rendered
    assert result.warnings[0] == f"Graphviz: {warning}"
    assert "pic.png" in result.warnings[1] and "unreadable" in result.warnings[1]
    assert ".svg" in result.warnings[1] and "--depth" in result.warnings[1]


def test_unknown_format_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown picture format"):
        write_graph(partitions(), tmp_path / "x.jpg")
    assert not os.listdir(tmp_path)


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot")
def test_module_level_bert_is_readable_with_real_graphviz(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = transformers.BertModel(transformers.BertConfig(
        hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64, vocab_size=100)).eval()
    kwargs = {"input_ids": torch.randint(0, 100, (1, 8)), "attention_mask": torch.ones(1, 8, dtype=torch.long)}
    traced = trace_hybrid(model, (), kwargs)
    result = write_graph(traced.partitions, tmp_path / "bert.png", name="bert", depth=3)
    assert result.rendered and result.warnings == []
    width, height = result.size
    assert width < 3000 and height < 4000  # no shrinking: text stays at its full size
    names = labels(parsed(dot_source(traced.partitions, "bert", depth=3)))
    modules = {text.split("\\n")[0] for text in names.values()}
    assert {f"encoder.layer.{i}" for i in range(4)} <= modules
    assert "embeddings.LayerNorm" in modules  # case kept, real path
    assert all(len(line) <= LABEL_WIDTH for text in names.values() for line in text.split("\\n"))
    assert not any(re.search(r"[lL]_self|_modules_", text) for text in names.values())
    assert len(names) < 60  # one box per module, not per op (BERT-4 has ~280 nodes)
