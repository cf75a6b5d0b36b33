"""A full disk or a file size limit mid-run: the file is cut back to its last
whole member (plain: chunk of whole lines), Perfetto and dftracer_validate
accept it, one stderr line says what happened, and the program runs on and
exits normally even under ``python -W error``."""

import glob
import json
import os
import re
import shutil
import subprocess
import textwrap

import pytest

import perfetto_tp
from subproc import run_python
from test_core_format import members
from tracefile import dftracer_validate

CHILD = textwrap.dedent("""
    import json, resource, sys
    limit = int(sys.argv[2])
    if limit:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # CPython ignores SIGXFSZ: EFBIG
    import dftrace_dynamo
    from dftrace_dynamo import _core
    dftrace_dynamo.initialize_log(logfile=sys.argv[1])
    for i in range(60_000):
        with dftrace_dynamo.region("r", i=i):
            pass
        if i % 2000 == 1999:
            _core.flush()  # many members
    print("still running", json.dumps(dftrace_dynamo.finalize()))
""")

MESSAGE = re.compile(r"^dftrace_dynamo: cannot write the trace file (\S+): (.+); tracing stopped, "
                     r"the file keeps (\d+) events \((\d+) lost so far; later events are lost too, "
                     r"finalize\(\) counts them all\)$")


def run_child(prefix, comp, limit):
    out = run_python(["-W", "error", "-c", CHILD, prefix, str(limit)], env={"DFTRACER_TRACE_COMPRESSION": str(comp)})
    assert out.stdout.startswith("still running"), out.stdout
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    m = MESSAGE.match(lines[0])
    assert m, lines[0]
    (path,) = glob.glob(prefix + "-*.pfw*")
    assert m.group(1) == path
    return path, m.group(2), int(m.group(3)), int(m.group(4)), json.loads(out.stdout.split(" ", 2)[2])


def check_file(path, comp, kept, lost):
    with open(path, "rb") as f:
        data = f.read()
    text = b"".join(members(data, comp)) if comp else data  # every member whole
    assert text.endswith(b"\n")
    lines = text.decode().splitlines()
    assert lines[0] == "["
    objs = [json.loads(line) for line in lines[1:] if line != "]"]
    regions = [o for o in objs if o["name"] == "r"]
    assert len(regions) == kept > 0 and lost > 0
    assert [o["args"]["i"] for o in regions] == list(range(kept))
    if lines[-1] == "]":  # the end record fitted after the cut
        assert objs[-1]["name"] == "end"
        assert objs[-1]["args"]["num_events"] == kept and objs[-1]["args"]["dropped"] == lost
    return regions


@pytest.mark.parametrize("comp", [0, 1])
def test_file_size_limit_cuts_back_to_whole_members(tmp_path, comp):
    path, cause, kept, lost, res = run_child(str(tmp_path / "t"), comp, 300_000)
    assert cause == "File too large"
    assert os.path.getsize(path) <= 300_000
    check_file(path, comp, kept, lost)
    # what finalize() returns matches the file
    assert res["num_events"] == kept and res["dropped"] >= lost and res["path"] == path
    if comp == 1:
        assert perfetto_tp.error_stats(path) == []
        n = perfetto_tp.rows(path, "select count(*) as n from slice where name = 'r'")[0]["n"]
        assert n == kept
        dftracer_validate(path)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_full_disk_cuts_back_to_whole_members(tiny_tmpfs, tmp_path):
    path, cause, kept, lost, res = run_child(str(tiny_tmpfs / "t"), 1, 0)
    assert cause == "No space left on device"
    check_file(path, 1, kept, lost)
    copy = tmp_path / "copy.pfw.gz"  # read outside the tmpfs before it is unmounted
    shutil.copy(path, copy)
    assert perfetto_tp.error_stats(copy) == []
    assert perfetto_tp.rows(copy, "select count(*) as n from slice where name = 'r'")[0]["n"] == kept
    dftracer_validate(copy)


DROP_CHILD = textwrap.dedent("""
    import sys
    from dftrace_dynamo import _core
    site = _core.intern_site("op", "c")
    _core.open(sys.argv[1], 1, 1 << 42, b"", 1, "0" * 16)  # a ring no machine can allocate
    for i in range(100):
        _core.record(site, 1000 * i, 1000 * i + 1)
    print(_core.close())
""")


def test_dropped_events_are_reported_on_stderr(tmp_path):
    path = str(tmp_path / "d.pfw.gz")
    out = run_python(["-W", "error", "-c", DROP_CHILD, path], timeout=60)
    assert out.stdout.strip() == str({"num_events": 0, "dropped": 100, "path": path})
    assert out.stderr.splitlines() == [
        f"dftrace_dynamo: the trace file {path} misses 100 events that could not be buffered (out of memory)"]


def test_plain_text_keeps_every_whole_line_that_fits(tmp_path):
    # the limit is below one member (2000 events): gzip keeps no member, plain text keeps the lines
    path, cause, kept, lost, res = run_child(str(tmp_path / "t"), 0, 100_000)
    assert cause == "File too large"
    size = os.path.getsize(path)
    assert 99_000 < size <= 100_000  # cut at the last newline that fitted
    check_file(path, 0, kept, lost)
    assert res["num_events"] == kept and res["dropped"] >= lost
    assert perfetto_tp.rows(path, "select count(*) as n from slice where name = 'r'")[0]["n"] == kept
