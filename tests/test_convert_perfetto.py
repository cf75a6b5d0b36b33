"""convert --format perfetto: Perfetto's protobuf trace, checked in the real trace processor
against the JSON of the same events, and packet by packet against the perfetto package's own
messages (perfetto_trace_pb2)."""

import json
import os
import sys
import zlib

import orjson
import pytest

import perfetto_tp
from backend_support import run_python, run_torchrun
from scripts.clitools import assert_bad_input, cli
from tracefile import read_bytes, traces

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
OFFSET_NS = 1_234_567  # stepgen: rank R's clock R * OFFSET_NS from rank 0's (error bound 1 µs)

SLICES = """select p.name process, t.name thread, s.name, s.category, s.depth, s.ts, s.dur
            from slice s join thread_track tt on s.track_id = tt.id join thread t using (utid)
            left join process p using (upid)"""
ARGS = """select s.ts, s.name, s.depth, a.key, a.display_value from slice s join args a using (arg_set_id)
          where a.key glob 'args.*' or a.key glob 'debug.*'"""
COUNTERS = """select p.name process, t.name track, c.ts, c.value from counter c
              join process_counter_track t on c.track_id = t.id join process p using (upid)"""


def convert(src, out, *extra):
    p = cli("convert", *([src] if isinstance(src, (str, os.PathLike)) else src), "-o", out, *extra)
    assert p.returncode == 0, p.stderr
    return p


def tp_view(path, clean=True):
    """What the trace processor shows: slices, their args (without the args./debug. prefix),
    counters, process and thread names; asserts zero error stats (``clean``)."""
    assert not clean or perfetto_tp.error_stats(path) == []
    slices, args, counters, procs, threads = perfetto_tp.query(
        path, SLICES, ARGS, COUNTERS, "select name from process where pid != 0",
        "select name from thread where tid != 0")
    arg_rows = sorted((r["ts"], r["name"], r["depth"], r["key"].split(".", 1)[1], r["display_value"])
                      for r in perfetto_tp.as_dicts(args))
    return {"slices": sorted(tuple(r.values()) for r in perfetto_tp.as_dicts(slices)), "args": arg_rows,
            "counters": sorted(tuple(r.values()) for r in perfetto_tp.as_dicts(counters)),
            "processes": sorted(r[0] for r in procs["rows"]), "threads": sorted(r[0] or "" for r in threads["rows"])}


def text_of(path):
    """The decompressed text of a (possibly cut) gzip file: its members, as far as they go."""
    if not path.endswith(".gz"):
        return read_bytes(path)
    data, out = open(path, "rb").read(), []
    while data:
        d = zlib.decompressobj(31)
        out.append(d.decompress(data))
        data = d.unused_data
    return b"".join(out)


def events_of(paths):
    """The events of the files (aggregate records left out; a cut last line too), split at newlines
    only (names may hold U+2028)."""
    out = []
    for path in paths:
        for line in text_of(str(path)).split(b"\n"):
            line = line.strip().rstrip(b",")
            if line.startswith(b"{"):
                try:
                    out.append(orjson.loads(line))
                except orjson.JSONDecodeError:  # the cut last line of a cut file
                    pass
    return [e for e in out if e.get("name") != "dftrace_aggregates"]


# --- the packets, decoded with the package's messages ------------------------------------------

def packets(path):
    """``(raw bytes, TracePacket)`` of each packet, framed by hand and parsed by perfetto_trace_pb2."""
    data, at, out = open(path, "rb").read(), 0, []
    while at < len(data):
        assert data[at] == 0x0A, at  # Trace.packet
        at += 1
        size = shift = 0
        while True:
            b = data[at]
            at += 1
            size |= (b & 127) << shift
            shift += 7
            if b < 128:
                break
        raw = data[at:at + size]
        at += size
        out.append((raw, pb.TracePacket.FromString(raw)))
    return out


def annotation_value(a, strings):
    """A DebugAnnotation as the JSON value it stands for."""
    kind = a.WhichOneof("value")
    if kind == "string_value_iid":
        return strings[a.string_value_iid]
    if kind in ("bool_value", "int_value", "uint_value", "double_value", "string_value"):
        return getattr(a, kind)
    if a.dict_entries:
        return {e.name: annotation_value(e, strings) for e in a.dict_entries}
    return [annotation_value(e, strings) for e in a.array_values]


def decoded(path):
    """Every event of a protobuf trace as the package's messages give it, resolving interned
    strings, the incremental clock and track defaults by hand: (process name, thread name or
    counter track name, kind, name, cat, start ns, end ns or value, args); also asserts that each
    event packet is the exact serialization of its parsed message."""
    tracks, seqs, out, open_slices = {}, {}, [], {}
    for raw, p in packets(path):
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            tracks[d.uuid] = d
            continue
        s = seqs.setdefault(p.trusted_packet_sequence_id, {})
        if p.HasField("trace_packet_defaults"):
            assert p.sequence_flags & 1 and p.trace_packet_defaults.timestamp_clock_id == 64
            s["track"] = p.trace_packet_defaults.track_event_defaults.track_uuid
            clocks = {c.clock_id: c for c in p.clock_snapshot.clocks}
            assert clocks[64].is_incremental and clocks[64].timestamp == clocks[6].timestamp
            s["t"] = clocks[64].timestamp
        if p.HasField("interned_data"):
            i = p.interned_data
            s["names"] = {e.iid: e.name for e in i.event_names}
            s["cats"] = {e.iid: e.name for e in i.event_categories}
            s["keys"] = {e.iid: e.name for e in i.debug_annotation_names}
            s["strings"] = {e.iid: e.str.decode() for e in i.debug_annotation_string_values}
        if not p.HasField("track_event"):
            continue
        assert p.SerializeToString() == raw  # the hand encoding is the package's, byte for byte
        e = p.track_event
        s["t"] += p.timestamp
        track = tracks[e.track_uuid if e.HasField("track_uuid") else s["track"]]
        if e.type == pb.TrackEvent.TYPE_SLICE_END:
            out.append(open_slices[track.uuid].pop() + (s["t"],))
            continue
        owner = tracks[track.parent_uuid] if track.HasField("parent_uuid") else track
        pid = owner.process.pid if owner.HasField("process") else owner.thread.pid
        where = track.thread.thread_name if track.HasField("thread") else track.name
        if e.type == pb.TrackEvent.TYPE_COUNTER:
            out.append((pid, where, "C", None, None, s["t"], e.counter_value if e.HasField("counter_value")
                        else e.double_counter_value, None))
            continue
        args = orjson.dumps({s["keys"][a.name_iid]: annotation_value(a, s["strings"])
                             for a in e.debug_annotations}, option=orjson.OPT_SORT_KEYS)
        cat = s["cats"][e.category_iids[0]] if e.category_iids else None
        head = (pid, where, "X" if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN else "i", s["names"][e.name_iid],
                cat, s["t"])
        if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            open_slices.setdefault(track.uuid, []).append(head + (args,))  # the end time comes with the end
        else:
            out.append(head + (s["t"], args))
    assert all(not v for v in open_slices.values())
    return out


def kept(value):
    """A JSON value without the nulls, empty objects and empty lists the JSON importer drops."""
    if isinstance(value, dict):
        value = {k: v for k, v in ((k, kept(v)) for k, v in value.items()) if v is not None}
    elif isinstance(value, list):
        value = [v for v in map(kept, value) if v is not None]
    return None if value in ({}, []) else value


def expected(events, offsets_ns=None):
    """What :func:`decoded` must give for the JSON ``events`` of one process, from the events."""
    thread_names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    out = []
    for e in events:
        ts = e.get("ts")
        if ts is None or e.get("ph") == "M":
            continue
        start = round(ts * 1000) - (offsets_ns or {}).get(e["pid"], 0)
        args = kept(e.get("args") or {}) or {}
        if e["ph"] == "X":
            out.append((e["pid"], thread_names.get(e["tid"], ""), "X", e["name"], e.get("cat"), start,
                        start + round(e["dur"] * 1000), orjson.dumps(args, option=orjson.OPT_SORT_KEYS)))
        elif e["ph"] == "C":
            out += [(e["pid"], f"{e['name']} {k}", "C", None, None, start, v, None) for k, v in args.items()]
    return sorted(out, key=repr)


def reorder(rows):
    """:func:`decoded` rows with a slice's args last, sorted like :func:`expected`."""
    return sorted(((r[0], r[1], r[2], r[3], r[4], r[5], r[7], r[6]) if r[2] == "X" else r for r in rows), key=repr)


# --- real training: two ranks of a compiled transformer ----------------------------------------

@pytest.fixture(scope="module")
def training(tmp_path_factory):
    d = tmp_path_factory.mktemp("train")
    run_torchrun(os.path.join(SCRIPTS, "transformer_train.py"), d, d / "run" / "job", args=["5"])
    files = traces(d / "run")
    assert len(files) == 2
    return d


def test_real_training_ranks_load_as_the_json_does(training, tmp_path):
    out, merged = tmp_path / "train.perfetto-trace", tmp_path / "merged.json"
    p = convert(training / "run", out)  # a run directory: the format from the extension
    assert "events from 2 files (perfetto)" in p.stdout
    assert cli("merge", training / "run", "-o", tmp_path / "m.pfw").returncode == 0
    convert(tmp_path / "m.pfw", merged)
    proto, js = tp_view(out), tp_view(merged)
    assert proto == js
    events = events_of(traces(training / "run"))
    assert len(proto["slices"]) == sum(e.get("ph") == "X" for e in events)
    assert len(proto["counters"]) == sum(e.get("ph") == "C" for e in events) > 0
    assert {r[1] for r in proto["counters"]} == {"memory rss"}
    cats = {r[3] for r in proto["slices"]}
    assert {"step", "dynamo", "module", "comm", "optimizer", "backward"} <= cats, cats
    assert max(r[4] for r in proto["slices"]) >= 4  # step > graph > module > module > op
    assert [n.split(" ")[:2] for n in proto["processes"]] == [["rank", "0"], ["rank", "1"]]
    reduces = sum(e.get("name") == "all_reduce" for e in events)
    assert sum(r[2] == "all_reduce" for r in proto["slices"]) == reduces >= 2 * 5
    # the ranks' main threads keep their names; the 64 MiB buffer of step 2 shows in the counter
    assert proto["threads"].count("MainThread") == 2
    rss = [r[3] for r in proto["counters"]]
    assert max(rss) - min(rss) >= 48 << 20
    # every event field and argument, packet by packet, as the package's messages read them
    by_pid = {}
    for e in events:
        by_pid.setdefault(e["pid"], []).append(e)
    assert reorder(decoded(out)) == sorted((r for evs in by_pid.values() for r in expected(evs)), key=repr)
    # short names: ~0.29 (results_perfetto.rst); the ratio moves with a run's own times (0.3005
    # seen with both cores overloaded)
    assert os.path.getsize(out) <= 0.32 * os.path.getsize(merged)


# --- stepgen: ranks with a clock offset, odd strings, a cut file -------------------------------

def stepgen(prefix, *args):
    return run_python([os.path.join(SCRIPTS, "stepgen.py"), str(prefix), *map(str, args)],
                      env={"DFTRACER_RUN_ID": "job"}).stdout.strip()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    d = tmp_path_factory.mktemp("stepgen")
    for rank in (0, 1, 2):
        stepgen(d / f"job-rank{rank}", "--steps", 30, "--rank", rank, "--seed", rank, "--recompile-at", 7,
                "--graph-break", "--clock-offset-ns", OFFSET_NS)
    return d


def test_ranks_merged_with_their_clock_offsets_applied_exactly(ranks, tmp_path):
    """Rank R's clock runs R * 1,234,567 ns ahead: its times move back by that in whole µs, as
    merge moves them, in integer ns (no float on the way)."""
    out, merged = tmp_path / "job.pftrace", tmp_path / "merged.json"
    p = convert(ranks, out)
    assert p.stderr.count("times are moved onto rank 0's clock") == 2, p.stderr
    assert cli("merge", ranks, "-o", tmp_path / "m.pfw").returncode == 0
    convert(tmp_path / "m.pfw", merged)
    proto, js = tp_view(out), tp_view(merged)
    assert proto == js  # offsets of whole µs, as merge moves them: the same times to the ns
    files = traces(ranks)
    assert len(proto["slices"]) == sum(e.get("ph") == "X" for e in events_of(files))
    offsets = {}
    for path in files:
        evs = events_of([path])
        rank = int(path.split("rank")[1][0])
        offsets[evs[0]["pid"]] = round(rank * OFFSET_NS / 1000) * 1000  # whole µs, exactly
    want = sorted((r for path in files for r in expected(events_of([path]), offsets)), key=repr)
    assert reorder(decoded(out)) == want
    assert os.path.getsize(out) <= 0.3 * os.path.getsize(merged)  # ~0.28: 7 arguments an op (results_perfetto.rst)


ODD = ['say "hi"\n\tnow', "naïve Ωμέγα 東京 🚀", "back\\slash\\", "x" * 100_000, "", "a\u2028b\x00c"]


def odd_trace(path):
    """A trace written by the C writer holding names, categories and arguments with quotes,
    newlines, non-ASCII, a NUL, a 100 kB name, nested values and numbers of every JSON kind."""
    code = f"""
import sys
from dftrace_dynamo import _core
from dftrace_dynamo.session import logger
logger.initialize_log({str(path)!r})
path = _core.path()
odd = {ODD!r}
t = _core.now_ns() + 1_000_000
for i, s in enumerate(odd):
    _core.log(s, s[:50] or "c", t + 10_000 * i, t + 10_000 * i + 5_000,
              {{"text": s, s[:20] or "k": i, "nested": {{"a": [1, s, 2.5, True], "b": {{"c": None}}}},
               "big": 2**63 + 5, "neg": -(2**40), "f": 0.1, "flag": False, "none": None}})
logger.finalize()
print(path)
"""
    return run_python(["-c", code], env={"DFTRACER_ENABLE": "1"}).stdout.strip()


def test_odd_strings_arrive_exactly(tmp_path):
    src = odd_trace(tmp_path / "odd")
    out = tmp_path / "odd.pftrace"
    convert(src, out, "--format", "perfetto")
    assert perfetto_tp.error_stats(out) == []
    names = perfetto_tp.rows(out, "select name, category, dur from slice where category != 'dftracer' order by ts")
    # the file holds each string exactly (decoded() below); the trace processor ends one at a NUL
    assert [r["name"] for r in names] == [s.split("\x00")[0] for s in ODD] and {r["dur"] for r in names} == {5000}
    assert [r["category"] for r in names] == [(s[:50] or "c").split("\x00")[0] for s in ODD]
    args = perfetto_tp.rows(out, """select s.name, a.key, a.value_type, a.display_value from slice s
                                    join args a using (arg_set_id) where a.key glob 'debug.*' order by s.ts, a.id""")
    first = {r["key"]: (r["value_type"], r["display_value"]) for r in args if r["name"] == ODD[0]}
    assert first["debug.text"] == ("string", ODD[0])
    assert first["debug.nested.a[1]"] == ("string", ODD[0]) and first["debug.nested.a[3]"] == ("bool", "true")
    assert first["debug.big"] == ("string", str(2**63 + 5))  # the writer's text for integers beyond int64 and first["debug.neg"] == ("int", str(-(2**40)))
    assert first["debug.f"] == ("real", "0.1") and first["debug.flag"] == ("bool", "false")
    assert "debug.none" not in first and "debug.nested.b.c" not in first  # as the JSON importer: nulls dropped
    assert sorted(reorder(decoded(out))) == sorted(expected(events_of([src])))


def _inflated(data: bytes) -> bytes:
    """What gzip ``data`` decodes to, up to where it is cut."""
    out = b""
    while data:
        d = zlib.decompressobj(31)
        out += d.decompress(data)
        if not d.eof:
            break
        data = d.unused_data
    return out


def test_a_cut_input_gives_a_trace_of_what_it_holds(ranks, tmp_path):
    full = traces(ranks)[0]
    cut = tmp_path / "cut.pfw.gz"
    data = open(full, "rb").read()
    n = len(data) * 2 // 3
    while _inflated(data[:n]).endswith(b"\n"):  # the cut must fall inside a line
        n -= 1
    cut.write_bytes(data[:n])
    out = tmp_path / "cut.pftrace"
    p = convert(cut, out)
    assert "truncated: the gzip member" in p.stderr and "dropped the cut last line" in p.stderr
    kept = events_of([str(cut)])
    assert 0 < len(kept) < len(events_of([full]))
    assert perfetto_tp.error_stats(out) == []
    n = perfetto_tp.rows(out, "select count(*) n from slice")[0]["n"]
    assert n == sum(e.get("ph") == "X" for e in kept)
    assert reorder(decoded(out)) == expected(kept)


def test_instants_counters_and_phases_it_does_not_carry(tmp_path):
    """Instants of each scope, a counter of two values and a zero-length slice inside another
    load as the JSON's; B/E events are left out and counted in a warning."""
    evs = [{"name": "process_name", "ph": "M", "pid": 7, "args": {"name": "p7"}},
           {"name": "thread_name", "ph": "M", "pid": 7, "tid": 8, "args": {"name": "worker"}},
           {"name": "outer", "cat": "c", "ph": "X", "pid": 7, "tid": 8, "ts": 100, "dur": 50, "args": {"k": 1}},
           {"name": "zero", "cat": "c", "ph": "X", "pid": 7, "tid": 8, "ts": 100, "dur": 0},
           {"name": "inner", "cat": "c", "ph": "X", "pid": 7, "tid": 8, "ts": 120, "dur": 29.5},
           {"name": "mark", "cat": "c", "ph": "i", "pid": 7, "tid": 8, "ts": 130, "s": "t", "args": {"why": "x"}},
           {"name": "pmark", "ph": "I", "pid": 7, "tid": 8, "ts": 131, "s": "p"},
           {"name": "gmark", "ph": "i", "pid": 7, "tid": 8, "ts": 132, "s": "g"},
           {"name": "mem", "cat": "memory", "ph": "C", "pid": 7, "tid": 9, "ts": 110, "args": {"a": 5, "b": 2.5}},
           {"name": "mem", "cat": "memory", "ph": "C", "pid": 7, "tid": 9, "ts": 140, "args": {"a": 6, "b": -1.5}},
           {"name": "b", "ph": "B", "pid": 7, "tid": 8, "ts": 160}, {"name": "b", "ph": "E", "pid": 7, "tid": 8, "ts": 170}]
    src, js, out = tmp_path / "t.pfw", tmp_path / "t.json", tmp_path / "t.pftrace"
    src.write_text("[\n" + "".join(json.dumps(e) + "\n" for e in evs[:-2]) + "]\n")
    convert(src, js)
    full = tmp_path / "full.pfw"
    full.write_text("[\n" + "".join(json.dumps(e) + "\n" for e in evs) + "]\n")
    p = convert(full, out)
    assert "left out events the protobuf output does not carry: 1 B, 1 E" in p.stderr
    sql = ("select s.name, s.ts, s.dur, s.depth, s.category, t.type from slice s join track t on s.track_id = t.id",
           "select t.name, c.ts, c.value from counter c join counter_track t on c.track_id = t.id",
           "select a.key, a.display_value from slice s join args a using (arg_set_id) where a.key glob '*.why'")
    got = [sorted(map(tuple, r["rows"])) for r in perfetto_tp.query(out, *sql)]
    want = [sorted(map(tuple, r["rows"])) for r in perfetto_tp.query(js, *sql)]
    assert perfetto_tp.error_stats(out) == []
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in got[0]] == [(r[0], r[1], r[2], r[3], r[4]) for r in want[0]]
    assert [r[3] for r in got[0] if r[0] == "inner"] == [1] and len(got[0]) == 6
    assert got[1] == want[1] == [("mem a", 110000, 5.0), ("mem a", 140000, 6.0), ("mem b", 110000, 2.5),
                                 ("mem b", 140000, -1.5)]
    assert got[2] == [("debug.why", "x")] and want[2] == [("args.why", "x")]


# --- the command around it ---------------------------------------------------------------------

def test_validate_accepts_it_and_summary_points_at_the_pfw_files(ranks, tmp_path):
    out = tmp_path / "job.perfetto-trace"
    convert(ranks, out)
    p = cli("validate", out)
    assert p.returncode == 0, p.stdout
    n = len(decoded(out))
    assert p.stdout.startswith(f"{out}: OK ({n:,} events") and "protobuf" in p.stdout
    cut = tmp_path / "cut.perfetto-trace"
    cut.write_bytes(out.read_bytes()[:-7])
    p = cli("validate", cut)
    assert p.returncode == 1 and "cut" in p.stdout, p.stdout
    p = cli("summary", out)
    line = assert_bad_input(p, "Perfetto protobuf trace", ".pfw")
    assert str(out) in line


def test_without_the_perfetto_package_one_line(ranks, tmp_path):
    block = tmp_path / "block"
    block.mkdir()
    (block / "perfetto.py").write_text("raise ImportError('not installed')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(block), *sys.path])}
    p = cli("convert", traces(ranks)[0], "-o", tmp_path / "x.pftrace", env=env)
    assert_bad_input(p, "pip install 'dftrace-dynamo[perfetto]'")
    assert not (tmp_path / "x.pftrace").exists()


def test_several_inputs_only_with_the_perfetto_format(ranks, tmp_path):
    p = cli("convert", ranks, "-o", tmp_path / "x.pfw.gz")
    assert_bad_input(p, "convert takes one trace file", "--format perfetto")
    p = cli("convert", ranks, "-o", tmp_path / "parts", "--split", "--max-events", "10", "--format", "perfetto")
    assert_bad_input(p, "--split writes .pfw.gz parts")
