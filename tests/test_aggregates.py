"""Aggregate records stored in trace files (traces.aggregates): summary and diff read them
instead of every event when every file has one, say so, and give what the full scan gives
(counts and totals exactly, p50/p99 within the sketch's bound); they fall back to the events
otherwise. Records are made here from a full scan of each file (traces.aggregates.write; a
later record than the writer's own, see test_writer_aggregates);
the files keep loading in Perfetto and passing both validators."""

import json
import os
import shutil

import pytest

import perfetto_tp
from dftrace_dynamo.traces import aggregates, clock, partials
from dftrace_dynamo.traces.diff import diff
from dftrace_dynamo.traces.reader import TraceError, compression_of
from dftrace_dynamo.traces.writer import compress
from dftrace_dynamo.traces.summary import summarize
from scripts.clitools import assert_bad_input, cli
from test_engines import assert_same, rank_files  # noqa: F401 (fixture)
from tracefile import dftracer_validate, read_bytes


def with_aggregates(paths, directory):
    """Copies of ``paths`` in ``directory``, each with its aggregate record."""
    directory.mkdir(exist_ok=True)
    out = []
    for p in paths:
        out.append(str(shutil.copy(p, directory)))
        aggregates.write(out[-1])
    return out


@pytest.fixture(scope="module")
def ranks_agg(rank_files, tmp_path_factory):
    return with_aggregates(rank_files, tmp_path_factory.mktemp("ranks_agg"))


@pytest.fixture(scope="module")
def training_agg(training, tmp_path_factory):
    return with_aggregates(training, tmp_path_factory.mktemp("training_agg"))


OPTIONS = ({}, {"include_warmup": True, "module_depth": 1}, {"views": ["op", "kernel", "step"], "top": 2})


@pytest.mark.parametrize("options", OPTIONS, ids=("default", "warmup-depth", "views"))
def test_aggregates_equal_the_full_scan_on_real_training(training_agg, options):
    options = dict({"top": None}, **options)
    events = summarize(training_agg, source="events", **options)
    from_aggregates = summarize(training_agg, source="aggregates", **options)
    assert from_aggregates["scan"] == {"source": "aggregates", "engine": "local", "quantiles": "sketch"}
    assert events["op_events"] > 20 and events["steps"]["rows"] and events["compile_events"]
    if "kernel" in (options.get("views") or ["kernel"]):
        assert events["views"]["kernel"]
    assert assert_same(events, from_aggregates) > 0


@pytest.mark.parametrize("options", OPTIONS, ids=("default", "warmup-depth", "views"))
def test_aggregates_equal_the_full_scan_on_rank_files(ranks_agg, options):
    options = dict({"top": None}, **options)
    events = summarize(ranks_agg, step_samples=True, source="events", **options)
    from_aggregates = summarize(ranks_agg, step_samples=True, **options)  # auto: every file has them
    assert from_aggregates["scan"]["source"] == "aggregates"
    assert events["ranks"] is not None or options.get("views")
    assert assert_same(events, from_aggregates) > 0
    for view, rows in events["views"].items():  # counts and totals to the last bit
        assert [(r["key"], r["count"], r["total_us"]) for r in rows] == \
            [(r["key"], r["count"], r["total_us"]) for r in from_aggregates["views"][view]], view


def test_the_rank_view_reads_no_file_for_its_clocks(ranks_agg, monkeypatch):
    """A record keeps the file's clock record (or says there is none): the rank view takes it
    from there instead of decompressing the file looking for one."""
    monkeypatch.setattr(clock, "record", lambda path: pytest.fail(f"{path} read for its clock record"))
    result = summarize(ranks_agg, top=None)
    assert result["scan"]["source"] == "aggregates" and result["ranks"]["rows"]


def test_diff_reads_the_aggregates(ranks_agg):
    events = diff(ranks_agg[:1], ranks_agg[1:2], source="events")
    from_aggregates = diff(ranks_agg[:1], ranks_agg[1:2])
    assert {s["source"] for s in from_aggregates["scan"].values()} == {"aggregates"}
    assert_same(events, from_aggregates)


def without_aggregates(path, directory):
    """A copy of ``path`` without its aggregate records (as written before the writer kept them)."""
    directory.mkdir(exist_ok=True)
    out = directory / os.path.basename(path)
    lines = read_bytes(path).splitlines(keepends=True)
    out.write_bytes(compress(b"".join(line for line in lines if aggregates.MARKER not in line), compression_of(path)))
    return str(out)


def test_a_file_without_aggregates_means_the_full_scan(rank_files, ranks_agg, tmp_path):
    plain = [without_aggregates(p, tmp_path) for p in rank_files]
    assert all(aggregates.read(p) is None for p in plain)
    mixed = [ranks_agg[0], plain[1], ranks_agg[2]]
    result = summarize(mixed, top=None)
    assert result["scan"] == {"source": "events", "engine": "local", "quantiles": "exact"}
    # the record is no event: the events of a file with one are those of the file without
    local = summarize(plain, top=None)
    assert local["views"] == result["views"] and local["steps"] == result["steps"]
    assert summarize(ranks_agg, top=None, source="events")["views"] == local["views"]
    with pytest.raises(TraceError, match="not every file holds aggregates"):
        summarize(mixed, source="aggregates")
    assert_bad_input(cli("summary", *mixed, "--source", "aggregates"), "not every file holds aggregates")


def test_a_record_that_cannot_answer_is_not_used(ranks_agg, tmp_path):
    """Warm-up steps folded into the steady totals (a writer that judged them otherwise): the
    record cannot leave them out exactly, so the events are read."""
    record = aggregates.read(ranks_agg[0])
    assert record["warmup"] and partials.from_record(ranks_agg, 0, record, ["op"]) is not None
    record["warmup"] = record["warmup"][1:]
    assert partials.from_record(ranks_agg, 0, record, ["op"]) is None
    copy = shutil.copy(ranks_agg[0], tmp_path)
    aggregates.write(copy, record)  # a later record: the last one counts
    assert aggregates.read(copy)["warmup"] == record["warmup"]
    assert summarize([copy])["scan"]["source"] == "events"
    aggregates.write(copy, {"version": aggregates.VERSION, "groups": [[1]], "process_names": []})  # not as documented
    assert summarize([copy])["scan"]["source"] == "events"
    assert perfetto_tp.error_stats(copy) == []


def test_cli_says_which_source_it_used(ranks_agg):
    p = cli("summary", "--format", "json", *ranks_agg)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["scan"]["source"] == "aggregates"
    assert "read the aggregate records of the 3 file(s)" in p.stderr
    p = cli("summary", "--format", "json", "--source", "events", *ranks_agg)
    assert json.loads(p.stdout)["scan"]["source"] == "events" and "aggregate" not in p.stderr


def test_files_with_aggregates_load_in_perfetto_and_validate(training_agg, ranks_agg):
    for path in (training_agg[0], ranks_agg[0]):
        assert perfetto_tp.error_stats(path) == []
        dftracer_validate(path)
        p = cli("validate", path)
        assert p.returncode == 0 and "OK" in p.stdout, p.stdout + p.stderr
