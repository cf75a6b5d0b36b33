"""summary and diff on a Dask cluster (``--engine dask``, traces.engines): the files scanned on
the workers of a LocalCluster give what the local scan gives, counts and totals exactly and
p50/p99 within the quantile sketch's bound (traces.sketch), on traces of a real traced training
loop (steps, modules, Inductor kernels) and on several rank files written by the C writer."""

import json
import os
import random
import sys

import pytest

from dftrace_dynamo.cli import main
from dftrace_dynamo.traces import sketch, steps
from dftrace_dynamo.traces.diff import diff
from dftrace_dynamo.traces.engines import Dask
from dftrace_dynamo.traces.summary import summarize
from scripts.clitools import assert_bad_input, cli
from subproc import python, run_python

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
QUANTILES = ("p50_us", "p99_us")


def write_ranks(directory, ranks=3, *extra):
    """``ranks`` stepgen rank files of one run (same run id), different jitter per rank."""
    env = {"DFTRACER_ENABLE": "1", "DFTRACER_RUN_ID": "ranks"}
    args = ["--steps", "8", "--layers", "2", *extra]
    return [run_python([os.path.join(SCRIPTS, "stepgen.py"), str(directory / "job"), *args, "--rank", str(r),
                        "--seed", str(r), "--recompile-at", str(4 + r)], env=env).stdout.strip()
            for r in range(ranks)]


@pytest.fixture(scope="module")
def rank_files(tmp_path_factory):
    return write_ranks(tmp_path_factory.mktemp("ranks"))


@pytest.fixture(scope="module")
def engine():
    """Two workers as threads of this process (a 2-core machine shared with other jobs)."""
    with Dask(workers=2, processes=False) as e:
        yield e


def assert_same(local, other, path="", quantiles=0):
    """``other`` equals ``local``, quantile fields within the sketch's bound (and ``scan``, what
    was read how, apart); returns how many quantiles were compared."""
    if isinstance(local, dict):
        assert set(local) == set(other), (path, set(local) ^ set(other))
        for k in set(local) - {"scan"}:
            if k in QUANTILES and local[k] is not None:
                assert other[k] == pytest.approx(local[k], rel=sketch.ALPHA * (1 + 1e-9)), f"{path}.{k}"
                quantiles += 1
            else:
                quantiles = assert_same(local[k], other[k], f"{path}.{k}", quantiles)
    elif isinstance(local, list):
        assert len(local) == len(other), path
        for i, (a, b) in enumerate(zip(local, other)):
            quantiles = assert_same(a, b, f"{path}[{i}]", quantiles)
    else:
        assert local == other, (path, local, other)
    return quantiles


def test_sketch_quantiles_are_within_the_bound_and_merge_exactly():
    rng = random.Random(7)
    values = [rng.lognormvariate(1, 2) for _ in range(5000)] + [0.0] * 40 + [3.0] * 500
    whole = sketch.Sketch()
    parts = [sketch.Sketch() for _ in range(4)]
    for i, v in enumerate(values):
        whole.add(v)
        parts[i % 4].add(v)
    merged = parts[0].merge(parts[1]).merge(parts[2]).merge(parts[3])
    assert merged.counts == whole.counts and merged.n == len(values)
    for q in (0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1):
        exact = steps.quantile(values, q)  # DuckDB's quantile_cont
        assert whole.quantile(q) == pytest.approx(exact, rel=sketch.ALPHA, abs=1e-12), q
    assert whole.quantile(0) == min(values) and whole.quantile(1) == max(values)
    assert sketch.Sketch().quantile(0.5) is None


def test_sketch_keys_are_the_same_in_sql():
    import duckdb

    values = [1e-12, 0.0, 0.5, 1.0, 14.123, 1e6, -3.0, -0.001]
    got = duckdb.connect().execute(f"SELECT {sketch.key_sql('v')} FROM (SELECT unnest(?) AS v)", [values]).fetchall()
    assert [k for (k,) in got] == [sketch.key(v) for v in values]
    for v in values[2:]:
        assert sketch.value(sketch.key(v)) == pytest.approx(v, rel=sketch.ALPHA)


def test_dask_engine_equals_local_on_rank_files(rank_files, engine):
    # the events, not the files' aggregate records: the engines' scans are compared
    local = summarize(rank_files, top=None, step_samples=True, source="events")
    on_dask = summarize(rank_files, top=None, step_samples=True, engine=engine, source="events")
    assert local["processes"] == 3 and local["op_events"] == 3 * 6 * 12  # 2 warm-up steps each (0, the recompile)
    assert local["ranks"] is not None and local["steps"]["warmup_steps"]
    assert local["scan"] == {"source": "events", "engine": "local", "quantiles": "exact"}
    assert on_dask["scan"] == {"source": "events", "engine": "dask", "quantiles": "sketch"}
    assert assert_same(local, on_dask) > 20
    # the op views hold the same groups: exact counts and totals, to the last bit
    for view, rows in local["views"].items():
        assert [(r["key"], r["count"], r["total_us"]) for r in rows] == \
            [(r["key"], r["count"], r["total_us"]) for r in on_dask["views"][view]], view


def test_dask_engine_equals_local_on_real_training(training, engine):
    for kwargs in ({"source": "events"}, {"source": "events", "include_warmup": True, "module_depth": 1}):
        local = summarize(training, top=None, **kwargs)
        assert {"kernel", "module", "op"} <= set(local["views"]) and local["steps"]["rows"]
        assert any(r["key"] == "l2" for r in local["views"]["module"])
        assert assert_same(local, summarize(training, top=None, engine=engine, **kwargs)) > 10


def test_diff_on_the_dask_engine(rank_files, engine):
    local = diff(rank_files[:1], rank_files[1:2], source="events")
    assert_same(local, diff(rank_files[:1], rank_files[1:2], engine=engine, source="events"))


def test_cli_on_an_existing_cluster(rank_files, engine, capsys):
    """--scheduler ADDRESS: the command connects to a running cluster and leaves it running."""
    address = engine.client.scheduler.address
    assert main(["summary", "--format", "json", "--top", "100", "--source", "events", *rank_files]) == 0
    local = json.loads(capsys.readouterr().out)
    assert main(["summary", "--format", "json", "--top", "100", "--source", "events", "--engine", "dask",
                 "--scheduler", address, *rank_files]) == 0
    out = capsys.readouterr()
    assert_same(local, json.loads(out.out))
    assert "p50/p99 from quantile sketches" in out.err
    assert engine.client.status == "running"
    assert main(["diff", "--format", "json", "--engine", "dask", "--scheduler", address, *rank_files[:2]]) in (0, 1)
    assert json.loads(capsys.readouterr().out)["per"] == "step"


def test_engine_options_are_checked(rank_files):
    assert_bad_input(cli("summary", rank_files[0], "--workers", "2"), "--engine dask")
    assert_bad_input(cli("summary", rank_files[0], "--engine", "dask", "--workers", "2", "--scheduler", "x:1"),
                     "exclude each other")
    assert_bad_input(cli("summary", rank_files[0], "--engine", "dask", "--workers", "0"), "at least 1")


def test_engine_dask_without_dask_says_how_to_install(rank_files):
    """Without Dask the local engine still works; --engine dask is one line and exit 2."""
    hide = "import sys; sys.modules.update(dict.fromkeys(('dask', 'dask.distributed', 'distributed')))"
    code = f"{hide}; from dftrace_dynamo.cli import main; sys.exit(main(sys.argv[1:]))"
    assert_bad_input(python(["-c", code, "summary", "--engine", "dask", rank_files[0]]), "needs Dask",
                     "dftrace-dynamo[dask]")
    run_python(["-c", code, "summary", rank_files[0]])
    assert sys.modules.get("dask") is not None  # this process kept its Dask
