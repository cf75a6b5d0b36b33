"""Graph capture (partitions, op counts, graph breaks) and exported partition code."""

import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves

from dftrace_dynamo.graphs.capture import capture_graphs, target_name
from dftrace_dynamo.graphs.export import ExportError, export_capture, export_partition, load_exported, partition_source
from dftrace_dynamo.graphs.hybrid import trace_hybrid

transformers = pytest.importorskip("transformers")


class Branchy(nn.Module):
    """Data-dependent branch and a print: two graph breaks, three graphs."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        x = self.a(x)
        if x.sum() > 0:  # BREAK-BRANCH
            x = x * 2
        else:
            x = x - 1
        print("side effect")  # BREAK-PRINT
        return self.b(x)


def line_of(marker):
    import inspect

    lines, start = inspect.getsourcelines(Branchy.forward)
    return start + next(i for i, text in enumerate(lines) if marker in text)


def same(a, b):
    left, right = tree_leaves(a), tree_leaves(b)
    return len(left) == len(right) and all(torch.equal(x, y) for x, y in zip(left, right))


def small_transformers():
    return [
        ("bert", transformers.BertModel(transformers.BertConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100)),
         {"input_ids": torch.randint(0, 100, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)}),
        ("gpt2", transformers.GPT2Model(transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100)),
         {"input_ids": torch.randint(0, 100, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)}),
        ("vit", transformers.ViTModel(transformers.ViTConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
            patch_size=8)), {"pixel_values": torch.randn(2, 3, 32, 32)}),
    ]


def test_graph_breaks_counted_with_reasons_and_locations():
    torch.manual_seed(0)
    result = capture_graphs(Branchy(), (torch.randn(2, 4),))
    assert result.graph_count == 3
    assert result.break_count == 2
    first, second = result.graph_breaks
    assert first.location.endswith(f":{line_of('BREAK-BRANCH')}")
    assert second.location.endswith(f":{line_of('BREAK-PRINT')}")
    assert "print" in second.reason
    assert first.short_reason and "\n" not in second.short_reason
    # Each graph says why Dynamo ended it; the last one simply returned.
    assert result.partitions[-1].compile_reason == "return_value"
    assert "graph breaks: 2" in result.summary()


def test_capture_works_with_tracing_switched_off(monkeypatch):
    import dataclasses

    from dftrace_dynamo.session import config

    monkeypatch.setattr(config, "_config", dataclasses.replace(config.get(), enable=False))
    result = capture_graphs(Branchy(), (torch.randn(2, 4),))
    assert result.graph_count == 3 and result.break_count == 2


def test_partition_inputs_and_op_counts():
    result = capture_graphs(Branchy(), (torch.randn(2, 4),))
    first = result.partitions[0]
    kinds = {m.kind for m in first.inputs}
    assert kinds == {"parameter", "tensor"}
    x = next(m for m in first.inputs if m.kind == "tensor")
    assert (x.shape, x.dtype) == ((2, 4), "float32")
    assert first.ops_by_kind["placeholder"] == 3
    assert first.ops_by_target["torch.nn.functional.linear"] == 1
    assert first.ops_by_target["Tensor.sum"] == 1
    assert first.num_ops == sum(first.ops_by_target.values())
    assert result.ops_by_target()["torch.nn.functional.linear"] == 2


def test_target_names_are_readable():
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2)))
    names = {target_name(n) for n in gm.graph.nodes if n.op == "call_module"}
    assert names == {"Linear"}
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.matmul, (x, x)))
    assert target_name(list(graph.nodes)[1]) == "torch.matmul"


@pytest.mark.parametrize("name,model,kwargs", small_transformers(), ids=["bert", "gpt2", "vit"])
def test_transformers_capture_and_export_roundtrip(tmp_path, name, model, kwargs):
    result = capture_graphs(model.eval(), (), kwargs)
    assert result.graph_count >= 1
    assert all(p.num_ops > 10 for p in result.partitions)
    for part, path in zip(result.partitions, export_capture(result, tmp_path, stem=name, title=name)):
        module = load_exported(path)
        exported = getattr(module, f"Partition{part.index}")()
        assert same(exported(*part.example_inputs), part.graph_module(*part.example_inputs))
        # the random example inputs have the captured shapes, so the file runs on its own
        assert [tuple(t.shape) for t in module.example_inputs() if isinstance(t, torch.Tensor)] == \
            [m.shape for m in part.inputs if m.shape is not None]


def test_every_partition_of_a_broken_graph_exports(tmp_path):
    result = capture_graphs(Branchy(), (torch.randn(2, 4),))
    paths = export_capture(result, tmp_path)
    assert [p.name for p in paths] == ["graph_0.py", "graph_1.py", "graph_2.py"]
    for part, path in zip(result.partitions, paths):
        exported = getattr(load_exported(path), f"Partition{part.index}")()
        assert same(exported(*part.example_inputs), part.graph_module(*part.example_inputs))
    text = paths[0].read_text()
    assert "Graph ended because:" in text
    assert "parameter float32[4, 4]" in text


def test_exported_file_runs_as_a_script(tmp_path):
    result = capture_graphs(Branchy(), (torch.randn(2, 4),))
    path = export_partition(result.partitions[-1], tmp_path / "last.py")
    p = subprocess.run([sys.executable, str(path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "(2, 4)" in p.stdout


def test_fx_partition_with_submodules_exports_attributes(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    traced = trace_hybrid(model, (x,))
    assert traced.method == "symbolic_trace"
    (part,) = traced.partitions
    path = export_partition(part, tmp_path / "cnn.py")
    assert (tmp_path / "cnn.attrs.pt").exists()
    exported = load_exported(path).Partition0()
    assert torch.equal(exported(x), model(x))
    with pytest.raises(ExportError):
        partition_source(part)  # attributes but no sidecar file named
