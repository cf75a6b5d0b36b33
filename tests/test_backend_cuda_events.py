"""DFTRACER_CUDA_EVENTS on a machine without a GPU: the option is refused with one
warning, and the device-timing machinery is checked with a stand-in event type whose
"device clock" is the trace clock (real CUDA runs were not possible here)."""

import dataclasses

import torch

import perfetto_tp
from tracefile import read_events, traces
from backend_support import MLP, executed_nodes, is_eager, run_py
from backend_support import fresh_dynamo, rec  # noqa: F401 (fixtures)
from dftrace_dynamo import _core, create_backend
from dftrace_dynamo.session import config
from dftrace_dynamo.events import cuda as cuda_events
from dftrace_dynamo.backend import instrument


class ClockEvent:
    """torch.cuda.Event look-alike: record() stamps the trace clock, elapsed_time() in ms."""

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.t = None

    def record(self):
        self.t = _core.now_ns()

    def synchronize(self):
        assert self.t is not None

    def elapsed_time(self, other):
        return (other.t - self.t) / 1e6


def test_device_events_nest_on_their_own_track(rec):
    model = MLP()
    gm = torch.fx.symbolic_trace(model)
    timer = cuda_events.DeviceTimer("graph 99 forward", 99, event_type=ClockEvent)
    cell = _core.TagCell()
    nodes = instrument.instrument(gm, 99, cell, False, timer)
    site = _core.intern_site("graph 99 forward", "dynamo_graph", {"graph": 99})
    graph = _core.GraphCall(timer.graph(gm.forward), site, cell, _core.PHASE_FORWARD, torch.is_grad_enabled)
    x = torch.randn(2, 16)
    for _ in range(2):
        assert torch.equal(graph(x), model(x))
    path = rec.path()  # closing the file waits for the resolver
    device = perfetto_tp.rows(path, (
        "select s.name name, s.depth depth, t.name thread from slice s join thread_track tt on s.track_id = tt.id "
        "join thread t using(utid) where s.category = 'dynamo_cuda' order by s.ts"))
    assert {d["thread"] for d in device} == {"dftrace-cuda"}
    assert [d["name"] for d in device if d["depth"] == 0] == ["graph 99 forward (cuda)"] * 2
    ops = [d for d in device if d["depth"] == 1]
    assert len(ops) == 2 * nodes == 2 * len(executed_nodes(gm))
    assert ops[0]["name"] == "layers.0 (cuda)"
    assert perfetto_tp.error_stats(path) == []


def test_cuda_events_without_cuda_warns_once_and_traces_normally(tmp_path):
    proc = run_py("""
        import torch
        from dftrace_dynamo import dftracer, create_backend
        log = dftracer.initialize_log("t.pfw", None, -1)
        fn = torch.compile(lambda x: x * 2 + 1, backend=create_backend(level="torch"))
        fn(torch.ones(3)); fn(torch.ones(3))
        torch.compile(lambda x: x - 1, backend=create_backend(level="torch"))(torch.ones(3))
        log.finalize()
    """, tmp_path, env={"DFTRACER_CUDA_EVENTS": "1"})
    assert proc.stderr.count("CUDA is not available") == 1
    (path,) = traces(tmp_path)
    events = read_events(path)
    assert [e["name"] for e in events if e.get("cat") == "dynamo" and not is_eager(e)][:2] == [
        "function.mul", "function.add"]  # the graph's ops
    assert not [e for e in events if e.get("cat") == "dynamo_cuda"]


def test_cuda_events_off_by_default():
    assert dataclasses.replace(config.load({})).cuda_events is False


def test_inductor_kernels_get_device_events(rec, monkeypatch):
    """level="inductor": each kernel call is bracketed like an op, each graph call too."""
    monkeypatch.setattr(cuda_events, "wanted", lambda inputs: True)
    monkeypatch.setattr(torch.cuda, "Event", ClockEvent)
    model = MLP()
    compiled = torch.compile(model, backend=create_backend(level="inductor"))
    x = torch.randn(2, 16)
    with torch.no_grad():
        for _ in range(2):
            compiled(x)
    path = rec.path()
    events = read_events(path)
    kernels = [e["name"] for e in events if e.get("cat") == "kernel"]
    assert len(kernels) >= 4 and len(kernels) % 2 == 0  # two calls of one graph
    device = perfetto_tp.rows(path, (
        "select s.name name, s.depth depth, t.name thread from slice s join thread_track tt on s.track_id = tt.id "
        "join thread t using(utid) where s.category = 'dynamo_cuda' order by s.ts"))
    assert {d["thread"] for d in device} == {"dftrace-cuda"}
    calls = [e["name"] for e in events if e.get("cat") == "dynamo_graph"]
    assert len(calls) == 2 and calls[0] == calls[1]  # "graph N inference": N counts the process's graphs
    assert [d["name"] for d in device if d["depth"] == 0] == [f"{calls[0]} (cuda)"] * 2
    assert [d["name"] for d in device if d["depth"] == 1] == [f"{k} (cuda)" for k in kernels]
    assert perfetto_tp.error_stats(path) == []
