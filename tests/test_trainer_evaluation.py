"""Trainers' evaluation loops are ``eval`` slices where they ran (issue 36, point 6), with eager ops
recorded (DFTRACER_EAGER_OPS=1) and without the tracer's trainer integrations: the Hugging Face
``Trainer`` with ``torch_compile=True`` (its evaluation runs eagerly: no graph call begins it) and
Lightning (validation in ``inference_mode``). Ground truth: each program's own marks (the
trace's clock) around every training step and evaluation."""

import json
import os

import pytest

from backend_support import inside, ops
from subproc import shell
from tracefile import read_events, traces

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
TOL_US = 2000  # a mark is taken just outside or inside the trainer's call (its callbacks, a subclass's evaluate)


def run(tmp_path, script):
    """(events, marks) of ``dftrace-dynamo run --compile-all`` of the script, eager ops on."""
    p = shell(f"dftrace-dynamo run --out run --compile-all {os.path.join(SCRIPTS, script)}", tmp_path,
              {"DFTRACER_EAGER_OPS": "1", "OMP_NUM_THREADS": "1"}, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    (path,) = traces(next((tmp_path / "run").iterdir()))  # the run's own directory
    marks = json.loads((tmp_path / "marks.json").read_text())
    return read_events(path), {k: [[t / 1e3 for t in pair] for pair in v] for k, v in marks.items()}


def slices(events, cat):
    return sorted(ops(events, cat), key=lambda e: e["ts"])


def end(e):
    return e["ts"] + e["dur"]


def check(events, iterations, evaluations, evaluated):
    """One step per training iteration; each evaluation an ``eval`` slice that holds the whole
    evaluation (``evaluated``: the marks inside the trainer's evaluation call) and begins after
    the iteration before it ended; every event in an eval slice carries no step."""
    steps, evals = slices(events, "step"), slices(events, "eval")
    assert len(steps) == len(iterations) and len(evals) == len(evaluated), (steps, evals)
    for e, (start, done), before in zip(evals, evaluated, evaluations):
        assert before - TOL_US <= e["ts"] <= start + TOL_US and done - TOL_US <= end(e) <= done + TOL_US, (
            e, start, done, before)
        assert not any(s["ts"] < end(e) and e["ts"] < end(s) for s in steps), e
    for s, (_, done) in zip(steps[1:], iterations[1:]):  # (step 0 begins where the trace did)
        assert s["ts"] <= done <= end(s) + TOL_US, (s, done)
    held = [x for x in events if x.get("ph") == "X" and x.get("cat") in ("dynamo", "module", "data")
            and any(inside(x, e) for e in evals)]
    assert held and not any("step" in x["args"] for x in held)


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return run(tmp_path_factory.mktemp("hf"), "hf_evaluate.py")


def test_hf_trainer_evaluation_is_the_evaluate_call(hf):
    events, marks = hf
    # the Trainer evaluates right after its step callbacks: its evaluate() call begins there
    check(events, marks["steps"], [s[1] for s in marks["steps"][1::2]], marks["evals"])


def test_lightning_validation_is_its_evaluation_loop(tmp_path):
    events, marks = run(tmp_path, "lit_evaluate.py")
    # validation after each epoch's last batch, its loop's run() around on_validation_start/_end
    last = [b[1] for b in marks["batches"][3::4]]
    check(events, marks["batches"], last, marks["validations"])
