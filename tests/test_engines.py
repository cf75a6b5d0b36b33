"""summary and diff on a Dask cluster (``--engine dask``, traces.engines): the files scanned on
the workers of a LocalCluster give what the local scan gives, counts and totals exactly and
p50/p99 within the quantile sketch's bound (traces.sketch), on traces of a real traced training
loop (steps, modules, Inductor kernels) and on several rank files written by the C writer."""

import json
import os
import random
import sys
import threading
import time

import pytest

from dftrace_dynamo.cli import main
from dftrace_dynamo.traces import partials, sketch, steps
from dftrace_dynamo.traces.diff import diff
from dftrace_dynamo.traces.engines import Dask, split
from dftrace_dynamo.traces.reader import TraceError
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


def test_files_are_split_in_contiguous_shares_of_about_equal_size(tmp_path):
    def files(*sizes):
        paths = [str(tmp_path / f"{i}-{size}.pfw.gz") for i, size in enumerate(sizes)]
        for path, size in zip(paths, sizes):
            with open(path, "wb") as f:
                f.write(b"x" * size)
        return paths

    assert split(files(*[10] * 20), 4) == [list(range(i, i + 5)) for i in range(0, 20, 5)]
    assert split(files(100, 1, 1, 1, 1, 100), 2) == [[0, 1, 2], [3, 4, 5]]  # by size, not count
    assert split(files(*[10] * 20), 4, 30) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10], [11, 12, 13],
                                               [14, 15, 16], [17, 18, 19]]  # at most ~30 bytes a share
    assert split(files(500, 10), 2, 30) == [[0], [1]]  # a file larger than the bound is a share of its own
    assert split(files(10, 10, 10), 8) == [[0], [1], [2]]  # never more shares than files
    assert split(files(10, 10, 10), 1) == [[0, 1, 2]]
    assert split([*files(10, 10, 10), str(tmp_path / "missing")], 2) == [[0, 1], [2, 3]]


def test_dask_scans_shares_of_several_files_as_the_local_scan(rank_files, monkeypatch, engine, recwarn):
    """One worker thread: the three files are scanned in two tasks (two per thread), one of two
    files, and the summary is the local scan's. A second local cluster (``engine``'s runs) starts
    without a warning (both once wanted port 8787)."""
    assert engine.client.status == "running"
    with Dask(workers=1, processes=False) as one:
        assert not [str(w.message) for w in recwarn if "8787" in str(w.message)]
        submitted = []
        submit = one.client.submit
        monkeypatch.setattr(one.client, "submit", lambda f, paths, share, *a, **k: submitted.append(share) or
                            submit(f, paths, share, *a, **k))
        on_dask = summarize(rank_files, top=None, step_samples=True, engine=one, source="events")
    assert sorted(map(len, submitted)) == [1, 2] and sum(submitted, []) == [0, 1, 2]
    assert assert_same(summarize(rank_files, top=None, step_samples=True, source="events"), on_dask) > 20


@pytest.mark.skipif(sys.platform != "linux", reason="the local cluster's workers are spawned elsewhere")
def test_the_local_clusters_workers_are_forked_with_what_this_process_imported(rank_files):
    """A spawned worker imports Dask, DuckDB and this package again before its first scan."""
    import types

    sys.modules["dftrace_fork_probe"] = types.ModuleType("dftrace_fork_probe")
    try:
        with Dask(workers=1) as forked:
            assert forked.client.run(lambda: "dftrace_fork_probe" in sys.modules) == {
                address: True for address in forked.client.scheduler_info()["workers"]}
            assert summarize(rank_files, source="events", engine=forked)["op_events"] == 3 * 6 * 12
    finally:
        del sys.modules["dftrace_fork_probe"]


def test_a_cluster_that_loses_its_workers_mid_scan_fails_within_the_timeout(rank_files, monkeypatch):
    scan = partials.of_files

    def slow(*args):
        time.sleep(1)
        return scan(*args)
    monkeypatch.setattr(partials, "of_files", slow)  # (the tasks run a copy: Dask pickles them)
    with Dask(workers=1, processes=False, timeout=2) as engine:
        cluster = engine.client.cluster
        (worker,) = cluster.workers.values()

        def lose_it():
            deadline = time.monotonic() + 60
            while not any(t.state == "processing" for t in cluster.scheduler.tasks.values()) \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
            cluster.sync(worker.close)
        threading.Thread(target=lose_it, daemon=True).start()
        t0 = time.monotonic()
        with pytest.raises(TraceError, match=r"has had no worker for 2 s \(3 of 3 file\(s\) left to scan\)"):
            summarize(rank_files, source="events", engine=engine)
        assert time.monotonic() - t0 < 15


def test_workers_that_die_scanning_a_share_end_the_scan_naming_it(rank_files, monkeypatch):
    """One worker thread, so two tasks: one file and two (see above); the first whose worker dies
    is named by its first file, with how many follow it."""
    import dask

    def die(*args):
        os._exit(1)
    monkeypatch.setattr(partials, "of_files", die)
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), Dask(workers=1) as engine:
        with pytest.raises(TraceError) as error:
            summarize(rank_files, source="events", engine=engine)
    shares = split(rank_files, 2)
    assert sorted(map(len, shares)) == [1, 2]
    assert str(error.value) in {f"Dask workers died scanning {rank_files[share[0]]}"
                                + (" and 1 file(s) after it" if len(share) == 2 else "")
                                + " (killed, or out of memory?)" for share in shares}, str(error.value)


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
