"""One step per training iteration in common loop shapes, checked against the loop's own clock
(tests/scripts/loops.py times each iteration): two optimizers (GAN), a critic stepping 5 times
per generator step, validation after each epoch (``eval`` slices, apart from the steps), and
explicit marks after the optimizer step."""

import json
import os
import statistics

import pytest

from backend_support import inside, ops, run_python
from groundtruth import skip_if_stepped
from dftrace_dynamo.traces.steps import quantile
from scripts.clitools import summary_json
from scripts.loops import SLEEP_S
from tracefile import read_events, traces

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "loops.py")
ITERS = 6


def run_loop(tmp_path, shape, env=None):
    """(events, iteration times in µs, evaluation times in µs) of one run of the loop."""
    truth = tmp_path / "truth.json"
    run_python([SCRIPT, shape, "--out", str(tmp_path / "tr"), "--truth", str(truth), "--iters", str(ITERS)],
               tmp_path, env, timeout=600)
    (path,) = traces(tmp_path, "tr-*")
    marks = json.loads(truth.read_text())
    skip_if_stepped(marks["wall_steps"])
    iterations = [(b - a) / 1e3 for a, b in zip(marks["iterations"], marks["iterations"][1:])]
    return path, read_events(path), iterations, [(b - a) / 1e3 for a, b in marks["evals"]]


def step_slices(events):
    return sorted(ops(events, "step"), key=lambda e: e["ts"])


def optimizer_steps_in(events, s):
    """The ``SGD.step`` slices inside the slice ``s``."""
    return len([e for e in ops(events, "optimizer") if e["name"] == "SGD.step"
                and inside(e, s)])


def assert_close(measured, truth, rel=0.05):
    assert abs(measured - truth) <= rel * truth, (measured, truth)


def assert_steps_close(steps, truths, rel=0.05):
    """Each step as long as its iteration: the typical one within ``rel`` of it, every one within
    3 x ``rel`` (a boundary that busy cores delay by a scheduler slice moves one step, not the rule)."""
    errors = [abs(s["dur"] - t) / t for s, t in zip(steps, truths, strict=True)]
    assert statistics.median(errors) <= rel and max(errors) <= 3 * rel, [(s["dur"], t) for s, t in zip(steps, truths)]


def assert_span(events, steps, iterations):
    """The steady steps (after the last that compiled, but the last step) span their iterations:
    from the first one's start to the last one's end as long as from the first's mark to the
    last's end (where each boundary falls, which busy cores delay, counts twice, not once a step)."""
    compiled = [i for i, s in enumerate(steps) if any(inside(e, s) for e in ops(events, "dynamo_compile"))]
    first = max(compiled, default=0) + 1
    held = steps[first:-1]
    assert len(held) >= 2, compiled
    assert_close(held[-1]["ts"] + held[-1]["dur"] - held[0]["ts"], sum(iterations[first:-1]))


@pytest.mark.parametrize("shape", ["gan", "gan_sample", "dcgan", "gan_loss_first", "actor_critic"])
def test_two_optimizers_make_one_step_per_iteration(tmp_path, shape):
    """Also when each iteration begins with the generator's samples under ``no_grad`` and then the
    critic's ``zero_grad()``: that is the iteration's start, not an evaluation; and when the second
    model's forward comes before its optimizer's first call (each model's own ``zero_grad()``, or
    each loss before its ``zero_grad()``): the first iteration is one step, not two."""
    _, events, iterations, _ = run_loop(tmp_path, shape)
    steps = step_slices(events)
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(ITERS)]
    # every step holds one D and one G optimizer step
    assert [optimizer_steps_in(events, s) for s in steps] == [2] * ITERS
    # steady steps last as long as the iterations (the last step ends at its last optimizer step)
    assert_span(events, steps, iterations)
    assert not ops(events, "eval")
    assert all(abs(a["ts"] + a["dur"] - b["ts"]) <= 1 for a, b in zip(steps, steps[1:]))  # nothing between


def test_a_model_that_no_optimizer_steps_leaves_one_step_per_iteration(tmp_path):
    """A compiled backbone whose parameters require grad but no optimizer steps, the loss computed
    before ``zero_grad()``: the first step waits for that model's optimizer, and ends when the
    head's optimizer zeroes again; each later step begins at the iteration's forward."""
    _, events, iterations, _ = run_loop(tmp_path, "untrained")
    steps = step_slices(events)
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(ITERS)]
    assert [optimizer_steps_in(events, s) for s in steps] == [1] * ITERS
    assert_span(events, steps, iterations)
    assert all(abs(a["ts"] + a["dur"] - b["ts"]) <= 1 for a, b in zip(steps, steps[1:]))
    zero_grads = sorted((e["ts"] for e in ops(events, "optimizer") if e["name"] == "SGD.zero_grad"))
    assert abs(steps[1]["ts"] - zero_grads[1]) <= 1
    # a later step begins where its iteration's backbone is entered (Dynamo's frame entry, which
    # busy cores can stretch to milliseconds, lies between that and the graph call), and the
    # backbone's graph call is inside that module slice
    backbones = sorted((e for e in ops(events, "module") if e["name"] == "backbone"), key=lambda e: e["ts"])
    graphs = [g for g in ops(events, "dynamo_graph") if g["name"].endswith("forward")]
    for s in steps[2:]:
        (entered,) = [b for b in backbones if abs(b["ts"] - s["ts"]) <= 1]
        assert any(inside(g, entered) for g in graphs), entered


def test_critic_steps_five_times_per_generator_step(tmp_path):
    """A step is one generator iteration; the critic steps before the generator's first step
    each end a step (warm-up)."""
    _, events, iterations, _ = run_loop(tmp_path, "critic")
    steps = step_slices(events)
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(ITERS + 4)]
    counts = [optimizer_steps_in(events, s) for s in steps]
    assert counts == [1, 1, 1, 1, 2] + [6] * (ITERS - 1), counts
    assert_close(statistics.median(e["dur"] for e in steps[5:-1]), statistics.median(iterations[1:-1]))


@pytest.mark.parametrize("shape", ["validate", "validate_eval_mode", "validate_loss_fn"])
def test_validation_is_in_eval_slices_apart_from_the_steps(tmp_path, shape):
    """Validation under ``no_grad``, or under ``model.eval()`` alone (grad enabled), also when
    the compiled function takes a loss module, which stays in training mode."""
    path, events, iterations, evals = run_loop(tmp_path, shape)
    steps = step_slices(events)
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(3 * ITERS)]
    passes = sorted(ops(events, "eval"), key=lambda e: e["ts"])
    assert len(passes) == 3  # the trailing evaluation is an eval slice, not a step
    for e, truth in zip(passes[1:], evals[1:]):  # the first one compiled its graph
        assert_close(e["dur"], truth)
    # the validation graph calls are in the eval slices and carry no step
    phase = "inference" if shape == "validate" else "forward"
    calls = [g for g in ops(events, "dynamo_graph") if g["name"].endswith(phase)
             and any(p["ts"] <= g["ts"] <= p["ts"] + p["dur"] for p in passes)]
    assert len(calls) == 3 * 2
    assert all("step" not in g["args"] for g in calls)
    # no step holds evaluation: training p90 is the iterations' p90
    training = [t for i, t in enumerate(iterations) if (i + 1) % (ITERS + 1)]  # iterations, not epoch ends
    result, _ = summary_json(path)
    assert result["steps"]["steady"]["steps"] == 3 * ITERS - 1
    assert_close(result["steps"]["steady"]["p90_us"], quantile(training[1:], 0.9))
    ev = result["evaluation"]
    assert ev["count"] == 3 and ev["median_us"] == pytest.approx(statistics.median(e["dur"] for e in passes))


def assert_training_only(events, iterations, graphs):
    """One step slice per iteration, as long as it, no evaluation, and each graph call in
    ``graphs`` (one per iteration) inside one step."""
    steps = step_slices(events)
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(ITERS)]
    assert not ops(events, "eval")
    assert_span(events, steps, iterations)
    assert len(graphs) == ITERS
    for g in graphs:
        assert sum(s["ts"] <= g["ts"] and g["ts"] + g["dur"] <= s["ts"] + s["dur"] for s in steps) == 1


def test_training_a_model_in_eval_mode_makes_steps_not_evaluation(tmp_path):
    """Frozen batch norm: every forward runs under ``model.eval()`` with grad enabled, and a
    backward follows it. The first such forward is undecided until its backward (its events
    carry no step); from then on they are training at once."""
    _, events, iterations, _ = run_loop(tmp_path, "frozen_norm")
    forwards = [g for g in ops(events, "dynamo_graph") if g["name"].endswith(" forward")]
    assert_training_only(events, iterations, forwards)
    # the first, before any training work (undecided from the trace's start), is step 0's
    assert [g["args"].get("step") for g in forwards] == [None, *range(1, ITERS)]


def test_a_frozen_teachers_no_grad_forward_is_part_of_the_step(tmp_path):
    """Distillation: a no_grad forward followed at once by training work (no data, no
    zero_grad between) is the step's, not an evaluation."""
    _, events, iterations, _ = run_loop(tmp_path, "distill")
    teacher = [g for g in ops(events, "dynamo_graph") if g["name"].endswith("inference")]
    assert_training_only(events, iterations, teacher)


@pytest.mark.parametrize("shape", ["nanogpt", "ema_eval"])
def test_evaluation_that_training_resumes_from_at_once_is_apart(tmp_path, shape):
    """Evaluation with no DataLoader batch or ``zero_grad()`` before the next training forward:
    of the model trained next (nanoGPT, at the top of the loop), or over several batches (an
    average of the weights). A ``zero_grad()`` at the end of the loop's body belongs to the
    step it follows, so the step after an evaluation is as long as its iteration. nanoGPT's
    first evaluation, before any optimizer step, is an evaluation too."""
    _, events, iterations, evals = run_loop(tmp_path, shape)
    steps = step_slices(events)
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(2 * ITERS)]
    passes = sorted(ops(events, "eval"), key=lambda e: e["ts"])
    assert len(passes) == len(evals) == (3 if shape == "nanogpt" else 2)
    assert_close(passes[1]["dur"], evals[1])  # the first one compiled its graph
    training = [t for i, t in enumerate(iterations) if (i + 1) % (ITERS + 1)]  # not the evaluations
    # the step before a first evaluation ends at its compile
    assert_steps_close(steps[1:], training[1:len(steps)], rel=0.15)
    for s in steps:
        held = sorted((e for e in ops(events, "optimizer") if inside(e, s)), key=lambda e: e["ts"])
        assert [e["name"] for e in held] == ["AdamW.step", "AdamW.zero_grad"], s["name"]


@pytest.mark.parametrize("shape, per_step", [
    ("replaced", [["SGD.zero_grad", "SGD.step"]] * ITERS + [["AdamW.zero_grad", "AdamW.step"]] * 2 * ITERS),
    ("sam", [["SAM.zero_grad", "SGD.step", "SAM.zero_grad"]] * ITERS),
])
def test_optimizers_of_the_same_parameters_step_as_one(tmp_path, shape, per_step):
    """A new optimizer that takes over the parameters of an earlier one (a fine-tuning phase, a
    new one per epoch) and a wrapper that steps the optimizer it wraps (SAM) count as one
    optimizer: one step per iteration, each as long as its iteration."""
    _, events, iterations, _ = run_loop(tmp_path, shape)
    steps = step_slices(events)
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(len(per_step))]
    held = [[e["name"] for e in sorted(ops(events, "optimizer"), key=lambda e: e["ts"]) if inside(e, s)]
            for s in steps]
    assert held == per_step
    assert_steps_close(steps[1:-1], iterations[1:-1], rel=0.15)


def test_a_region_between_zero_grad_and_the_forward_is_in_the_step_it_begins(tmp_path):
    """The step begins at ``zero_grad()``: the ``load`` region that follows, and the data slice
    inside it, are in that step (its number, its slice), where they happened."""
    _, events, iterations, _ = run_loop(tmp_path, "region_load")
    steps = step_slices(events)
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(ITERS)]
    for i, s in enumerate(steps):
        held = sorted((e for e in events if e.get("cat") in ("optimizer", "region", "data") and inside(e, s)),
                      key=lambda e: e["ts"])
        assert [e["name"] for e in held] == ["DataLoader.__iter__"] * (i == 0) + [
            "SGD.zero_grad", "load", "data", "SGD.step"], (s["name"], held)
        load, data = held[-3], held[-2]
        assert load["args"]["step"] == data["args"]["step"] == i and inside(data, load), (load, data)
        assert load["dur"] >= 1e6 * SLEEP_S and data["dur"] > 0, (load, data)
    assert_steps_close(steps[1:-1], iterations[1:-1], rel=0.15)


def test_a_region_holding_the_batch_that_begins_a_step_is_inside_that_step(tmp_path):
    """A step begins at the batch it loads; a ``region`` around that batch (begun before it) is
    where the step begins: the region, and the data slice in it, nest in the step."""
    _, events, _, _ = run_loop(tmp_path, "region_fetch")
    steps = step_slices(events)
    loads = sorted((e for e in events if e.get("cat") == "region"), key=lambda e: e["ts"])
    assert len(steps) == len(loads) == ITERS
    for i, (s, load) in enumerate(zip(steps, loads)):
        data = [e for e in ops(events, "data") if e["name"] == "data" and inside(e, load)]
        assert load["args"]["step"] == i and len(data) == 1 and load["dur"] >= 1e6 * SLEEP_S, (load, data)
        assert inside(load, s) and (i == 0 or s["ts"] == load["ts"]), (s, load)


def test_a_held_region_is_recorded_outside_the_step_windows_too(tmp_path):
    """Regions are recorded in every step (data slices only in the windows), also those held
    back behind a ``zero_grad()``."""
    _, events, _, _ = run_loop(tmp_path, "region_load", env={"DFTRACER_STEPS": "2-3"})
    loads = sorted(e["args"]["step"] for e in events if e.get("cat") == "region")
    assert loads == list(range(ITERS)), loads
    assert sorted(e["args"]["step"] for e in ops(events, "data") if e["name"] == "data") == [2, 3]


def test_a_zero_grad_through_an_optimizer_wrapper_ends_its_steps_iteration(tmp_path):
    """accelerate's gradient accumulation: one step per optimizer step (4 batches), and the
    ``zero_grad()`` after it at the end of the body, which reaches the optimizer through
    accelerate's wrapper, is in that step, not the start of the next."""
    _, events, iterations, _ = run_loop(tmp_path, "accelerate")
    steps = step_slices(events)
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(ITERS)]
    held = [[e["name"] for e in sorted(ops(events, "optimizer"), key=lambda e: e["ts"]) if inside(e, s)]
            for s in steps]
    # accelerate's wrapper is stepped every batch (it steps the optimizer at the 4th): its slices
    assert held == [["AcceleratedOptimizer.step"] * 4 + ["SGD.step", "SGD.zero_grad"]] * ITERS, held
    assert_span(events, steps, iterations)


def test_an_optimizer_step_the_grad_scaler_skips_still_ends_the_step(tmp_path):
    _, events, iterations, _ = run_loop(tmp_path, "amp_skip")
    steps = step_slices(events)
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(ITERS)]
    sgd = [e["args"]["step"] for e in ops(events, "optimizer") if e["name"] == "SGD.step"]
    assert sgd == [i for i in range(ITERS) if i not in (2, 3)]  # skipped steps ran no optimizer
    assert_steps_close(steps[1:-1], iterations[1:-1])


def test_an_optimizer_step_the_loop_skips_still_ends_the_iteration(tmp_path):
    """``if torch.isfinite(loss): optimizer.step()``: the next ``zero_grad()`` after a backward that
    no optimizer step followed begins the next iteration."""
    _, events, iterations, _ = run_loop(tmp_path, "skip_nonfinite")
    steps = step_slices(events)
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(ITERS)]
    sgd = [e["args"]["step"] for e in ops(events, "optimizer") if e["name"] == "SGD.step"]
    assert sgd == [i for i in range(ITERS) if i not in (2, 3)]
    zero_grads = sorted(e["ts"] for e in ops(events, "optimizer") if e["name"] == "SGD.zero_grad")
    assert all(abs(s["ts"] - z) <= 1 for s, z in zip(steps[1:], zero_grads[1:], strict=True))
    assert_steps_close(steps[1:-1], iterations[1:-1])


def test_an_lbfgs_closure_is_inside_its_step(tmp_path):
    """The closure's ``zero_grad()`` and backward, called several times by ``LBFGS.step``, are the
    step's: one step per iteration."""
    _, events, iterations, _ = run_loop(tmp_path, "lbfgs")
    steps = step_slices(events)
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(ITERS)]
    lbfgs = [e for e in ops(events, "optimizer") if e["name"] == "LBFGS.step"]
    assert [len([e for e in lbfgs if inside(e, s)]) for s in steps] == [1] * ITERS
    assert all(len([e for e in ops(events, "backward") if inside(e, s)]) >= 2 for s in steps)
    assert_steps_close(steps[1:-1], iterations[1:-1])


def test_a_mark_after_the_optimizer_step_ends_that_step(tmp_path):
    _, events, iterations, _ = run_loop(tmp_path, "marked")
    steps = step_slices(events)
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(ITERS)]
    assert all(any(e["args"]["step"] == s["args"]["step"] for e in ops(events, "optimizer")) for s in steps)
    # each step after the first lasts from one mark to the next (the loop's clock, read at the marks)
    assert_steps_close(steps[1:], iterations[:ITERS - 1])


def test_an_optimizer_step_inside_the_compiled_function_ends_each_step(tmp_path):
    """Dynamo traces the optimizer's hooks and the backward and zero_grad wrappers: each still
    runs (one step and one optimizer slice per iteration), and every graph break is located at
    the user's line, none inside the tracer's own code."""
    _, events, iterations, _ = run_loop(tmp_path, "compiled_step")
    steps = step_slices(events)
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(ITERS)]
    assert [optimizer_steps_in(events, s) for s in steps] == [1] * ITERS
    assert_span(events, steps, iterations)
    breaks = [e["args"] for e in ops(events, "dynamo_compile") if e["name"] == "graph break"]
    assert len(breaks) >= 3, breaks  # backward, the optimizer's pre-hook, zero_grad
    assert all(b["location"].startswith(SCRIPT + ":") for b in breaks), breaks
    assert not any("dftrace_dynamo" in b["reason"] for b in breaks), breaks


def test_step_windows_count_only_recorded_steps(tmp_path):
    path, _, _, _ = run_loop(tmp_path, "gan", env={"DFTRACER_STEPS": "3-4"})
    steps = summary_json(path)[0]["steps"]
    assert len(steps["rows"]) == ITERS and steps["recorded_steps"] == 2
    assert steps["steady"]["steps"] == 2
    assert [r["step"] for r in steps["rows"] if r["recorded"]] == [3, 4]
