"""summary's step and rank tables: a run traced in a step window (``run --steps 100-110``) shows
its recorded steps first, not the steps before the window that recorded nothing; ``ops/step``
of the rank table is a count of op events per step, and the op time per step says it is time."""

import json

from scripts.clitools import cli


def trace(path, pid, ops_per_step, window=range(100, 111), steps=120):
    """``steps`` step slices of one process; only the steps of ``window`` hold ``ops_per_step`` ops
    of 100 µs each (a data slice too, as a recorded step has)."""
    lines = ["["]
    for s in range(steps):
        ts = 10_000 * s
        lines.append(json.dumps({"name": f"step {s}", "cat": "step", "ph": "X", "pid": pid, "tid": pid,
                                 "ts": ts, "dur": 9_000, "args": {"step": s}}))
        if s in window:
            lines.append(json.dumps({"name": "data", "cat": "data", "ph": "X", "pid": pid, "tid": pid, "ts": ts + 1,
                                     "dur": 50, "args": {"step": s}}))
            for k in range(ops_per_step):
                lines.append(json.dumps({"name": "function.relu", "cat": "dynamo", "ph": "X", "pid": pid,
                                         "tid": pid, "ts": ts + 100 + 200 * k, "dur": 100,
                                         "args": {"step": s, "node": f"relu_{k}"}}))
    path.write_text("\n".join(lines + ["]"]) + "\n")
    return str(path)


def test_the_step_table_shows_the_recorded_steps_first(tmp_path):
    path = trace(tmp_path / "w.pfw", 1, 3)
    p = cli("summary", path, "--by", "step", "--top", "5")
    assert p.returncode == 0, p.stderr
    table = p.stdout[p.stdout.index("coverage\n"):]  # the step table, after its header
    rows = [line.split() for line in table.splitlines() if line.split() and line.split()[0].isdigit()
            and line.endswith("%")]
    assert [int(r[0]) for r in rows] == [100, 101, 102, 103, 104], p.stdout
    assert "not recorded" not in "".join(" ".join(r) for r in rows)
    assert "109 steps not recorded" in p.stdout, p.stdout  # 0-99 and 111-119, said in one line


def test_ops_per_step_of_the_rank_table_is_a_count(tmp_path):
    paths = [trace(tmp_path / "rank0.pfw", 1, 3), trace(tmp_path / "rank1.pfw", 2, 5)]
    p = cli("summary", *paths, "--by", "rank")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    header = next(line for line in lines if "ops/step" in line)
    assert "op ms/step" in header, header
    for pid, count, ms in ((1, 3, 0.3), (2, 5, 0.5)):
        row = next(line for line in lines if f"[pid {pid}]" in line).split()
        assert row[-2:] == [f"{ms:.3f}", str(count)], (header, row)
    doc = json.loads(cli("summary", *paths, "--format", "json").stdout)
    assert [(r["ops_median"], r["ops_median_us"]) for r in doc["steps"]["ranks"]] == [(3, 300.0), (5, 500.0)]
