"""DFTracer's own tool chain (dftracer-utils) reads our trace files: ``dftracer_stats``
counts the same events per name as our summary, and our readers take the parts that
``dftracer_split`` cuts a trace into. Traces from the C writer (tests/scripts/stepgen.py)
and from a real traced training loop (tests/scripts/steps_train.py)."""

import gzip
import json
import os
import subprocess
from collections import Counter

import pytest

from scripts.clitools import cli, summary_json
from subproc import run_python
from tracefile import dftracer_tool, dftracer_validate, traces

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


def run_tool(name, *args):
    p = subprocess.run([dftracer_tool(name), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (name, p.stdout[-3000:], p.stderr[-3000:])
    return p.stdout


@pytest.fixture(scope="module")
def stepgen_ranks(tmp_path_factory):
    """The two rank files of one synthetic job (12 steps; a recompile and a graph break)."""
    d = tmp_path_factory.mktemp("stepgen")
    for rank in (0, 1):
        run_python([os.path.join(SCRIPTS, "stepgen.py"), str(d / "t"), "--steps", "12", "--rank", str(rank),
                    "--seed", str(rank), "--recompile-at", "6", "--graph-break"], env={"DFTRACER_RUN_ID": "job"})
    return d


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    """A real traced training loop: ConvNet, Adam, 6 steps."""
    d = tmp_path_factory.mktemp("train")
    run_python([os.path.join(SCRIPTS, "steps_train.py"), "--out", str(d / "train"), "--steps", "6"])
    return d


def stats_counts(files, index_dir):
    """(category, name) -> events, from dftracer_stats' detailed report grouped by both."""
    out = run_tool("dftracer_stats", "--files", *files, "--report", "detailed", "--group-by", "cat", "name",
                   "--json", "--index-dir", index_dir, "--log-level", "off")
    counts = Counter()
    for per_file in json.loads(out):
        for key, stats in per_file["detailed"]["grouped_duration"].items():
            cat, _, name = key.partition("|")
            counts[(cat, name)] += stats["count"]
    return counts


def our_counts(*args):
    """What summary counts, all steps included: op events per name, graph calls, compile
    events, step slices."""
    result = summary_json("--include-warmup", "--by", "op", "--top", "100000", *args)[0]
    return ({r["key"]: r["count"] for r in result["views"]["op"]}, result["graph_calls"], result["compile_events"],
            sum(r["processes"] for r in result["steps"]["rows"]))


@pytest.mark.parametrize("trace", ["stepgen_ranks", "training"])
def test_dftracer_stats_counts_what_summary_counts(trace, request, tmp_path):
    files = traces(request.getfixturevalue(trace))
    theirs = stats_counts(files, tmp_path / "index")
    ops, graph_calls, compile_events, steps = our_counts(*files)
    assert ops and ops == {name: n for (cat, name), n in theirs.items() if cat == "dynamo"}
    assert graph_calls == sum(n for (cat, _), n in theirs.items() if cat == "dynamo_graph") > 0
    assert compile_events == sum(n for (cat, _), n in theirs.items() if cat == "dynamo_compile") > 0
    assert steps == sum(n for (cat, _), n in theirs.items() if cat == "step") > 0


@pytest.mark.parametrize("trace", ["stepgen_ranks", "training"])
def test_the_parts_dftracer_split_writes_are_read(trace, request, tmp_path):
    source = request.getfixturevalue(trace)
    # a few kB per part: every trace here is cut into several parts. dftracer_split 0.0.14 plans
    # one part too many for some sizes (its last part starts past the last line: "Start line must
    # be <= end line"); the next size up avoids that
    for size in ("4KB", "5KB", "6KB"):
        p = subprocess.run([dftracer_tool("dftracer_split"), "--directory", source, "--output", tmp_path / size,
                            "--app-name", "part", "--chunk-size", size, "--index-dir", tmp_path / "index",
                            "--log-level", "warn"], capture_output=True, text=True, timeout=300)
        if p.returncode == 0 or "Start line must be <= end line" not in p.stderr + p.stdout:
            break
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    parts = traces(tmp_path / size)
    assert len(parts) > len(traces(source)), parts
    p = cli("validate", *parts)
    assert p.returncode == 0 and p.stdout.count(": OK (") == len(parts), p.stdout + p.stderr
    dftracer_validate(parts[0])
    assert our_counts(*parts) == our_counts(*traces(source))


def test_a_part_cut_after_a_pause_joins_its_run(stepgen_ranks, tmp_path):
    """dftracer_split cuts files into parts by size and keeps the start record (with the run
    id) in the first part only; a part cut where the job paused between steps (a checkpoint
    save) overlaps no other part in time, and still belongs to its process's run."""
    source = traces(stepgen_ranks)[0]
    with gzip.open(source, "rt") as f:
        events = [json.loads(line) for line in f.read().splitlines() if line.startswith("{")]
    cut = max(i for i, e in enumerate(events) if e["name"] == "step 10") + 1
    for e in events[cut:]:
        if "ts" in e:
            e["ts"] += 1_000_000  # a 1 s pause before step 11
    parts = [tmp_path / "part-1.pfw", tmp_path / "part-2.pfw"]
    for path, part in zip(parts, (events[:cut], events[cut:])):
        path.write_text("[\n" + "\n".join(json.dumps(e, separators=(",", ":")) for e in part) + "\n]\n")
    assert our_counts(*parts) == our_counts(source)


@pytest.mark.xfail(strict=True, reason="our dur is in us with a fractional part (ns precision); dftracer_stats "
                                       "reads such a value as 0")
def test_dftracer_stats_durations_equal_ours(training, tmp_path):
    files = traces(training)
    out = run_tool("dftracer_stats", "--files", *files, "--report", "detailed", "--group-by", "name", "--json",
                   "--index-dir", tmp_path / "index", "--log-level", "off")
    theirs = {name: stats["sum"] for per_file in json.loads(out)
              for name, stats in per_file["detailed"]["grouped_duration"].items()}
    result = summary_json("--include-warmup", "--by", "op", "--top", "100000", *files)[0]
    for row in result["views"]["op"]:  # integer microseconds: at most 1 us per event apart
        assert theirs[row["key"]] == pytest.approx(row["total_us"], abs=row["count"]), row
