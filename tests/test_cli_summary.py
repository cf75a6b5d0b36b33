"""dftrace-dynamo summary, end to end through the command."""

import csv
import fcntl
import io
import os
import pty
import shutil
import struct
import subprocess
import termios
from collections import defaultdict

import pytest

from backend_support import eager_ops
from scripts import tracegen
from scripts.clitools import CLI, assert_bad_input, cli, summary_json
from tracefile import read_events

OPS = 1000


def rounded(views):
    """Views with floats rounded: sums in another order differ in the last bits."""
    return {v: [{k: float(f"{x:.9g}") if isinstance(x, float) else x for k, x in row.items()} for row in rows]
            for v, rows in views.items()}


def quantile(values, q):
    """Linear interpolation between closest ranks (DuckDB's quantile_cont)."""
    values = sorted(values)
    pos = (len(values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def expected_ops(path):
    """Op-view statistics computed in Python from the events."""
    durs = defaultdict(list)
    for ev in read_events(str(path)):
        if ev.get("ph") == "X" and "node" in ev.get("args", {}):
            durs[ev["name"]].append(ev["dur"])
    return durs


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return tracegen.write(tmp_path_factory.mktemp("s") / "t.pfw.gz", OPS)


def test_op_view_matches_the_events(trace):
    result, _ = summary_json(trace)
    durs = expected_ops(trace)
    total = sum(map(sum, durs.values()))
    assert result["op_events"] == OPS
    assert result["op_time_us"] == pytest.approx(total)
    rows = {r["key"]: r for r in result["views"]["op"]}
    assert set(rows) == set(durs)
    for name, values in durs.items():
        r = rows[name]
        assert r["count"] == len(values)
        assert r["total_us"] == pytest.approx(sum(values))
        assert r["mean_us"] == pytest.approx(sum(values) / len(values))
        assert r["p50_us"] == pytest.approx(quantile(values, 0.5))
        assert r["p99_us"] == pytest.approx(quantile(values, 0.99))
        assert r["share"] == pytest.approx(sum(values) / total)
    totals = [r["total_us"] for r in result["views"]["op"]]
    assert totals == sorted(totals, reverse=True)


def test_graph_calls_and_compile_events_are_not_ops(trace):
    result, _ = summary_json(trace)
    events = read_events(str(trace))
    graphs = [e for e in events if e.get("cat") == "dynamo_graph"]
    assert result["graph_calls"] == len(graphs) > 0
    assert result["graph_time_us"] == pytest.approx(sum(e["dur"] for e in graphs))
    assert result["compile_events"] == 1 and result["compile_time_us"] == 250000
    assert not any(r["key"].startswith("graph ") for r in result["views"]["op"])


def test_nested_compile_events_count_once(tmp_path):
    lines = ['{"name":"outer","cat":"dynamo_compile","ph":"X","pid":1,"tid":1,"ts":10,"dur":100}',
             '{"name":"inner","cat":"dynamo_compile","ph":"X","pid":1,"tid":1,"ts":20,"dur":50}',
             '{"name":"later","cat":"dynamo_compile","ph":"X","pid":1,"tid":1,"ts":200,"dur":5}']
    (tmp_path / "c.pfw").write_text("[\n" + "\n".join(lines) + "\n]\n")
    result, stderr = summary_json(tmp_path / "c.pfw")
    assert result["compile_events"] == 3 and result["compile_time_us"] == 105
    assert "no op events" in stderr


def test_module_phase_graph_views(trace):
    result, _ = summary_json(trace)
    events = [e for e in read_events(str(trace)) if "node" in e.get("args", {})]
    by = defaultdict(int)
    for e in events:
        by[("module", e["args"]["module"] or "(top level)")] += 1
        by[("phase", e["args"]["phase"])] += 1
        by[("graph", f"graph {e['args']['graph']} {e['args']['phase']}")] += 1
    got = {(v, r["key"]): r["count"] for v in ("module", "phase", "graph") for r in result["views"][v]}
    assert got == dict(by)


def test_module_depth_groups_paths(tmp_path):
    lines = ['{"name":"op","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":%d,"dur":1,"args":{"node":"n","module":"%s"}}'
             % (i, m) for i, m in enumerate(["enc.layers.0.attn", "enc.layers.1.mlp", "dec.head"])]
    (tmp_path / "m.pfw").write_text("[\n" + "\n".join(lines) + "\n")
    result, _ = summary_json(tmp_path / "m.pfw", "--module-depth", "2", "--by", "module")
    assert {r["key"]: r["count"] for r in result["views"]["module"]} == {"enc.layers": 2, "dec.head": 1}
    assert list(result["views"]) == ["module"]


def test_processes_and_ranks(tmp_path):
    a = tracegen.write(tmp_path / "trace-rank0-train-h-7.pfw.gz", 100, pid=7, rank=0)
    b = tracegen.write(tmp_path / "trace-rank1-train-h-7.pfw.zst", 60, pid=7, rank=1)
    c = tracegen.write(tmp_path / "other-9.pfw", 30, pid=9)
    result, _ = summary_json(tmp_path)
    assert result["processes"] == 3 and result["op_events"] == 190
    procs = {r["key"]: r["count"] for r in result["views"]["process"]}
    assert procs == {"rank0:train [pid 7]": 100, "rank1:train [pid 7]": 60, "python [pid 9]": 30}
    assert sorted(result["files"]) == sorted(map(str, (a, b, c)))


def test_same_pid_in_two_files_stays_two_processes(tmp_path):
    tracegen.write(tmp_path / "a.pfw", 10, pid=5)
    tracegen.write(tmp_path / "b.pfw", 20, pid=5)
    result, _ = summary_json(tmp_path)
    assert sorted(r["count"] for r in result["views"]["process"]) == [10, 20]


def test_compressions_and_json_array_agree(tmp_path, trace):
    plain = tmp_path / "t.pfw"
    assert cli("convert", trace, "-o", plain).returncode == 0
    assert cli("convert", trace, "-o", tmp_path / "t.pfw.zst").returncode == 0
    assert cli("convert", trace, "-o", tmp_path / "t.json").returncode == 0
    views = [rounded(summary_json(p)[0]["views"]) for p in (trace, plain, tmp_path / "t.pfw.zst", tmp_path / "t.json")]
    assert all(v == views[0] for v in views[1:])


def test_directories_and_globs(tmp_path):
    (tmp_path / "sub").mkdir()
    tracegen.write(tmp_path / "sub" / "x.pfw.gz", 10)
    tracegen.write(tmp_path / "y.pfw", 20)
    (tmp_path / "notes.txt").write_text("not a trace, not picked up from a directory")
    assert summary_json(tmp_path)[0]["op_events"] == 30
    assert summary_json(str(tmp_path / "*.pfw"))[0]["op_events"] == 20
    assert summary_json(str(tmp_path / "**" / "*.pfw.gz"))[0]["op_events"] == 10


def test_csv_and_table(trace):
    p = cli("summary", trace, "--format", "csv", "--by", "op", "--by", "phase")
    rows = list(csv.DictReader(io.StringIO(p.stdout)))
    assert {r["view"] for r in rows} == {"op", "phase"}
    assert sum(int(r["count"]) for r in rows if r["view"] == "phase") == OPS
    assert sum(float(r["share"]) for r in rows if r["view"] == "op") == pytest.approx(1, abs=1e-4)
    table = cli("summary", trace, "--top", "3").stdout
    assert table.startswith(f"1 file, 1 process: {OPS:,} op events")
    for title in ("Top ops by total time", "By module path", "By phase", "By graph", "By process"):
        assert title in table
    op_section = table.split("Top ops by total time\n")[1].split("\n\n")[0].splitlines()
    assert len(op_section) == 1 + 3  # header + --top rows


def test_plot(tmp_path, trace):
    png = tmp_path / "ops.png"
    p = cli("summary", trace, "--plot", png, "--by", "module")
    assert p.returncode == 0, p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    # nothing to draw: no steps in the trace, no op view asked for
    assert_bad_input(cli("summary", trace, "--plot", tmp_path / "none.png", "--by", "rank"), "--plot draws")
    assert not (tmp_path / "none.png").exists()


def test_truncated_gzip_uses_what_is_readable(tmp_path):
    full = tracegen.write(tmp_path / "full.pfw.gz", 200_000)
    data = full.read_bytes()
    cut = tmp_path / "cut.pfw.gz"
    cut.write_bytes(data[: len(data) * 2 // 3])
    result, stderr = summary_json(cut)
    assert 0 < result["op_events"] < 200_000
    warning = [line for line in stderr.splitlines() if "truncated" in line]
    assert len(warning) == 1 and "gzip member at byte" in warning[0] and "is cut after" in warning[0]


def test_cut_last_line_and_missing_bracket(tmp_path):
    full = tracegen.write(tmp_path / "full.pfw", 50)
    text = full.read_text().rstrip("]\n")
    (tmp_path / "crash.pfw").write_text(text[: text.rfind("\n") + 30])  # end inside an event
    result, _ = summary_json(tmp_path / "crash.pfw")
    assert result["op_events"] == 50


def _file(name, data):
    def make(directory):
        (directory / name).write_bytes(data)
        return directory / name
    return make


def _empty_dir(directory):
    (directory / "empty").mkdir()
    return directory / "empty"


@pytest.mark.parametrize("setup, fragments", [
    (lambda d: d / "missing.pfw.gz", ["no such file or directory", "missing.pfw.gz"]),
    (_empty_dir, ["no trace files", "empty"]),
    (lambda d: str(d / "*.nomatch"), ["no files match"]),
    (_file("img.pfw", b"\x89PNG\r\n\x1a\n" + bytes(100)), ["not a trace file", "img.pfw"]),
    (_file("text.pfw", b"hello world\n"), ["not a trace file"]),
    (_file("zero.pfw", b""), ["empty file"]),
    (_file("list.pfw", b"[1, 2, 3]\n"), ["not a trace file"]),
])
def test_bad_input(tmp_path, setup, fragments):
    assert_bad_input(cli("summary", setup(tmp_path)), *fragments)


def test_bad_numbers(trace):
    assert_bad_input(cli("summary", trace, "--top", "0"), "--top")
    assert_bad_input(cli("summary", trace, "--module-depth", "0"), "--module-depth")


def test_real_trace_from_the_backend(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "scripts", "compile_eager.py")
    p = cli("run", "--out", tmp_path, "--compile-all", script, "0")
    assert p.returncode == 0, p.stderr
    (trace,) = tmp_path.glob("*/*.pfw*")
    result, _ = summary_json(trace)
    durs = expected_ops(trace)
    eager = eager_ops(read_events(str(trace)))  # the program's eager code (the loss, the optimizer) is traced too
    assert durs and eager and result["op_events"] == sum(map(len, durs.values())) + len(eager)
    assert {r["key"] for r in result["views"]["phase"]} == {"forward", "backward"}
    assert "function.addmm.default" in {r["key"] for r in result["views"]["op"]}
    assert result["compile_events"] > 0 and result["graph_calls"] == 2


def test_no_progress_bar_in_pipes(trace):
    p = cli("summary", trace)
    assert "\r" not in p.stderr and p.stderr == ""


def test_progress_bar_on_a_terminal(tmp_path):
    # the bar appears after 0.5 s: give DuckDB a few seconds of work
    tracegen.write(tmp_path / "t0.pfw.gz", 1_000_000, pid=1)
    for i in (1, 2):
        shutil.copy(tmp_path / "t0.pfw.gz", tmp_path / f"t{i}.pfw.gz")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a sized terminal
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    p = subprocess.run([*CLI, "summary", str(tmp_path), "--by", "op"], stdout=subprocess.PIPE,
                       stderr=slave, env=env)
    os.set_blocking(master, False)
    try:
        shown = os.read(master, 1 << 20)
    except BlockingIOError:
        shown = b""
    os.close(slave)
    os.close(master)
    assert p.returncode == 0 and p.stdout.startswith(b"3 files")
    assert b"summary:" in shown and b"%|" in shown  # tqdm's "summary:  67%|####..." line


@pytest.mark.parametrize("suffix", [".pfw.gz", ".pfw.zst"])
def test_large_files_are_read_in_windows_with_the_same_result(tmp_path, monkeypatch, suffix):
    from dftrace_dynamo.traces import reader, writer
    from dftrace_dynamo.traces import summary as summary_mod

    monkeypatch.setattr(writer, "MEMBER_BYTES", 16 << 10)  # many small members
    trace = tracegen.write(tmp_path / f"t{suffix}", 20_000)
    whole = summary_mod.summarize([str(trace)])
    monkeypatch.setattr(reader, "WINDOW", 40 << 10)  # the C reader's gzip windows cut members
    pieces = summary_mod.summarize([str(trace)])
    assert rounded(pieces["views"]) == rounded(whole["views"]) and pieces["op_events"] == 20_000
    # a cut file in pieces: only its last piece fails; all the rest is still used
    data = trace.read_bytes()
    cut = tmp_path / f"cut{suffix}"
    cut.write_bytes(data[: len(data) - 3000])
    damaged = summary_mod.summarize([str(cut)])
    assert 15_000 < damaged["op_events"] < 20_000
    assert len(damaged["warnings"]) == 1 and "truncated" in damaged["warnings"][0]


def test_corrupt_member_in_the_middle(tmp_path):
    full = tracegen.write(tmp_path / "full.pfw.gz", 100_000)
    data = bytearray(full.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(64)
    bad = tmp_path / "bad.pfw.gz"
    bad.write_bytes(bytes(data))
    result, stderr = summary_json(bad)
    assert 90_000 < result["op_events"] < 100_000  # only the lines around the damage are lost
    damage, skipped = stderr.splitlines()  # the member's check fails: said, as validate says it
    assert "corrupt gzip data in the member at byte" in damage and "incorrect data check" in damage
    assert "lines that are not JSON events were skipped" in skipped


def test_pydftracer_traces_count_their_dynamo_events(tmp_path):
    # the layout of pydftracer's sample trace (seed 001): ops are cat "dynamo", no node/graph args
    meta = '{"id":1,"name":"HH","cat":"dftracer","pid":3,"tid":3,"ph":"M","args":{"name":"host"}}'
    start = '{"id":2,"name":"start","cat":"dftracer","pid":3,"tid":3,"ts":10,"dur":0,"ph":"X","args":{}}'
    op = ('{"id":%d,"name":"%s","cat":"dynamo","pid":3,"tid":3,"ts":%d,"dur":%d,"ph":"X",'
          '"args":{"hhash":"f9","p_idx":-1,"grad_enabled":0,"level":1}}')
    ops = [op % (i + 3, name, 100 + 50 * i, dur)
           for i, (name, dur) in enumerate([("function.convolution.default", 22746), ("function.relu.default", 289),
                                            ("function.convolution.default", 20000)])]
    end = '{"id":9,"name":"end","cat":"dftracer","pid":3,"tid":3,"ts":900,"dur":0,"ph":"X","args":{"num_events":5}}'
    (tmp_path / "seed.pfw").write_text("[\n" + "\n".join([meta, start, *ops, end]) + "\n]\n")
    result, _ = summary_json(tmp_path / "seed.pfw")
    assert result["op_events"] == 3
    assert [(r["key"], r["count"]) for r in result["views"]["op"]] == [
        ("function.convolution.default", 2), ("function.relu.default", 1)]
    assert result["views"]["phase"][0]["key"] == "(none)"
