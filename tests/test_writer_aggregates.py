"""Aggregate records written by the C trace writer (csrc/aggregates.c): summary and diff read
them instead of every event and give what the full scan gives (counts and totals exactly,
quantiles within the sketch's bound), on real traced training (steps, modules, Inductor kernels)
and on stepgen's rank files; the sketch buckets are those of traces.sketch.key; checkpoints
written as the run goes leave a killed process's file answerable up to its last one; the files
keep loading in Perfetto and passing dftracer_validate."""

import collections
import glob
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import perfetto_tp
from dftrace_dynamo.traces import aggregates, clock, sketch
from dftrace_dynamo.traces.diff import diff
from dftrace_dynamo.traces.reader import compression_of
from dftrace_dynamo.traces.summary import summarize
from subproc import clean_env, run_py, run_python
from test_aggregates import OPTIONS
from test_engines import SCRIPTS, assert_same, rank_files, write_ranks  # noqa: F401 (fixture)
from tracefile import dftracer_validate, read_bytes, read_events

STEPGEN = os.path.join(SCRIPTS, "stepgen.py")


def logged(tmp_path, durations):
    """The path of a trace whose process logged, one after another, an op event of each duration
    (ns) of ``durations`` (op name -> list), in order."""
    p = run_py(f"""
        from dftrace_dynamo import _core
        from dftrace_dynamo.session import logger
        logger.initialize_log({str(tmp_path / "logged")!r})
        t = _core.now_ns()
        for name, ns in {durations!r}.items():
            for d in ns:
                _core.log(name, "dynamo", t, t + d, {{"node": "x"}})
                t += d + 2000
        print(_core.path())
        logger.finalize()
        """, tmp_path, env={"DFTRACER_ENABLE": "1"})
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def writer_record(path):
    record = aggregates.read(path)
    assert record and record["version"] == aggregates.WRITER_VERSION and record["complete"], path
    return record


@pytest.mark.parametrize("options", OPTIONS, ids=("default", "warmup-depth", "views"))
@pytest.mark.parametrize("trace", ["training", "rank_files"])
def test_writer_aggregates_equal_the_full_scan(trace, options, request):
    paths = request.getfixturevalue(trace)
    for p in paths:
        writer_record(p)
    options = dict({"top": None}, **options)
    events = summarize(paths, step_samples=True, source="events", **options)
    from_aggregates = summarize(paths, step_samples=True, **options)  # auto: every file has one
    assert from_aggregates["scan"] == {"source": "aggregates", "engine": "local", "quantiles": "sketch"}
    assert events["op_events"] > 20 and events["steps"]["rows"] and events["compile_events"]
    if trace == "training" and "kernel" in options.get("views", ["kernel"]):
        assert events["views"]["kernel"]
    assert assert_same(events, from_aggregates) > 0
    for view, rows in events["views"].items():  # counts and totals to the last bit
        assert [(r["key"], r["count"], r["total_us"]) for r in rows] == \
            [(r["key"], r["count"], r["total_us"]) for r in from_aggregates["views"][view]], view


def test_rank_clocks_come_from_the_writer_aggregates(tmp_path, monkeypatch):
    """Each rank's clock record is copied into its aggregate record: the rank view takes the
    measured offsets from there, without reading the files, and equals the full scan's."""
    paths = write_ranks(tmp_path, 2, "--clock-offset-ns", "3000000")
    events = summarize(paths, top=None, source="events")
    assert events["ranks"]["clock"].startswith("measured")
    assert {r["rank"]: r["clock_offset_us"] for r in events["ranks"]["ranks"]} == {"rank0": 0, "rank1": 3000}
    monkeypatch.setattr(clock, "record", lambda path: pytest.fail(f"{path} read for its clock record"))
    from_aggregates = summarize(paths, top=None)
    assert from_aggregates["scan"]["source"] == "aggregates"
    assert_same(events, from_aggregates)


def test_records_read_by_several_processes_give_the_same_summary(rank_files):
    """Many files' records are read by a pool of processes, each its share of the files: the
    summary is the one read in this process, to the last bit (groups, steps, ranks, samples)."""
    here = summarize(rank_files, top=None, step_samples=True)
    pooled = summarize(rank_files, top=None, step_samples=True, processes=2)
    assert here["scan"]["source"] == "aggregates" and here["ranks"]["rows"] and here["step_samples"]["op"]
    assert pooled == here


def test_diff_reads_the_writer_aggregates(rank_files):
    events = diff(rank_files[:1], rank_files[1:], source="events")
    from_aggregates = diff(rank_files[:1], rank_files[1:])
    assert {s["source"] for s in from_aggregates["scan"].values()} == {"aggregates"}
    assert_same(events, from_aggregates)


def test_sketch_buckets_equal_sketch_key_at_bucket_edges(tmp_path):
    """Durations 1 ns around each bucket edge gamma^k µs (and 0): the writer's bucket of each
    equals traces.sketch.key of the duration the file holds. One op gets them in rising order,
    another in falling order, a third only those under 0.5 µs, falling (buckets that grow down
    through negative keys only)."""
    durations = [0, 1, 2] + [max(0, round(1000 * sketch.GAMMA ** k) + d) for k in range(-60, 900) for d in (-1, 0, 1)]
    path = logged(tmp_path, {name: durations[::order or -1] if order else [d for d in durations[::-1] if d < 500]
                             for name, order in (("function.edge.default", 1), ("function.edge_down.default", -1),
                                                 ("function.edge_sub_us.default", 0))})
    expected = collections.Counter(sketch.key(e["dur"]) for e in read_events(path) if e.get("cat") == "dynamo")
    assert sum(expected.values()) == 2 * len(durations) + sum(d < 500 for d in durations) and len(expected) > 800
    record = writer_record(path)
    got = collections.Counter()
    for _, _, _, _, _, _, zero, _, buckets in record["groups"]:
        got.update(dict(zip(buckets[::2], buckets[1::2])))
        got[sketch.ZERO] += zero
    assert +got == expected


def test_sum_of_squares_is_exact(tmp_path):
    """Each group's sum_sq_us2 is the exact sum of its durations squared (µs², from the ns the
    file holds), far past 2^53 and 2^64, as a JSON number: no float accumulation, no exponent."""
    durations = {"function.small.default": [1, 999, 1001, 123_457] * 250,
                 "function.big.default": [3_600_000_000_123, 59_999_999_999, 7] * 40}
    path = logged(tmp_path, durations)
    record = writer_record(path)
    text = read_bytes(path).decode()
    for name, ns in durations.items():
        gid = next(i for i, key in enumerate(record["keys"]) if key[2] == name)
        (group,) = [g for g in record["groups"] if g[0] == gid]
        exact = sum(d * d for d in ns)
        whole, frac = divmod(exact, 10**6)
        written = f"{whole}.{frac:06d}".rstrip("0").rstrip(".")
        assert f",{group[3]},{group[4]},{group[5]},{group[6]},{written},[" in text, (name, written)


def _member_with_record(path):
    """(offset, end) of the last member of ``path`` holding an aggregate record."""
    kind = compression_of(path)
    return next((start, end) for start, end, text in aggregates._members_from_end(path, kind, 1 << 30, None)
                if aggregates.MARKER in text)


def test_a_killed_process_keeps_its_last_checkpoint(tmp_path):
    """SIGKILL after several step ends: the file is not closed, yet its last checkpoint answers,
    and equals the full scan of the file up to that checkpoint."""
    # 32 layers: a checkpoint is due once the events since the last are many times its record's
    # text, which grows with the steps; with many events per step the second comes in seconds
    proc = subprocess.Popen([sys.executable, STEPGEN, str(tmp_path / "k"), "--steps", "1000000", "--layers", "32",
                             "--sleep-ms", "100"], env=clean_env({"DFTRACER_ENABLE": "1"}),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline, seen = time.monotonic() + 240, set()
        while len(seen) < 2:  # two checkpoints with steps in them
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.5)
            files = glob.glob(str(tmp_path / "k-*.pfw*"))
            record = aggregates.read(files[0]) if files else None
            if record and record["op_steps"]:
                seen.add(len(record["op_steps"]))
        # kill once events follow the last checkpoint (a fixed wait can end right at one)
        while _member_with_record(files[0])[1] >= os.path.getsize(files[0]):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    path = files[0]
    assert not read_bytes(path).rstrip().endswith(b"]")  # killed: never closed
    start, end = _member_with_record(path)
    assert end < os.path.getsize(path)  # events written after the last checkpoint
    prefix = tmp_path / "prefix" / os.path.basename(path)
    prefix.parent.mkdir()
    with open(path, "rb") as f:
        prefix.write_bytes(f.read(end))
    record = writer_record(path)
    assert len(record["op_steps"]) >= 2 * 3  # several steps, forward and backward
    from_checkpoint = summarize([path], top=None, step_samples=True)
    assert from_checkpoint["scan"]["source"] == "aggregates"
    events = summarize([str(prefix)], top=None, step_samples=True, source="events")
    assert events["steps"]["rows"] and events["op_events"] > 100
    # the answer says what it left out
    assert [w for w in from_checkpoint.pop("warnings") if "not closed" in w and "--source events" in w] != []
    events.pop("warnings")
    for doc in (events, from_checkpoint):
        doc.pop("files"), doc.pop("runs")
    assert assert_same(events, from_checkpoint) > 0


def test_no_checkpoint_for_events_the_record_does_not_hold(tmp_path):
    """An op, then seconds of events that no aggregate counts (a logged region of a category of
    its own: 2.5 MB of text, far past the cadence's 64 times the record): the record would be the
    same again, so the only checkpoint is the first (at three seconds) and the last record at
    close; both hold the one op."""
    p = run_py(f"""
        import time
        from dftrace_dynamo import _core
        from dftrace_dynamo.session import logger
        logger.initialize_log({str(tmp_path / "quiet")!r})
        t = _core.now_ns()
        _core.log("function.one.default", "dynamo", t, t + 5000, {{"node": "x"}})
        time.sleep(3.6)  # the first checkpoint: three seconds after open
        end = time.monotonic() + 4.5  # past a second checkpoint's three seconds
        while time.monotonic() < end:
            for _ in range(1000):
                t = _core.now_ns()
                _core.log("app.region", "app", t, t + 1000, {{"what": "nothing the record counts"}})
            time.sleep(0.2)
        print(_core.path())
        logger.finalize()
        """, tmp_path, env={"DFTRACER_ENABLE": "1"})
    assert p.returncode == 0, p.stderr
    path = p.stdout.strip()
    events = read_events(path)
    regions = sum(e.get("cat") == "app" for e in events)
    records = [e["args"] for e in events if e.get("name") == aggregates.NAME]
    assert regions >= 5000 and len(records) == 2, (regions, len(records))
    for r in records:
        assert [g[2] for g in r["groups"]] == [1] and [k[2] for k in r["keys"]] == ["function.one.default"]


def test_files_with_checkpoints_load_in_perfetto_and_validate(tmp_path, training):
    """A run long enough for checkpoints besides the last record: several records, the last
    one counts, and the file stays a trace that Perfetto and dftracer_validate accept."""
    path = run_python([STEPGEN, str(tmp_path / "c"), "--steps", "14", "--layers", "2", "--sleep-ms", "300"],
                      env={"DFTRACER_ENABLE": "1"}).stdout.strip()
    records = [e for e in read_events(path) if e.get("name") == aggregates.NAME]
    assert len(records) >= 2 and dict(records[-1]["args"], closed=True) == writer_record(path)
    assert records[-1]["ph"] == "M" and records[-1]["cat"] == "dftracer"
    events = summarize([path], top=None, source="events")
    assert_same(events, summarize([path], top=None, source="aggregates"))
    for p in (path, training[0]):
        assert perfetto_tp.error_stats(p) == []
        dftracer_validate(p)


def test_a_file_the_writer_could_not_aggregate_is_scanned(rank_files, tmp_path):
    """A record that says it cannot answer (bounds passed) means the full scan."""
    copy = shutil.copy(rank_files[0], tmp_path)
    aggregates.write(copy, {"version": aggregates.WRITER_VERSION, "writer": "c", "complete": False})
    result = summarize([copy], top=None)
    assert result["scan"]["source"] == "events"
    assert result["views"] == summarize(rank_files[:1], top=None, source="events")["views"]


@pytest.mark.parametrize("steps, complete", [(100_000, True), (100_001, False)])
def test_the_writer_keeps_at_most_100000_steps(tmp_path, steps, complete):
    """Per-step op time grows with the steps: past 100,000 the writer stops keeping it (its memory
    stays bounded) and the record says it cannot answer."""
    p = run_py(f"""
        from dftrace_dynamo import _core
        from dftrace_dynamo.backend import Tags
        from dftrace_dynamo.session import logger
        logger.initialize_log({str(tmp_path / "many")!r})
        tags = Tags()
        op = _core.Interceptor(abs, _core.intern_site("function.abs.default", "dynamo", {{"node": "abs"}}), tags.cell)
        for i in range({steps}):
            tags.update(step=i)
            op(i)
        print(_core.path())
        logger.finalize()
        """, tmp_path, env={"DFTRACER_ENABLE": "1"})
    assert p.returncode == 0, p.stderr
    record = aggregates.read(p.stdout.strip())
    assert record["version"] == aggregates.WRITER_VERSION and record["complete"] is complete
    assert summarize([p.stdout.strip()], top=None)["op_events"] == steps


def test_merged_files_answer_from_their_events(rank_files, tmp_path):
    """A merged file holds every rank's events: no rank's record may answer for it."""
    from dftrace_dynamo.traces.merge import merge

    merge(rank_files, str(tmp_path / "merged.pfw.gz"))
    assert not [e for e in read_events(str(tmp_path / "merged.pfw.gz")) if e["name"] == aggregates.NAME]
    merged = summarize([str(tmp_path / "merged.pfw.gz")], top=None)
    assert merged["scan"]["source"] == "events"
    separate = summarize(rank_files, top=None, source="events")
    assert merged["op_events"] == separate["op_events"] > 0
    assert merged["steps"]["steady"]["steps"] == separate["steps"]["steady"]["steps"]
