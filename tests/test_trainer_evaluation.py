"""Trainers' evaluation loops are ``eval`` slices where they ran (issue 36, point 6), and their own
loop code ``trainer`` slices, the step view's ``trainer`` part, with eager ops recorded
(DFTRACER_EAGER_OPS=1) and without the tracer's trainer integrations: the Hugging Face ``Trainer``
with ``torch_compile=True`` (its evaluation runs eagerly: no graph call begins it) and Lightning
(validation in ``inference_mode``). Ground truth: each program's own marks (the trace's clock)
around every training step and evaluation, and a 30 ms sleep in one callback of step 3."""

import json
import os

import pytest

import perfetto_tp
from backend_support import inside, ops
from dftrace_dynamo.traces.summary import summarize
from subproc import shell
from tracefile import read_events, traces

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
TOL_US = 2000  # a mark is taken just outside or inside the trainer's call (its callbacks, a subclass's evaluate)


SLEEP_AT = 3  # the step whose callback sleeps


def run(tmp_path, script):
    """(events, marks, path) of ``dftrace-dynamo run --compile-all`` of the script, eager ops on."""
    p = shell(f"dftrace-dynamo run --out run --compile-all {os.path.join(SCRIPTS, script)}", tmp_path,
              {"DFTRACER_EAGER_OPS": "1", "OMP_NUM_THREADS": "1", "SLEEP_AT": str(SLEEP_AT)}, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    (path,) = traces(next((tmp_path / "run").iterdir()))  # the run's own directory
    marks = json.loads((tmp_path / "marks.json").read_text())
    return read_events(path), {k: [[t / 1e3 for t in pair] for pair in v] for k, v in marks.items()}, path


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


@pytest.fixture(scope="module")
def lightning(tmp_path_factory):
    return run(tmp_path_factory.mktemp("lightning"), "lit_evaluate.py")


def test_hf_trainer_evaluation_is_the_evaluate_call(hf):
    events, marks, _ = hf
    # the Trainer evaluates right after its step callbacks: its evaluate() call begins there
    check(events, marks["steps"], [s[1] for s in marks["steps"][1::2]], marks["evals"])


def test_lightning_validation_is_its_evaluation_loop(lightning):
    events, marks, _ = lightning
    # validation after each epoch's last batch: its loop's run()
    last = [b[1] for b in marks["batches"][3::4]]
    check(events, marks["batches"], last, marks["validations"])


@pytest.mark.parametrize("trainer, call", [("hf", "CallbackHandler.call_event"),
                                           ("lightning", "[Callback]Marks.on_train_batch_end")])
def test_a_sleep_in_a_trainer_callback_is_its_trainer_slice_and_trainer_time(trainer, call, request):
    """The callback's sleep lies in the trainer slice of its call, in step 3's slice and in that
    step's ``trainer`` part (both sources), not in ``other``; every trainer slice nests in the
    steps and evaluations (inside one, or outside all), as Perfetto loads the file (no error)."""
    events, marks, path = request.getfixturevalue(trainer)
    ((a, b),) = marks["sleep"]
    holding = min((e for e in slices(events, "trainer") if e["ts"] <= a and b <= end(e)), key=lambda e: e["dur"])
    assert holding["name"] == call and holding["args"]["step"] == SLEEP_AT, holding
    (step,) = [s for s in slices(events, "step") if s["args"]["step"] == SLEEP_AT]
    assert inside(holding, step)
    for source in ("aggregates", "events"):
        got = summarize([path], top=None, source=source)
        assert got["scan"]["source"] == source and not got["warnings"], got["warnings"]
        (row,) = [r for r in got["steps"]["rows"] if r["step"] == SLEEP_AT]
        assert row["trainer_us"] >= b - a and row["other_us"] < (b - a) / 2, (source, row, b - a)
    for e in slices(events, "trainer"):
        for s in slices(events, "step") + slices(events, "eval"):
            assert inside(e, s) or inside(s, e) or end(e) <= s["ts"] or end(s) <= e["ts"], (e, s)
    assert perfetto_tp.error_stats(path) == []


@pytest.mark.parametrize("trainer", ["hf", "lightning"])
def test_the_first_compile_inside_a_trainer_call_is_not_trainer_time(trainer, request):
    """Step 0 compiles inside the trainer's call (``training_step``, Lightning's closure): that
    compile is not trainer time (it stays where it was: ``other``, or the optimizer's closure)."""
    events, _, path = request.getfixturevalue(trainer)
    compiled = sum(e["dur"] for e in slices(events, "dynamo_compile")
                   if e["args"].get("kind") == "compile" and e["args"].get("step") == 0)
    (row,) = [r for r in summarize([path], top=None, include_warmup=True)["steps"]["rows"] if r["step"] == 0]
    assert compiled > 100_000 and row["trainer_us"] < compiled / 10, (row, compiled)


LIGHTNING_ACTION = """
import time, torch, dftrace_dynamo
from dftrace_dynamo.backend import tracer
from lightning.pytorch.profilers import PassThroughProfiler
dftrace_dynamo.initialize_log("job")
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
f = torch.compile(model, backend="dftrace")
for _ in range(2):
    f(torch.ones(2, 4)).sum().backward()
    with PassThroughProfiler().profile("[Callback]Sleepy.on_train_batch_end"):
        time.sleep(0.01)
    opt.step()
    opt.zero_grad()
dftrace_dynamo.finalize()
"""


@pytest.mark.parametrize("switch, count", [(None, 2), ("0", 0)])
def test_trainer_slices_can_be_turned_off(tmp_path, switch, count):
    """A Lightning action in each of two steps is a trainer slice; ``DFTRACER_TRAINER_SLICES=0``
    writes none (the steps are there either way)."""
    env = {"OMP_NUM_THREADS": "1", **({"DFTRACER_TRAINER_SLICES": switch} if switch else {})}
    p = shell(f"python -c '{LIGHTNING_ACTION}'", tmp_path, env, timeout=300)
    assert p.returncode == 0 and "dftrace_dynamo" not in p.stderr, p.stderr[-3000:]
    (path,) = traces(tmp_path)
    events = read_events(path)
    got = [(e["name"], e["args"]["step"]) for e in slices(events, "trainer")]
    assert got == [("[Callback]Sleepy.on_train_batch_end", i) for i in range(count)], got
    assert len(slices(events, "step")) == 2
