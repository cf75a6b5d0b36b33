"""The flight recorder (DFTRACER_FLIGHT=N): nothing written until a trigger, then one numbered dump
of the kept steps per trigger, readable like any trace."""

import json
import os
import pathlib
import socket

import pytest

import groundtruth as gt
import perfetto_tp
from scripts.clitools import cli, summary_json
from subproc import python
from tracefile import read_events, traces

SCRIPTS = pathlib.Path(__file__).parent / "scripts"


def train(tmp_path, flight="5", **env):
    """tests/scripts/flight_train.py in flight mode with ``env``: (process, main trace, dumps in order)."""
    env = {"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": str(tmp_path / "run" / "t"), "OMP_NUM_THREADS": "1",
           **({"DFTRACER_FLIGHT": flight} if flight is not None else {}), **{k: str(v) for k, v in env.items()}}
    proc = python([str(SCRIPTS / "flight_train.py")], tmp_path, env, timeout=600)
    files = traces(tmp_path / "run")
    dumps = sorted((f for f in files if "-flight" in f), key=lambda f: int(f.rsplit("-flight", 1)[1].split(".")[0]))
    main = [f for f in files if "-flight" not in f]
    assert len(main) == 1, files
    return proc, main[0], dumps


def trigger(events):
    (record,) = [e for e in events if e.get("name") == "flight_dump"]
    return record["args"]


def step_numbers(events):
    return sorted(int(e["name"].split()[1]) for e in events if e.get("cat") == "step")


def x_events(events):
    return [e for e in events if e.get("ph") == "X" and e.get("name") != "end"]


def test_a_slow_step_writes_one_dump_of_it_and_the_steps_before(tmp_path):
    # 25 x the median step (~10 ms): the 600 ms step, never a step that busy cores stretch to 40-50 ms,
    # which the default factor (3) rightly dumps too
    proc, main, dumps = train(tmp_path, "5", STEPS=40, SLOW_STEP=25, SLEEP_S=0.6, MARKS=tmp_path / "marks.json",
                              DFTRACER_FLIGHT_SLOW=25)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(dumps) == 1, dumps
    assert dumps[0].endswith("-flight1.pfw.gz")
    events = read_events(dumps[0])
    assert step_numbers(events) == [21, 22, 23, 24, 25]
    args = trigger(events)
    assert (args["trigger"], args["step"], args["dump"]) == ("slow_step", 25, 1)
    doc = json.load(open(tmp_path / "marks.json"))
    gt.skip_if_stepped(doc["wall_steps"])
    marks = {i: (s, e) for i, s, e in doc["steps"]}
    (slow,) = [e for e in events if e.get("name") == "step 25"]
    assert slow["dur"] >= 600e3 and args["dur_ms"] >= 600
    assert marks[25][0] / 1e3 - 2e3 <= slow["ts"] and slow["ts"] + slow["dur"] <= marks[25][1] / 1e3 + 2e3
    # the kept steps in full: ops, graphs, modules, optimizer, backward of each of them
    for step in range(21, 26):
        cats = {e["cat"] for e in x_events(events) if e.get("args", {}).get("step") == step}
        assert {"step", "module", "dynamo_graph", "optimizer", "backward"} <= cats, (step, cats)
        assert sum(e["cat"] not in ("step", "module", "dynamo_graph", "optimizer", "backward")
                   for e in x_events(events) if e.get("args", {}).get("step") == step) >= 5
    assert {e.get("args", {}).get("step") for e in x_events(events)} <= {21, 22, 23, 24, 25, None}
    # the trace file itself holds no events but its metadata
    assert {e["name"] for e in read_events(main) if e.get("ph") == "X"} == {"start", "end"}
    assert "dump 1 (slow_step: step 25" in proc.stderr
    # like any trace: validate, summary, Perfetto
    p = cli("validate", dumps[0])
    assert p.returncode == 0, p.stdout + p.stderr
    doc, _ = summary_json(dumps[0])
    assert [r["step"] for r in doc["steps"]["rows"]] == [21, 22, 23, 24, 25]
    assert perfetto_tp.error_stats(dumps[0]) == []


def test_dump_and_sigusr2_write_numbered_dumps_and_recording_goes_on(tmp_path):
    proc, main, dumps = train(tmp_path, "3", STEPS=20, DUMP_AT=8, DUMP_REASON="checkpoint 8", SIGNAL_AT=15,
                              DFTRACER_FLIGHT_SLOW=1000)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [os.path.basename(d).rsplit("-", 1)[1] for d in dumps] == ["flight1.pfw.gz", "flight2.pfw.gz"]
    first, second = read_events(dumps[0]), read_events(dumps[1])
    assert (trigger(first)["trigger"], trigger(first)["reason"]) == ("dump", "checkpoint 8")
    assert (trigger(second)["trigger"], trigger(second)["reason"]) == ("signal", "SIGUSR2")
    # what is kept: the 3 steps before the one in progress, and that one (dump() in step 8, the
    # signal in step 15)
    assert step_numbers(first) == [5, 6, 7] and max(e["args"].get("step", 0) for e in x_events(first)) == 8
    assert step_numbers(second) == [12, 13, 14]
    assert f"dump: {dumps[0]}" in proc.stdout


def test_an_exception_writes_a_dump_and_still_propagates(tmp_path):
    proc, _, dumps = train(tmp_path, "4", STEPS=30, RAISE_AT=12, DFTRACER_FLIGHT_SLOW=1000)
    assert proc.returncode == 1
    assert "ValueError: boom at step 12" in proc.stderr and "Traceback" in proc.stderr
    (dump,) = dumps
    events = read_events(dump)
    args = trigger(events)
    assert (args["trigger"], args["reason"]) == ("exception", "ValueError: boom at step 12")
    assert "raise ValueError" in args["traceback"]
    # the 4 steps before it and the one in progress (no slice: it did not end)
    assert step_numbers(events) == [8, 9, 10, 11]
    assert max(e["args"].get("step", 0) for e in x_events(events)) == 12


def test_the_dump_cap_stops_a_flapping_trigger(tmp_path):
    proc, _, dumps = train(tmp_path, "2", STEPS=12, DUMP_AT="2,4,6,8", DFTRACER_FLIGHT_DUMPS=2,
                           DFTRACER_FLIGHT_SLOW=1000)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(dumps) == 2
    assert proc.stderr.count("DFTRACER_FLIGHT_DUMPS") == 1
    assert proc.stdout.count("dump: None") == 2


MEMORY = """
    import json, resource, sys
    import dftrace_dynamo
    from dftrace_dynamo import _core, step
    dftrace_dynamo.initialize_log("run/m")
    peaks = []
    for i in range(10000):
        with dftrace_dynamo.region("work", "compute", i=i, pad="x" * (i % 200)):
            pass
        step()
        if i % 1000 == 999:
            _core.flush()
            stats = _core.flight_stats()
            peaks.append((stats["bytes"], stats["kept_steps"],
                          resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
    print(json.dumps({"peaks": peaks, "stats": _core.flight_stats(), "dump": dftrace_dynamo.dump("end")}))
"""


@pytest.mark.parametrize("steps, cap", [(3, "1M"), (100000, "64K")])
def test_memory_stays_within_its_bound_over_10000_steps(tmp_path, steps, cap):
    """Bounded by N steps (N=3: at most the step in progress and 3 before it), or by the byte cap
    (64 KiB: far fewer than N steps)."""
    import textwrap

    env = {"DFTRACER_FLIGHT": str(steps), "DFTRACER_FLIGHT_BYTES": cap, "DFTRACER_FLIGHT_HANG": "0",
           "DFTRACER_FLIGHT_SLOW": "1e9"}
    proc = python(["-c", textwrap.dedent(MEMORY)], tmp_path, env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    limit = 1 << 20 if cap == "1M" else 64 << 10
    assert doc["stats"]["peak_bytes"] <= limit
    assert doc["stats"]["evicted_events"] > 9000
    kept = [k for _, k, _ in doc["peaks"]]
    if steps == 3:
        assert all(1 <= k <= 4 for k in kept), kept
        # the step in progress (10000, no slice yet) and the 3 before it; the in-progress one is
        # among the 4 kept once the writer has drained anything of it (on busy cores, a GC slice
        # or the last step's end may reach it only after step() began 10000), else 4 whole steps
        numbers = step_numbers(read_events(doc["dump"]))
        assert numbers in (list(range(9996, 10000)), list(range(9997, 10000))), numbers
    else:  # the byte cap holds far fewer steps than N, and keeps the newest
        assert all(10 <= k < 2000 for k in kept), kept
        assert step_numbers(read_events(doc["dump"]))[-1] == 9999
    rss = [r for _, _, r in doc["peaks"]]
    assert rss[-1] - rss[1] < 16 * 1024, rss  # KiB: no growth with the steps


@pytest.mark.parametrize("name, value", [("DFTRACER_FLIGHT", "many"), ("DFTRACER_FLIGHT", "-2"),
                                         ("DFTRACER_FLIGHT_SLOW", "0.5"), ("DFTRACER_FLIGHT_SLOW", "nan"),
                                         ("DFTRACER_FLIGHT_HANG", "soon"), ("DFTRACER_FLIGHT_BYTES", "12Q"),
                                         ("DFTRACER_FLIGHT_DUMPS", "0")])
def test_a_bad_value_gives_one_line_and_the_whole_trace(tmp_path, name, value):
    proc, main, dumps = train(tmp_path, "5" if name != "DFTRACER_FLIGHT" else None, STEPS=8, DUMP_AT=4,
                              **{name: value})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "dftrace_dynamo" in line]
    assert len(lines) == 1 and name in lines[0] and repr(value) in lines[0], lines
    assert dumps == [] and "dump: None" in proc.stdout
    events = read_events(main)
    assert step_numbers(events) == list(range(8))
    ops = {e["args"]["step"] for e in x_events(events) if e["name"].startswith("function.")}
    assert ops == set(range(8))


def test_a_hang_dumps_on_both_ranks_while_they_are_blocked(tmp_path):
    """Rank 1 sleeps 7 s in stall_here() before its all_reduce: both ranks dump within
    DFTRACER_FLIGHT_HANG (3 s) and 4 s more, while still blocked; rank 0's dump shows the
    all_reduce it waits in, rank 1's its own stack."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": str(tmp_path / "run" / "job"), "OMP_NUM_THREADS": "1",
           "DFTRACER_FLIGHT": "4", "DFTRACER_FLIGHT_HANG": "3", "DFTRACER_FLIGHT_SLOW": "1e9",
           "MARKS": str(tmp_path / "marks"), "STALL_S": "7"}  # the 3 s + 4 s window checked below
    argv = ["-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
            "--rdzv_endpoint", f"127.0.0.1:{port}", str(SCRIPTS / "flight_hang.py")]
    proc = python(argv, tmp_path, env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    marks = {r: json.load(open(tmp_path / f"marks.{r}.json")) for r in (0, 1)}
    gt.skip_if_stepped(marks[0]["wall_steps"] + marks[1]["wall_steps"])
    stall_start, stall_end = (t / 1e3 for t in marks[1]["stall"])
    for rank in (0, 1):
        (dump,) = traces(tmp_path / "run", f"job-rank{rank}-*-flight*")
        events = read_events(dump)
        (record,) = [e for e in events if e.get("name") == "flight_dump"]
        args = record["args"]
        assert args["trigger"] in ("hang", "peer") and args["rank"] == rank
        # written while blocked, within the hang time and a few seconds of the stall
        assert stall_start + 3e6 - 1.5e6 <= record["ts"] <= min(stall_start + 3e6 + 4e6, stall_end)
        assert step_numbers(events) == [4, 5, 6, 7]  # and step 8, in progress
        pending = [e for e in events if e.get("args", {}).get("pending") is True]
        if rank == 0:
            (op,) = pending
            assert (op["name"], op["cat"], op["args"]["peers"], op["args"]["bytes"]) == \
                ("all_reduce", "comm", [0, 1], 4)
            assert op["ts"] >= marks[0]["wait"][0] / 1e3 - 2 and op["args"]["waited_s"] >= 1.5
            assert [p["op"] for p in args["pending"]] == ["all_reduce"]
        else:
            assert pending == []
            (main,) = [v for k, v in args["stacks"].items() if k.startswith("MainThread")]
            assert "in stall_here: time.sleep(seconds)" in main[-1] and "flight_hang.py" in main[-1]
    # the origin of a hang, found with summary --by rank on the dumps
    doc, _ = summary_json(*traces(tmp_path / "run", "*-flight*"), "--by", "rank")
    assert [r["rank"] for r in doc["ranks"]["ranks"]] == ["rank0", "rank1"]
