"""An event field of the wrong JSON type (reader.FIELD_TYPES) anywhere in a file, far beyond its
first events: summary and diff refuse the file with validate's line (file, line, field) and exit
status 2, on the local and the Dask engine; validate refuses exactly the same files, and right
values that look like wrong ones (a name that starts with a digit, args without the keys summary
reads, a ph number, a pid beyond 2^63) are read, by both."""

import gzip
import json

import pytest
import zstandard

from dftrace_dynamo.traces import aggregates
from dftrace_dynamo.traces.reader import TraceError
from dftrace_dynamo.traces.summary import summarize
from dftrace_dynamo.traces.validate import validate
from scripts.clitools import assert_bad_input, cli
from test_engines import engine  # noqa: F401 (fixture)

OP = {"name": "op", "cat": "dynamo", "ph": "X", "pid": 1, "tid": 1, "ts": 1_760_000_000_000_000, "dur": 5,
      "args": {"node": "n", "module": "m"}}
EVENTS = 2500
AT = 2000  # the event that differs; line AT + 2 (line 1 is '[')
LINE = AT + 2
COMPRESSIONS = {"plain": (".pfw", lambda b: b), "gzip": (".pfw.gz", gzip.compress),
                "zstd": (".pfw.zst", zstandard.ZstdCompressor().compress)}
WRONG = [("ts", "abc"), ("ts", "10"), ("ts", True), ("dur", [1]), ("dur", False), ("dur", {"us": 5}),
         ("tid", {"a": 1}), ("tid", 1.5), ("tid", "1"), ("pid", "x"), ("pid", "7"), ("pid", 1.0), ("pid", True),
         ("pid", 2 ** 64), ("pid", 1e3), ("args", 5), ("args", [1]), ("args", "x"), ("args", True),
         ("name", 7), ("name", True), ("name", [1]), ("name", {"a": 1}), ("name", -2.5), ("cat", {"a": 1}),
         ("cat", 1.5), ("cat", False), ("ph", ["X"]), ("ph", 1.5), ("ph", False), ("ph", {"p": "X"})]
# right JSON types that look like the text DuckDB makes of wrong ones (summary checks these lines too)
LOOK_ALIKE = [("name", "123"), ("name", "-1"), ("name", "[x]"), ("name", "{x}"), ("name", "true"),
              ("cat", "1.5"), ("ph", 1), ("ph", "false"), ("args", {}), ("args", {"other": [1]}),
              ("pid", 2 ** 63), ("dur", 0), ("ts", -1.5e-3)]


def write(path, field, value):
    """A trace of EVENTS op events, event AT with ``field`` set to ``value``, in the compression
    ``path``'s name says."""
    events = [dict(OP, ts=OP["ts"] + 10 * i) for i in range(EVENTS)]
    events[AT][field] = value
    text = "\n".join(["[", *(json.dumps(e) for e in events), "]"]) + "\n"
    compress = next(c for suffix, c in COMPRESSIONS.values() if str(path).endswith(suffix))
    path.write_bytes(compress(text.encode()))
    return str(path)


def trace(tmp_path, compression, field, value):
    return write(tmp_path / f"t{COMPRESSIONS[compression][0]}", field, value)


def refusal(function, *args, **kwargs):
    with pytest.raises(TraceError) as e:
        function(*args, **kwargs)
    return str(e.value)


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("field, value", WRONG, ids=[f"{f}-{json.dumps(v)}" for f, v in WRONG])
def test_summary_refuses_what_validate_refuses(tmp_path, compression, field, value):
    path = trace(tmp_path, compression, field, value)
    message = refusal(validate, path)
    assert message.startswith(f"{path}: line {LINE}: event field '{field}' is "), message
    assert refusal(summarize, [path], source="events") == message


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("field, value", LOOK_ALIKE, ids=[f"{f}-{json.dumps(v)}" for f, v in LOOK_ALIKE])
def test_right_types_that_look_wrong_are_read(tmp_path, compression, field, value):
    path = trace(tmp_path, compression, field, value)
    assert validate(path).events == EVENTS
    result = summarize([path], source="events")
    ops = EVENTS - (field == "cat" or (field == "ph" and value != 1))  # not an op event any more
    assert result["op_events"] == ops, result["warnings"]


@pytest.mark.parametrize("command", ["summary", "diff"])
def test_cli_one_line_exit_2(tmp_path, command):
    good, bad = write(tmp_path / "good.pfw.gz", "dur", 5), write(tmp_path / "bad.pfw.zst", "tid", [1, 2])
    line = f"{bad}: line {LINE}: event field 'tid' is an array ([1,2]), not an integer"
    assert assert_bad_input(cli(command, good, bad), line) == f"dftrace-dynamo {command}: error: {line}"
    assert assert_bad_input(cli("validate", bad), line) == f"dftrace-dynamo validate: error: {line}"


def test_dask_engine_refuses(tmp_path, engine):  # noqa: F811 (fixture)
    good, bad = write(tmp_path / "good.pfw", "dur", 5), write(tmp_path / "bad.pfw.gz", "args", 5)
    assert refusal(summarize, [good, bad], engine=engine) == refusal(validate, bad)
    assert summarize([good, good], engine=engine)["op_events"] == 2 * EVENTS


def test_event_after_the_aggregate_record(tmp_path):
    """The record holds the events before it (made by a full scan, which refuses a wrong type); an
    event after it is one the record does not hold: summary reads every event then, and checks them."""
    path = write(tmp_path / "t.pfw", "dur", 5)
    aggregates.write(path)
    assert summarize([path])["scan"]["source"] == "aggregates"
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[-1] == "]" and aggregates.NAME in lines[-2]
    after = [json.dumps(dict(OP, ts=OP["ts"] - 10)), json.dumps(dict(OP, ts="late"))]
    with open(path, "w") as f:
        f.write("\n".join(lines[:-1] + after + ["]"]) + "\n")
    line = len(lines) + 1
    assert refusal(summarize, [path]) == refusal(validate, path) == (
        f"{path}: line {line}: event field 'ts' is a string (\"late\"), not a number")
    with open(path, "w") as f:
        f.write("\n".join(lines[:-1] + after[:1] + ["]"]) + "\n")
    result = summarize([path])
    assert result["scan"]["source"] == "events" and result["op_events"] == EVENTS + 1


@pytest.mark.parametrize("event", [{"name": "process_name", "ph": "M", "pid": 1, "cat": 5, "args": {"name": "p"}},
                                   {"pid": 1, "tid": 1, "cat": ["x"]}, {"name": "n", "ph": ["M"]}],
                         ids=["process_name", "no-name-no-ph", "no-cat"])
def test_cat_and_ph_where_no_kind_compares_them(tmp_path, event):
    """cat and ph are strings on the events whose kind they decided; these events' kinds do not
    compare both (a process name is told by ph and name; a line without ph and name is unread)."""
    path = write(tmp_path / "t.pfw.gz", "args", {"node": "n"})
    lines = gzip.decompress((tmp_path / "t.pfw.gz").read_bytes()).decode().splitlines()
    lines.insert(AT + 1, json.dumps(event))
    (tmp_path / "t.pfw.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    message = refusal(validate, path)
    assert f"line {AT + 2}: event field" in message
    assert refusal(summarize, [path], source="events") == message
