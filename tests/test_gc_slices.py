"""Garbage collection inside the step windows is a slice of its own (``gc``, cat ``gc``) on the
thread it stopped, with the generation and the objects it collected. Ground truth: time marks the
test takes around ``gc.collect()`` at a known place, the count it returns, the cycles it made."""

import gc
import shutil
import statistics

import pytest
import torch

from backend_support import MLP, ops, recording
from scripts.clitools import summary_json
from tracefile import read_events
from dftrace_dynamo import _core, create_backend, set_steps

CYCLES = 500  # reference cycles of two objects each made before each collection


class Node:
    pass


def garbage(n=CYCLES):
    for _ in range(n):
        a, b = Node(), Node()
        a.other, b.other = b, a


def test_collections_in_the_step_windows_are_slices_with_generation_and_counts(tmp_path):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, backend=create_backend())
    marks = {}  # step -> (start, end, objects found)
    with recording(tmp_path) as rec:
        set_steps("1-2")
        gc.disable()  # only the test's collections: each finds exactly the cycles made before it
        try:
            for i in range(4):
                opt.zero_grad()
                compiled(torch.randn(4, 16)).sum().backward()
                garbage()
                start = _core.now_ns()
                found = gc.collect()
                marks[i] = (start, _core.now_ns(), found)
                opt.step()
        finally:
            gc.enable()
            set_steps(None)
        events = rec.events()
    slices = ops(events, "gc")
    assert all(e["name"] == "gc" for e in slices)
    ours = {}
    for i, (start, end, found) in marks.items():
        inside = [e for e in slices if start / 1e3 - 1 <= e["ts"] and e["ts"] + e["dur"] <= end / 1e3 + 1]
        if i not in (1, 2):
            assert inside == [], i  # outside the step windows: nothing
            continue
        (e,) = inside
        ours[i] = e
        assert e["args"]["generation"] == 2 and e["args"]["step"] == i
        assert e["args"]["collected"] + e["args"]["uncollectable"] == found >= 2 * CYCLES
        assert e["dur"] >= 0.9 * (end - start) / 1e3 - 50  # the collection is nearly all of the call
    steps = {e["args"]["step"]: e for e in ops(events, "step")}
    for i, e in ours.items():
        s = steps[i]
        assert s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"]
        assert e["tid"] == s["tid"]



class CollectingSGD(torch.optim.SGD):
    """An optimizer whose step() collects garbage first: that pause is the optimizer's time."""

    def __init__(self, params, marks):
        super().__init__(params, lr=0.01)
        self.marks = marks

    def step(self, closure=None):
        garbage()
        start = _core.now_ns()
        gc.collect()
        self.marks.append(_core.now_ns() - start)
        return super().step(closure)


@pytest.fixture(scope="module")
def collecting_run(tmp_path_factory):
    """A loop collecting garbage between the backward and the optimizer step, and inside the
    optimizer's step: the trace and the marks (ns) around each collection, outside and inside."""
    model = MLP()
    outside, inside = [], []
    opt = CollectingSGD(model.parameters(), inside)
    compiled = torch.compile(model, backend=create_backend())
    with recording(tmp_path_factory.mktemp("collecting")) as rec:
        gc.disable()
        try:
            for _ in range(4):
                opt.zero_grad()
                compiled(torch.randn(4, 16)).sum().backward()
                garbage(20 * CYCLES)
                start = _core.now_ns()
                gc.collect()
                outside.append(_core.now_ns() - start)
                opt.step()
        finally:
            gc.enable()
        path = rec.path()
    return path, outside, inside


@pytest.mark.parametrize("source", ["aggregates", "events"])
def test_the_step_view_names_a_collection_outside_the_phases_gc(collecting_run, source):
    """A collection between the backward and the optimizer step is the step's ``gc`` time, no
    longer ``other``; one inside the optimizer's step stays optimizer time. Ground truth: marks
    around each ``gc.collect()``; both sources of ``summary`` say the same."""
    path, outside, inside = collecting_run
    result, _ = summary_json(path, "--by", "step", "--source", source)
    rows = {r["step"]: r for r in result["steps"]["rows"]}
    assert sorted(rows) == list(range(4))
    slices = {}
    for e in ops(read_events(path), "gc"):
        slices.setdefault(e["args"]["step"], []).append(e["dur"])
    for step in range(1, 4):  # (compiling collects garbage too: not step 0)
        row = rows[step]
        assert len(slices[step]) == 2, slices
        out_us, in_us = outside[step] / 1e3, inside[step] / 1e3
        assert 0.9 * out_us - 50 <= row["gc_us"] <= out_us + 1, (row, out_us)
        assert row["gc_us"] == pytest.approx(max(slices[step]) if out_us > in_us else min(slices[step]), abs=0.01)
        assert row["optimizer_us"] >= 0.9 * in_us - 50, (row, in_us)
        parts = sum(row[f"{p}_us"] for p in ("data", "forward", "backward", "optimizer", "gc", "trainer", "other"))
        assert parts == pytest.approx(row["wall_us"], abs=0.01)
    steady = result["steps"]["steady"]
    assert steady["gc_mean_us"] == pytest.approx(statistics.fmean(rows[s]["gc_us"] for s in range(1, 4)))


def test_records_made_before_gc_was_a_part_are_not_read(collecting_run, tmp_path):
    """A writer's record without ``gc`` (its copies hold no gc slices) and a computed record
    without ``gc_parts``: summary reads the events instead, and says the same as they do."""
    from dftrace_dynamo.traces import aggregates
    from dftrace_dynamo.traces.summary import summarize

    path, _, _ = collecting_run

    def steps(trace, expect):
        result = summarize([trace], views=("step",), top=None, source="auto")
        assert result["scan"]["source"] == expect
        return result["steps"]["rows"]

    events = steps(path, "aggregates")
    assert any(r["gc_us"] for r in events)
    written = aggregates.verified(path)
    assert written["gc"] is True
    stale = {}
    for name, record in (("writer", written), ("computed", aggregates.compute(path))):
        record.pop("gc", None)
        record.pop("gc_parts", None)
        record.pop("span", None)
        stale[name] = str(shutil.copy(path, tmp_path / f"{name}.pfw.gz"))
        aggregates.write(stale[name], record)
        assert steps(stale[name], "events") == events, name
