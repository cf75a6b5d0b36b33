"""Memory stays bounded whatever the program logs: distinct log_event names and distinct tag
values (``update(step=i)`` before every event), all written, with no exception. The 10 M run
and its figures are ``benchmarks/bench_memory.py`` and ``benchmarks/results_memory.rst``."""

import json
import os
import subprocess
import sys

import pytest

from dftrace_dynamo import _core
from subproc import clean_env
from test_core_format import closed_core, events, open_trace, read_objects  # noqa: F401 (closed_core: autouse fixture)

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "bench_memory.py")
N = 400_000


def test_distinct_names_and_tags_leave_memory_flat(tmp_path):
    """After the first fifth (buffers and caches full) RSS stays flat: a name or tag value kept
    after it is written (an interned string and its table entry: 14 bytes or more) would add
    4.3 MiB over the 320,000 iterations after it, so the property holds at this size as at 10 M,
    where the benchmark reads 0.0 MiB of growth. The writer is waited for every 10,000
    iterations: on a loaded machine its backlog (bounded by the rings) would be growth too."""
    out = subprocess.run([sys.executable, BENCH, "--n", str(N), "--drain-every", "10000", "--dir", str(tmp_path)], capture_output=True,
                         text=True, timeout=600, env=clean_env())
    assert out.returncode == 0 and out.stderr == "", out.stderr
    res = json.loads(out.stdout)
    assert res["num_events"] == res["end_num_events"] == 2 * N + res["samples"] + res["collections"] and res["dropped"] == 0, res
    assert res["names"] == res["steps"] == N, res
    assert res["growth_mib"] < 4 and res["extra_mib"] <= 64, res


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
