"""Reading .pfw / .pfw.gz / .pfw.zst files in tests, independently of the package (and writing
synthetic ones)."""

import glob
import gzip
import io
import json
import os
import shutil
import subprocess
import sys

import zstandard


def read_bytes(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".gz"):
        return gzip.decompress(data)
    if path.endswith(".zst"):
        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True).read()
    return data


def read_lines(path):
    return read_bytes(path).decode("utf-8").splitlines()


def read_events(path):
    """Every JSON object of the file (the ``[`` and ``]`` lines are checked and skipped)."""
    lines = read_lines(path)
    assert lines[0] == "[", lines[:1]
    body = lines[1:-1] if lines[-1] == "]" else lines[1:]
    return [json.loads(line) for line in body]


def traces(directory, pattern="*.pfw*"):
    return sorted(glob.glob(os.path.join(str(directory), pattern)))


def dftracer_tool(name):
    """The dftracer-utils command ``name`` (next to this interpreter when its venv is not
    activated); skips the test where it is not installed."""
    import pytest

    found = shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))
    if found is None:
        pytest.skip(f"{name} not installed (pip install dftracer-utils)")
    return found


def dftracer_validate(path):
    """dftracer-utils' validator must pass ``path``."""
    v = subprocess.run([dftracer_tool("dftracer_validate"), "--files", str(path)], capture_output=True, text=True,
                       timeout=300)
    assert v.returncode == 0 and "1 passed, 0 failed" in v.stdout, v.stdout + v.stderr


def write_rank_job(directory, ranks, steps, emit):
    """A job's trace files, one per rank (``job-rank<R>-<pid>.pfw``, pid 100 + R), in the DFTracer
    layout: per rank and step ``emit(log, r, s)`` logs complete events with ``log(name, cat, ts, end,
    **args)`` (their args get the step). Returns the paths."""
    paths = []
    for r in range(ranks):
        events = []
        for s in range(steps):
            def log(name, cat, ts, end, r=r, s=s, **args):
                events.append({"name": name, "cat": cat, "ph": "X", "pid": 100 + r, "tid": 1, "ts": ts,
                               "dur": end - ts, "args": {"step": s, **args}})
            emit(log, r, s)
        path = directory / f"job-rank{r}-{100 + r}.pfw"
        path.write_text("[\n" + "".join(json.dumps(e) + "\n" for e in sorted(events, key=lambda e: e["ts"]))
                        + "]\n")
        paths.append(str(path))
    return paths
