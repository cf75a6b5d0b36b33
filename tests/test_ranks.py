"""The rank view (traces.ranks) over many ranks, against a direct computation of its rules."""

import json
import random
import statistics

import numpy as np
import pytest

from dftrace_dynamo.traces import partials, ranks, summary

RANKS, STEPS, SLOW_RANK, SKEW_US = 12, 16, 5, 100.0


def _write_job(directory, seed=0):
    """One trace file per rank: per step data, compute, one all_reduce and the step slice (with
    its peak memory); rank r's clock runs r * SKEW_US ahead; SLOW_RANK computes longer from step
    2 on, so the others wait for it. Returns (paths, per rank and step: the aligned times)."""
    rng = random.Random(seed)
    paths, truth = [], {}
    start = [1_700_000_000_000_000.0 + s * 20_000 for s in range(STEPS)]
    compute = {(r, s): rng.randrange(2_000, 3_000) + (4_000 if r == SLOW_RANK and s >= 2 else 0) + rng.choice(
        (0, 0.25, 0.5)) for r in range(RANKS) for s in range(STEPS)}
    # every member of a collective ends it when the last one has arrived (and 300 µs more)
    ends = {s: max(start[s] + 1_000 + compute[(r, s)] for r in range(RANKS)) + 300 for s in range(STEPS)}
    for r in range(RANKS):
        events = []

        def log(name, cat, ts, end, **args):
            events.append({"name": name, "cat": cat, "ph": "X", "pid": 100 + r, "tid": 1,
                           "ts": ts + r * SKEW_US, "dur": end - ts, "args": {"step": s, **args}})
        for s in range(STEPS):
            t0, arrive = start[s], start[s] + 1_000 + compute[(r, s)]
            log("data", "data", t0, t0 + 1_000)
            log("backward", "backward", t0 + 1_000, arrive)
            log("all_reduce", "comm", arrive, ends[s], group="pg0", bytes=4096)
            log(f"step {s}", "step", t0, ends[s] + 50, peak_rss=1_000_000 * (r + 1) + s)
            truth[(r, s)] = (t0, arrive, ends[s] + 50)
        path = directory / f"job-rank{r}-{100 + r}.pfw"
        path.write_text("[\n" + "".join(json.dumps(e) + "\n" for e in events) + "]\n")
        paths.append(str(path))
    return paths, truth


def test_many_ranks_against_the_rules(tmp_path):
    paths, truth = _write_job(tmp_path)
    doc = summary.summarize(paths, source="events")["ranks"]
    steady = list(range(1, STEPS))  # the first step is never steady; nothing compiled
    assert doc["clock"] == "aligned on collective completions" and doc["collectives"] == STEPS
    assert [r["clock_offset_us"] for r in doc["ranks"]] == [r * SKEW_US for r in range(RANKS)]
    # per step: each rank waits for the last arrival; the last one is charged the others' median wait
    caused = {(r, s): 0.0 for r in range(RANKS) for s in steady}
    for s in steady:
        arrive = {r: truth[(r, s)][1] for r in range(RANKS)}
        last = max(arrive, key=arrive.get)
        waits = {r: arrive[last] - arrive[r] for r in range(RANKS)}
        caused[(last, s)] += statistics.median(w for r, w in waits.items() if r != last)
        for r in range(RANKS):
            row = doc["rows"][r * len(steady) + s - 1]
            assert (row["rank"], row["step"]) == (f"rank{r}", s)
            assert row["wall_us"] == truth[(r, s)][2] - truth[(r, s)][0]
            assert row["end_us"] == truth[(r, s)][2]
            assert row["wait_us"] == waits[r] and row["data_us"] == 1_000
            assert row["compute_us"] == arrive[r] - truth[(r, s)][0] - 1_000
            assert row["comm_us"] == truth[(r, s)][2] - 50 - arrive[last] and row["other_us"] == 50
    for r, entry in enumerate(doc["ranks"]):
        own = [caused[(r, s)] for s in steady]
        assert entry["wait_caused_us"] == statistics.fmean(own)
        assert entry["wait_caused_median_us"] == statistics.median(own)
        assert entry["peak_rss_max"] == 1_000_000 * (r + 1) + STEPS - 1
    walls = {r: [truth[(r, s)][2] - truth[(r, s)][0] for s in steady] for r in range(RANKS)}
    noise = statistics.median(1.4826 * statistics.median(abs(w - statistics.median(v)) for w in v)
                              for v in walls.values())
    assert doc["noise_us"] == noise
    assert doc["threshold_us"] == max(3 * noise, 0.05 * statistics.median(w for v in walls.values() for w in v))
    assert doc["straggler"]["rank"] == f"rank{SLOW_RANK}"
    assert doc["straggler"]["wait_caused_median_us"] == statistics.median(caused[(SLOW_RANK, s)] for s in steady)
    # the step ends are all the same instant (the collective's end) once the clocks are aligned
    assert doc["skew"]["steps"] == [{"step": s, "skew_us": 0.0} for s in steady]
    assert [m["step"] for m in doc["memory"]] == list(range(STEPS))
    assert doc["memory"][3]["peak_rss"] == {f"rank{r}": 1_000_000 * (r + 1) + 3 for r in range(RANKS)}


def test_ranks_merged_from_parts_equal_one_scan(tmp_path):
    """Rank rows read file by file (as the workers and the Dask tasks do), then joined, give
    the document one scan of every file gives."""
    paths, _ = _write_job(tmp_path, seed=1)
    whole = summary.summarize(paths, source="events")
    parts = [partials.scan(paths, [i]) for i in reversed(range(len(paths)))]
    merged = summary.merge(paths, parts, list(summary.VIEWS), 20)
    assert merged["ranks"] == whole["ranks"] and merged["ranks"]["straggler"]


def _split_one_by_one(lo, hi, row, layer, start, end, layers):
    """ranks._split the slow way: per row, its pieces in time order, each to the first layer
    whose intervals hold its midpoint (the starts minus the ends at or before it)."""
    lo, hi, row, layer, start, end = (np.asarray(x).tolist() for x in (lo, hi, row, layer, start, end))
    out = np.zeros((len(lo), layers + 1))
    for r in range(len(lo)):
        own = [k for k in range(len(row)) if row[k] == r]
        points = sorted({lo[r], hi[r], *(x for k in own for x in (start[k], end[k]) if lo[r] < x < hi[r])})
        for a, b in zip(points, points[1:]):
            mid = (a + b) / 2
            held = [sum((start[k] <= mid) - (end[k] <= mid) for k in own if layer[k] == i and end[k] > start[k])
                    for i in range(layers)]
            out[r, next((i for i in range(layers) if held[i] > 0), layers)] += b - a
    return out


def test_split_equals_adding_the_pieces_one_by_one():
    """Including the midpoints that round onto a piece's end: times one float step apart."""
    rng = np.random.default_rng(3)
    for trial in range(300):
        base, unit = (1_700_000_000_000_000.0, 0.25) if trial % 2 else (0.0, 1.0)  # 0.25: one float step there
        n, m = int(rng.integers(1, 5)), int(rng.integers(0, 20))
        bounds = base + np.sort(rng.integers(0, 40, (n, 2)), axis=1) * unit
        start = base + rng.integers(-5, 45, m) * unit
        args = (bounds[:, 0], bounds[:, 1], rng.integers(0, n, m), rng.integers(0, 4, m), start,
                start + rng.integers(-3, 20, m) * unit, 4)
        assert ranks.split_layers(*args).tobytes() == _split_one_by_one(*args).tobytes(), args



BAD_CLOCKS = [(1e18, 1000), (5_000_000, -1000), ("12", 1000), (1000, None), (1000, [1]), (True, 1000),
              (-(10**17), 10**6), (1000, 10**15)]


@pytest.mark.parametrize("off, err", BAD_CLOCKS)
def test_absurd_clock_records_are_refused_with_one_line_and_never_applied(tmp_path, off, err):
    from dftrace_dynamo.traces import merge as merge_mod

    paths, _ = _write_job(tmp_path)
    paths = paths[:2]
    for r, (o, e) in enumerate([(0, 1000), (off, err)]):  # rank 0's record is a sound one
        record = {"name": "clock", "cat": "dftracer", "ph": "X", "pid": 100 + r, "tid": 1, "ts": 1.7e15, "dur": 0,
                  "args": {"rank": r, "clock_offset_ns": o, "clock_error_ns": e}}
        with open(paths[r]) as f:
            lines = f.read().splitlines(keepends=True)
        with open(paths[r], "w") as f:
            f.write(lines[0] + json.dumps(record) + "\n" + "".join(lines[1:]))
    result = summary.summarize(paths, source="events")
    doc = result["ranks"]
    assert doc["clock"] == "aligned on collective completions"
    assert [r["clock_offset_us"] for r in doc["ranks"]] == [0, SKEW_US]
    (ignored,) = [w for w in result["warnings"] if "clock record ignored" in w]
    assert ignored.startswith(paths[1] + ": clock record ignored (") and len(ignored) < len(paths[1]) + 120
    out = tmp_path / "merged.pfw"
    _, _, warnings = merge_mod.merge(paths, str(out))
    assert [w for w in warnings if "clock" in w] == [ignored]
    merged = [json.loads(line) for line in out.read_text().splitlines()[1:-1]]
    assert min(e["ts"] for e in merged if e.get("cat") == "step") == 1_700_000_000_000_000.0  # nothing moved
