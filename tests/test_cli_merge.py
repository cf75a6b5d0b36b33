"""dftrace-dynamo merge: one Perfetto file, one named process per input."""

import json
import os

import perfetto_tp
from scripts import tracegen
from scripts.clitools import assert_bad_input, cli
from tracefile import read_events


def x_events(path):
    return [e for e in read_events(str(path)) if e.get("ph") == "X"]


def test_ranks_with_the_same_pid_become_distinct_named_processes(tmp_path):
    inputs = [tracegen.write(tmp_path / f"trace-rank{r}-train-h-7.pfw.gz", 40 + r, pid=7, rank=r)
              for r in range(3)]
    out = tmp_path / "merged.pfw.gz"
    p = cli("merge", *inputs, "-o", out)
    assert p.returncode == 0, p.stderr
    assert "3 processes from 3 files" in p.stdout
    assert "(pid 7 -> 8)" in p.stderr and "(pid 7 -> 9)" in p.stderr
    assert perfetto_tp.error_stats(out) == []
    procs = perfetto_tp.rows(out, "select pid, name from process where pid != 0 order by pid")
    assert procs == [{"pid": 7, "name": "rank0:train"}, {"pid": 8, "name": "rank1:train"},
                     {"pid": 9, "name": "rank2:train"}]
    threads = perfetto_tp.rows(out, "select tid, upid from thread where tid != 0 order by tid")
    assert [t["tid"] for t in threads] == [7, 8, 9] and len({t["upid"] for t in threads}) == 3
    n = perfetto_tp.rows(out, "select count(*) n from slice")[0]["n"]
    assert n == sum(len(x_events(i)) for i in inputs)
    per_process = perfetto_tp.rows(out, """
        select p.pid, count(*) n from slice s join thread_track tt on s.track_id = tt.id
        join thread using (utid) join process p using (upid)
        where s.name like 'function.%' group by p.pid order by p.pid""")
    assert [r["n"] for r in per_process] == [40, 41, 42]


def test_process_names_without_ranks_and_sort_order(tmp_path):
    a = tracegen.write(tmp_path / "a.pfw", 5, pid=100)
    b = tmp_path / "b.pfw"
    b.write_text('[\n{"name":"op","cat":"dynamo","ph":"X","pid":100,"tid":100,"ts":1,"dur":1,"args":{"node":"n"}}\n]\n')
    out = tmp_path / "m.pfw"
    assert cli("merge", a, b, "-o", out, "--all-runs").returncode == 0  # b's times are not a's run's
    names = perfetto_tp.rows(out, "select pid, name from process where pid != 0 order by pid")
    assert names == [{"pid": 100, "name": "python"}, {"pid": 101, "name": "b"}]
    meta = [e for e in read_events(str(out)) if e.get("name") == "process_sort_index"]
    assert [e["args"]["sort_index"] for e in meta] == [0, 1]


def test_other_threads_keep_apart(tmp_path):
    a = tracegen.write(tmp_path / "a.pfw", 10, pid=5, tid=6)
    b = tracegen.write(tmp_path / "b.pfw.zst", 10, pid=6, tid=6)
    out = tmp_path / "m.pfw.gz"
    assert cli("merge", a, b, "-o", out).returncode == 0
    events = [e for e in read_events(str(out)) if e.get("ph") == "X"]
    assert {(e["pid"], e["tid"]) for e in events} == {(5, 6), (6, 7)}
    assert perfetto_tp.error_stats(out) == []


def test_zstd_output_and_real_traces(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "scripts", "compile_eager.py")
    for rank in range(2):
        assert cli("run", "--out", tmp_path / "runs", "--compile-all", script, "0",
                   env={"RANK": str(rank)}).returncode == 0
    out = tmp_path / "m.pfw.zst"
    p = cli("merge", tmp_path / "runs", "-o", out, "--all-runs")  # two launches: two runs
    assert p.returncode == 0, p.stderr
    inputs = sorted((tmp_path / "runs").glob("*/*.pfw*"))  # one run directory each
    merged = read_events(str(out))
    assert len([e for e in merged if e.get("ph") == "X"]) == sum(len(x_events(i)) for i in inputs)
    assert len({e["pid"] for e in merged if e.get("ph") == "X"}) == 2
    gz = tmp_path / "m.pfw.gz"
    assert cli("convert", out, "-o", gz).returncode == 0  # Perfetto v52 cannot read zstd itself
    assert perfetto_tp.error_stats(gz) == []
    assert cli("validate", gz).returncode == 0
    names = [r["name"] for r in perfetto_tp.rows(gz, "select name from process where pid != 0 order by name")]
    assert [n.split(" (")[0] for n in names] == ["rank 0", "rank 1"]


def test_truncated_input_still_gives_a_loadable_file(tmp_path):
    full = tracegen.write(tmp_path / "full.pfw.gz", 100_000)
    cut = tmp_path / "cut.pfw.gz"
    cut.write_bytes(full.read_bytes()[:-3000])
    other = tracegen.write(tmp_path / "other.pfw", 10, pid=1)
    out = tmp_path / "m.pfw.gz"
    p = cli("merge", cut, other, "-o", out)
    assert p.returncode == 0
    assert "truncated" in p.stderr and "dropped the cut last line" in p.stderr
    assert cli("validate", out).returncode == 0
    assert perfetto_tp.error_stats(out) == []


def test_existing_output_and_output_among_inputs(tmp_path):
    a = tracegen.write(tmp_path / "a.pfw", 5)
    out = tmp_path / "m.pfw"
    assert cli("merge", a, "-o", out).returncode == 0
    assert_bad_input(cli("merge", a, "-o", out), "exists", "--force")
    assert cli("merge", a, "-o", out, "--force").returncode == 0
    assert_bad_input(cli("merge", a, out, "-o", out, "--force"), "is one of the inputs")
    assert_bad_input(cli("merge", a, "-o", tmp_path / "nodir" / "m.pfw"), "does not exist")


def test_bad_inputs(tmp_path):
    assert_bad_input(cli("merge", tmp_path / "none.pfw", "-o", tmp_path / "m.pfw"), "no such file")
    (tmp_path / "empty").mkdir()
    assert_bad_input(cli("merge", tmp_path / "empty", "-o", tmp_path / "m.pfw"), "no trace files")
    (tmp_path / "junk.pfw").write_text("garbage\n")
    assert_bad_input(cli("merge", tmp_path / "junk.pfw", "-o", tmp_path / "m.pfw"), "not a trace file")
    assert not (tmp_path / "m.pfw").exists()


def test_times_moved_onto_rank0s_clock_stay_whole_microseconds(tmp_path):
    """Rank 1's clock is 12.3456789 ms ahead of rank 0's (its clock record says so): merge moves
    its events by a whole number of µs, so every ``ts`` stays an integer, the graph slices still
    hold their ops exactly, ``validate`` passes and Perfetto keeps every slice."""
    inputs = []
    for r in range(2):
        path = tracegen.write(tmp_path / f"job-rank{r}-h-{50 + r}.pfw", 2_000, pid=50 + r, rank=r)
        lines = path.read_text().splitlines()
        clock = {"name": "clock", "cat": "dftracer", "pid": 50 + r, "tid": 50 + r, "ph": "X", "dur": 0,
                 "ts": 1_760_934_170_000_000, "args": {"rank": r, "clock_offset_ns": 12_345_678.9 * r,
                                                       "clock_error_ns": 50_000 * (r + 1)}}
        lines.insert(2, json.dumps(clock))
        path.write_text("\n".join(lines) + "\n")
        inputs.append(path)
    out = tmp_path / "m.pfw.gz"
    p = cli("merge", *inputs, "-o", out)
    assert p.returncode == 0, p.stderr
    assert "+12.346 ms from rank 0's" in p.stderr
    merged = [e for e in read_events(str(out)) if "ts" in e]
    assert all(isinstance(e["ts"], int) for e in merged), [e["ts"] for e in merged if not isinstance(e["ts"], int)][:3]
    moved = {e["ts"] for e in merged if e["pid"] == 51}
    given = {e["ts"] for e in read_events(str(inputs[1])) if "ts" in e}
    assert moved == {t - 12_346 for t in given}
    assert cli("validate", out).returncode == 0
    assert perfetto_tp.error_stats(out) == []
    n = perfetto_tp.rows(out, "select count(*) n from slice")[0]["n"]
    assert n == sum(len(x_events(i)) for i in inputs)
