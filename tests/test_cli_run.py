"""dftrace-dynamo run: unmodified scripts traced, their output and status passed through."""

import os
import re

import pytest

from scripts.clitools import assert_bad_input, cli
from subproc import shell
from tracefile import read_events

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
EAGER = os.path.join(SCRIPTS, "compile_eager.py")


def only_trace(directory):
    """The one trace file, in the one run directory that ``run`` made under ``directory``."""
    (run_dir,) = [os.path.join(directory, n) for n in os.listdir(directory)]
    (path,) = [os.path.join(run_dir, n) for n in os.listdir(run_dir)]
    return path


def ops(path):
    return [e for e in read_events(path) if e.get("ph") == "X" and "node" in e.get("args", {})]


def test_compile_all_replaces_the_scripts_backend_and_traces_aten_ops(tmp_path):
    p = cli("run", "--out", tmp_path, "--compile-all", EAGER, "3", "hello")
    assert p.returncode == 3
    assert p.stdout == "args ['3', 'hello']\n"
    assert p.stderr.startswith("to stderr\n")
    trace = only_trace(tmp_path)
    assert os.path.basename(trace).startswith("compile_eager-")
    assert f"dftrace-dynamo summary {os.path.dirname(trace)}" in p.stderr and trace in p.stderr
    assert os.path.basename(os.path.dirname(trace)).startswith("compile_eager-")
    events = ops(trace)
    assert {"function.addmm.default", "function.threshold_backward.default"} <= {e["name"] for e in events}
    assert {e["args"]["phase"] for e in events} == {"forward", "backward"}


def test_level_torch(tmp_path):
    p = cli("run", "--out", tmp_path, "--compile-all", "--level", "torch", EAGER)
    assert p.returncode == 0, p.stderr
    names = {e["name"] for e in ops(only_trace(tmp_path))}
    assert names and not any(n.endswith(".default") for n in names)  # torch-level, no ATen overloads


def test_keep_backend_traces_graph_calls_only(tmp_path):
    p = cli("run", "--out", tmp_path, "--compile-all", "--keep-backend", EAGER)
    assert p.returncode == 0, p.stderr
    events = read_events(only_trace(tmp_path))
    graphs = [e for e in events if e.get("cat") == "dynamo_graph"]
    assert len(graphs) == 1 and graphs[0]["args"]["inner"] == "eager"
    assert ops(only_trace(tmp_path)) == []


def test_decorator_and_module_compile_with_inductor_default(tmp_path):
    p = cli("run", "--out", tmp_path, "--compile-all", os.path.join(SCRIPTS, "compile_decorator.py"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("5.04") and "torch.Size([1, 2])" in p.stdout
    assert "mode='reduce-overhead'" in p.stderr and "ignored" in p.stderr
    names = {e["name"] for e in ops(only_trace(tmp_path))}
    assert {"function.sin.default", "function.addmm.default"} <= names


def test_module_mode(tmp_path):
    p = cli("run", "--out", tmp_path / "t", "--compile-all", "-m", "compile_eager", "0", "x", cwd=SCRIPTS)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "args ['0', 'x']\n"
    assert ops(only_trace(tmp_path / "t"))


def test_without_compile_all_the_scripts_backend_is_kept(tmp_path):
    p = cli("run", "--out", tmp_path, EAGER, "0")
    assert p.returncode == 0
    assert os.listdir(tmp_path) == []
    assert "no trace written" in p.stderr and "--compile-all" in p.stderr


def test_script_using_the_tracer_traces_with_run_alone(tmp_path):
    script = tmp_path / "own.py"
    script.write_text("import torch\nfrom dftrace_dynamo import tracer_backend\n"
                      "f = torch.compile(lambda x: x.relu() + 1, backend=tracer_backend)\nf(torch.ones(2))\n")
    p = cli("run", "--out", tmp_path / "t", script)
    assert p.returncode == 0, p.stderr
    assert {e["name"] for e in ops(only_trace(tmp_path / "t"))} == {"function.relu.default", "function.add.Tensor"}


def test_script_exception_passes_through(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("raise SystemExit('boom: bad config')\n")
    p = cli("run", "--out", tmp_path / "t", script)
    assert p.returncode == 1 and "boom: bad config" in p.stderr
    script.write_text("import os\nos.kill(os.getpid(), 9)\n")
    assert cli("run", "--out", tmp_path / "t", script).returncode == 128 + 9


@pytest.mark.parametrize("args, fragment", [
    (["nope.py"], "no such script: nope.py"),
    ([], "give a script"),
    (["--keep-backend", EAGER], "--keep-backend needs --compile-all"),
    (["--level", "fx", EAGER], "invalid choice"),
])
def test_bad_input(tmp_path, args, fragment):
    assert_bad_input(cli("run", "--out", tmp_path, *args), fragment)


def test_script_options_are_the_scripts_even_when_they_look_like_runs(tmp_path):
    script = tmp_path / "argv.py"
    script.write_text("import sys\nprint(sys.argv[1:])\n")
    p = cli("run", "--out", tmp_path / "t", script, "-m", "foo", "--out", "bar", "--help")
    assert p.returncode == 0 and p.stdout == "['-m', 'foo', '--out', 'bar', '--help']\n"


DIST = os.path.join(SCRIPTS, "compile_dist.py")
TORCHRUN = "torchrun --standalone --nproc-per-node=2"


@pytest.mark.parametrize("command", [
    f"dftrace-dynamo run --out t --compile-all {TORCHRUN} {DIST} a -- --b",
    f"dftrace-dynamo run --out t --compile-all -m torch.distributed.run --standalone --nproc_per_node 2 {DIST} a -- --b",
    f"{TORCHRUN} --no-python dftrace-dynamo run --out t --compile-all {DIST} a -- --b",
])
def test_every_rank_of_a_torchrun_job_traces_into_one_run_directory(tmp_path, command):
    """``run`` around torchrun (the command or its module) or torchrun around ``run``: every
    worker runs the script with --compile-all (its own backend replaced), the script's arguments
    pass through unchanged (``--`` included), and both ranks write into one run directory."""
    p = shell(command, tmp_path, {"OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    # (the two ranks print at once: their lines can interleave)
    assert sorted(re.findall(r"rank \d args \[[^]]*\]", p.stdout)) == [f"rank {r} args ['a', '--', '--b']"
                                                                    for r in range(2)], p.stdout
    (run_dir,) = (tmp_path / "t").iterdir()
    assert run_dir.name.startswith("compile_dist-")
    files = sorted(run_dir.iterdir())
    assert [f.name.split("-")[1] for f in files] == ["rank0", "rank1"], files
    for path in files:
        names = {e["name"] for e in ops(str(path))}
        assert {"function.addmm.default", "function.threshold_backward.default"} <= names, names
    assert p.stderr.count(f"dftrace-dynamo summary {run_dir}") == 1, p.stderr


def test_a_torchrun_job_that_compiles_nothing_says_so(tmp_path):
    p = shell(f"dftrace-dynamo run --out t --compile-all {TORCHRUN} {DIST}", tmp_path,
              {"OMP_NUM_THREADS": "1", "NO_COMPILE": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    (line,) = [x for x in p.stderr.splitlines() if "no trace written" in x]
    assert "called no torch.compile" in line
    assert not (tmp_path / "t").exists()
