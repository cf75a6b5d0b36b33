"""Ground truth for trace timestamps: runs tests/scripts/groundtruth_train.py, which
takes wall-clock marks around everything the tracer records, and compares the
trace with them event by event.

The trace's timeline is ``CLOCK_MONOTONIC`` mapped onto the Unix epoch when the
tracer is imported, so ``time.time_ns()`` read in the traced process is on the
same timeline (to well under a microsecond; a wall clock stepped forward is followed at the
writer's next wake).
An event recorded between marks ``t0`` and ``t1`` must lie inside ``[t0, t1]``
up to the microsecond grid of ``ts``.
"""

import json
import os

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "groundtruth_train.py")
GRID_US = 2.0  # ts is whole µs, nesting may trim an event by at most 1 µs, and the clock model's error
EARLY_US = 500.0  # times taken before the trace opened, on the clock model not yet anchored by open()

# mark label -> how the trace names what was recorded between the two marks
SLICES = {"data": ("name", "data"), "backward": ("cat", "backward"),
          "zero_grad": ("name", "SGD.zero_grad"), "optimizer": ("name", "SGD.step")}


def argv(marks, mode, *extra):
    return [SCRIPT, str(marks), "--open", mode, *map(str, extra)]


def skip_if_stepped(wall_steps):
    """Skips the test when the machine's wall clock was stepped while its script took marks
    (``wall_steps``, from tests/scripts/wallclock.py): they are no ground truth to the µs then."""
    if wall_steps:
        pytest.skip(f"this machine's wall clock was stepped {len(wall_steps)} times during the run "
                    f"({', '.join(f'{ns / 1e6:+.3f} ms' for ns in wall_steps[:5])})")


def load_marks(path):
    """The marks and rank the script wrote (:func:`skip_if_stepped`)."""
    with open(path) as f:
        doc = json.load(f)
    skip_if_stepped(doc["wall_steps"])
    return doc["marks"], doc["rank"]


def x_events(events, pid=None):
    return [e for e in events if e.get("ph") == "X" and (pid is None or e["pid"] == pid)]


def main_pid(events):
    (start,) = [e for e in events if e.get("name") == "start"]
    return start["pid"]


def _inside(ev, t0_ns, t1_ns, shift_us=0.0, opened_us=0.0, grid_us=GRID_US):
    ts, end = ev["ts"] + shift_us, ev["ts"] + ev["dur"] + shift_us
    tol = max(EARLY_US, grid_us) if ev["ts"] < opened_us else grid_us
    return t0_ns / 1000 - tol <= ts and end <= t1_ns / 1000 + tol


def check(events, marks, shift_us=0.0, tid=None, grid_us=GRID_US):
    """Every traced step, and the data/backward/optimizer slices and graph calls of each,
    lies inside the marks taken around it; returns a list of mismatches (empty: all true).

    ``shift_us`` is added to every trace time (the merged view's clock correction);
    ``tid``: the training thread (default: the main thread, tid == pid); ``grid_us``: the
    tolerance (a clock offset measured between ranks is good to a bound, not to the µs)."""
    (start,) = [e for e in events if e.get("name") == "start"]
    pid = start["pid"]
    tid = pid if tid is None else tid
    evs = [e for e in x_events(events, pid) if e["tid"] == tid]
    bad = []
    # marks of this trace's steps; what ran before the file opened (a lazy open inside the first
    # compile) is not in it, except the batch that began the first step
    traced_marks = [m for m in marks if m[1] >= 0 and (m[3] / 1000 >= start["ts"] or m[0] == "data")]
    steps = sorted((e for e in evs if e["cat"] == "step"), key=lambda e: e["args"]["step"])
    opt_marks = [m for m in traced_marks if m[0] == "optimizer"]
    if [s["args"]["step"] for s in steps] != list(range(len(opt_marks))):
        bad.append(f"step slices {[s['args']['step'] for s in steps]} for {len(opt_marks)} optimizer steps")
    data_marks = {m[1]: m for m in traced_marks if m[0] == "data"}
    for s, m in zip(steps, opt_marks):
        # a step ends with its optimizer step, or where the next iteration's work begins; the last
        # one holds what its thread recorded after the loop too (a collection at exit): it ends
        # with the last of that
        nxt = data_marks.get(m[1] + 1, m)
        after = [e["ts"] + e["dur"] + shift_us for e in evs if m[1] + 1 not in data_marks and e is not s
                 and e.get("args", {}).get("step") == s["args"]["step"] and e["ts"] + shift_us >= m[3] / 1000 - grid_us]
        end = s["ts"] + s["dur"] + shift_us
        if not m[2] / 1000 - grid_us <= end <= max(m[3] / 1000, nxt[3] / 1000, *after) + grid_us:
            bad.append(f"step {s['args']['step']} ends at {end:.1f}, optimizer.step() ran "
                       f"{m[2] / 1000:.1f}..{m[3] / 1000:.1f} ({end - m[3] / 1000:+.1f} µs)")
    if steps and traced_marks and steps[0]["ts"] + shift_us > traced_marks[0][3] / 1000 + grid_us:
        bad.append(f"step 0 begins at {steps[0]['ts'] + shift_us:.1f}, after the loop's first call "
                   f"{traced_marks[0][2] / 1000:.1f}..{traced_marks[0][3] / 1000:.1f}")
    for label, (key, value) in SLICES.items():
        got = {}
        for e in evs:
            if e.get(key) == value:
                got.setdefault(e["args"].get("step"), []).append(e)
        for m in (m for m in traced_marks if m[0] == label):
            found = got.pop(m[1], [])
            if len(found) != 1:
                bad.append(f"step {m[1]}: {len(found)} {value} slices for one call")
            elif not _inside(found[0], m[2], m[3], shift_us, start["ts"], grid_us):
                bad.append(f"step {m[1]}: {value} slice {found[0]['ts'] + shift_us:.1f}+{found[0]['dur']} outside "
                           f"its call {m[2] / 1000:.1f}..{m[3] / 1000:.1f}")
        if got:
            bad.append(f"{value} slices without a call: {sorted(got, key=str)}")
    graphs = sorted((e for e in evs if e["cat"] == "dynamo_graph" and e["args"].get("phase") != "backward"),
                    key=lambda e: e["ts"])
    calls = [m for m in traced_marks if m[0] in ("graph1", "graph2")]
    if len(graphs) != len(calls):
        bad.append(f"{len(graphs)} forward graph calls for {len(calls)} calls")
    for e, m in zip(graphs, calls):
        if not _inside(e, m[2], m[3], shift_us, 0.0, grid_us):
            bad.append(f"graph {e['name']} {e['ts'] + shift_us:.1f}+{e['dur']} outside its call "
                       f"{m[2] / 1000:.1f}..{m[3] / 1000:.1f} ({m[0]}, step {m[1]})")
    first = [m for m in traced_marks if m[0] in ("graph1", "graph2", "backward")]
    for e in evs:
        if e["cat"] == "dynamo_compile" and e["args"].get("kind") == "compile" and \
                not any(_inside(e, m[2], m[3], shift_us, start["ts"], grid_us) for m in first):
            bad.append(f"{e['name']} {e['ts'] + shift_us:.1f}+{e['dur']} outside the calls that compile")
    return bad


def coverage(events, marks):
    """Fraction of the traced loop's wall time (first ``next()`` to last ``optimizer.step()``) that
    the main thread's step slices cover."""
    pid = main_pid(events)
    traced = [m for m in marks if m[1] >= 0]
    lo, hi = traced[0][2] / 1000, [m for m in traced if m[0] == "optimizer"][-1][3] / 1000
    covered = sum(max(0.0, min(hi, e["ts"] + e["dur"]) - max(lo, e["ts"]))
                  for e in x_events(events, pid) if e["cat"] == "step")
    return covered / (hi - lo)
