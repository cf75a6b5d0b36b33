"""Memory stays bounded whatever the program logs: 10 M distinct log_event
names and 10 M distinct tag values (``update(step=i)`` before every event),
all written, with at most 64 MiB of extra RSS and no exception."""

import io
import json
import re
import subprocess
import sys
import textwrap

import pytest
import zstandard

from dftrace_dynamo import _core
from subproc import clean_env
from test_core_format import closed_core, events, open_trace, read_objects  # noqa: F401 (closed_core: autouse fixture)
from tracefile import traces

N = 10_000_000

CHILD = textwrap.dedent("""
    import json, sys
    import psutil
    from dftrace_dynamo import _core
    from dftrace_dynamo.session import logger
    from dftrace_dynamo.backend import Tags
    n = int(sys.argv[2])
    tags = Tags()
    op = _core.Interceptor(abs, _core.intern_site("op", "dynamo"), tags.cell)
    log_event, update, t0 = logger.log_event, tags.update, logger.get_time()
    proc = psutil.Process()
    base = peak = proc.memory_info().rss
    logger.initialize_log(logfile=sys.argv[1])
    for i in range(n):
        update(step=i)
        op(i)
        log_event(f"name {i}", "user", t0 + 2 * i, 1)
        if i % 200_000 == 0:
            peak = max(peak, proc.memory_info().rss)
    peak = max(peak, proc.memory_info().rss)
    res = logger.finalize()
    from dftrace_dynamo.events import memory  # its counter samples are events too
    print(json.dumps({"extra_mib": (peak - base) / 2**20, "samples": memory.samples, **res}))
""")


def lines_of(path):
    """The decompressed lines, read in blocks (the file holds ~4 GB of text)."""
    with open(path, "rb") as f:
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
        rest = b""
        while True:
            block = reader.read(1 << 24)
            if not block:
                break
            block = rest + block
            cut = block.rfind(b"\n") + 1
            yield block[:cut]
            rest = block[cut:]
        assert rest == b""


def test_ten_million_distinct_names_and_tags(tmp_path):
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "mem"), str(N)], capture_output=True,
                         text=True, timeout=900, env=clean_env({"DFTRACER_TRACE_COMPRESSION": "zstd"}))
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    res = json.loads(out.stdout)
    assert res["num_events"] == 2 * N + res["samples"] and res["dropped"] == 0
    assert res["extra_mib"] <= 64, res
    (path,) = traces(tmp_path)
    step_re = re.compile(rb'"name":"op".*"step":(\d+)')
    name_re = re.compile(rb'"name":"name (\d+)","cat":"user"')
    steps, names = 0, 0
    for block in lines_of(path):
        got = list(map(int, step_re.findall(block)))
        assert got == list(range(steps, steps + len(got)))
        steps += len(got)
        got = list(map(int, name_re.findall(block)))
        assert got == list(range(names, names + len(got)))
        names += len(got)
    assert steps == names == N
    end = json.loads(io.BytesIO(block).read().splitlines()[-2])
    assert end["name"] == "end" and end["args"]["num_events"] == 2 * N + res["samples"]


def test_tag_cell_frees_tags_once_written(tmp_path):
    site = _core.intern_site("op", "c")
    cell, other = _core.TagCell(), _core.TagCell()
    path = open_trace(tmp_path, 0)
    cell.set({"step": 0})
    a = cell.id
    _core.record(site, 1000, 2000, 0, a)
    other.id = a  # held by two cells
    cell.set({"step": 1})
    assert cell.id not in (0, a)
    _core.record(site, 3000, 4000, 0, cell.id)
    _core.record(site, 5000, 6000, 0, a)  # still held by other
    cell.set({"step": 1})  # same text: same entry
    other.id = 0  # a is released: freed after the writer's next pass, then reused
    with pytest.raises(ValueError):
        _core.record(site, 7000, 8000, 0, a)
    _core.flush()
    cell.set({"step": 2})
    assert cell.id == a
    _core.record(site, 9000, 10000, 0, cell.id)
    cell.set(None)
    assert cell.id == 0
    _core.record(site, 11000, 12000, 0, cell.id)
    _core.close()
    assert [e["args"].get("step") for e in events(read_objects(path))] == [0, 1, 0, 2, None]
