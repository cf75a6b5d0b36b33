"""A program forked from the zygote (tests/zygote.py) runs as it would in a new interpreter."""

import json
import os
import subprocess
import sys

import pytest

import zygote
from subproc import clean_env

PROBE = """
import atexit, json, os, sys, threading, time
import torch
import __main__

atexit.register(lambda: print("atexit ran", flush=True))
late = threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined", flush=True)))
late.start()
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "name": __name__,
                  "file": getattr(__main__, "__file__", None), "cwd": os.getcwd(), "probe": os.environ.get("PROBE"),
                  "seed": torch.initial_seed(), "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
                  "main_is_this": __main__.__dict__ is globals()}))
if sys.argv[-1] == "raise":
    raise ValueError("the probe's own error")
sys.exit(int(sys.argv[-1]))
"""


def both(argv, cwd, env=None, timeout=120):
    """(forked, new interpreter) CompletedProcesses of ``python *argv``."""
    env = clean_env(env)
    forked = zygote.run(argv, cwd, env, timeout)
    assert forked is not None, "the zygote did not take the program"
    fresh = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return forked, fresh


def fields(proc):
    first, *rest = proc.stdout.splitlines()
    return json.loads(first), rest


@pytest.mark.parametrize("last", ["0", "3", "raise"])
def test_a_script_sees_what_a_new_interpreter_gives_it(tmp_path, last):
    script = tmp_path / "sub" / "probe.py"
    script.parent.mkdir()
    script.write_text(PROBE)
    forked, fresh = both([os.path.relpath(script, tmp_path), "x", last], tmp_path, {"PROBE": "yes"})
    (a, rest_a), (b, rest_b) = fields(forked), fields(fresh)
    assert a.pop("seed") != b.pop("seed")  # each run seeds torch anew
    assert a == b
    assert a["file"] == str(script) and a["path0"] == str(script.parent) and a["probe"] == "yes" and a["main_is_this"]
    assert rest_a == rest_b == ["thread joined", "atexit ran"]
    assert forked.returncode == fresh.returncode == {"0": 0, "3": 3, "raise": 1}[last]
    assert forked.stderr == fresh.stderr  # the traceback from the program's first frame, nothing of the zygote's
    if last == "raise":
        assert forked.stderr.startswith('Traceback (most recent call last):\n  File "')
        assert "probe's own error" in forked.stderr


def test_code_given_with_c(tmp_path):
    forked, fresh = both(["-c", PROBE, "y", "0"], tmp_path)
    (a, _), (b, _) = fields(forked), fields(fresh)
    a.pop("seed"), b.pop("seed")
    assert a == b and a["argv"] == ["-c", "y", "0"] and a["path0"] == "" and a["file"] is None


def test_a_program_past_its_timeout_is_killed_with_its_output_kept(tmp_path):
    code = "import torch, time; print('started', flush=True); time.sleep(60)"
    with pytest.raises(subprocess.TimeoutExpired) as e:
        zygote.run(["-c", code], tmp_path, clean_env(), 2)
    assert e.value.output == "started\n"


@pytest.mark.parametrize("argv, env", [(["-c", "print(1)"], None),  # no torch: a new interpreter is cheaper
                                       (["-c", "import torch, resource"], None),  # limits apply to the whole process
                                       (["-u", "-c", "import torch"], None),
                                       (["-c", "import dftrace_dynamo\nimport torch"], None),  # the tracer first
                                       (["-c", "import torch"], {"LD_PRELOAD": "x.so"})])
def test_what_a_fork_cannot_give_gets_a_new_interpreter(tmp_path, argv, env):
    assert zygote.run(argv, tmp_path, clean_env(env), 60) is None


def test_values_read_at_start_get_a_zygote_started_with_them(tmp_path, monkeypatch):
    """OpenMP reads OMP_NUM_THREADS when torch loads it: a program given another value is forked
    from a zygote that started with it."""
    monkeypatch.setattr(zygote, "_zygotes", [])  # none of this process's earlier tests
    code = "import torch; print(torch.get_num_threads())"
    for threads in ("1", "2", "1"):
        forked, fresh = both(["-c", code], tmp_path, {"OMP_NUM_THREADS": threads})
        assert forked.stdout == fresh.stdout == f"{threads}\n"
