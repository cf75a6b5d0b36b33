"""Reading .pfw / .pfw.gz / .pfw.zst files in tests, independently of the package."""

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
