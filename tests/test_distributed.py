"""Distributed runs (torchrun, gloo, CPU): collectives as events, who waits for whom, compile
divergence across ranks and memory per step."""

import pathlib

import pytest

from backend_support import run_torchrun
from scripts.clitools import summary_json
from tracefile import read_events, traces

SCRIPT = pathlib.Path(__file__).parent / "scripts" / "dist_train.py"


def job(tmp_path, monkeypatch, **env):
    """The script as a 2-rank job (settings in the environment torchrun passes on); its trace files."""
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    run_torchrun(SCRIPT, tmp_path, tmp_path / "run" / "job")
    files = traces(tmp_path / "run")
    assert len(files) == 2, files
    return files


def comm_events(path):
    return [e for e in read_events(path) if e.get("cat") == "comm"]


def test_eager_collectives_counts_and_bytes(tmp_path, monkeypatch):
    for rank, path in enumerate(job(tmp_path, monkeypatch, MODE="eager", STEPS=3)):
        got = {}
        for e in comm_events(path):
            a = e["args"]
            assert a["op"] == e["name"] and a["group_size"] == 2 and a["rank"] == rank, e
            got.setdefault((e["name"], a["bytes"], a.get("dtype"), a.get("async_op", False)), []).append(a["step"])
        got = {key: sorted(steps) for key, steps in got.items()}  # async ones are written on completion
        assert got == {("all_reduce", 4000, "float32", False): [0, 1, 2], ("broadcast", 80, "float64", False): [0, 1, 2],
                       ("all_gather", 20, "int32", False): [0, 1, 2], ("all_reduce", 1024, "float32", True): [0, 1, 2],
                       ("barrier", 0, None, False): [3]}, got


@pytest.mark.parametrize("delay_ms", [30, 0])
def test_ddp_straggler(tmp_path, monkeypatch, delay_ms):
    files = job(tmp_path, monkeypatch, MODE="ddp", STEPS=8, DELAY_MS=delay_ms)
    for path in files:  # one bucket all-reduce per step, 17 * 4 floats
        buckets = [e for e in comm_events(path) if "bucket" in e["args"]]
        assert len(buckets) == 8 and {e["args"]["bytes"] for e in buckets} == {17 * 4 * 4}, buckets
    info = summary_json(tmp_path / "run", "--by", "rank")[0]["ranks"]
    if delay_ms:
        assert info["straggler"]["rank"] == "rank1", info
        assert 0.8 * 30e3 <= info["straggler"]["wait_caused_us"] <= 1.2 * 30e3, info
        assert info["ranks"][0]["wait_us"] > 0.8 * 30e3, info
    else:
        assert info["straggler"] is None, info
    assert info["threshold_us"] > 0 and info["skew"]["median_us"] is not None


def test_recompile_divergence(tmp_path, monkeypatch):
    job(tmp_path, monkeypatch, MODE="recompile", STEPS=5)
    div = summary_json(tmp_path / "run", "--by", "rank")[0]["ranks"]["divergence"]
    assert div is not None and div["rank0"]["recompile_steps"] == [] and div["rank1"]["recompile_steps"] == [3], div


def test_peak_memory_per_step(tmp_path, monkeypatch):
    for path in job(tmp_path, monkeypatch, MODE="memory", STEPS=6):
        peaks = {e["args"]["step"]: e["args"]["peak_rss"] for e in read_events(path) if e.get("cat") == "step"}
        base = min(peaks[s] for s in (2, 4))
        assert abs(peaks[3] - base - (64 << 20)) <= 0.1 * (64 << 20), peaks
        assert any(e.get("ph") == "C" and e["cat"] == "memory" for e in read_events(path))
