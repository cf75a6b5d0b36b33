"""Hybrid tracing: warm-up, FX symbolic_trace first, Dynamo when it fails."""

import pytest
import torch
import torch.nn as nn

from dftrace_dynamo.graphs.hybrid import trace_hybrid


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x, scale=2.0):
        return torch.relu(self.fc(x)) * scale


class DataDependent(nn.Module):
    """symbolic_trace cannot branch on a tensor value."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        if y.mean() > 0:
            return y.relu()
        return -y


class LazyInit(nn.Module):
    """Makes a buffer on its first call (like YOLO's anchors): only the warm-up may do that."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.offset = None
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.offset is None:
            self.offset = torch.ones(int(x.shape[-1]))  # int(Proxy) fails under symbolic_trace
        return self.fc(x) + self.offset


class Noisy(nn.Module):
    """Traceable, but its graph cannot reproduce the eager output."""

    def forward(self, x):
        return x + torch.rand_like(x)


def test_fx_is_used_when_it_works():
    traced = trace_hybrid(Plain(), (torch.randn(2, 4),))
    assert traced.method == "symbolic_trace"
    assert traced.fx_error is None
    assert traced.graph_breaks == []
    (part,) = traced.partitions
    assert {n.op for n in part.graph_module.graph.nodes} >= {"call_module", "call_function"}
    # the optional forward argument became a placeholder fed with its default
    assert [m.name for m in part.inputs] == ["x", "scale"]
    assert part.example_inputs[1] == 2.0


def test_data_dependent_control_flow_falls_back_to_dynamo_with_reason():
    torch.manual_seed(0)
    traced = trace_hybrid(DataDependent(), (torch.randn(2, 4),))
    assert traced.method == "dynamo"
    assert traced.fx_error.startswith("TraceError")
    assert "control flow" in traced.fx_error
    assert len(traced.partitions) >= 1
    assert len(traced.graph_breaks) >= 1


def test_warm_up_runs_before_tracing():
    model = LazyInit()
    traced = trace_hybrid(model, (torch.randn(2, 4),))
    # warm-up made the tensor, so symbolic_trace never ran the shape-dependent init
    assert traced.method == "symbolic_trace"
    assert model.calls >= 2
    assert traced.output.shape == (2, 4)


def test_output_mismatch_falls_back():
    traced = trace_hybrid(Noisy(), (torch.zeros(3),))
    assert traced.method == "dynamo"
    assert "differs from eager" in traced.fx_error


def test_method_choice():
    assert trace_hybrid(Plain(), (torch.randn(2, 4),), method="dynamo").method == "dynamo"
    with pytest.raises(RuntimeError, match="symbolic_trace failed: TraceError"):
        trace_hybrid(DataDependent(), (torch.randn(2, 4),), method="fx")
    with pytest.raises(ValueError):
        trace_hybrid(Plain(), (torch.randn(2, 4),), method="onnx")


def test_plain_functions_go_to_dynamo():
    traced = trace_hybrid(lambda x: torch.sin(x) + 1, (torch.randn(3),))
    assert traced.method == "dynamo"
    assert traced.fx_error == "not a torch.nn.Module"
