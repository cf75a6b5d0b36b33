"""dftrace-dynamo convert: compressions and the strict JSON array."""

import json

import pytest

import perfetto_tp
from scripts import tracegen
from scripts.clitools import assert_bad_input, cli
from tracefile import read_bytes, read_events, read_lines


@pytest.fixture
def trace(tmp_path):
    return tracegen.write(tmp_path / "t.pfw.gz", 2000)


def test_round_trip_keeps_every_line_byte_for_byte(tmp_path, trace):
    zst, plain, gz = tmp_path / "t.pfw.zst", tmp_path / "t.pfw", tmp_path / "back.pfw.gz"
    for src, dst in ((trace, zst), (zst, plain), (plain, gz)):
        p = cli("convert", src, "-o", dst)
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith(f"wrote {dst}: ")
    assert read_bytes(str(zst))[:2] == b"[\n" and open(zst, "rb").read(4) == b"\x28\xb5\x2f\xfd"
    assert open(gz, "rb").read(2) == b"\x1f\x8b" and open(plain, "rb").read(2) == b"[\n"
    assert read_lines(str(gz)) == read_lines(str(trace))
    assert perfetto_tp.error_stats(gz) == []


def test_json_array_is_strict_json_and_loads_in_perfetto(tmp_path, trace):
    out = tmp_path / "t.json"
    p = cli("convert", trace, "-o", out)
    assert p.returncode == 0 and "(json-array)" in p.stdout
    events = json.loads(out.read_text())
    assert events == read_events(str(trace))
    slices = perfetto_tp.rows(out, "select count(*) n from slice")[0]["n"]
    assert slices == sum(1 for e in events if e.get("ph") == "X")
    assert perfetto_tp.error_stats(out) == []
    gz = tmp_path / "a.pfw.gz"
    assert cli("convert", trace, "-o", gz, "--format", "json-array").returncode == 0
    assert json.loads(read_bytes(str(gz))) == events


def test_truncated_gzip_is_repaired(tmp_path):
    full = tracegen.write(tmp_path / "full.pfw.gz", 100_000)
    cut = tmp_path / "cut.pfw.gz"
    cut.write_bytes(full.read_bytes()[:-4000])
    out = tmp_path / "fixed.pfw.gz"
    p = cli("convert", cut, "-o", out)
    assert p.returncode == 0
    first, second = p.stderr.splitlines()
    assert f"{cut}: truncated: the gzip member at byte" in first
    assert f"{cut}: dropped the cut last line" in second
    assert cli("validate", cut).returncode == 1 and cli("validate", out).returncode == 0
    assert perfetto_tp.error_stats(out) == []
    n = len(read_events(str(out)))
    assert 0.5 * 100_000 < n < len(read_events(str(full)))


def test_broken_lines_are_dropped_with_their_numbers(tmp_path):
    src = tmp_path / "b.pfw"
    ok = '{"name":"a","ph":"X","pid":1,"tid":1,"ts":%d,"dur":1}'
    src.write_text("[\n" + ok % 1 + "\n{broken\n" + ok % 5 + "\n7\n" + ok % 9 + "\n")
    out = tmp_path / "o.pfw"
    p = cli("convert", src, "-o", out)
    assert p.returncode == 0
    assert "dropped 2 line(s) that are not JSON events (line 3, 5)" in p.stderr
    assert [e["ts"] for e in read_events(str(out))] == [1, 5, 9]
    assert perfetto_tp.rows(out, "select count(*) n from slice") == [{"n": 3}]


def test_bad_input(tmp_path, trace):
    assert_bad_input(cli("convert", tmp_path / "no.pfw", "-o", tmp_path / "o.pfw"), "no such file")
    assert_bad_input(cli("convert", trace, "-o", trace), "is one of the inputs")
    assert_bad_input(cli("convert", trace, "-o", trace, "--force"), "is one of the inputs")
    other = tracegen.write(tmp_path / "other.pfw", 5)
    assert_bad_input(cli("convert", trace, "-o", other), "exists", "--force")
    assert_bad_input(cli("convert", tmp_path, "-o", tmp_path / "o.pfw"), "takes one trace file", "holds 2")
    assert_bad_input(cli("convert", trace, "-o", tmp_path / "o.pfw", "--format", "xml"), "invalid choice")
