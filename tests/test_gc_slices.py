"""Garbage collection inside the step windows is a slice of its own (``gc``, cat ``gc``) on the
thread it stopped, with the generation and the objects it collected. Ground truth: time marks the
test takes around ``gc.collect()`` at a known place, the count it returns, the cycles it made."""

import gc

import torch

from backend_support import MLP, ops, recording
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

