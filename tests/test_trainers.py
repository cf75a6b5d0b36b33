"""Every recipe of docs/trainers.rst runs as written, and its trace has what the page says: one step
per optimizer step numbered as the trainer numbers them, evaluation in ``eval`` slices apart from
the steps, ops named by the model's own module paths. Files and commands are read from the page
(the parser of tests/test_recipes.py)."""

import os
import pathlib
import re

import pytest

from subproc import python, run_py
from test_recipes import parse, run_recipe, traces_under
from tracefile import read_events, traces

PAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "trainers.rst"
FILES, COMMANDS = parse(PAGE.read_text().replace(".. _trainer-", ".. _recipe-"))
TORCH = "2.13.0"


def run_page_recipe(label, cwd):
    """The recipe ``label`` of this page, run in ``cwd`` as :func:`run_recipe` runs one; its processes."""
    return run_recipe(label, cwd, FILES, COMMANDS)


def run_traces(directory):
    """{file name: events} of a recipe's run."""
    paths = traces_under(directory)
    assert paths, f"no trace under {directory}"
    return {os.path.basename(p): read_events(p) for p in paths}


def single_trace(tmp_path_factory, label, out):
    """The events of the one trace that the recipe ``label`` writes under ``out``."""
    cwd = tmp_path_factory.mktemp(label)
    run_page_recipe(label, cwd)
    (events,) = run_traces(cwd / out).values()
    return events


def of(events, cat):
    return [e for e in events if e.get("cat") == cat]


def step_numbers(events):
    return [e["args"]["step"] for e in sorted(of(events, "step"), key=lambda e: e["ts"])]


def inside(event, slices):
    return any(s["ts"] <= event["ts"] and event["ts"] + event.get("dur", 0) <= s["ts"] + s["dur"] + 1e-3
               for s in slices)


def check_evaluation(events, passes):
    """``passes`` eval slices, none overlapping a step; each holds inference graph calls whose events
    carry no step; every graph call outside them is training, in a step."""
    evals, steps = of(events, "eval"), of(events, "step")
    assert len(evals) == passes, evals
    for e in evals:
        assert not any(s["ts"] < e["ts"] + e["dur"] and e["ts"] < s["ts"] + s["dur"] for s in steps), e
    graphs = of(events, "dynamo_graph")
    in_eval = [g for g in graphs if inside(g, evals)]
    assert len({id(e) for e in evals if any(inside(g, [e]) for g in in_eval)}) == passes
    assert all(g["args"]["grad_enabled"] == 0 and "step" not in g["args"] for g in in_eval), in_eval
    training = [g for g in graphs if not inside(g, evals)]
    assert training and all(inside(g, steps) for g in training)
    assert all(g["args"]["phase"] in ("forward", "backward") for g in training)


def user_modules(events):
    return {e["args"].get("module") for e in of(events, "dynamo")} - {None, ""}


def test_every_recipe_is_tested():
    assert set(COMMANDS) == {"recipe-hf", "recipe-lightning", "recipe-ddp"}
    assert {"hf_train.py", "lit_train.py", "ddp_fit.py"} == set(FILES)


def test_lightning_keeps_torch():
    # the test extra's lightning must not bring another torch
    import torch
    pytest.importorskip("lightning")
    assert torch.__version__.split("+")[0] == TORCH


def test_integrations_import_no_trainer():
    code = ("import sys, dftrace_dynamo.integrations as i; "
            "assert not {'torch', 'transformers', 'lightning'} & set(sys.modules), sys.modules.keys(); "
            "print(sorted(i.__all__))")
    p = python(["-c", code])
    assert p.returncode == 0 and p.stdout.strip() == "['DftraceProfiler', 'DftraceTrainerCallback']", p.stderr


@pytest.mark.parametrize("name", ["DftraceTrainerCallback", "DftraceProfiler"])
def test_a_bad_window_fails_where_the_trainer_is_set_up(name):
    pytest.importorskip("transformers" if name == "DftraceTrainerCallback" else "lightning")
    from dftrace_dynamo import integrations
    with pytest.raises(ValueError):
        getattr(integrations, name)(steps="ten")


RESUMED = """
from types import SimpleNamespace as NS
import torch
from dftrace_dynamo.integrations import {cls}

hook = {cls}()
model = torch.compile(torch.nn.Linear(4, 1), backend="dftrace")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for global_step in range(100, 104):  # a run resumed at the trainer's step 100
    model(torch.randn(8, 4)).sum().backward()
    {call}
    optimizer.step()
    optimizer.zero_grad()
"""
CALLS = {
    "DftraceTrainerCallback": "hook.on_pre_optimizer_step(None, NS(global_step=global_step), None)",
    "DftraceProfiler": ("hook._lightning_module = NS(trainer=NS(global_step=global_step)); "
                        "hook.stop('[Strategy]SingleDeviceStrategy.training_step')"),
}


@pytest.mark.parametrize("cls", sorted(CALLS))
def test_steps_take_the_trainers_numbers(cls, tmp_path):
    # where the trainer calls the hook (after backward, before the optimizer step), as after a resume
    pytest.importorskip("transformers" if cls == "DftraceTrainerCallback" else "lightning")
    run_py(RESUMED.format(cls=cls, call=CALLS[cls]), tmp_path,
           {"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": str(tmp_path / "t")})
    (path,) = traces(tmp_path)
    events = read_events(path)
    assert step_numbers(events) == [100, 101, 102, 103]
    assert [e["args"]["step"] for e in of(events, "optimizer") if e["name"] == "SGD.step"] == [100, 101, 102, 103]


# ---- Hugging Face Trainer ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    return single_trace(tmp_path_factory, "recipe-hf", "hf-run")


def test_hf_steps_are_the_trainers(hf):
    assert step_numbers(hf) == [0, 1, 2, 3]  # max_steps=4
    # steps="1-": step 0 keeps its slice only; the window follows the Trainer's numbers
    assert {e["args"]["step"] for e in of(hf, "dynamo") if "step" in e["args"]} == {1, 2, 3}
    assert sorted(e["args"]["step"] for e in of(hf, "optimizer") if e["name"] == "AdamW.step") == [1, 2, 3]


def test_hf_evaluation_is_apart(hf):
    check_evaluation(hf, passes=2)  # eval_steps=2 of 4
    evals, steps = of(hf, "eval"), sorted(of(hf, "step"), key=lambda e: e["ts"])
    # one after step 1, one after step 3
    assert [sum(s["ts"] < e["ts"] for s in steps) for e in sorted(evals, key=lambda e: e["ts"])] == [2, 4]


def test_hf_modules_are_the_models(hf):
    from transformers import BertConfig, BertForSequenceClassification
    config = re.search(r"config = (BertConfig\(.*?\))\n", FILES["hf_train.py"], re.S).group(1)
    # the root's own ops (eager ops, on by default) carry its name: the variable that holds it
    names = {n for n, _ in BertForSequenceClassification(eval(config)).named_modules()} - {""} | {"model"}
    found = user_modules(hf)
    assert found <= names, found - names
    assert {"bert.encoder.layer.0.attention.self.query", "bert.encoder.layer.0.output.dense", "classifier"} <= found


# ---- Lightning --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory):
    pytest.importorskip("lightning")
    return single_trace(tmp_path_factory, "recipe-lightning", "lit-run")


def test_lightning_steps_and_evaluation(lightning_run):
    assert step_numbers(lightning_run) == list(range(8))  # 2 epochs of 4 batches
    assert len(of(lightning_run, "backward")) == 8
    check_evaluation(lightning_run, passes=2)  # one validation pass per epoch


def test_lightning_modules_are_the_models(lightning_run):
    assert user_modules(lightning_run) == {"body.0", "body.1", "head"}


def test_a_tracer_object_compiles_with_lightning_imported(tmp_path):
    pytest.importorskip("lightning")
    proc = run_py("""
        import lightning, torch
        from dftrace_dynamo import create_backend
        backend = create_backend(level="torch")
        model = torch.compile(torch.nn.Linear(4, 1), backend=backend)
        backend.update(step=3)
        model(torch.randn(2, 4))
        print("compiled")
    """, tmp_path)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]


# ---- torchrun DDP -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("ddp")
    procs = run_page_recipe("recipe-ddp", cwd)
    return procs[0], run_traces(cwd / "fit-run")


def test_ddp_every_rank(ddp):
    proc, files = ddp
    assert sorted(re.search(r"-rank(\d)-", n).group(1) for n in files) == ["0", "1"], list(files)
    for events in files.values():
        assert step_numbers(events) == list(range(16))  # 2 epochs of 8 batches
        check_evaluation(events, passes=2)
        # the DDP wrapper is the model it holds (``model``, its variable: DDP's own eager ops)
        assert user_modules(events) == {"model", "body.0", "body.1", "head"}
        # the gradient all-reduces; the barrier before the teardown follows the last step
        comm = of(events, "comm")
        assert {e["args"]["step"] for e in comm if e["name"] != "barrier"} == set(range(16))
        assert [e["args"].get("step") for e in comm if e["name"] == "barrier"] == [None]
    assert proc.stdout.count("validation loss") == 2


def test_ddp_shows_no_profiler_warning(ddp):
    # compiling the DDP wrapper would make Dynamo warn on every rank (any backend): the recipe does not
    proc, _ = ddp
    assert "Profiler record function" not in proc.stderr, proc.stderr[-3000:]


def test_ddp_shows_no_warning_of_the_tracer(ddp):
    proc, _ = ddp
    assert not re.search(r"\w+Warning\b", proc.stderr), proc.stderr[-3000:]
