"""dftrace-dynamo validate: each Perfetto importer rule, with line numbers, and
agreement with the real Perfetto trace processor."""

import gzip
import json

import pytest

import perfetto_tp
from scripts import tracegen
from scripts.clitools import assert_bad_input, cli


def x(ts, dur, name="op", pid=1, tid=1, **extra):
    return json.dumps({"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, **extra})


def write(path, *lines, close=True):
    path.write_text("[\n" + "".join(line + "\n" for line in lines) + ("]\n" if close else ""))
    return path


def problems(p):
    """{line number or 'file': message} from validate's output."""
    out = {}
    for line in p.stdout.splitlines()[1:]:
        if line.startswith("  line "):
            where, message = line[7:].split(": ", 1)
            out.setdefault(int(where), message)
        elif line.startswith("  file: "):
            out.setdefault("file", line[8:])
    return out


def test_clean_synthetic_trace(tmp_path):
    trace = tracegen.write(tmp_path / "t.pfw.gz", 500)
    p = cli("validate", trace)
    assert p.returncode == 0 and p.stdout.startswith(f"{trace}: OK (")
    assert perfetto_tp.error_stats(trace) == []


def test_clean_real_trace(tmp_path):
    trace = tmp_path / "real.pfw"
    # the demo trains with the real C writer: validate must find it clean, and Perfetto too
    assert cli("demo", "--out", tmp_path / "demo", "--steps", "1").returncode == 0
    (trace,) = (tmp_path / "demo").iterdir()
    assert cli("validate", trace).returncode == 0
    assert perfetto_tp.error_stats(trace) == []


def test_broken_line_in_the_middle(tmp_path):
    t = write(tmp_path / "b.pfw", x(1, 1), '{"name": "op", "ph": "X", "ts": 5', x(10, 1))
    p = cli("validate", t)
    assert p.returncode == 1
    assert "not valid JSON" in problems(p)[3]
    with pytest.raises(perfetto_tp.TraceLoadError):
        perfetto_tp.query(t, "select count(*) from slice")


def test_cut_last_line_is_only_a_note(tmp_path):
    t = tmp_path / "cut.pfw"
    t.write_text("[\n" + x(1, 1) + "\n" + x(5, 1)[:20])
    p = cli("validate", t)
    assert p.returncode == 0, p.stdout
    assert "note: line 3: cut last line" in p.stdout and "no closing ']'" in p.stdout
    assert perfetto_tp.rows(t, "select count(*) n from slice") == [{"n": 1}]


def test_only_open_bracket_is_rejected(tmp_path):
    t = tmp_path / "only.pfw"
    t.write_text("[\n")
    p = cli("validate", t)
    assert p.returncode == 1 and "Unknown trace type" in problems(p)[1]


def test_sniff_needs_an_object_in_the_first_128_bytes(tmp_path):
    near = write(tmp_path / "near.pfw", *[""] * 10, x(1, 1))  # whitespace is removed before sniffing
    assert cli("validate", near).returncode == 0
    assert perfetto_tp.rows(near, "select count(*) n from slice") == [{"n": 1}]
    far = tmp_path / "far.pfw"
    far.write_text("[" + " " * 200 + "\n" + x(1, 1) + "\n]\n")
    p = cli("validate", far)
    assert p.returncode == 1 and "Unknown trace type" in problems(p)[1]
    with pytest.raises(perfetto_tp.TraceLoadError):
        perfetto_tp.query(far, "select count(*) from slice")


@pytest.mark.parametrize("pid, tid", [(-1, 1), (1, 2**32)])  # other types: test_hostile_traces
def test_pid_tid_out_of_range(tmp_path, pid, tid):
    t = write(tmp_path / "p.pfw", x(1, 1), x(5, 1, pid=pid, tid=tid))
    p = cli("validate", t)
    assert p.returncode == 1 and "not an integer in 0..2^32-1" in problems(p)[3]


def test_x_without_dur(tmp_path):
    t = write(tmp_path / "d.pfw", x(1, 1), '{"name":"nodur","ph":"X","pid":1,"tid":1,"ts":5}')
    p = cli("validate", t)
    assert p.returncode == 1 and "without a numeric dur" in problems(p)[3]
    assert [s["name"] for s in perfetto_tp.error_stats(t)] == ["json_parser_failure"]


def test_partial_overlap_reports_the_later_event(tmp_path):
    t = write(tmp_path / "o.pfw", x(20, 5, "a"), x(0, 1, "z"), x(24, 5, "b"))
    p = cli("validate", t)
    assert p.returncode == 1
    assert list(problems(p)) == [4] and "overlaps line 2" in problems(p)[4]
    assert [s["name"] for s in perfetto_tp.error_stats(t)] == ["slice_drop_overlapping_complete_event"]


def test_nesting_follows_perfetto_order_and_rounding(tmp_path):
    # child written before its parent with the same start; sub-µs durations rounded as Perfetto does
    t = write(tmp_path / "n.pfw", x(10, 1, "child"), x(10, 5, "parent"),
              x(20, 1.0004, "p2"), x(20, 1.0001, "c2"), x(30, 2, "dup"), x(30, 2, "dup"),
              x(40, 1, "other-thread", tid=2), x(40.5, 0.25, "t2", tid=2))
    p = cli("validate", t)
    assert p.returncode == 0, p.stdout
    assert perfetto_tp.error_stats(t) == []
    t2 = write(tmp_path / "n2.pfw", x(20, 1.0004, "p"), x(20, 1.0006, "c"))
    # 1000.4 ns -> 1000, 1000.6 ns -> 1001: "c" is the longer one and contains "p": no overlap
    assert cli("validate", t2).returncode == 0
    t3 = write(tmp_path / "n3.pfw", x(20, 2, "p"), x(21, 1.0006, "c"))
    assert cli("validate", t3).returncode == 1
    assert [s["name"] for s in perfetto_tp.error_stats(t3)] == ["slice_drop_overlapping_complete_event"]


def test_appended_run_after_closing_bracket(tmp_path):
    t = tmp_path / "twice.pfw"
    t.write_text("[\n" + x(1, 1) + "\n]\n[\n" + x(5, 1) + "\n]\n")
    p = cli("validate", t)
    assert p.returncode == 1 and list(problems(p)) == [3]
    assert "Perfetto stops reading here" in problems(p)[3]
    assert perfetto_tp.rows(t, "select count(*) n from slice") == [{"n": 1}]


def test_truncated_gzip_member(tmp_path):
    full = tracegen.write(tmp_path / "full.pfw.gz", 100_000)
    cut = tmp_path / "cut.pfw.gz"
    cut.write_bytes(full.read_bytes()[:-5000])
    p = cli("validate", cut)
    assert p.returncode == 1
    assert "truncated" in problems(p)["file"] and "cut last line" in p.stdout


def test_several_files_one_bad(tmp_path):
    good = tracegen.write(tmp_path / "good.pfw", 10)
    bad = write(tmp_path / "bad.pfw", x(1, 1), "{oops}")
    p = cli("validate", good, bad)
    assert p.returncode == 1
    assert f"{good}: OK" in p.stdout and f"{bad}: 1 problem " in p.stdout


def test_max_problems(tmp_path):
    t = write(tmp_path / "m.pfw", *[x(i, 2) for i in range(0, 40)])
    p = cli("validate", t, "--max-problems", "3")
    assert p.returncode == 1 and "20 problems" in p.stdout and "... and 17 more" in p.stdout


def test_gzip_and_json_array_forms(tmp_path):
    t = tmp_path / "a.json.gz"
    t.write_bytes(gzip.compress(json.dumps([json.loads(x(1, 1)), json.loads(x(3, 1))]).encode()))
    p = cli("validate", t)
    assert p.returncode == 0 and "(2 events)" in p.stdout


def test_bad_input(tmp_path):
    assert_bad_input(cli("validate", tmp_path / "nope.pfw"), "no such file")


def test_corrupt_gzip_member_fails_in_perfetto_and_convert_repairs_it(tmp_path):
    full = tracegen.write(tmp_path / "full.pfw.gz", 100_000)
    data = bytearray(full.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = bytes(64)
    bad = tmp_path / "bad.pfw.gz"
    bad.write_bytes(bytes(data))
    p = cli("validate", bad)
    assert p.returncode == 1 and "corrupt gzip data in the member at byte" in problems(p)["file"]
    with pytest.raises(perfetto_tp.TraceLoadError):
        perfetto_tp.query(bad, "select count(*) from slice")
    fixed = tmp_path / "fixed.pfw.gz"
    assert cli("convert", bad, "-o", fixed).returncode == 0
    assert cli("validate", fixed).returncode == 0
    assert perfetto_tp.error_stats(fixed) == []
