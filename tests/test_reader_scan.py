"""The full scan's C reader (``_core.Scanner``, csrc/reader.c; traces/fullscan.py).

Ground truth: ``json.loads`` of each line for the rows the C reader takes, and DuckDB's JSON
reader of *every* line (the reader summary used before, still used for the lines the C reader
does not take) for the event table and every summary document built on it: real training
traces, stepgen traces written by the C writer, hostile lines (escapes, unicode, missing fields,
other writers' forms, wrong types, a cut last line), concatenated gzip members with lines cut
across them, gzip members cut by the reading window, plain and zstd files."""

import gzip
import json
import os
import subprocess
import sys
import zlib

import pytest
import torch
import zstandard

from backend_support import MLP, recording
from dftrace_dynamo import _core, create_backend
from dftrace_dynamo.traces import clock, events, fullscan, reader, summary
from dftrace_dynamo.traces.reader import TraceError
from dftrace_dynamo.traces.kinds import VIEWS

STEPGEN = os.path.join(os.path.dirname(__file__), "scripts", "stepgen.py")
NULL = -(1 << 63)
FIELDS = (*events._ARGS, "aten_ops")

# lines the C reader takes (each as json.loads reads it), then lines it leaves to DuckDB's reader
TAKEN = [
    r'{"id":1,"name":"op\"q\\s\/\u00e9\ud83d\ude00\n\t","cat":"dynamo","pid":1,"tid":1,"ts":10,"dur":1.5,"ph":"X",'
    r'"args":{"node":"n","module":"m.\u00fc","step":1}}',
    '{"name":"ünï日本😀","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":11,"dur":2,"args":{"node":"n","module":"ünï"}}',
    '{"name":"op","ph":"X","cat":"dynamo"}',
    '{"name":"op","ph":"X","cat":"dynamo","pid":1,"tid":1,"ts":12,"dur":null,"args":null}',
    '{ "args" : { "module" : "m" , "node" : [1, {"a": [true, null, -2.5]}] , "x": {} } , "dur" : 3.25 , '
    '"ts" : 13 , "tid" : 2 , "pid" : 1 , "cat" : "dynamo" , "ph" : "X" , "name" : "spaced" }\r',
    '{"name":"n1","cat":"dynamo","ph":1,"pid":1,"tid":1,"ts":14,"dur":1,"args":{"node":"x"}}',
    '{"name":"k","cat":"kernel","ph":"X","pid":1,"tid":1,"ts":15,"dur":4,"args":{"kernel_type":"triton",'
    '"aten_ops":["aten.mm","aten.relu"],"graph":0,"phase":"forward","step":1}}',
    '{"name":"k2","cat":"kernel","ph":"X","pid":1,"tid":1,"ts":15,"dur":4,"args":{"kernel_type":"cpp","aten_ops":[],'
    '"graph":0,"step":1}}',
    '{"name":"step 1","cat":"step","ph":"X","pid":1,"tid":1,"ts":9,"dur":100,"args":{"step":1,"peak_rss":123456789,'
    '"cuda_max_allocated":null}}',
    '{"name":"all_reduce","cat":"comm","ph":"X","pid":1,"tid":1,"ts":20,"dur":5,"args":{"bytes":4096,"group":"default",'
    '"rank":0,"async_op":false,"step":1}}',
    r'{"name":"dynamo compile forward","cat":"dynamo_compile","ph":"X","pid":1,"tid":1,"ts":1,"dur":40,'
    r'"args":{"kind":"compile","reason":"r \"q\"","location":"t.py:1","frame":"forward","graph":0,"step":0}}',
    '{"name":"recomputed","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":21,"dur":1,"args":{"node":"a","recompute":true,'
    '"phase":"backward","step":1}}',
    '{"name":"process_name","cat":"dftracer","ph":"M","pid":1,"tid":1,"args":{"name":"rank 0"}}',
    '{"name":"big","cat":"dynamo","ph":"X","pid":123456789012345678,"tid":-7,"ts":1796203014849.125,'
    '"dur":0.000001,"args":{"node":"n","step":-2}}',
    '{"name":"fr","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":22,"dur":0.1234567890123456,"args":{"node":"n"}}',
    '{"name":"fr2","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":22,"dur":98765432.10987654,"args":{"node":"n"}}',
    '{"name":"1 starts with a digit","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":23,"dur":0,"args":{}}',
    '{}',
]
LEFT = [
    '{"name":"19 digits","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":1796203014849273.125,"dur":1}',
    '{"name":"exp","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":1e3,"dur":1.5E-3,"args":{"node":"n"}}',
    '{"name":"negzero","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":23,"dur":1,"args":{"node":"n","graph":-0}}',
    '{"name":"dup","name":"dup2","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":24,"dur":1,"args":{"node":"n"}}',
    '{"name":"dupnull","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":24,"dur":1,"args":{"module":null,"module":"m2"}}',
    r'{"name":"nul\u0000","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":25,"dur":1,"args":{"node":"n"}}',
    '{"name":"bigint","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":26,"dur":1,"args":{"step":12345678901234567890}}',
    '{"name":"floatstep","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":27,"dur":1,"args":{"node":"n","step":3.0}}',
    '{"name":"strstep","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":28,"dur":1,"args":{"node":"n","step":"4"}}',
    '{"name":"floatarg","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":29,"dur":1,"args":{"node":"n","graph":1.50}}',
    r'{"name":"esckey","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":30,"dur":1,"args":{"nod\u0065":"n"}}',
    '{"name":"trail","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":31,"dur":1,"args":{"node":"n"}},',
    '{"name":"garbage after","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":32,"dur":1} x',
    r'{"name":"lone","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":33,"dur":1,"args":{"node":"\ud800"}}',
    'not json at all',
    '[{"name":"arr","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":34,"dur":1}]',
    '{"id":99999999999999999999,"name":"hugeid","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":35,"dur":1}',
    '{"name":"deep","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":36,"dur":1,"args":{"x":' + "[" * 70 + "]" * 70 + "}}",
    '{"name":"aten_ops not strings","cat":"kernel","ph":"X","pid":1,"tid":1,"ts":37,"dur":1,"args":{"aten_ops":[1]}}',
    '{"name":"cut","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":38,"du',
    "[",
    "]",
    "   ",
]
# events with a field of the wrong JSON type: every reader refuses the file
WRONG = ['{"name":"op","cat":"dynamo","ph":"X","pid":"1","tid":1,"ts":1,"dur":1}',
         '{"name":"op","cat":"dynamo","ph":"X","pid":1.0,"tid":1,"ts":1,"dur":1}',
         '{"name":["op"],"cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":1,"dur":1}',
         '{"name":"op","cat":"dynamo","ph":true,"pid":1,"tid":1,"ts":1,"dur":1}',
         '{"name":"op","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":"1","dur":1}',
         '{"name":"op","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":1,"dur":1,"args":[1]}']


def scanner(fd, **kw):
    return _core.Scanner(fd, FIELDS, present="node", integer="step", listed="aten_ops", **kw)


def lines_one_by_one(tmp_path, lines):
    """(row or None, fallback bytes) per line, feeding the C reader one line at a time."""
    fallback = tmp_path / "fallback"
    fd = os.open(fallback, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    s, out, sites, seen = scanner(fd), [], [], 0
    try:
        for line in lines:
            s.feed(line + b"\n")
            s.finish()
            n, new, *columns = s.take()
            sites += new
            size = os.path.getsize(fallback)
            if n:
                site, pid, tid, ts, dur, step = (memoryview(c).cast(t)[0] for c, t in zip(columns, "iqqddq"))
                out.append(((pid, tid, ts, dur, step), sites[site]))
            else:
                out.append(None)
            # a line is read one way, never two; a blank one (no event) not at all
            assert size == seen + (0 if n or not line.strip(b" \t\r") else len(line) + 1)
            seen = size
    finally:
        os.close(fd)
    return out


def expected_row(line):
    """What the C reader must make of ``line``: json.loads of it."""
    ev = json.loads(line)
    args = ev.get("args") or {}

    def text(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        return tuple(v) if isinstance(v, list) else v if v is None or isinstance(v, str) else str(v)

    def number(v, null=NULL):
        return null if v is None else v

    fields = tuple("" if f == "node" and args.get(f) is not None else None if f in ("node", "step") else
                   text(args.get(f)) for f in FIELDS)
    nums = (number(ev.get("pid")), number(ev.get("tid")), number(ev.get("ts"), None), number(ev.get("dur"), None),
            number(args.get("step")))
    return nums, (text(ev.get("ph")), ev.get("cat"), ev.get("name"), *fields)


def test_rows_taken_equal_json_loads_and_the_rest_is_left_whole(tmp_path):
    got = lines_one_by_one(tmp_path, [line.encode() for line in TAKEN + LEFT])
    for line, row in zip(TAKEN, got):
        assert row is not None, line
        (pid, tid, ts, dur, step), site = row
        want_nums, want_site = expected_row(line)
        ts = None if ts != ts else ts  # NaN: NULL
        dur = None if dur != dur else dur
        assert (pid, tid, ts, dur, step) == want_nums, line
        assert site == want_site, line
    assert got[len(TAKEN):] == [None] * len(LEFT)


def test_invalid_utf8_and_controls_are_left_to_the_general_reader(tmp_path):
    bad = [b'{"name":"bad\xff","cat":"dynamo","ph":"X","pid":1,"tid":1,"ts":1,"dur":1}',
           b'{"name":"overlong \xc0\xaf","cat":"dynamo","ph":"X"}',
           b'{"name":"surrogate \xed\xa0\x80","cat":"dynamo","ph":"X"}',
           b'{"name":"tab\there","cat":"dynamo","ph":"X"}']
    assert lines_one_by_one(tmp_path, bad) == [None] * len(bad)


def write(path, lines, how="plain", members=1):
    """``lines`` (bytes) as a trace file: plain, gzip (``members`` members, cut mid-line) or zstd."""
    text = b"\n".join(lines) + b"\n"
    if how == "gzip":
        cuts = [len(text) * i // members for i in range(members + 1)]
        data = b"".join(gzip.compress(text[a:b]) for a, b in zip(cuts, cuts[1:]))
    elif how == "zstd":
        data = zstandard.ZstdCompressor().compress(text)
    else:
        data = text
    path.write_bytes(data)
    return str(path)


@pytest.fixture(scope="module")
def stepgen(tmp_path_factory):
    """A stepgen trace written by the C writer (compiles, a recompile, a graph break, aggregates)."""
    d = tmp_path_factory.mktemp("stepgen")
    env = dict(os.environ, DFTRACER_ENABLE="1", DFTRACER_RUN_ID="scan")
    out = subprocess.run([sys.executable, STEPGEN, str(d / "job"), "--steps", "40", "--layers", "6", "--rank", "0",
                          "--recompile-at", "7", "--graph-break", "--clock-offset-ns", "1000"],
                         env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    """A real training trace: an MLP compiled with the backend at the aten level, Adam, 4 steps."""
    d = tmp_path_factory.mktemp("train")
    torch.manual_seed(0)
    with recording(d) as rec:
        model = MLP()
        opt = torch.optim.Adam(model.parameters())
        compiled = torch.compile(model, backend=create_backend(level="aten"))
        for _ in range(4):
            compiled(torch.randn(8, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
        path = rec.path()
    torch._dynamo.reset()
    return path


def table(paths, monkeypatch, general):
    """Table ``ev`` (all columns but ``suspect``, which only says which files to check) and the
    scanners' (lines, taken) after :func:`.events.load`; ``general``: every line by DuckDB."""
    made, real = [], _core.Scanner

    def counted(*args, **kwargs):
        scanner = real(*args, **kwargs)
        if args[0] >= 0:  # (fallback_fd -1: a text-mode scanner of the other readers, reader.iter_chunks)
            made.append(scanner)
        return scanner
    with monkeypatch.context() as m:
        m.setattr(fullscan._core, "Scanner", counted)
        if general:
            m.setattr(fullscan, "MAX_LINE", 0)  # the C reader takes no line
        con, out, _ = events.load(paths, list(range(len(paths))))
    rows = con.execute("SELECT * EXCLUDE (suspect) FROM ev ORDER BY ALL").fetchall()
    con.close()
    return rows, out, (sum(s.lines[0] for s in made), sum(s.lines[1] for s in made))


def document(paths, monkeypatch, general):
    with monkeypatch.context() as m:
        if general:
            m.setattr(fullscan, "MAX_LINE", 0)
        return summary.summarize(paths, VIEWS, top=None, source="events", all_runs=True, step_samples=True)


def same_as_general(paths, monkeypatch, taken_share):
    """The C reader's table and summary equal the general reader's, and it took at least
    ``taken_share`` of the lines."""
    fast, out, (lines, taken) = table(paths, monkeypatch, False)
    general, out_general, (_, none) = table(paths, monkeypatch, True)
    assert none == 0 and taken >= taken_share * lines, (lines, taken)
    assert len(fast) == len(general) and fast == general
    assert out["warnings"] == out_general["warnings"]
    assert document(paths, monkeypatch, False) == document(paths, monkeypatch, True)
    return out


def test_stepgen_trace(stepgen, monkeypatch):
    out = same_as_general([stepgen], monkeypatch, 0.999)
    assert out["clocks"] == {0: clock.record(stepgen)} and out["clocks"][0]["clock_offset_ns"] == 0


def test_training_trace(training, monkeypatch):
    same_as_general([training], monkeypatch, 0.99)


def test_hostile_lines_in_every_compression(tmp_path, monkeypatch):
    lines = [b"["] + [line.encode() for line in TAKEN + LEFT] + [b'{"name":"bad\xff","cat":"dynamo","ph":"X"}']
    for how in ("plain", "gzip", "zstd"):
        path = write(tmp_path / f"h.pfw.{how}", lines, how, members=7)
        same_as_general([path], monkeypatch, len(TAKEN) / len(lines))


def test_crlf_lines_and_a_file_without_final_newline(tmp_path, monkeypatch, stepgen):
    text = gzip.decompress(open(stepgen, "rb").read())
    crlf = tmp_path / "crlf.pfw"
    crlf.write_bytes(text.replace(b"\n", b"\r\n"))
    bare = tmp_path / "bare.pfw"
    bare.write_bytes(text.rstrip(b"\n]"))  # ends on an event line without its newline
    same_as_general([str(crlf), str(bare)], monkeypatch, 0.999)


def test_cut_and_corrupt_gzip_members(tmp_path, monkeypatch, stepgen):
    data = open(stepgen, "rb").read()
    cut = tmp_path / "cut.pfw.gz"
    cut.write_bytes(data[:len(data) * 2 // 3])  # a member cut: what it decodes to is used
    text = gzip.decompress(data)
    members = [gzip.compress(text[i:i + 20000]) for i in range(0, len(text), 20000)]  # lines cut across members
    members[3] = members[3][:10] + bytes(len(members[3]) - 20) + members[3][-10:]  # a corrupt member inside
    corrupt = tmp_path / "corrupt.pfw.gz"
    corrupt.write_bytes(b"".join(members))
    out = same_as_general([str(cut), str(corrupt)], monkeypatch, 0.99)
    assert any("truncated" in w for w in out["warnings"]) and any("corrupt gzip" in w for w in out["warnings"])
    # the lines scanned are those the Python decoder gives, each once
    python_lines = sum(len(b"".join(reader.iter_chunks(str(p))).rstrip(b"\n").split(b"\n")) for p in (cut, corrupt))
    assert table([str(cut), str(corrupt)], monkeypatch, False)[2][0] == python_lines


def test_members_cut_by_the_reading_window_and_larger_than_it(tmp_path, monkeypatch, stepgen):
    text = gzip.decompress(open(stepgen, "rb").read())
    comp = zlib.compressobj(6, zlib.DEFLATED, 31)
    one = tmp_path / "one-member.pfw.gz"
    one.write_bytes(comp.compress(text) + comp.flush())
    monkeypatch.setattr(reader, "WINDOW", 4096)  # the writer's members straddle it; the single one exceeds it
    same_as_general([stepgen, str(one)], monkeypatch, 0.999)


def test_zlib_inflates_what_libdeflate_does(tmp_path, stepgen):
    outs = []
    for inflater in ("auto", "zlib"):
        fd = os.open(tmp_path / inflater, os.O_WRONLY | os.O_CREAT)
        s = scanner(fd, inflater=inflater)
        data, at, batches = open(stepgen, "rb").read(), 0, []
        while at < len(data):
            at, failed = s.feed_gzip(data, at, 1000)
            assert not failed
            batches.append(s.take())
        s.finish()
        os.close(fd)
        outs.append((batches, s.lines))
    assert outs[0] == outs[1] and outs[0][1][1] > 0


def test_wrong_types_are_refused_as_by_validate(tmp_path, monkeypatch):
    for i, bad in enumerate(WRONG):
        path = write(tmp_path / f"w{i}.pfw", [b"[", TAKEN[0].encode(), bad.encode(), b"]"])
        messages = []
        for general in (False, True):
            with pytest.raises(TraceError) as e:
                table([path], monkeypatch, general)
            messages.append(str(e.value))
        assert messages[0] == messages[1] and "line 3: event field" in messages[0], messages


def test_the_clock_record_comes_from_the_scan(tmp_path, monkeypatch, stepgen):
    # rank files were decompressed a second time looking for it (half the time of a summary)
    ranks = [tmp_path / f"job-rank{r}.pfw.gz" for r in (0, 1)]
    for rank in ranks:
        rank.write_bytes(open(stepgen, "rb").read())
    want = clock.record(str(ranks[0]))
    monkeypatch.setattr(clock, "record", lambda path: pytest.fail(f"{path} read again for its clock record"))
    result = summary.summarize([str(r) for r in ranks], source="events", all_runs=True)
    assert [r["clock_offset_us"] for r in result["ranks"]["ranks"]] == [0.0, 0.0] and want["clock_offset_ns"] == 0


def test_the_clock_line_is_found_wherever_the_text_is_cut(tmp_path):
    clock_line = b'{"name":"clock","cat":"dftracer","ph":"X","pid":1,"tid":1,"ts":1,"dur":0,"args":{"rank":1,' \
                 b'"clock_offset_ns":-5,"clock_error_ns":1000}}'
    text = TAKEN[0].encode() + b"\n" + clock_line + b"\n" + clock_line.replace(b"-5", b"7") + b"\n"
    fd = os.open(tmp_path / "fallback", os.O_WRONLY | os.O_CREAT)
    try:
        for cut in range(len(text) + 1):
            s = scanner(fd, mark=fullscan.MARK)
            s.feed(text[:cut])
            s.feed(text[cut:])
            s.finish()
            assert s.mark_line == clock_line, cut
        s = scanner(fd, mark=fullscan.MARK, mark_limit=len(TAKEN[0]))  # only lines starting within the limit
        s.feed(text)
        assert s.mark_line is None
    finally:
        os.close(fd)


@pytest.mark.parametrize("rows, defer_rows, defer_sites", [(1000, 1, 1), (1000, 1 << 30, 1 << 30), (7, 50, 3)])
def test_batches_and_sites_classified_late_give_the_same_table(stepgen, training, tmp_path, monkeypatch, rows,
                                                               defer_rows, defer_sites):
    # many batches per file; the events of new sites inserted at once, held to the end, or in between
    hostile = write(tmp_path / "h.pfw.gz", [line.encode() for line in TAKEN + LEFT], "gzip", members=3)
    paths = [stepgen, training, hostile]
    general = table(paths, monkeypatch, True)[0]
    monkeypatch.setattr(fullscan, "ROWS", rows)
    monkeypatch.setattr(fullscan, "DEFER_ROWS", defer_rows)
    monkeypatch.setattr(fullscan, "DEFER_SITES", defer_sites)
    assert table(paths, monkeypatch, False)[0] == general


def test_every_command_reads_a_file_through_the_c_reader(tmp_path, monkeypatch, stepgen):
    """validate, convert, split and merge read an intact gzip file as the full scan does (its
    members inflated by the C reader: the Python decoder is only for damaged members), and
    their outputs hold the file's text, event for event."""
    from dftrace_dynamo.cli import main

    def refused(*args):
        raise AssertionError("an intact gzip member decoded by the Python decoder")
    text = gzip.decompress(open(stepgen, "rb").read())
    events_in = [json.loads(line.rstrip(b",")) for line in text.split(b"\n") if line.strip() not in (b"", b"[", b"]")]
    monkeypatch.setattr(reader, "_members", refused)
    assert b"".join(reader.iter_chunks(stepgen)) == text
    assert main(["validate", stepgen]) == 0
    assert main(["convert", stepgen, "-o", str(tmp_path / "copy.pfw")]) == 0
    copied = [json.loads(line.rstrip(b",")) for line in (tmp_path / "copy.pfw").read_bytes().split(b"\n")
              if line.strip() not in (b"", b"[", b"]")]
    assert copied == events_in
    assert main(["convert", "--split", "--max-events", "500", stepgen, "-o", str(tmp_path / "parts")]) == 0
    assert len(os.listdir(tmp_path / "parts")) > 1
    assert main(["merge", stepgen, "-o", str(tmp_path / "merged.pfw")]) == 0
    merged = [line for line in (tmp_path / "merged.pfw").read_bytes().split(b"\n") if line.strip() not in (b"", b"[", b"]")]
    assert len(merged) >= len(events_in)
