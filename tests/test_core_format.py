"""File format written by the C core (dftrace_dynamo._core): structure, JSON
validity of every line in every compression mode, ids, counts, the end record,
escaping, timestamps and flags."""

import gc
import json
import os
import random
import subprocess
import sys
import threading
import zlib

import pytest
import zstandard
from hypothesis import assume, given, settings, strategies as st

from dftrace_dynamo import _core
from dftrace_dynamo.session import hooks
from tracefile import read_bytes

HHASH = "0123456789abcdef"
HEADER = (
    b'{"id":1,"name":"process_name","cat":"dftracer","pid":42,"tid":42,"ph":"M","args":{"name":"p"}}\n'
    b'{"id":2,"name":"start","cat":"dftracer","pid":42,"tid":42,"ts":1,"dur":0,"ph":"X","args":{}}\n'
)
EXT = {0: ".pfw", 1: ".pfw.gz", 2: ".pfw.zst"}


@pytest.fixture(autouse=True)
def closed_core():
    _core.close()
    hooks.remove_all()  # a session earlier in this process left e.g. the gc callback, which writes into any open trace
    yield
    _core.close()


def open_trace(tmp_path, comp=0, header=HEADER, name="t", buffer_size=1 << 20):
    path = str(tmp_path / (name + EXT[comp]))
    _core.open(path, comp, buffer_size, header, 42, HHASH)
    return path


def members(data, comp):
    """Split a gzip/zstd file into its members, checking each decodes alone."""
    out = []
    while data:
        if comp == 1:
            d = zlib.decompressobj(31)
            out.append(d.decompress(data))
            assert d.eof, "truncated gzip member"
            data = d.unused_data
        else:
            d = zstandard.ZstdDecompressor().decompressobj()
            out.append(d.decompress(data))
            assert d.eof, "truncated zstd frame"
            data = d.unused_data
    return out


def read_text(path):
    """The decoded text (tracefile.read_bytes), checking that every gzip member
    or zstd frame also decodes alone."""
    text = read_bytes(path)
    comp = 1 if path.endswith(".gz") else 2 if path.endswith(".zst") else 0
    if comp:
        with open(path, "rb") as f:
            assert b"".join(members(f.read(), comp)) == text
    return text.decode("utf-8")


def read_objects(path):
    """Checks the line structure ([, one object per line, ]) and parses every line."""
    lines = read_text(path).split("\n")
    assert lines[0] == "[" and lines[-2:] == ["]", ""], (lines[:1], lines[-2:])
    objs = []
    for line in lines[1:-2]:
        assert line.startswith("{") and line.endswith("}"), line
        objs.append(json.loads(line))
    return objs


def events(objs):
    return [o for o in objs if o["ph"] == "X" and o["cat"] != "dftracer"]


@pytest.mark.parametrize("comp", [0, 1, 2])
def test_structure_ids_counts_and_end(tmp_path, comp):
    site = _core.intern_site("op.add", "dynamo", {"graph": 0, "node": "add_1"})
    tags = _core.intern_tags({"step": 7, "name": "train"})
    t = _core.now_ns()
    n = 2500
    path = open_trace(tmp_path, comp)
    for i in range(n):
        _core.record(site, t + 1000 * i, t + 1000 * i + 500, 0, tags if i % 2 else 0)
    _core.log("user", "app", t + 1000 * n, t + 1000 * n + 10, {"k": [1, 2]})
    assert _core.is_open() and _core.path() == path
    res = _core.close()
    assert res == {"num_events": n + 1, "dropped": 0, "path": path}
    assert not _core.is_open() and _core.path() is None

    objs = read_objects(path)
    assert [json.dumps(o, separators=(",", ":")).encode() + b"\n" for o in objs[:2]] == HEADER.splitlines(True)
    assert [o["id"] for o in objs] == list(range(1, len(objs) + 1))
    names = [o for o in objs if o["name"] == "thread_name"]
    assert len(names) == 1 and names[0]["ph"] == "M" and names[0]["args"]["name"] == "MainThread"
    assert names[0]["tid"] == threading.get_native_id()
    ev = events(objs)
    assert len(ev) == n + 1
    ops = [e for e in ev if e["name"] == "op.add"]
    assert len(ops) == n
    assert all(e["pid"] == 42 and e["args"]["hhash"] == HHASH for e in ev)
    assert ops[1]["args"] == {"hhash": HHASH, "graph": 0, "node": "add_1", "step": 7, "name": "train",
                              "grad_enabled": 0}
    assert ops[0]["args"] == {"hhash": HHASH, "graph": 0, "node": "add_1", "grad_enabled": 0}
    user = [e for e in ev if e["name"] == "user"]
    assert user[0]["cat"] == "app" and user[0]["args"] == {"hhash": HHASH, "k": [1, 2]}
    end = objs[-1]
    assert end["name"] == "end" and end["ph"] == "X" and end["dur"] == 0
    assert end["args"] == {"hhash": HHASH, "num_events": n + 1, "dropped": 0}


@pytest.mark.parametrize("comp", [1, 2])
def test_flush_writes_independent_members(tmp_path, comp):
    site = _core.intern_site("op", "c")
    path = open_trace(tmp_path, comp)
    t = _core.now_ns()
    sizes = []
    for k in range(3):
        for i in range(100):
            _core.record(site, t, t + 1)
            t += 2000
        _core.flush()
        sizes.append(os.path.getsize(path))
    assert sizes[0] < sizes[1] < sizes[2]
    with open(path, "rb") as f:
        data = f.read()
    # header member + one per flush, each decodable alone
    parts = members(data, comp)
    assert len(parts) >= 4  # the 1 s timer may add one on a slow machine
    assert all(p.endswith(b"\n") for p in parts)
    # a copy cut right after the 2nd flush reads as a valid prefix
    lines = b"".join(members(data[: sizes[1]], comp)).decode().splitlines()
    assert lines[0] == "[" and sum('"name":"op"' in line for line in lines) == 200
    for line in lines[1:]:
        json.loads(line)
    _core.close()


def test_plain_flush_is_visible(tmp_path):
    site = _core.intern_site("op", "c")
    path = open_trace(tmp_path, 0)
    t = _core.now_ns()
    _core.record(site, t, t + 5)
    _core.flush()
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0] == "[" and json.loads(lines[-1])["name"] == "op"


def test_open_never_overwrites(tmp_path):
    path = tmp_path / "x.pfw"
    path.write_text("keep")
    with pytest.raises(FileExistsError):
        _core.open(str(path), 0, 1 << 20, b"", 1, HHASH)
    assert path.read_text() == "keep" and not _core.is_open()


def test_open_twice_and_close_when_closed(tmp_path):
    assert _core.close() is None
    open_trace(tmp_path, 0, name="a")
    with pytest.raises(RuntimeError):
        open_trace(tmp_path, 0, name="b")
    assert not (tmp_path / "b.pfw").exists()
    assert _core.close()["num_events"] == 0
    with pytest.raises(ValueError):
        _core.open(str(tmp_path / "c.pfw"), 4, 1 << 20, b"", 1, HHASH)


def test_recording_while_closed_is_a_noop(tmp_path):
    site = _core.intern_site("op", "c")
    before = _core.stats()["recorded"]
    _core.record(site, 1, 2)
    _core.log("x", "y", 1, 2)
    assert _core.stats()["recorded"] == before
    path = open_trace(tmp_path, 0)
    _core.record(site, 1, 2)
    st_ = _core.stats()
    assert st_["recorded"] == 1 and st_["dropped"] == 0
    _core.close()
    assert len(events(read_objects(path))) == 1


def test_bad_ids_are_rejected(tmp_path):
    site = _core.intern_site("op", "c")
    with pytest.raises(ValueError):
        _core.record(0, 1, 2)
    with pytest.raises(ValueError):
        _core.record(10**6, 1, 2)
    with pytest.raises(ValueError):
        _core.record(site, 1, 2, 0, 10**6)
    with pytest.raises(TypeError):
        _core.intern_site("a", "b", [1])
    assert _core.intern_site("a", "b", {"x": 1}) == _core.intern_site("a", "b", {"x": 1})
    assert _core.intern_tags({}) == _core.intern_tags(None) == 0


def test_timestamps_and_sub_microsecond_durations(tmp_path):
    durs = [0, 1, 10, 999, 1000, 1500, 1234567]
    sites = [_core.intern_site(f"d{d}", "c") for d in durs]
    path = open_trace(tmp_path, 0)
    base = 1_700_000_000_123_456_789
    for k, (site, d) in enumerate(zip(sites, durs)):
        s = base + k * 10_000_000  # far apart: no placement shift
        _core.record(site, s, s + d)
    _core.close()
    ev = {e["name"]: e for e in events(read_objects(path))}
    raw = {json.loads(line)["name"]: line for line in read_text(path).splitlines()[1:-1]}
    for k, d in enumerate(durs):
        e = ev[f"d{d}"]
        assert isinstance(e["ts"], int)
        assert e["ts"] == (base + k * 10_000_000) // 1000
        assert round(e["dur"] * 1000) == d
        assert f'"dur":{d // 1000}' + (f".{d % 1000:03d}".rstrip("0") if d % 1000 else "") + ","\
            in raw[f"d{d}"]


@pytest.mark.parametrize(
    "flags,expect",
    [
        (0, {"grad_enabled": 0}),
        (_core.FLAG_GRAD, {"grad_enabled": 1}),
        (_core.FLAG_GRAD | (_core.PHASE_FORWARD << _core.PHASE_SHIFT), {"grad_enabled": 1, "phase": "forward"}),
        (_core.PHASE_BACKWARD << _core.PHASE_SHIFT, {"grad_enabled": 0, "phase": "backward"}),
        ((_core.PHASE_INFERENCE << _core.PHASE_SHIFT) | _core.FLAG_FAILED,
         {"grad_enabled": 0, "phase": "inference", "failed": 1}),
        (_core.PHASE_OPTIMIZER << _core.PHASE_SHIFT, {"grad_enabled": 0, "phase": "optimizer"}),
        # the writer's own bits (no context, caller's times, step slice, own step) are ignored
        (_core.FLAG_GRAD | 16 | 32 | 64 | 128, {"grad_enabled": 1}),
    ],
)
def test_flags(tmp_path, flags, expect):
    site = _core.intern_site("op", "c")
    path = open_trace(tmp_path, 0)
    _core.record(site, 1000, 2000, flags)
    _core.close()
    (e,) = events(read_objects(path))
    assert e["name"] == "op" and e["args"] == {"hhash": HHASH, **expect}


@pytest.fixture
def no_gc():
    """No collection (and so no ``gc`` slice from an earlier test's hooks) among the events."""
    gc.disable()
    yield
    gc.enable()


@pytest.mark.parametrize("comp", [0, 1])
def test_one_site_in_changing_contexts(tmp_path, comp, no_gc):
    """The end of an interned site's line is formatted once per (site, tags' text, flags, step)
    and reused: every event still shows its own tags, flags and step, also when a tags id is
    reused for other text of the same length, when the tags are too long to reuse, and when two
    sites alternate in one slot; the gzip trace (whose encoder relies on it) holds the same
    lines."""
    sites = [_core.intern_site("op", "dynamo", {"node": "op_1"}), _core.intern_site("op", "dynamo", {"node": "op_2"})]
    for k in range(16384 - 2):  # the site 16384 ids on shares sites[0]'s slot (writer.c TAIL_SLOTS)
        _core.intern_site(f"filler{k}", "c")
    sites.append(_core.intern_site("far", "dynamo"))
    assert sites[2] - sites[0] == 16384
    long_tags = {"module": "m" * 70, "x": 1}
    tag_ids = {"none": 0, "short": _core.intern_tags({"k": "a"}), "long": _core.intern_tags(long_tags)}
    tag_args = {"none": {}, "short": {"k": "a"}, "long": long_tags}
    cell = _core.TagCell()
    fwd, bwd = _core.PHASE_FORWARD << _core.PHASE_SHIFT, _core.PHASE_BACKWARD << _core.PHASE_SHIFT
    flag_args = {0: {"grad_enabled": 0}, _core.FLAG_GRAD | fwd: {"grad_enabled": 1, "phase": "forward"},
                 bwd | _core.FLAG_FAILED: {"grad_enabled": 0, "phase": "backward", "failed": 1}}
    path = open_trace(tmp_path, comp)
    rnd = random.Random(5)
    expect, t, ids = [], 1_700_000_000_000_000_000, set()
    for block in range(150):  # a few events of one context, then one or more of its parts change
        if block % 7 == 0:
            _core.set_step(None if block % 14 or block == 140 else block)
        if block % 5 == 0:  # the cell's text changes; a released id is reused after a flush
            _core.flush()
            cell.set({"w": f"v{block // 5 % 3}"})
            ids.add(cell.id)
        site, kind, flags = rnd.randrange(3), rnd.choice(["none", "short", "long", "cell"]), rnd.choice(list(flag_args))
        for _ in range(rnd.randrange(1, 6)):
            _core.record(sites[site], t, t + 500 + rnd.randrange(3000), flags, cell.id if kind == "cell" else tag_ids[kind])
            step = _core.get_step()
            expect.append({"hhash": HHASH, **({"node": f"op_{site + 1}"} if site < 2 else {}),
                           **({"w": f"v{block // 5 % 3}"} if kind == "cell" else tag_args[kind]),
                           **({} if step is None else {"step": step}), **flag_args[flags]})
            t += 5000
    assert len(ids) < 30  # ids were reused
    _core.flush()
    cell.set({"w": "v7"})
    first = cell.id
    cell.set({"w": "v8"})  # first is released, free once the writer passed
    _core.flush()
    for text in ("v7", "v9"):  # one site and context; the tags id again, for other text
        cell.set({"w": text})
        assert cell.id == first
        _core.record(sites[0], t, t + 1000, 0, cell.id)
        expect.append({"hhash": HHASH, "node": "op_1", "w": text, "grad_enabled": 0})
        cell.set({"w": "v8"})
        _core.flush()
        t += 5000
    _core.close()
    got = [e["args"] for e in events(read_objects(path))]
    assert got == expect


def test_constants():
    assert (_core.FLAG_GRAD, _core.PHASE_SHIFT, _core.FLAG_FAILED) == (1, 1, 1024)
    assert (_core.PHASE_NONE, _core.PHASE_FORWARD, _core.PHASE_BACKWARD, _core.PHASE_INFERENCE,
            _core.PHASE_OPTIMIZER) == (0, 1, 2, 3, 4)
    assert (_core.CALL, _core.METHOD) == (0, 1)
    assert (_core.GRAD_INHERIT, _core.GRAD_ON, _core.GRAD_OFF) == (0, 1, 2)


def test_now_ns_is_epoch_based():
    import time

    a = time.time_ns()
    b = _core.now_ns()
    c = time.time_ns()
    assert a - 5_000_000 <= b <= c + 5_000_000


ANY_TEXT = st.text(alphabet=st.characters(blacklist_categories=()), max_size=40)


def _expected(s):
    return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in s)


@settings(max_examples=60, deadline=None)
@given(name=ANY_TEXT, cat=ANY_TEXT, key=ANY_TEXT, value=ANY_TEXT, tag=ANY_TEXT)
def test_escaping_any_text(tmp_path_factory, name, cat, key, value, tag):
    assume(_expected(key) not in {"nested", "tag", "hhash", "grad_enabled"})
    assume(_expected(cat) != "dftracer")  # events() leaves the tracer's own records out
    tmp = tmp_path_factory.mktemp("esc")
    site = _core.intern_site(name, cat, {key: value, "nested": [value, {key: [1.5, None, True]}]})
    tags = _core.intern_tags({"tag": tag})
    path = open_trace(tmp, 1)
    _core.record(site, 1000, 2000, 0, tags)
    _core.log(name, cat, 3000, 4000, {key: value})
    _core.close()
    ev = events(read_objects(path))  # json.loads of every line
    assert len(ev) == 2
    for e in ev:
        assert e["name"] == _expected(name) and e["cat"] == _expected(cat)
        assert e["args"][_expected(key)] == _expected(value)
    assert ev[0]["args"]["tag"] == _expected(tag)
    assert ev[0]["args"]["nested"][0] == _expected(value)


def test_escaping_specials(tmp_path):
    name = 'q"b\\n\n\t\x00\x1f\x7f é \u2028 😀 \ud800'
    site = _core.intern_site(name, "c", {"big": 2**70, "neg": -5, "f": 0.1, "inf": float("inf"),
                                          "t": (1, "a"), 3: "intkey", "o": object.__new__(type("T", (), {"__str__": lambda s: "T!"}))})
    path = open_trace(tmp_path, 0)
    _core.record(site, 1, 2)
    _core.close()
    text = read_text(path)
    assert "\\u0000" in text and "\\u001f" in text and "😀" in text
    (e,) = events(read_objects(path))
    assert e["name"] == _expected(name)
    # beyond int64 an int is written as a string of its digits
    assert e["args"]["big"] == str(2**70) and e["args"]["neg"] == -5 and e["args"]["f"] == 0.1
    assert e["args"]["inf"] == "inf" and e["args"]["t"] == [1, "a"] and e["args"]["3"] == "intkey"
    assert e["args"]["o"] == "T!"


def test_self_referencing_args_are_cut_where_they_repeat(tmp_path):
    a = [1]
    a.append(a)
    before = _core.arg_issues()["self_reference"]
    site = _core.intern_site("x", "y", {"a": a})
    assert _core.arg_issues()["self_reference"] == before + 1
    path = open_trace(tmp_path)
    _core.record(site, 1, 2)
    _core.close()
    (e,) = events(read_objects(path))
    assert e["args"]["a"] == [1, "[...]"]


FALLBACK_CHILD = """
import sys
from dftrace_dynamo import _core
site = _core.intern_site("op", "c")
try:
    _core.open(sys.argv[1], int(sys.argv[2]), 1 << 20, b"", 1, "0" * 16)
except RuntimeError as e:
    print("RuntimeError:", e)
    sys.exit(0)
for i in range(3000):
    _core.record(site, 1000 * i, 1000 * i + 1)
    if i % 1000 == 0:
        _core.flush()
print(_core.close()["num_events"])
"""


def run_without_libs(tmp_path, path, comp):
    """Runs FALLBACK_CHILD where libdeflate.so.0 and libzstd.so.1 resolve to
    empty files, as on a machine without them."""
    bogus = tmp_path / "bogus"
    bogus.mkdir()
    (bogus / "libdeflate.so.0").write_bytes(b"")
    (bogus / "libzstd.so.1").write_bytes(b"")
    env = dict(os.environ, LD_LIBRARY_PATH=str(bogus))
    out = subprocess.run([sys.executable, "-c", FALLBACK_CHILD, path, str(comp)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_gzip_general_falls_back_to_zlib(tmp_path):
    path = str(tmp_path / "z.pfw.gz")
    assert run_without_libs(tmp_path, path, 3) == "3000"
    with open(path, "rb") as f:
        data = f.read()
    assert data[9] == 3  # zlib's gzip header (libdeflate writes OS=255)
    assert len(members(data, 1)) >= 3
    assert len(events(read_objects(path))) == 3000


def test_zstd_without_libzstd_is_a_clear_error(tmp_path):
    path = str(tmp_path / "z.pfw.zst")
    out = run_without_libs(tmp_path, path, 2)
    assert out.startswith("RuntimeError: zstd compression needs libzstd.so.1")
    assert not os.path.exists(path)
