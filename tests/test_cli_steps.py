"""Step analysis: summary's step, graphs and rank views, warm-up steps apart (diff between
runs: test_cli_diff.py), runs kept apart, and big traces cut by convert --split. Traces with step structure
are written by the real C writer (tests/scripts/stepgen.py) and by real traced training loops."""

import json
import os
import textwrap
import time

import pytest

import perfetto_tp
from backend_support import is_eager, run_py, run_torchrun
from scripts.clitools import assert_bad_input, cli, summary_json
from subproc import run_python
from tracefile import read_events

STEPGEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "stepgen.py")
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
SLOW_MS = 20


def stepgen(prefix, *args, env=None):
    """Writes a step-structured trace through _core; returns its path."""
    return run_python([STEPGEN, str(prefix), *map(str, args)], env=env).stdout.strip()


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    """12 steps; step 0 compiles (with a graph break), step 8 recompiles, layers.1 costs 20 ms more in steps 3-5."""
    d = tmp_path_factory.mktemp("loop")
    return stepgen(d / "train", "--steps", 12, "--slow", f"3-5:{SLOW_MS}", "--graph-break", "--recompile-at", 8)


def test_step_view_splits_each_step_and_leaves_warmup_out(loop):
    result = summary_json(loop)[0]
    steps = result["steps"]
    rows = {r["step"]: r for r in steps["rows"]}
    assert sorted(rows) == list(range(12))
    assert {w["step"]: w["reason"] for w in steps["warmup_steps"]} == {0: "compiled", 8: "recompiled"}
    events = read_events(loop)
    slices = {e["args"]["step"]: e["dur"] for e in events if e.get("cat") == "step"}
    for n, r in rows.items():
        assert r["wall_us"] == pytest.approx(slices[n])
        own = [e for e in events if e.get("args", {}).get("step") == n]
        for part, match in (("data", lambda e: e["cat"] == "data"), ("backward", lambda e: e["cat"] == "backward"),
                            ("optimizer", lambda e: e["cat"] == "optimizer"),
                            ("forward", lambda e: e["cat"] == "dynamo_graph" and e["args"]["phase"] == "forward")):
            assert r[f"{part}_us"] == pytest.approx(sum(e["dur"] for e in own if match(e)))
        inside = sum(r[f"{p}_us"] for p in ("data", "forward", "backward", "optimizer", "gc"))
        assert r["other_us"] == pytest.approx(r["wall_us"] - inside)
        assert r["coverage"] == pytest.approx(inside / r["wall_us"])
    # the injected cost shows in steps 3-5 only, in their forward
    normal = [rows[n]["forward_us"] for n in (1, 2, 6, 7, 9, 10, 11)]
    for n in (3, 4, 5):
        assert rows[n]["forward_us"] - max(normal) == pytest.approx(SLOW_MS * 1000, rel=0.01)
    steady = [r["wall_us"] for n, r in rows.items() if n not in (0, 8)]
    st = steps["steady"]
    assert st["steps"] == 10
    assert st["min_us"] == pytest.approx(min(steady)) and st["max_us"] == pytest.approx(max(steady))
    assert st["median_us"] == pytest.approx(sorted(steady)[4] / 2 + sorted(steady)[5] / 2)
    assert st["max_us"] > st["median_us"] + SLOW_MS * 900 > st["median_us"]  # 3 of 10 steps slow: p90 sees them
    # every statistic leaves the warm-up steps out: 24 ops per step, 10 steady steps
    assert result["op_events"] == 240
    assert summary_json(loop, "--include-warmup")[0]["op_events"] == 288
    assert max(r["total_us"] for r in result["views"]["op"]) < 100_000  # no compile-time op in the means


SLOW_LOOP = """
    import time
    import torch
    import torch.nn as nn
    from dftrace_dynamo import create_backend, dftracer

    state = {"step": 0}


    @torch.compiler.disable
    def straggle():  # the injected cost, run eagerly between the two graphs (no guard on the step)
        if 3 <= state["step"] <= 5:
            time.sleep(%(sleep)s)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

        def forward(self, x):
            x = self.fc1(x).relu()
            straggle()
            return self.fc2(x)


    log = dftracer.initialize_log("loop", None, -1)
    model = Net()
    compiled = torch.compile(model, backend=create_backend())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10):
        state["step"] = step
        opt.zero_grad()
        compiled(torch.randn(8, 16)).sum().backward()
        opt.step()
    log.finalize()
"""


def test_traced_training_loop_with_a_slow_module_in_steps_3_to_5(tmp_path):
    sleep_s = 0.2  # well above what load adds to the steps without it
    run_py(SLOW_LOOP % {"sleep": sleep_s}, tmp_path)
    (path,) = [str(p) for p in tmp_path.glob("loop*.pfw*")]
    result = summary_json(path)[0]
    steps = result["steps"]
    assert steps["warmup_steps"] == [{"step": 0, "reason": "compiled"}]  # forward, backward compiled
    rows = {r["step"]: r for r in steps["rows"]}
    assert sorted(rows) == list(range(10))
    for n in range(1, 10):  # the sleep is in the compiled model's call (eager ops on): forward of its step
        if n in (3, 4, 5):
            assert rows[n]["forward_us"] >= 0.95 * sleep_s * 1e6, rows[n]
        else:
            assert rows[n]["forward_us"] < 0.5 * sleep_s * 1e6, rows[n]
        assert rows[n]["other_us"] < 0.5 * sleep_s * 1e6, rows[n]
        assert rows[n]["forward_us"] > 0 and rows[n]["backward_us"] > 0 and rows[n]["optimizer_us"] > 0
    assert steps["steady"]["steps"] == 9 and steps["steady"]["max_us"] >= sleep_s * 1e6
    # the op views leave step 0 out
    ops = [e for e in read_events(path) if e.get("cat") == "dynamo"]  # the graphs' ops and the eager ones
    assert any(is_eager(e) for e in ops) and any("node" in e["args"] for e in ops)
    assert result["op_events"] == len([e for e in ops if e["args"]["step"] != 0]) > 0
    with_warmup = summary_json("--include-warmup", path)[0]
    assert with_warmup["op_events"] == len(ops) and with_warmup["steps"]["steady"]["steps"] == 10


def test_step_view_with_warmup_included(loop):
    steps = summary_json(loop, "--include-warmup")[0]["steps"]
    assert steps["include_warmup"] and steps["steady"]["steps"] == 12
    assert steps["steady"]["max_us"] == max(r["wall_us"] for r in steps["rows"])  # step 0 compiled: slowest


def test_table_header_lists_compiles_breaks_and_recompiles(loop):
    p = cli("summary", loop, "--top", "3")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "compiled: 1 graph, 1 graph break, 1 recompile" in lines
    assert "  graph break at train.py:57 (1x, step 0): Unsupported: builtin print" in lines
    assert ("  recompile at train.py:42 (1x, step 8): tensor 'x' size mismatch at index 0. expected 8, actual 4"
            in lines)
    assert ("steps: 12; warm-up, left out of every statistic (--include-warmup counts it): step 0 compiled, "
            "step 8 recompiled") in lines
    step_section = p.stdout.split("Steps (ms; warm-up steps marked)\n")[1].split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in step_section[1:-1]] == ["0", "1", "2", "3", "8"]  # warm-up + --top 3
    assert "warm-up: recompiled" in step_section[-2] and "more steady-state steps" in step_section[-1]
    graphs = cli("summary", loop, "--by", "graphs").stdout
    assert "graph break at train.py:57 in forward (1x, steps 0;" in graphs
    # the trace's event names (pydftracer's), in the user's words
    assert "  compile of forward() at train.py:42: " in graphs
    assert "  compile of a backward graph (at its first backward): " in graphs
    assert "dynamo compile" not in graphs and "lazy_backward" not in graphs


def test_table_names_ops_without_the_trace_prefix(loop):
    out = cli("summary", loop, "--by", "op").stdout
    rows = out.split("Top ops by total time\n")[1].splitlines()[1:]
    assert {row.split()[0] for row in rows} == {"t.default", "addmm.default", "relu.default",
                                                "threshold_backward.default", "mm.default", "sum.dim_IntList"}
    assert summary_json(loop)[0]["views"]["op"][0]["key"].startswith("function.")  # json keeps the trace's names


def test_compile_document(loop):
    comp = summary_json(loop)[0]["compile"]
    assert comp["graphs_compiled"] == 1
    assert [(b["reason"], b["location"], b["steps"]) for b in comp["graph_breaks"]] == [
        ("Unsupported: builtin print", "train.py:57", [0])]
    assert [(r["location"], r["steps"]) for r in comp["recompiles"]] == [("train.py:42", [8])]


def test_step_csv_and_plot(loop, tmp_path):
    p = cli("summary", loop, "--by", "step", "--format", "csv")
    header, *rows = p.stdout.splitlines()
    assert header.startswith("step,processes,wall_us,data_us") and len(rows) == 12
    png = tmp_path / "steps.png"
    assert cli("summary", loop, "--plot", png).returncode == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20000
    only_steps = tmp_path / "only_steps.png"  # no op view asked for: the step timeline alone
    p = cli("summary", loop, "--by", "step", "--plot", only_steps)
    assert p.returncode == 0, p.stderr
    assert only_steps.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and only_steps.stat().st_size < png.stat().st_size


def test_warmup_rule():
    from dftrace_dynamo.traces import steps

    slices = [(0, 1, 1, n, n * 100.0, 100.0) for n in range(5)]
    kinds = {}  # no step parts given

    def warm(compile_at):
        records = [{"file": 0, "pid": 1, "ts": n * 100.0 + 10, "step": None, "kind": "compile", "name": "c"}
                   for n in compile_at]
        return {k[2] for k in steps.analyse(slices, [], records, kinds)["warmup_keys"]}

    assert warm([0]) == {0}
    assert warm([0, 1, 3]) == {0, 1, 3}  # a later compile makes its step warm-up again
    assert warm([1]) == {1}  # step 0 compiled nothing: it is the first clean step
    assert warm([]) == set()
    # outside every slice, a compile belongs to its args.step
    out = {"file": 0, "pid": 1, "ts": 10_000.0, "step": 2, "kind": "recompile", "name": "recompile"}
    assert steps.analyse(slices, [], [out], kinds)["warmup_keys"] == [(0, 1, 2)]


def test_traces_without_steps_keep_working(tmp_path):
    from scripts import tracegen

    trace = tracegen.write(tmp_path / "old.pfw.gz", 500)
    result = summary_json(trace)[0]
    assert result["steps"] is None and result["op_events"] == 500
    table = cli("summary", trace, "--by", "step", "--by", "op").stdout
    assert "(no step slices in these traces)" in table and "Top ops by total time" in table


def test_two_runs_land_in_two_directories_and_are_not_mixed(tmp_path):
    script = os.path.join(SCRIPTS, "compile_eager.py")
    for _ in range(2):
        assert cli("run", "--out", tmp_path, "--compile-all", script, "0").returncode == 0
    dirs = sorted(tmp_path.iterdir())
    assert len(dirs) == 2 and all(d.name.startswith("compile_eager-") for d in dirs)
    files = [next(d.glob("*.pfw.gz")) for d in dirs]
    starts = [next(e for e in read_events(str(f)) if e["name"] == "start") for f in files]
    assert [s["args"]["run_id"] for s in starts] == [d.name for d in dirs]
    line = assert_bad_input(cli("summary", tmp_path), "2 different runs", "--all-runs")
    assert f"run {dirs[0].name}" in line and f"run {dirs[1].name}" in line
    one = summary_json(dirs[0])[0]
    assert one["op_events"] > 0 and len(one["runs"]) == 1
    both = summary_json(tmp_path, "--all-runs")[0]
    assert both["op_events"] == 2 * one["op_events"]


def test_runs_without_run_id_are_told_apart_by_time(tmp_path):
    first = stepgen(tmp_path / "a", "--steps", 3)
    time.sleep(0.5)  # stepgen's events run ~0.1 s past its own exit: start the next run after them
    second = stepgen(tmp_path / "b", "--steps", 3)  # written after the first: another run
    assert_bad_input(cli("summary", first, second), "2 different runs", os.path.basename(first))


RANK_SCRIPT = """
    import os
    import time
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from dftrace_dynamo import Dynamo
    from dftrace_dynamo.session import logger

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    logger.ensure_open()  # the file opens now, so the step slices below are recorded from step 0
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
    tracer = Dynamo(name="ddp", epoch=0, step=0)
    compiled = tracer.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):  # each optimizer step ends a step slice
        tracer.update(step=step)
        opt.zero_grad()
        compiled(torch.randn(4, 8) + rank).sum().backward()
        if rank == 1:
            time.sleep(0.05)  # the straggler
        dist.barrier()
        opt.step()
    dist.destroy_process_group()
"""


def test_rank_view_on_a_two_rank_torchrun_trace(tmp_path):
    script = tmp_path / "train_ddp.py"
    script.write_text(textwrap.dedent(RANK_SCRIPT))
    run_torchrun(script, tmp_path, tmp_path / "ddp")
    result = summary_json(*sorted(tmp_path.glob("ddp-*.pfw*")))[0]
    steps = result["steps"]
    assert [r["process"].split()[0:2] for r in steps["ranks"]] == [["rank", "0"], ["rank", "1"]]
    assert all(r["steps"] >= 4 for r in steps["ranks"])  # step 0 (and 1 if it compiled backward) is warm-up
    # synchronous training: the barrier makes every rank's step as slow as the straggler's
    assert all(r["median_us"] >= 50_000 for r in steps["ranks"])
    spread = steps["rank_spread"]
    assert spread is not None and 0 <= spread["spread_us"] < 25_000
    table = cli("summary", tmp_path, "--by", "rank").stdout
    assert "By rank (steady-state step time, ms)" in table and "slowest: rank " in table


def test_rank_view_names_the_slowest_rank(tmp_path):
    job = {"DFTRACER_RUN_ID": "job-1"}  # one run: the two ranks' files carry the same run id
    stepgen(tmp_path / "r", "--steps", 10, "--rank", 0, env=job)
    stepgen(tmp_path / "r", "--steps", 10, "--rank", 1, "--slow", "0-99:3", env=job)
    result = summary_json(tmp_path)[0]
    ranks = result["steps"]["ranks"]
    assert [r["process"].split(" (")[0] for r in ranks] == ["rank 0", "rank 1"]
    assert all(r["steps"] == 9 for r in ranks)
    spread = result["steps"]["rank_spread"]
    assert spread["slowest"].startswith("rank 1") and spread["fastest"].startswith("rank 0")
    assert spread["spread_us"] == pytest.approx(3000, rel=0.05)
    assert spread["spread"] == pytest.approx(3000 / ranks[0]["median_us"], rel=0.05)
    assert ranks[1]["ops_median_us"] - ranks[0]["ops_median_us"] == pytest.approx(3000, rel=0.05)
    csv_rows = cli("summary", tmp_path, "--by", "rank", "--format", "csv").stdout.splitlines()
    assert csv_rows[0].startswith("process,steps,min_us") and len(csv_rows) == 3


GRAPH_BREAK_SCRIPT = """
    import torch
    from dftrace_dynamo import tracer_backend

    def f(x, n):
        y = x.relu()
        print("a graph break")
        return y * n

    g = torch.compile(f, backend=tracer_backend)
    g(torch.ones(3), 2)
    g(torch.ones(3), 3)  # n is specialised: a recompile
"""


def test_real_graph_breaks_and_recompiles_are_listed(tmp_path):
    script = tmp_path / "breaks.py"
    script.write_text(textwrap.dedent(GRAPH_BREAK_SCRIPT))
    p = cli("run", "--out", tmp_path / "t", script)
    assert p.returncode == 0, p.stderr
    (run_dir,) = (tmp_path / "t").iterdir()
    comp = summary_json(run_dir)[0]["compile"]
    assert comp["graphs_compiled"] == 3  # f up to the print, the rest of f, the rest again for n == 3
    (brk,) = comp["graph_breaks"]
    assert brk["location"] == f"{script}:7" and "print" in brk["reason"] and brk["frame"] == "f"
    (rec,) = comp["recompiles"]
    assert rec["reason"] == "n == 2" and rec["location"] == f"{script}:7"
    lines = cli("summary", run_dir).stdout.splitlines()
    assert "compiled: 3 graphs, 1 graph break, 1 recompile" in lines
    (brk_line,) = [line for line in lines if line.startswith(f"  graph break at {script}:7 (1x): ")]
    assert "print" in brk_line  # the reason, its explanation and hints on one line
    assert f"  recompile at {script}:7 (1x): n == 2" in lines


def test_split_parts_load_in_perfetto_and_hold_every_event(loop, tmp_path):
    whole = read_events(loop)
    records = [e for e in whole if e["name"] == "dftrace_aggregates"]  # they stand for the whole file
    assert records
    meta = [e for e in whole if (e.get("ph") == "M" or e["name"] == "start") and e not in records]
    body = [e for e in whole if e not in meta and e not in records]
    p = cli("convert", loop, "--split", "--max-events", 150, "-o", tmp_path)
    assert p.returncode == 0, p.stderr
    parts = sorted(tmp_path.glob("*-part*.pfw.gz"))
    assert len(parts) >= 3
    seen = []
    for part in parts:
        events = read_events(str(part))
        assert [e for e in events if e in meta] == meta  # metadata and start in every part
        assert not [e for e in events if e["name"] == "dftrace_aggregates"]
        seen += [e for e in events if e not in meta]
        assert perfetto_tp.error_stats(part) == []
        assert cli("validate", part).returncode == 0
        # no slice cut in half: every op's graph call is in the same part
        graphs = {(e["args"]["step"], e["args"]["phase"]) for e in events if e.get("cat") == "dynamo_graph"}
        assert all((e["args"]["step"], e["args"]["phase"]) in graphs for e in events if e.get("cat") == "dynamo")
    assert sorted(map(json.dumps, seen)) == sorted(map(json.dumps, body))


def test_split_by_steps_and_time(loop, tmp_path):
    p = cli("convert", loop, "--split", "--steps", "3-5", "-o", tmp_path)
    assert p.returncode == 0, p.stderr
    (part,) = tmp_path.glob("*-steps-3-5.pfw.gz")
    events = read_events(str(part))
    assert sorted({e["args"]["step"] for e in events if "step" in e.get("args", {})}) == [3, 4, 5]
    assert len([e for e in events if e.get("cat") == "step"]) == 3
    assert perfetto_tp.error_stats(part) == []
    assert summary_json(part)[0]["steps"]["steady"]["steps"] == 3
    assert cli("convert", loop, "--split", "--time", "0:0.01", "-o", tmp_path).returncode == 0
    assert cli("convert", loop, "--split", "--steps", "10-", "-o", tmp_path).returncode == 0
    (tail,) = tmp_path.glob("*-steps-10-end.pfw.gz")
    assert {e["args"]["step"] for e in read_events(str(tail)) if e.get("cat") == "step"} == {10, 11}
    assert_bad_input(cli("convert", loop, "--split", "--steps", "50-60", "-o", tmp_path), "no step slices")
    assert_bad_input(cli("convert", loop, "--split", "--steps", "5-3", "-o", tmp_path), "A <= B")
    assert_bad_input(cli("convert", loop, "--split", "-o", tmp_path), "exactly one of")
    assert_bad_input(cli("convert", loop, "--split", "--time", "5", "-o", tmp_path), "--time")
    assert_bad_input(cli("convert", loop, "--max-events", "5", "-o", tmp_path / "x.pfw"), "go with --split")


def test_validate_warns_above_the_perfetto_ui_limit(loop, monkeypatch, capsys):
    from dftrace_dynamo.cli import main
    from dftrace_dynamo.traces import validate

    assert main(["validate", loop]) == 0
    assert "warning" not in capsys.readouterr().out
    monkeypatch.setattr(validate, "UI_MAX_EVENTS", 100)
    assert main(["validate", loop]) == 0  # a warning, not a problem
    out = capsys.readouterr().out
    assert "more than the Perfetto web UI loads" in out
    assert f"dftrace-dynamo convert {loop} --split --max-events 8000000 -o DIR" in out
