"""diff takes its samples from the steps summary counts: a step outside the step windows
(``DFTRACER_STEPS``), which recorded nothing, is in no row's samples."""

import json

from dftrace_dynamo.traces.diff import diff


def trace(path):
    """Ten steps of one process; only steps 3..6 (the window) hold an op."""
    lines = ["["]
    for s in range(10):
        lines.append(json.dumps({"name": f"step {s}", "cat": "step", "ph": "X", "pid": 1, "tid": 1,
                                 "ts": 1000 * s, "dur": 900, "args": {"step": s}}))
        if 3 <= s <= 6:
            lines.append(json.dumps({"name": "function.relu", "cat": "dynamo", "ph": "X", "pid": 1, "tid": 1,
                                     "ts": 1000 * s + 10, "dur": 100 + s, "args": {"step": s, "node": "relu"}}))
    path.write_text("\n".join(lines + ["]"]) + "\n")
    return [str(path)]


def test_steps_outside_the_step_windows_are_no_samples(tmp_path):
    d = diff(trace(tmp_path / "a.pfw"), trace(tmp_path / "b.pfw"))
    assert d["method"]["steps"] == [4, 4]
    assert {(r["view"], r["key"]) for r in d["rows"]} >= {("step", "time"), ("op", "function.relu")}
    assert all(r["samples"] == [4, 4] for r in d["rows"]), d["rows"]
