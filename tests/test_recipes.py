"""Every recipe of docs/recipes.rst runs as written, and gives what its text says.

The files (``.. code-block:: python`` with a ``:caption:``) and the commands
(``$`` lines of ``.. code-block:: console``) are read from the page itself, so
the documentation and this test cannot drift apart."""

import json
import os
import pathlib
import re
import statistics
import textwrap

import pytest

import perfetto_tp
from scripts.clitools import cli
from subproc import shell
from tracefile import read_events

RECIPES = pathlib.Path(__file__).resolve().parent.parent / "docs" / "recipes.rst"
_DIRECTIVE = re.compile(r"^\.\. code-block:: (\w+)\n((?:   :\w+:.*\n)*)\n((?:(?:   .*)?\n)+)", re.M)
_LABEL = re.compile(r"^\.\. _(recipe-[\w-]+):$", re.M)


def parse(text):
    """({file name: content}, {recipe label: [command, ...]}) of the page."""
    files, commands = {}, {}
    labels = [(m.start(), m.group(1)) for m in _LABEL.finditer(text)]
    for m in _DIRECTIVE.finditer(text):
        lang, options, body = m.group(1), m.group(2), textwrap.dedent(m.group(3)).strip("\n") + "\n"
        caption = re.search(r":caption: (\S+)", options)
        if lang == "python" and caption:
            files[caption.group(1)] = body
        elif lang == "console":
            label = [name for start, name in labels if start < m.start()][-1]
            commands.setdefault(label, []).extend(
                line[2:] for line in body.splitlines() if line.startswith("$ "))
    return files, commands


FILES, COMMANDS = parse(RECIPES.read_text())


def test_page_has_every_recipe():
    assert set(COMMANDS) == {"recipe-steps", "recipe-slowest-module", "recipe-diff", "recipe-torchrun",
                             "recipe-inductor", "recipe-split"}
    assert {"train.py", "blocks.py", "ddp_train.py", "inductor_model.py"} <= set(FILES)


def run_recipe(label, cwd, files=FILES, commands=COMMANDS, env=None):
    """Writes the page's ``files`` into ``cwd`` and runs the recipe's ``commands`` there as a user
    would (:func:`subproc.shell`, plus ``env``); returns their processes. One OpenMP thread: on
    CI's shared cores a program's two threads wait for a busy core in some steps (a 1 ms step of
    the diff recipe took 24 ms in half its base run), which can outweigh what a recipe shows."""
    for name, content in files.items():
        (cwd / name).write_text(content)
    env = {"OMP_NUM_THREADS": "1", **(env or {})}
    done = []
    for command in commands[label]:
        p = shell(command, cwd, env, timeout=900)
        assert p.returncode == 0, (command, p.returncode, p.stdout[-3000:], p.stderr[-3000:])
        done.append(p)
    return done


def events_under(directory):
    paths = traces_under(directory)
    assert paths, f"no trace under {directory}"
    return [e for path in paths for e in read_events(path)]


def traces_under(directory):
    # `run` may put each run in a directory of its own under --out
    return sorted(str(p) for p in pathlib.Path(directory).rglob("*.pfw*"))


def op_events(events):
    """The compiled graphs' op events (not the eager ops)."""
    return [e for e in events if e.get("cat") == "dynamo" and e.get("ph") == "X" and e["args"].get("level") != "eager"]


def test_steps_100_to_110(tmp_path):
    run_recipe("recipe-steps", tmp_path)
    events = events_under(tmp_path / "steps-run")
    # every step keeps its step slice (the step-time series covers the run); ops only in the window
    all_steps = sorted(e["args"]["step"] for e in events if e.get("cat") == "step")
    assert all_steps == list(range(200)), all_steps  # one step per iteration: step N is iteration N
    steps = list(range(100, 111))
    ops = op_events(events)
    assert {e["args"]["step"] for e in ops} == set(steps)
    # forward and backward of each traced step, nothing of the 189 others
    assert len({(e["args"]["step"], e["args"]["phase"]) for e in ops}) == 2 * len(steps)
    for name, cat in (("backward", "backward"), ("SGD.step", "optimizer")):
        assert sorted(e["args"]["step"] for e in events if e.get("cat") == cat and e["name"] == name) == steps


def test_slowest_module(tmp_path):
    run_recipe("recipe-slowest-module", tmp_path)
    rows = json.loads((tmp_path / "modules.json").read_text())["views"]["module"]
    assert [r["key"] for r in rows][:1] == ["body"], rows
    assert {"embed", "head"} <= {r["key"] for r in rows}


def test_compare_two_runs(tmp_path):
    outputs = [p.stdout for p in run_recipe("recipe-diff", tmp_path)]
    assert "function.addmm.default" in outputs[2] or "function.mm.default" in outputs[2], outputs[2]
    # 256x wider layers: far more than 20 % slower, so --fail-above fails
    assert outputs[3].strip().endswith("slower by more than 20 %"), outputs[3]


def test_torchrun_straggler(tmp_path):
    outputs = run_recipe("recipe-torchrun", tmp_path)
    names = [os.path.basename(p) for p in traces_under(tmp_path / "ddp-run")]
    assert sorted(re.search(r"-rank(\d)-", n).group(1) for n in names) == ["0", "1"], names
    info = json.loads((tmp_path / "ranks.json").read_text())["ranks"]
    # rank 1 sleeps 30 ms a batch: rank 0 waits for it in the gradient all-reduce, every step
    assert info["straggler"]["rank"] == "rank1", info
    cost = info["straggler"]["wait_caused_median_us"]

    def median(rank, part):
        return statistics.median(r[f"{part}_us"] for r in info["rows"] if r["rank"] == rank)

    # the sleep is neither compute nor communication; what rank 1 costs is rank 0's wait (less than the
    # 30 ms where rank 0 computed longer than rank 1 meanwhile: the recipe's bound is loose)
    assert median("rank1", "other") >= 0.8 * 30e3, info
    assert 0.5 * 30e3 <= cost <= median("rank0", "wall") and cost > info["threshold_us"], info
    assert median("rank0", "wait") == pytest.approx(cost, rel=0.05) and median("rank1", "wait") < 0.2 * cost, info
    # the table header and the straggler line the page quotes are what summary prints
    page = RECIPES.read_text()
    header = next(line.strip() for line in page.splitlines() if line.strip().startswith("rank          wall"))
    table = outputs[1].stdout
    assert header in [line.strip() for line in table.splitlines()], table
    straggler = re.compile(r"^ *straggler: rank1, the rank it delays waits ([\d.]+) ms per step for it \(median of "
                           r"\d+ steps; threshold [\d.]+ ms: "
                           r"3 x the step-to-step noise \([\d.]+ ms\), at least 5% of the median step\)"
                           r"; slower than its peers in eager code \(\+[\d.]+ ms per step\)$", re.M)
    assert straggler.search(page)
    line = straggler.search(table)
    assert line and float(line.group(1)) == pytest.approx(cost / 1e3, abs=0.001), table


def test_inductor_kernels(tmp_path):
    outputs = run_recipe("recipe-inductor", tmp_path)
    events = events_under(tmp_path / "inductor-run")
    kernels = [e for e in events if e.get("cat") == "kernel"]
    graphs = [e for e in events if e.get("cat") == "dynamo_graph"]
    assert kernels and graphs
    assert {e["args"]["kernel_type"] for e in kernels} <= {"cpp", "extern", "fallback", "triton"}
    assert any(e["name"].startswith("cpp_fused") for e in kernels), {e["name"] for e in kernels}
    assert any(e["name"] == "extern_kernels.addmm" for e in kernels), {e["name"] for e in kernels}
    for k in kernels:  # each inside a graph call of its thread
        assert any(g["tid"] == k["tid"] and g["ts"] <= k["ts"] and k["ts"] + k["dur"] <= g["ts"] + g["dur"] + 1e-3
                   for g in graphs), k
        assert k["args"]["aten_ops"], k
    assert "cpp_fused" in outputs[1].stdout


def _counted(events):
    # what --max-events counts: complete events other than the file's start and end records
    return [e for e in events if e.get("ph") == "X" and e.get("cat") != "dftracer"]


def test_cut_big_trace(tmp_path):
    run_recipe("recipe-split", tmp_path)
    whole = events_under(tmp_path / "big-run")
    parts = traces_under(tmp_path / "parts")
    assert len(parts) >= 2, parts
    part_events = [read_events(p) for p in parts]
    assert all(len(_counted(ev)) <= 2000 for ev in part_events), [len(_counted(ev)) for ev in part_events]
    # no op lost or repeated
    assert sum(len(op_events(ev)) for ev in part_events) == len(op_events(whole))
    window = events_under(tmp_path / "window")
    steps = {e["args"]["step"] for e in window if e.get("cat") == "step"}
    assert steps and min(steps) >= 100 and max(steps) <= 110, steps
    assert {e["args"]["step"] for e in op_events(window)} <= steps
    p = cli("validate", tmp_path / "parts", tmp_path / "window")
    assert p.returncode == 0, p.stdout + p.stderr
    assert all(perfetto_tp.error_stats(path) == [] for path in parts)

