"""Bytes of in-place ops and embedding lookups, node numbers, module paths, depth table, timing warnings."""

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dftrace_dynamo.graphs.explore import render_explorer
from dftrace_dynamo.graphs.hybrid import trace_hybrid
from dftrace_dynamo.graphs.profile import NodeProfile, ModelProfile, _timing_warnings, profile_traced
from dftrace_dynamo.graphs.report import render_profile

F32, I64 = 4, 8


class InPlace(nn.Module):
    """Three in-place forms on a 4x6 float tensor: ``+=``, ``ReLU(inplace=True)``, ``add_``."""

    def __init__(self):
        super().__init__()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x, y):
        h = x * 2
        h += y
        h = self.act(h)
        h.add_(1.0)
        return h


def profiled(model, args, method):
    traced = trace_hybrid(model, args, method=method)
    return traced, profile_traced(traced, model, args, runs=0)


def one(profile, *suffixes):
    (node,) = [n for n in profile.nodes if n.target.endswith(suffixes)]
    return node


@pytest.mark.parametrize("method", ["fx", "dynamo"])
def test_in_place_ops_count_what_they_read_and_write(method):
    _, profile = profiled(InPlace().eval(), (torch.randn(4, 6), torch.randn(4, 6)), method)
    size = F32 * 4 * 6
    # FX records += as operator.add (a Proxy has no __iadd__), Dynamo as operator.iadd
    mul, iadd, relu, add_ = profile.nodes
    assert iadd.target == ("operator.iadd" if method == "dynamo" else "operator.add")
    assert (iadd.bytes_read, iadd.bytes_written, iadd.bottleneck) == (2 * size, size, "memory")
    assert relu.target.endswith(("ReLU", "relu"))
    assert (relu.bytes_read, relu.bytes_written, relu.bottleneck) == (size, size, "memory")
    assert add_.target == "Tensor.add_"
    assert (add_.bytes_read, add_.bytes_written) == (size, size)


def test_fx_and_dynamo_agree_on_in_place_bytes():
    args = (torch.randn(4, 6), torch.randn(4, 6))
    fx = [(n.bytes_read, n.bytes_written) for n in profiled(InPlace().eval(), args, "fx")[1].nodes]
    dynamo = [(n.bytes_read, n.bytes_written) for n in profiled(InPlace().eval(), args, "dynamo")[1].nodes]
    assert fx == dynamo


class Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(1000, 16)
        self.pos = nn.Parameter(torch.randn(50, 16))

    def forward(self, ids):
        return self.table(ids) + F.embedding(torch.arange(ids.shape[1]), self.pos)


@pytest.mark.parametrize("method", ["fx", "dynamo"])
def test_embedding_lookups_read_rows_and_indices_not_the_table(method):
    ids = torch.randint(0, 1000, (2, 5))
    _, profile = profiled(Lookup().eval(), (ids,), method)
    table, pos = [n for n in profile.nodes if n.target.endswith(("Embedding", "embedding"))]
    rows = F32 * 2 * 5 * 16
    assert (table.bytes_read, table.bytes_written) == (rows + I64 * 2 * 5, rows)
    assert table.params == 1000 * 16  # the table is still the module's parameter
    assert (pos.bytes_read, pos.bytes_written) == (F32 * 5 * 16 + I64 * 5, F32 * 5 * 16)


def test_gpt2_output_memory_includes_the_kv_cache():
    transformers = pytest.importorskip("transformers")
    model = transformers.GPT2Model(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100)).eval()
    kwargs = {"input_ids": torch.randint(0, 100, (1, 8))}
    traced = trace_hybrid(model, (), kwargs)
    profile = profile_traced(traced, model, (), kwargs, runs=0)
    hidden = F32 * 8 * 32
    kv = 2 * 2 * F32 * 8 * 32  # keys and values of 2 layers
    assert profile.output_bytes == hidden + kv


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.LayerNorm = nn.LayerNorm(8)
        self.register_buffer("offset", torch.zeros(8))

    def forward(self, x):
        return self.LayerNorm(x) + self.offset


class Nested(nn.Module):
    """ResNet/DETR-style ``embedder.embedder`` path; ``embedder`` called twice; a max-pool."""

    def __init__(self):
        super().__init__()
        self.embedder = nn.Sequential()
        self.embedder.add_module("embedder", Inner())
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = self.embedder(x)
        h = self.proj(h)
        h = self.embedder(h)
        return F.max_pool1d(h.unsqueeze(0), 2)


@pytest.mark.parametrize("method", ["fx", "dynamo"])
def test_module_paths_are_named_modules_names(method):
    model = Nested().eval()
    traced, profile = profiled(model, (torch.randn(3, 8),), method)
    names = dict(model.named_modules())
    assert {n.module for n in profile.nodes} - {""} <= names.keys()
    assert "embedder.embedder.LayerNorm" in {n.module for n in profile.nodes}
    assert all(names[path].__class__.__name__ == kind for path, kind in profile.module_types.items())
    assert one(profile, "max_pool1d").target == "torch.nn.functional.max_pool1d"


def test_placeholder_names_keep_their_case():
    traced = trace_hybrid(Nested().eval(), (torch.randn(3, 8),), method="dynamo")
    text = render_explorer(traced, profile_traced(traced, Nested(), (torch.randn(3, 8),), runs=0),
                           show_params=True)
    assert "[placeholder] embedder.embedder.LayerNorm.weight" in text
    assert "layer_norm.weight" not in text


def test_later_calls_of_a_module_are_listed_under_its_row():
    _, profile = profiled(Nested().eval(), (torch.randn(3, 8),), "dynamo")
    table = render_profile(profile).splitlines()
    start = next(i for i, line in enumerate(table) if "LayerNorm (LayerNorm)" in line)
    below = table[start + 1:start + 3]  # both layer_norm calls right under the module row
    assert all("[layer_norm]" in line for line in below), table


def node_lines(text):
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^(?:>>|  )\s*(\d+)\. \[\w+\] (\S+)", text, re.M)}


@pytest.mark.parametrize("method", ["fx", "dynamo"])
def test_profile_and_explore_share_node_numbers(method):
    model = Nested().eval()
    traced, profile = profiled(model, (torch.randn(3, 8),), method)
    shown = node_lines(render_explorer(traced, profile))
    assert {n.index: n.label for n in profile.nodes}.items() <= shown.items()
    table = render_profile(profile)
    for node in profile.nodes:  # the table's Node column holds the same numbers
        assert re.search(rf"^\s*{node.index}\s+.*\[", table, re.M)


def test_explore_folds_parameters_unless_asked():
    model = Nested().eval()
    traced, profile = profiled(model, (torch.randn(3, 8),), "dynamo")
    folded = render_explorer(traced, profile)
    assert "[placeholder] embedder.embedder.LayerNorm.weight" not in folded
    assert "5 parameter/buffer inputs, unnumbered (folded into their ops" in folded
    assert "[placeholder] x" in folded
    shown = render_explorer(traced, profile, show_params=True)
    assert "[placeholder] embedder.embedder.LayerNorm.weight" in shown
    # --max-nodes counts the nodes shown: the first two are the input and an op, not parameters
    first = node_lines(render_explorer(traced, profile, max_nodes=2))
    assert len(first) == 2 and list(first.values())[0] == "x"


def test_depth_table_aggregates_modules():
    _, profile = profiled(Nested().eval(), (torch.randn(3, 8),), "dynamo")
    table = render_profile(profile, depth=1)
    assert "modules to depth 1" in table
    body = table.split("Model summary")[0]
    assert "embedder (Sequential)" in body and "proj (Linear)" in body
    assert "LayerNorm" not in body and "[layer_norm]" not in body
    assert "ops at top level" in body  # unsqueeze and max-pool outside every module


def timed(times, spreads):
    nodes = [NodeProfile(index=i, graph=0, name=f"n{i}", op="call_function", target="t", module="", module_type="",
                         params=0, shape="", flops=0, bytes_read=1, bytes_written=1, time_ns=t, time_spread=s)
             for i, (t, s) in enumerate(zip(times, spreads))]
    return ModelProfile(model="m", method="dynamo", fx_error=None, nodes=nodes, graph_breaks=[], graph_count=1,
                        balance=10.0, input_bytes=0, output_bytes=0, weight_bytes=0)


def test_timing_warnings():
    quiet = timed([1e6, 2e6], [0.1, 0.2])
    quiet.graph_time_ns = 3.2e6
    assert _timing_warnings(quiet) == []
    noisy = timed([8e6, 8e6, 1e5], [2.5, 1.8, 0.1])
    noisy.graph_time_ns = 16.5e6
    (warning,) = _timing_warnings(noisy)
    assert "noisy" in warning and "99%" in warning
    too_much = timed([8e6, 8e6], [0.0, 0.0])  # the ops' medians add up to more than the graph took
    too_much.graph_time_ns = 5e6
    (warning,) = _timing_warnings(too_much)
    assert "add up to 16.00 ms" in warning and "5.00 ms" in warning
