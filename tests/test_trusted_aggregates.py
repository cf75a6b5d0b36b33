"""Aggregate records are used only while they describe their file (traces.trust): a file filtered,
cut, duplicated or joined by another tool, or a record edited by hand (each value out of range,
each field of the wrong type), makes summary and diff read the events instead, with one warning,
and give exactly what the events give; nothing raises and diff finishes. The ground truth is the
full scan of the same (edited) file, whose events the edits leave as they are."""

import json
import os
import shutil
import zlib

import orjson
import pytest

from dftrace_dynamo.traces import aggregates
from dftrace_dynamo.traces.diff import diff
from dftrace_dynamo.traces.reader import compression_of
from dftrace_dynamo.traces.summary import summarize
from dftrace_dynamo.traces.writer import compress
from scripts.clitools import cli
from test_engines import SCRIPTS
from tracefile import read_bytes, read_events
from subproc import run_py, run_python


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A stepgen trace with the trace writer's own record (version 2)."""
    d = tmp_path_factory.mktemp("written")
    return run_python([os.path.join(SCRIPTS, "stepgen.py"), str(d / "job"), "--steps", "8", "--layers", "2",
                       "--recompile-at", "4"], env={"DFTRACER_ENABLE": "1"}).stdout.strip()


@pytest.fixture(scope="module")
def computed(written, tmp_path_factory):
    """The same trace with a record made from a full scan (version 1) after the writer's."""
    path = str(shutil.copy(written, tmp_path_factory.mktemp("computed")))
    aggregates.write(path)
    return path


def raw(path):
    with open(path, "rb") as f:
        return f.read()


def copy_of(path, directory, name="copy"):
    directory.mkdir(exist_ok=True)
    return str(shutil.copy(path, directory / (name + os.path.basename(path)[len("job"):])))


def record_member(path):
    """(offset, end, text) of the member holding the file's last aggregate record."""
    return next((o, e, t) for o, e, t in aggregates._members_from_end(path, compression_of(path), 1 << 30, None)
                if aggregates.MARKER in t)


def edit_record(path, change):
    """Rewrites the member holding the file's last record with ``change(args)`` applied to it (or
    the line ``change`` returns when given the line's bytes), every other byte as it was."""
    kind = compression_of(path)
    offset, end, text = record_member(path)
    at = text.rfind(aggregates.MARKER)
    start, stop = text.rfind(b"\n", 0, at) + 1, text.find(b"\n", at)
    line = text[start:stop]
    event = orjson.loads(line)
    change(event["args"])
    data = raw(path)
    with open(path, "wb") as f:
        line = json.dumps(event, separators=(",", ":")).encode()  # (ints past 64 bits too)
        f.write(data[:offset] + compress(text[:start] + line + text[stop:], kind) + data[end:])


def rewrite_lines(path, keep):
    """The file with only the lines ``keep(line)`` accepts, compressed again as one member."""
    lines, kind = read_bytes(path).splitlines(keepends=True), compression_of(path)
    with open(path, "wb") as f:
        f.write(compress(b"".join(line for line in lines if keep(line)), kind))


def assert_events_with_one_warning(path, step_samples=False):
    """summary of ``path`` read its events, said so in one line, and equals the full scan."""
    got = summarize([path], top=None, step_samples=step_samples)
    events = summarize([path], top=None, step_samples=step_samples, source="events")
    notes = [w for w in got["warnings"] if "aggregate record" in w]
    assert got["scan"]["source"] == "events" and len(notes) == 1 and "\n" not in notes[0], got["warnings"]
    assert notes[0].startswith(path) and "read the events" in notes[0]
    assert got["warnings"] == notes + events["warnings"]
    got.pop("warnings"), events.pop("warnings")
    assert got == events
    return notes[0]


def test_an_untouched_file_answers_from_its_record(written, computed):
    for path in (written, computed):
        result = summarize([path], top=None, step_samples=True)
        assert result["scan"]["source"] == "aggregates" and result["warnings"] == []


def test_a_file_opened_late_answers_from_its_record_with_the_events_before_it(tmp_path):
    """The trace opens inside the first compile, 1.5 s after the first batch began step 0: the
    record's step 0 starts before the file's ``start`` record, as it did, and is still trusted."""
    p = run_py("""
        import time, torch
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        f = torch.compile(model, backend="dftrace")
        for i, x in enumerate(torch.utils.data.DataLoader(torch.ones(8, 4), batch_size=2)):
            if i == 0:
                print(time.time_ns() // 1000)
                time.sleep(1.5)
            opt.zero_grad()
            f(x).sum().backward()
            opt.step()
    """, tmp_path, env={"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": str(tmp_path / "job")})
    assert p.returncode == 0, p.stderr[-3000:]
    (path,) = [str(f) for f in tmp_path.glob("job*.pfw.gz")]
    events = read_events(path)
    start = next(e for e in events if e["name"] == "start")
    step0 = next(e for e in events if e["name"] == "step 0")
    assert step0["ts"] <= int(p.stdout) < start["ts"] - 1_500_000 + 1000, (step0, start)
    got = summarize([path], top=None, step_samples=True)
    assert got["scan"]["source"] == "aggregates" and got["warnings"] == [], got["warnings"]
    events = summarize([path], top=None, step_samples=True, source="events")
    assert got["steps"] == events["steps"] and len(got["steps"]["rows"]) == 4
    assert start["args"]["since"] <= step0["ts"]


@pytest.mark.parametrize("which", ["written", "computed"])
def test_a_filtered_file_is_read_from_its_events(which, request, tmp_path):
    """One module's op events removed by another tool (the record left as written), then every op event."""
    source = request.getfixturevalue(which)
    path = copy_of(source, tmp_path)
    full = summarize([source], top=None, source="events")
    rewrite_lines(path, lambda line: b'"module":"layers.0"' not in line or b'"cat":"dynamo"' not in line)
    assert 0 < summarize([path], source="events")["op_events"] < full["op_events"]
    assert "events changed, removed or added" in assert_events_with_one_warning(path)  # trust.MISMATCH
    rewrite_lines(path, lambda line: b'"cat":"dynamo"' not in line or b'"node"' not in line)
    assert_events_with_one_warning(path)
    assert summarize([path])["op_events"] == 0


@pytest.mark.parametrize("which", ["written", "computed"])
def test_a_duplicated_or_joined_file_is_read_from_its_events(which, request, tmp_path):
    source = request.getfixturevalue(which)
    path = copy_of(source, tmp_path)
    data = raw(source)
    with open(path, "wb") as f:  # the whole file twice (cat f f)
        f.write(data + data)
    assert_events_with_one_warning(path)
    path = copy_of(source, tmp_path, "line")  # the record's line twice
    kind = compression_of(path)
    offset, end, text = record_member(path)
    at = text.rfind(aggregates.MARKER)
    line = text[text.rfind(b"\n", 0, at) + 1:text.find(b"\n", at) + 1]
    with open(path, "wb") as f:
        f.write(data[:offset] + compress(text.replace(line, line + line), kind) + data[end:])
    assert_events_with_one_warning(path)


@pytest.mark.parametrize("which", ["written", "computed"])
def test_a_cut_record_is_read_from_its_events(which, request, tmp_path):
    source = request.getfixturevalue(which)
    path = copy_of(source, tmp_path)
    kind = compression_of(path)
    offset, end, text = record_member(path)
    at = text.rfind(aggregates.MARKER)
    stop = text.find(b"\n", at)
    data = raw(source)
    with open(path, "wb") as f:  # the record's line cut in the middle
        f.write(data[:offset] + compress(text[:(at + stop) // 2] + text[stop:], kind) + data[end:])
    assert "not JSON as documented" in assert_events_with_one_warning(path)


def _set(field, index, value, row=0):
    def change(args):
        args[field][row][index] = value
    return change


def _scale(field, index, factor, row=0):
    def change(args):
        args[field][row][index] *= factor
    return change


def _op_group(args):
    """Index of the first op group with several events of different durations (version 2)."""
    return next(i for i, g in enumerate(args["groups"]) if args["keys"][g[0]][0] == 1 and g[2] > 2 and g[4] < g[5])


def _in_op_group(index, value):
    def change(args):
        args["groups"][_op_group(args)][index] = value(args["groups"][_op_group(args)][index])
    return change


def _copied(name, field, value):
    """A change of the first copied event of category ``name`` (version 2)."""
    def change(args):
        event = next(e for e in args["events"] if e.get("cat") == name and field in e)
        event[field] = value(event[field])
    return change


WRITTEN_EDITS = {
    "count negative": _in_op_group(2, lambda v: -v),
    "count a string": _in_op_group(2, str),
    "count null": _in_op_group(2, lambda v: None),
    "sum x1000": _in_op_group(3, lambda v: v * 1000),
    "sum 1e30": _in_op_group(3, lambda v: 1e30),
    "sum a string": _in_op_group(3, str),
    "min above max": _in_op_group(4, lambda v: 10 ** 12),
    "max beyond the file": _in_op_group(5, lambda v: v * 10 ** 9),
    "zero count": _in_op_group(6, lambda v: v + 1),
    "sum of squares x1000": _in_op_group(7, lambda v: v * 1000),
    "sum of squares nan": _in_op_group(7, lambda v: float("nan")),
    "bucket count": _in_op_group(8, lambda v: v[:-1] + [v[-1] + 5]),
    "buckets null": _in_op_group(8, lambda v: None),
    "key out of range": _in_op_group(0, lambda v: 10 ** 6),
    "key kind": lambda args: args["keys"][0].__setitem__(0, "op"),
    "keys null": lambda args: args.__setitem__("keys", None),
    "groups a string": lambda args: args.__setitem__("groups", "many"),
    "complete a string": lambda args: args.__setitem__("complete", "yes"),
    "op step time x1000": _scale("op_steps", 2, 1000),
    "op step time negative": _scale("op_steps", 2, -1),
    "samples 1e20": _set("samples", 2, 10 ** 20),
    "sample a float": _set("samples", 2, 1e20),
    "sample step a string": _set("samples", 1, "3"),
    "step slice x1000": _copied("step", "dur", lambda v: v * 1000),
    "step slice before the file": _copied("step", "ts", lambda v: v - 10 ** 9),
    "step slice dur a string": _copied("step", "dur", str),
    "compile x1000": _copied("dynamo_compile", "dur", lambda v: v * 1000),
    "events null": lambda args: args.__setitem__("events", None),
    "covers null": lambda args: args.__setitem__("covers", None),
    "covers a string": lambda args: args["covers"].__setitem__("bytes", str(args["covers"]["bytes"])),
    "version": lambda args: args.__setitem__("version", 3),
}


def _v1_op_group(args):
    return next(i for i, g in enumerate(args["groups"]) if g[0] == 1 and g[10] > 1 and g[12] < g[13])


def _in_v1_group(index, value):
    def change(args):
        row = args["groups"][_v1_op_group(args)]
        row[index] = value(row[index])
    return change


COMPUTED_EDITS = {
    "count negative": _in_v1_group(9, lambda v: -v),
    "count a string": _in_v1_group(9, str),
    "timed above count": _in_v1_group(10, lambda v: v + 10 ** 6),
    "sum x1000": _in_v1_group(11, lambda v: v * 1000),
    "sum 1e30": _in_v1_group(11, lambda v: 1e30),
    "min above max": _in_v1_group(12, lambda v: 1e9),
    "max beyond the file": _in_v1_group(13, lambda v: v * 1e9),
    "sum of squares x1000": _in_v1_group(14, lambda v: v * 1000),
    "bucket out of range": _in_v1_group(8, lambda v: v + 500),
    "name null": _in_v1_group(1, lambda v: None),
    "all null": lambda args: args.__setitem__("groups", [[None] * 15 for _ in args["groups"]]),
    "warmup a string": lambda args: args.__setitem__("warmup", "0"),
    "samples 1e20": lambda args: args["samples"][0].__setitem__(4, 10 ** 20),
    "sample a float": lambda args: args["samples"][0].__setitem__(4, 1e20),
    "step slice x1000": _scale("slices", 5, 1000),
    "step slice ts null": _set("slices", 4, None),
    "op step part x1000": lambda args: next(r for r in args["parts"] if r[3] == 1).__setitem__(
        5, next(r for r in args["parts"] if r[3] == 1)[5] * 1000),  # (kind 1: the op time of a step)
    "compile x1000": lambda args: args["records"][0].__setitem__("dur", args["records"][0]["dur"] * 1000),
    "evaluation negative": lambda args: args.__setitem__("evaluation", [-1.0]),
    "rank events null": lambda args: args.__setitem__("rank_rows", [[None] * len(args["rank_rows"][0])] * 8),
    "rank event beyond the file": lambda args: args["rank_rows"][6].__setitem__(0, args["rank_rows"][6][0] + 1e12),
    "runs reversed": lambda args: args["runs"][0].__setitem__(2, args["runs"][0][1] - 1),
    "unparsed negative": lambda args: args.__setitem__("unparsed", -5),
    "process name a number": lambda args: args["process_names"][0].__setitem__(1, 7),
    "clock a list": lambda args: args.__setitem__("clock", [1]),
}


EDITS = [("written", e) for e in WRITTEN_EDITS] + [("computed", e) for e in COMPUTED_EDITS]


@pytest.mark.parametrize("which, edit", EDITS, ids=[f"{w}-{e}" for w, e in EDITS])
def test_a_hand_edited_record_is_read_from_its_events(which, edit, request, tmp_path):
    path = copy_of(request.getfixturevalue(which), tmp_path)
    edit_record(path, (WRITTEN_EDITS if which == "written" else COMPUTED_EDITS)[edit])
    assert_events_with_one_warning(path, step_samples=True)
    assert_events_with_one_warning(path)


@pytest.mark.parametrize("edit", ["samples 1e20", "step slice x1000", "count a string"])
def test_diff_finishes_and_agrees_with_summary_on_edited_records(edit, written, tmp_path):
    """diff of an edited file against itself: one line of warning per side, no traceback, the
    events' step time; summary of the same file gives the same steps."""
    path = copy_of(written, tmp_path)
    edit_record(path, WRITTEN_EDITS[edit])
    p = cli("diff", path, path, "--format", "json", timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    doc = json.loads(p.stdout)
    assert {s["source"] for s in doc["scan"].values()} == {"events"}
    assert sum("aggregate record" in line for line in p.stderr.splitlines()) == 2, p.stderr
    events = diff([path], [path], source="events")
    assert doc["step_time"] == json.loads(json.dumps(events["step_time"])) and doc["per"] == "step"
    assert summarize([path])["steps"] == summarize([path], source="events")["steps"]


def test_a_record_without_covers_is_read_from_its_events(written, tmp_path):
    """A record that does not say which bytes it stands for (older writers) cannot be checked."""
    path = copy_of(written, tmp_path)
    edit_record(path, lambda args: args.pop("covers"))
    assert "older version" in assert_events_with_one_warning(path)


def test_covers_cite_the_bytes_before_the_record(written):
    """The writer's citation is the CRC-32 of the file's bytes before the record's member and of
    that member's text before the record, as zlib computes them here."""
    offset, _, text = record_member(written)
    covers = aggregates.read(written)["covers"]
    line_at = text.rfind(b"\n", 0, text.rfind(aggregates.MARKER)) + 1
    data = raw(written)
    assert covers == {"bytes": offset, "crc32": zlib.crc32(data[:offset]), "text_bytes": line_at,
                      "text_crc32": zlib.crc32(text[:line_at])}


def test_diff_intervals_end_on_huge_durations():
    """The bisection behind diff's intervals stops at the doubles' own spacing: samples of 1e14 µs
    and more (a corrupt or hand-made trace) end in a moment."""
    code = ("import numpy as np; from dftrace_dynamo.traces.diff import _kth_differences as k; "
            "print(k(np.array([5.0, 1e14, 2e14, 3e14]), np.array([7.0, 4e14, 9e15, 1e20]), [3, 8]).tolist())")
    p = run_python(["-c", code], timeout=60)
    assert json.loads(p.stdout) == [7 - 1e14, 4e14 - 5]
