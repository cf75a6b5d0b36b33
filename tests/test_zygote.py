"""A program forked from the zygote (tests/zygote.py) runs as it would in a new interpreter."""

import json
import os
import subprocess
import sys
import time

import pytest

import zygote
from subproc import clean_env, python

pytestmark = pytest.mark.skipif(bool(os.environ.get("TESTS_FRESH_INTERPRETERS")),
                                reason="the zygote is off (TESTS_FRESH_INTERPRETERS)")

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
left_open = open(f"left_open.{os.getpid()}", "w")  # the interpreter's exit closes it
left_open.write("written")
print(os.getpid())
if sys.argv[-1] == "raise":
    raise ValueError("the probe's own error")
if sys.argv[-1] == "message":
    sys.exit("the probe's message")
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


@pytest.mark.parametrize("last", ["0", "3", "raise", "message", "257"])
def test_a_script_sees_what_a_new_interpreter_gives_it(tmp_path, last):
    script = tmp_path / "sub" / "probe.py"
    script.parent.mkdir()
    script.write_text(PROBE)
    forked, fresh = both([os.path.relpath(script, tmp_path), "x", last], tmp_path, {"PROBE": "yes"})
    (a, rest_a), (b, rest_b) = fields(forked), fields(fresh)
    assert a.pop("seed") != b.pop("seed")  # each run seeds torch anew
    assert a == b
    assert a["file"] == str(script) and a["path0"] == str(script.parent) and a["probe"] == "yes" and a["main_is_this"]
    pids = [rest.pop(0) for rest in (rest_a, rest_b)]
    assert [(tmp_path / f"left_open.{pid}").read_text() for pid in pids] == ["written", "written"]
    assert rest_a == rest_b == ["thread joined", "atexit ran"]
    assert forked.returncode == fresh.returncode == {"0": 0, "3": 3, "raise": 1, "message": 1, "257": 1}[last]
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
        forked = zygote.run(["-c", code], tmp_path, clean_env({"OMP_NUM_THREADS": threads}), 120)
        assert forked.stdout == f"{threads}\n"  # as a new interpreter prints it
    assert [z["env"]["OMP_NUM_THREADS"] for z in zygote._zygotes] == ["1", "2"]


RANK = """
import json, os, signal, sys, time
forked = "torch._inductor.compile_fx" in sys.modules  # the zygote's, not imported by this program
import torch
import torch.distributed as dist

out, rank = sys.argv[1], int(os.environ["RANK"])
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"forked": forked, "pid": os.getpid(), "argv": sys.argv, "exec": os.environ.get("PYTHON_EXEC"),
               "world": os.environ["WORLD_SIZE"], "unbuffered": sys.stdout.write_through}, f)
print(f"rank {rank} started")  # no flush: python -u writes it at once
if sys.argv[2] == "fail":
    if rank == 0:
        time.sleep(1)
        sys.exit(3)
    signal.signal(signal.SIGTERM, lambda *_: (open(os.path.join(out, "terminated"), "w").close(), sys.exit(5)))
    time.sleep(120)
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()
"""


def _torchrun(tmp_path, monkeypatch, how):
    monkeypatch.setattr(zygote, "_zygotes", [])  # room for the one these ranks need, whatever ran before
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    argv = ["-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", str(script), str(tmp_path), how]
    proc = python(argv, tmp_path, {"OMP_NUM_THREADS": "1"}, timeout=180)
    return proc, [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_torchrun_ranks_are_forked_and_see_what_torchrun_gives_them(tmp_path, monkeypatch):
    proc, ranks = _torchrun(tmp_path, monkeypatch, "ok")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in ranks:
        assert r["forked"] and r["exec"] is None and r["world"] == "2" and r["unbuffered"]
        assert r["argv"] == [str(tmp_path / "rank.py"), str(tmp_path), "ok"]
    assert sorted(proc.stdout.splitlines()) == ["rank 0 started", "rank 1 started"]


def test_a_failed_rank_ends_the_job_and_torchruns_signal_reaches_the_others(tmp_path, monkeypatch):
    """Rank 0 exits 3; torchrun stops rank 1 with SIGTERM, sent to its launcher and passed on:
    rank 1's handler runs, and no rank outlives the job."""
    proc, ranks = _torchrun(tmp_path, monkeypatch, "fail")
    assert proc.returncode != 0 and "exitcode  : 3" in proc.stderr, proc.stderr[-3000:]
    assert all(r["forked"] for r in ranks) and (tmp_path / "terminated").exists()
    for r in ranks:
        with pytest.raises(ProcessLookupError):
            os.kill(r["pid"], 0)


def test_a_killed_launcher_takes_its_rank_with_it(tmp_path, monkeypatch):
    monkeypatch.setattr(zygote, "_zygotes", [])
    state = zygote._zygote_for(clean_env())
    script = tmp_path / "sleeper.py"
    script.write_text("import os, sys, time, torch\nprint(os.getpid(), flush=True)\ntime.sleep(120)\n")
    launcher = subprocess.Popen([state["launcher"], "-u", str(script)], cwd=tmp_path, env=clean_env(),
                                stdout=subprocess.PIPE, text=True)
    pid = int(launcher.stdout.readline())
    assert pid != launcher.pid
    launcher.kill()
    launcher.wait()
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    pytest.fail("the rank outlived its launcher")
