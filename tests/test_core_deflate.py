"""The writer's own gzip encoder (csrc/deflate.c, compression 1, the default): every member
decodes alone, with zlib and Python's gzip, to exactly the text given, whatever the lines hold
and whatever the members before it held (their symbols make its codes), and a trace written
with it holds exactly the plain-text trace of the same events."""

import gzip
import hashlib
import json
import os
import random
import re
import zlib

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import perfetto_tp
from dftrace_dynamo import _core
from dftrace_dynamo.traces import reader
from test_core_format import closed_core  # noqa: F401 (autouse fixture)
from tracefile import dftracer_validate

HHASH = "0123456789abcdef"
HEADER = b'{"id":1,"name":"start","cat":"dftracer","pid":42,"tid":42,"ts":1,"dur":0,"ph":"X","args":{}}\n'
T0 = 1_700_000_000_000_000_000


def check_member(out, data):
    """A gzip member (the readers find members by these bytes) that zlib (CRC-32 and length
    checked) and Python's gzip decode to data, with nothing after it."""
    assert out[:3] == reader.MEMBER_START["gzip"]
    d = zlib.decompressobj(31)
    assert d.decompress(out) == data
    assert d.eof and d.unused_data == b""
    assert gzip.decompress(out) == data


def roundtrip(*parts):
    """The members of parts, encoded in order as one file's: each checked; their sizes."""
    out = _core.gzip_members(parts)
    assert len(out) == len(parts)
    for member, data in zip(out, parts):
        check_member(member, data)
    return [len(m) for m in out]


def trace_line(k, name, args, ts, dur):
    return (f'{{"id":{k},"name":{name},"cat":"dynamo","pid":4242,"tid":4242,"ts":{ts},"dur":{dur},'
            f'"ph":"X","args":{{"hhash":"{HHASH}"{args}}}}}\n').encode("utf-8", "surrogatepass")


def json_text(s):
    return json.dumps(s, ensure_ascii=False)


# sites: a name and its args, any unicode (lone surrogates included, as the writer's escaping
# may keep them), a field sometimes missing
site_st = st.tuples(st.text(max_size=40).map(json_text),
                    st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=20)),
                                    max_size=4).map(lambda d: "".join(f",{json_text(k)}:{json_text(v)}"
                                                                      for k, v in d.items())))


@settings(max_examples=200, deadline=None)
@given(sites=st.lists(site_st, min_size=1, max_size=40),
       picks=st.lists(st.tuples(st.integers(0, 39), st.integers(0, 10**7), st.integers(0, 10**9)), max_size=400),
       newline=st.booleans())
def test_trace_lines_interleaved_sites(sites, picks, newline):
    ts, lines = T0 // 1000, []
    for k, (i, gap, dur) in enumerate(picks):
        ts += gap
        name, args = sites[i % len(sites)]
        lines.append(trace_line(k, name, args, ts, f"{dur / 1000:.3f}".rstrip("0").rstrip(".")))
    data = b"".join(lines)
    cut = len(data) // 3
    roundtrip(data if newline else data[:-1], data[:cut], data[cut:])


def hinted_line(k, name, args, ts, dur, tid=4242):
    """A trace line and the writer's hint on it (deflate.h), at offset 0: its key says what the
    line holds outside the id, ts and dur digits, its fam its name and track."""
    parts = [b'{"id":', str(k).encode(), f',"name":{name},"cat":"dynamo","pid":4242,"tid":{tid},"ts":',
             str(ts).encode(), b',"dur":', str(dur).encode(),
             f',"ph":"X","args":{{"hhash":"{HHASH}"{args}}}}}\n']
    parts = [p if isinstance(p, bytes) else p.encode("utf-8", "surrogatepass") for p in parts]
    f = [sum(map(len, parts[:i + 1])) for i in range(6)]
    outside = b"".join(parts[0::2])
    key = int.from_bytes(hashlib.blake2b(outside, digest_size=8).digest(), "little")
    fam = int.from_bytes(hashlib.blake2b(parts[2], digest_size=8).digest(), "little")
    return b"".join(parts), [key, fam, 0, f[5] + len(parts[6]), *f]


def hinted_member(lines):
    """The text of (line, hint) pairs and the hints, offsets in that text (those the writer would
    not send, with fewer than 8 bytes after the dur, left out)."""
    text, hints = b"", []
    for line, h in lines:
        if h is not None and h[8] + 8 <= h[3]:
            hints.append((h[0], h[1], len(text), *h[3:]))
        text += line
    return text, hints


def roundtrip_hinted(*members):
    """Members of (line, hint) pairs, encoded with their hints in order: each checked; sizes."""
    built = [hinted_member(m) for m in members]
    out = _core.gzip_members([t for t, _ in built], [h for _, h in built])
    assert len(out) == len(built)
    for member, (data, _) in zip(out, built):
        check_member(member, data)
    return [len(m) for m in out]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sites=st.lists(site_st, min_size=1, max_size=40),
       picks=st.lists(st.tuples(st.integers(0, 39), st.integers(0, 10**7), st.integers(0, 10**9),
                                st.integers(0, 3)), max_size=400),
       fams=st.sampled_from(["name", "one", "each"]), start=st.sampled_from([0, 7, 95, 9990, 99999990]),
       cuts=st.lists(st.integers(0, 400), max_size=3), clss=st.sampled_from([None, "one", "each", "site"]))
def test_hinted_lines_of_alternating_sites(sites, picks, fams, start, cuts, clss):
    """Lines of sites in any order, with the writer's hints: against the last line of their key
    (the same site) or, out of the window or absent, the last line of their fam, which need not
    share anything (fams: by name and track as the writer gives them, one for all lines, one per
    line), else the last line of their cls, which vouches for nothing (none given, one for all,
    one per line, one per site). Ids pass from 9 to 10 digits and on (a different field length),
    sites share names, tracks change, members end anywhere (a line's earlier lines in the member
    before are out of reach)."""
    ts, lines = T0 // 1000, []
    for k, (i, gap, dur, tid) in enumerate(picks):
        ts += gap
        name, args = sites[i % len(sites)]
        line, h = hinted_line(start + k, name, args, ts, f"{dur / 1000:.3f}".rstrip("0").rstrip("."), 4242 + tid)
        h[1] = {"name": h[1] ^ tid, "one": 1, "each": k}[fams]
        if clss:
            h.append({"one": 1, "each": k, "site": i % len(sites)}[clss])
        lines.append((line, h))
    cuts = sorted({0, len(lines), *(c % (len(lines) + 1) for c in cuts)})
    roundtrip_hinted(*(lines[a:b] for a, b in zip(cuts, cuts[1:])))


def test_hinted_lines_beyond_the_window():
    """The elem workload's pattern: 300 sites of 3 names called in turn, a site's last line ~70 KiB
    back (out of deflate's window), its name's 3 lines back; node names that change length (x_9,
    x_10), args longer than the window, a site's args changing, lines the writer sends without a
    hint among them, and the same keys again in the members after (what was compared once holds
    for them). The hints make the members no bigger than without."""
    names = ['"function.relu"', '"function.mul"', '"function.add"']
    lines, k = [], 0
    for call in range(12):
        for op in range(300):
            node = f"x_{op // 3}" if op % 3 == 0 else f"n{op % 3}_{op}"
            args = f',"graph":0,"node":"{node}","step":{call // 5}'
            if op == 150:
                args += ',"big":"' + "y" * (40000 if call % 2 else 20) + '"'
            line, h = hinted_line(k, names[op % 3], args, 1_700_000_000_000_000 + 3 * k, f"{1 + op % 7}.{k % 1000}")
            lines.append((line, None if op == 77 else h))
            k += 1
    members = [lines[a:a + 1100] for a in range(0, len(lines), 1100)]
    hinted = roundtrip_hinted(*members)
    plain = roundtrip(*(b"".join(line for line, _ in m) for m in members))
    assert sum(hinted) <= sum(plain) * 1.02, (hinted, plain)


def test_module_slices_against_their_type():
    """mlp with module slices: 100 ops, each inside a slice of its own module (a name no other
    line has, its last line a call back, beyond deflate's window), Linear and GELU in turn. With
    the writer's cls (category, track and args: the module type), a slice's line is compared with
    the last slice of its type, 2 lines back, instead of the op before it: the text comes out
    the same, the slices' lines at half the size or less."""
    lines, k = [], 0
    for call in range(10):
        for op in range(100):
            kind = ("linear", "Linear") if op % 2 == 0 else ("gelu", "GELU")
            lines.append(hinted_line(k, f'"function.{kind[0]}"', f',"graph":1,"node":"x_{op}","module":"layers.{op}"',
                                     1_700_000_000_000_000 + 40 * k, f"{1 + op % 7}.{k % 1000}"))
            line, h = hinted_line(k + 1, f'"layers.{op}"', f',"module_type":"{kind[1]}","graph":1',
                                  1_700_000_000_000_000 + 40 * k, f"{2 + op % 7}.{k % 997}")
            line = line.replace(b'"cat":"dynamo"', b'"cat":"module"')
            h.append(int.from_bytes(hashlib.blake2b(kind[1].encode(), digest_size=8).digest(), "little"))
            lines.append((line, h))
            k += 2
    members = [lines[a:a + 500] for a in range(0, len(lines), 500)]
    with_cls = roundtrip_hinted(*members)
    without = roundtrip_hinted(*([(line, h[:-1] if len(h) > 10 else h) for line, h in m] for m in members))
    ops = roundtrip_hinted(*([p for p in m if len(p[1]) == 10] for m in members))
    assert sum(with_cls) - sum(ops) <= (sum(without) - sum(ops)) / 2, (with_cls, without, ops)


def test_hints_out_of_bounds():
    """Hints the encoder cannot use (out of order, past the text, fields out of order or too
    near the end) are ignored, and a fam vouches for nothing (here: empty fields, each line its
    own key): the text comes out the same."""
    lines = [hinted_line(k, '"op"', f',"node":"n{k % 5}"', 1_000_000 + k, k % 9) for k in range(40)]
    text, hints = hinted_member(lines)
    bad = [list(h) for h in hints]
    bad[3][2] += 1                     # not at a line start
    bad[5][3] = len(text)              # past the text
    bad[7][4:6] = [bad[7][5], bad[7][4]]  # id's end before its start
    bad[9][9] = bad[9][3]              # dur ending at the line's end
    bad[11], bad[12] = bad[12], bad[11]  # out of order
    bad[20][2] = 1 << 31
    for hs in (bad, [hints[1]] * 3, [(k, 1, h[2], h[3], 0, 0, 0, 0, 0, 0) for k, h in enumerate(hints)]):
        out = _core.gzip_members([text, text], [[tuple(h) for h in hs], None])
        for member in out:
            check_member(member, text)
    with pytest.raises(ValueError):
        _core.gzip_members([text, text], [hints])
    with pytest.raises(TypeError):
        _core.gzip_members([text], [[(1, 2, 3)]])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=300), max_size=30), min_size=1, max_size=4),
       st.sampled_from([b"\n", b",", b'"', b"", b"\n\n"]))
def test_any_bytes(members, sep):
    roundtrip(*(sep.join(chunks) for chunks in members))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(min_size=1, max_size=200), min_size=1, max_size=50))
def test_utf8_text_lines(texts):
    data = "\n".join(texts).encode("utf-8", "surrogatepass") + b"\n"
    roundtrip(data, data[::-1], data)


def test_every_length_and_byte():
    """Lengths around every 16-byte step of the comparison and of the CRC's 64-byte folding,
    each byte value, lines repeated whole (back-references longer than deflate's 258 bytes)."""
    rnd = random.Random(1)
    base = b'{"id":1,"name":"op","cat":"c"}\n'
    roundtrip(*(rnd.randbytes(n) for n in range(300)))
    roundtrip(*((base * (n // len(base) + 1))[:n] for n in range(300)))
    roundtrip(bytes(range(256)) * 3)
    for n in range(250, 270):
        roundtrip((b"x" * n + b"\n") * 3)
        roundtrip((rnd.randbytes(2 * n).replace(b"\n", b"") + b"\n") * 3)
    roundtrip(b"\n" * 1000)


def test_long_lines_beyond_the_window():
    """Lines longer than deflate's 32 KiB window: the earlier line is out of reach (no
    back-reference may go that far), a later copy of a long line, and lines with no
    repetition at all."""
    rnd = random.Random(2)
    big = rnd.randbytes(40 << 10).replace(b"\n", b" ")
    lines = [b'{"id":1,"name":"' + big + b'"}\n', b'{"id":2,"name":"' + big + b'"}\n',
             b'{"id":3,"name":"short"}\n', b'{"id":4,"name":"' + big[:30000] + b'"}\n',
             b'{"id":5,"name":"short"}\n']
    noise = [rnd.randbytes(rnd.randrange(1, 600)).replace(b"\n", b"") + b"\n" for _ in range(300)]
    roundtrip(b"".join(lines), b"".join(noise), b"".join(noise) + b"".join(lines) + b"".join(noise))


def test_trace_lines_compress():
    """The repeated parts of trace lines become back-references: the first member (fixed codes)
    takes under 32 bytes per line of ~230 (literals alone would take more than 230), the next
    ones, with codes made for the members before, under 20 (a general deflate at level 1:
    ~17). A member unlike the one before (random bytes after trace lines, and back) is encoded
    with fixed codes: at most 9 bits per byte."""
    lines = [trace_line(k, f'"function.op{k % 16}.default"', f',"node":"op_{k % 16}","step":3',
                        1_700_000_000_000_000 + 7 * k, f"{1 + k % 50}.{k % 997}") for k in range(30000)]
    members = [b"".join(lines[k:k + 5000]) for k in range(0, 15000, 5000)]
    noise = random.Random(4).randbytes(100000)
    sizes = roundtrip(*members, noise, members[0])
    assert sizes[0] < 32 * 5000 and sizes[1] < 20 * 5000 and sizes[2] < 20 * 5000, sizes
    assert sizes[3] <= len(noise) * 9 // 8 + 64 and sizes[4] < 32 * 5000, sizes


def unify_end(text):
    """The end record's ts is the close time, different in each run, and what an aggregate
    record's ``covers`` says of the file's bytes (compressed or not) differs by compression: left out."""
    text = re.sub(rb'("covers":\{"bytes":)\d+,"crc32":\d+', rb"\1", text)
    return re.sub(rb'("name":"end","cat":"dftracer","pid":42,"tid":\d+,"ts":)\d+', rb"\1", text)


def write_trace(path, comp, ops, sites):
    _core.open(str(path), comp, 1 << 20, HEADER, 42, HHASH)
    for op in ops:
        if op[0] == "rec":
            _, i, start, dur, flags = op
            _core.record(sites[i % len(sites)], T0 + start, T0 + start + dur, flags)
        elif op[0] == "log":
            _, name, args, start = op
            _core.log(name, "cat", T0 + start, T0 + start + 1000, args)
        else:
            _core.flush()
    _core.close()
    with open(path, "rb") as f:
        raw = f.read()
    return raw if comp == 0 else gzip.decompress(raw)


op_st = st.one_of(
    st.tuples(st.just("rec"), st.integers(0, 30), st.integers(0, 10**12), st.integers(0, 10**9), st.integers(0, 15)),
    st.tuples(st.just("log"), st.text(max_size=30), st.dictionaries(st.text(max_size=5), st.text(max_size=30),
                                                                     max_size=3), st.integers(0, 10**12)),
    st.just(("flush",)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.text(max_size=30), min_size=1, max_size=31), ops=st.lists(op_st, max_size=300))
def test_writer_gzip_is_the_plain_trace(tmp_path, names, ops):
    """Events recorded and flushed (a member ends) at any point, then closed: the gzip trace,
    with the writer's encoder (1) and with the general deflate (3, gzip-general), holds the bytes
    of the plain one."""
    sites = [_core.intern_site(n, "dynamo", {"node": n, "graph": k}) for k, n in enumerate(names)]
    n = len(os.listdir(tmp_path))
    plain = write_trace(tmp_path / f"{n}.pfw", 0, ops, sites)
    for comp in (1, 3):
        assert unify_end(write_trace(tmp_path / f"{n}-{comp}.pfw.gz", comp, ops, sites)) == unify_end(plain)


def test_members_of_a_large_trace(tmp_path):
    """Several ~1 MiB members, long events among them: each decodes alone from its first
    line, the whole equals the plain trace; Perfetto loads every event and
    dftracer_validate passes the file."""
    names = [f"function.op{k}.default" for k in range(12)]
    sites = [_core.intern_site(n, "dynamo", {"node": n, "graph": 0}) for n in names]
    rnd = random.Random(3)
    ops = [("rec", rnd.randrange(12), 1000 * k, rnd.randrange(100, 900), k & 7) for k in range(15000)]
    ops[7000:7000] = [("log", "long " + "é" * 50000, {"x": "y" * 40000}, 7_000_000 + k) for k in range(3)]
    plain = write_trace(tmp_path / "t.pfw", 0, ops, sites)
    path = tmp_path / "t.pfw.gz"
    text = write_trace(path, 1, ops, sites)
    assert unify_end(text) == unify_end(plain)
    data = path.read_bytes()
    parts = []
    while data:
        assert reader.starts_a_line(data[:1 << 18], "gzip")
        d = zlib.decompressobj(31)
        parts.append(d.decompress(data))
        assert d.eof
        data = d.unused_data
    assert len(parts) >= 4 and b"".join(parts) == text
    assert all(p.endswith(b"\n") for p in parts)
    res = perfetto_tp.query(path, perfetto_tp.ERROR_STATS_SQL,
                            "select count(*) as n from slice where category = 'dynamo'",
                            "select count(*) as n from slice where name like 'long %'")
    assert res[0]["rows"] == []
    assert perfetto_tp.as_dicts(res[1]) == [{"n": 15000}] and perfetto_tp.as_dicts(res[2]) == [{"n": 3}]
    dftracer_validate(path)


def test_writer_lines_of_one_name(tmp_path):
    """Op sites sharing three names, each called once per 300 events (its own last line out of
    the window: the line goes against its name's last one), args of many lengths, some past the
    writer's tail slot (240 bytes: those lines go without a hint), flushed at odd points: the gzip
    trace holds the plain trace's bytes."""
    names = ["function.relu", "function.mul", "function.add"]
    sites = [_core.intern_site(names[k % 3], "dynamo", {"node": f"x_{k}", "graph": 0, "pad": "p" * (k % 7 * 45)})
             for k in range(300)]
    ops = []
    for call in range(8):
        ops += [("rec", k, 1000 * (300 * call + k), 100 + 7 * k, 0) for k in range(300)]
        if call % 3 == 1:
            ops.append(("flush",))
    ops.insert(1000, ("flush",))
    plain = write_trace(tmp_path / "t.pfw", 0, ops, sites)
    assert plain.count(b'"pad":"' + b"p" * 270) == 8 * 42
    assert unify_end(write_trace(tmp_path / "t.pfw.gz", 1, ops, sites)) == unify_end(plain)
