"""Per-node FLOPs/bytes/intensity profile, measured op times and the report formats."""

import csv
import io
import json
import os

import pytest
import torch
import torch.nn as nn

from dftrace_dynamo.graphs.hybrid import trace_hybrid
from dftrace_dynamo.graphs.profile import DEFAULT_BALANCE, machine_balance, profile_model, profile_partitions
from dftrace_dynamo.graphs.report import human, human_bytes, render_profile


class Net(nn.Module):
    """Conv2d(3→8, 3x3, pad 1) on 2x3x4x4, Linear(128→10), matmul with a 10x5 constant."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 10)
        self.register_buffer("proj", torch.randn(10, 5))

    def forward(self, x):
        y = self.conv(x).flatten(1)
        return torch.matmul(self.fc(y), self.proj)


# Hand-computed: MACs = N * Cout * Hout * Wout * Cin * kh * kw; Linear N * in * out; matmul M * K * N.
CONV_MACS = 2 * 8 * 4 * 4 * 3 * 3 * 3
LINEAR_MACS = 2 * 128 * 10
MATMUL_MACS = 2 * 10 * 5
F32 = 4


def profiled(method, balance=DEFAULT_BALANCE):
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 3, 4, 4)
    traced = trace_hybrid(model, (x,), method=method)
    return profile_partitions(traced.partitions, method=traced.method, model_inputs=x, model_output=traced.output,
                              weights=list(model.parameters()) + list(model.buffers()), balance=balance)


def by_target(profile, suffix):
    (node,) = [n for n in profile.nodes if n.target.endswith(suffix)]
    return node


@pytest.mark.parametrize("method,conv,linear", [("fx", "Conv2d", "Linear"), ("dynamo", "conv2d", "linear")])
def test_flops_match_hand_computed_values(method, conv, linear):
    profile = profiled(method)
    assert by_target(profile, conv).macs == CONV_MACS
    assert by_target(profile, conv).flops == 2 * CONV_MACS
    assert by_target(profile, linear).flops == 2 * LINEAR_MACS
    assert by_target(profile, "matmul").flops == 2 * MATMUL_MACS
    assert profile.total_flops == 2 * (CONV_MACS + LINEAR_MACS + MATMUL_MACS)


@pytest.mark.parametrize("method,linear", [("fx", "Linear"), ("dynamo", "linear")])
def test_params_bytes_and_views(method, linear):
    profile = profiled(method)
    fc = by_target(profile, linear)
    assert fc.params == 128 * 10 + 10
    assert fc.bytes_read == F32 * (2 * 128 + 128 * 10 + 10)  # input, weight, bias
    assert fc.bytes_written == F32 * 2 * 10
    assert fc.shape == "2x10"
    assert fc.intensity == pytest.approx(fc.flops / (fc.bytes_read + fc.bytes_written))
    flatten = by_target(profile, "flatten")
    assert (flatten.bytes_read, flatten.bytes_written, flatten.bottleneck) == (0, 0, "none")
    assert profile.total_params == sum(p.numel() for p in Net().parameters())
    assert profile.weight_bytes == F32 * (sum(p.numel() for p in Net().parameters()) + 50)
    assert profile.input_bytes == F32 * 2 * 3 * 4 * 4
    assert profile.output_bytes == F32 * 2 * 5


def test_fx_and_dynamo_modules_agree():
    fx, dynamo = profiled("fx"), profiled("dynamo")
    assert by_target(fx, "Linear").module == by_target(dynamo, "linear").module == "fc"
    assert by_target(dynamo, "linear").module_type == "Linear"
    assert by_target(dynamo, "matmul").module == ""


def test_bottleneck_follows_machine_balance():
    conv_ai = by_target(profiled("fx"), "Conv2d").intensity
    assert by_target(profiled("fx", balance=conv_ai * 0.9), "Conv2d").bottleneck == "compute"
    assert by_target(profiled("fx", balance=conv_ai * 1.1), "Conv2d").bottleneck == "memory"
    dist = profiled("fx", balance=conv_ai * 0.9).bottlenecks()
    assert dist["compute"]["nodes"] >= 1
    assert sum(d["nodes"] for d in dist.values()) == 4


def test_machine_balance_rules():
    assert machine_balance() == DEFAULT_BALANCE
    assert machine_balance(peak_flops=1e12, mem_bw=1e11) == 10.0
    assert machine_balance(balance=3.0) == 3.0
    for bad in ({"peak_flops": 1e12}, {"mem_bw": 1e9}, {"balance": -1.0},
                {"balance": 2.0, "peak_flops": 1e12, "mem_bw": 1e9}, {"peak_flops": 0.0, "mem_bw": 1.0}):
        with pytest.raises(ValueError):
            machine_balance(**bad)


def test_attention_flops_are_counted_on_cpu():
    q = torch.randn(2, 2, 8, 16)
    model = Attention().eval()
    profile = profile_model(model, (q,), runs=0)
    sdpa = by_target(profile, "scaled_dot_product_attention")
    assert sdpa.flops == 2 * (2 * 2 * 8 * 8 * 16) * 2  # QK^T and PV, 2 FLOPs per MAC


class Recurrent(nn.Module):
    """A recurrent layer after a data-dependent branch, which symbolic tracing cannot follow."""

    def __init__(self, cls, batch_first):
        super().__init__()
        self.rnn = cls(16, 32, num_layers=2, bidirectional=True, batch_first=batch_first)

    def forward(self, x):
        if x.sum() > 0:
            x = -x
        return self.rnn(x)[0]


@pytest.mark.parametrize("cls, gates", [(nn.LSTM, 4), (nn.GRU, 3), (nn.RNN, 1)])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("method", ["fx", "dynamo"])
def test_recurrent_layer_flops_are_their_gate_products(cls, gates, batch_first, method):
    """Per layer and direction, 2 * tokens * gates * hidden * (input + hidden): the CPU LSTM runs
    as one oneDNN kernel that torch's counter has no formula for, GRU and RNN as addmm/mm. Dynamo
    (which torch.compile leaves such layers to run eagerly for) captures them in a graph."""
    model = (Recurrent(cls, batch_first) if method == "dynamo" else nn.Sequential(cls(
        16, 32, num_layers=2, bidirectional=True, batch_first=batch_first))).eval()
    profile = profile_model(model, (torch.randn(5, 7, 16),), runs=0, method=method)
    assert profile.method == {"fx": "symbolic_trace", "dynamo": "dynamo"}[method]
    tokens = 5 * 7
    per_direction = [2 * tokens * gates * 32 * (16 + 32), 2 * tokens * gates * 32 * (2 * 32 + 32)]
    assert profile.total_flops == 2 * sum(per_direction)
    assert profile.total_params == profile.model_params == sum(p.numel() for p in model.parameters())


class Disabled(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    @torch.compiler.disable
    def tail(self, x):
        return self.b(x)

    def forward(self, x):
        return self.tail(self.a(x))


def test_parameters_no_graph_uses_are_reported():
    profile = profile_model(Disabled(), (torch.randn(4, 16),), runs=0, method="dynamo")
    assert (profile.total_params, profile.model_params) == (272, 544)
    assert profile.summary()["model_params"] == 544
    assert "parameters:        272 of the model's 544: the rest are in no graph" in render_profile(profile)
    complete = profile_model(nn.Linear(16, 16), (torch.randn(4, 16),), runs=0)
    assert "parameters:        272\n" in render_profile(complete)


class Attention(nn.Module):
    def forward(self, q):
        return torch.nn.functional.scaled_dot_product_attention(q, q, q)


def test_op_times_come_from_the_tracer(monkeypatch):
    monkeypatch.delenv("DFTRACER_ENABLE", raising=False)
    monkeypatch.delenv("DFTRACER_LOG_FILE", raising=False)
    profile = profile_model(Net().eval(), (torch.randn(2, 3, 4, 4),), runs=3)
    assert profile.timing_error is None
    assert profile.timing == "tracer, median of 3 run(s)"
    assert all(n.time_ns is not None and n.time_ns > 0 and n.calls == 3 for n in profile.nodes)
    conv = by_target(profile, "Conv2d")
    assert conv.achieved_flops == pytest.approx(conv.flops / (conv.time_ns * 1e-9))
    summary = profile.summary()
    assert summary["time_ns"] == pytest.approx(sum(n.time_ns for n in profile.nodes))
    from dftrace_dynamo.session import logger
    assert not logger.enabled()  # the temporary trace was closed
    # and child processes do not inherit a trace file in the removed directory
    assert "DFTRACER_LOG_FILE" not in os.environ and "DFTRACER_ENABLE" not in os.environ


def test_timing_refuses_an_open_trace(tmp_path, monkeypatch):
    from dftrace_dynamo.session import logger

    # initialize_log exports these for children: restored by monkeypatch afterwards
    monkeypatch.delenv("DFTRACER_ENABLE", raising=False)
    monkeypatch.delenv("DFTRACER_LOG_FILE", raising=False)

    logger.initialize_log(str(tmp_path / "user"))
    try:
        profile = profile_model(Net().eval(), (torch.randn(2, 3, 4, 4),), runs=2)
    finally:
        logger.finalize()
    assert profile.timing is None
    assert "already open" in profile.timing_error
    assert all(n.time_ns is None for n in profile.nodes)


def test_report_formats():
    profile = profile_model(Net().eval(), (torch.randn(2, 3, 4, 4),), name="net", runs=1)
    data = json.loads(render_profile(profile, "json"))
    assert data["summary"]["flops"] == profile.total_flops
    assert data["summary"]["bottlenecks"].keys() == {"compute", "memory", "none"}
    assert len(data["nodes"]) == len(profile.nodes)
    assert {"macs", "intensity", "achieved_flops", "time_ns"} <= data["nodes"][0].keys()
    rows = list(csv.DictReader(io.StringIO(render_profile(profile, "csv"))))
    assert [r["name"] for r in rows] == [n.name for n in profile.nodes]
    assert int(rows[0]["flops"]) == profile.nodes[0].flops
    table = render_profile(profile, "table", show_shapes=True)
    assert "Model summary" in table and "Bottleneck distribution" in table
    assert "2x8x4x4" in table and "conv (Conv2d)" in table
    assert "Time" in table and "FLOP/s" in table
    assert "2x8x4x4" not in render_profile(profile, "table", show_shapes=False)
    with pytest.raises(ValueError):
        render_profile(profile, "xml")


@pytest.mark.parametrize("value,text", [(None, "-"), (999, "999"), (1500, "1.50K"), (2.5e9, "2.50G"), (0.5, "0.50")])
def test_human_numbers(value, text):
    assert human(value) == text


def test_human_bytes():
    assert human_bytes(512) == "512 B"
    assert human_bytes(2048) == "2.00 KiB"
    assert human_bytes(3 << 20) == "3.00 MiB"
