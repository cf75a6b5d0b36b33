"""The Dask engine never waits without bound (traces.engines): a scheduler that accepts the
connection and never answers fails within --timeout, with one line and exit status 2; an
address that is no address is a usage error (exit status 2, one line), never a traceback."""

import socket
import time

import pytest

from dftrace_dynamo.traces import engines
from dftrace_dynamo.traces.reader import TraceError
from scripts.clitools import assert_bad_input, cli
from test_engines import rank_files  # noqa: F401 (fixture)

pytest.importorskip("dask.distributed")


@pytest.fixture
def silent_scheduler():
    """A local socket that accepts connections and never answers: its address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_a_scheduler_that_never_answers_fails_within_the_timeout(silent_scheduler):
    import dask.distributed  # noqa: F401 (imported before the clock starts: it takes seconds on a loaded machine)

    start = time.monotonic()
    message = f"cannot reach the Dask scheduler at {silent_scheduler}: no answer within 2 s"
    with pytest.raises(TraceError, match=message):
        engines.make("dask", silent_scheduler, timeout=2)
    assert time.monotonic() - start < 2 + 1 + 5  # the timeout, the join's second, some slack for a busy machine


def test_the_cli_gives_up_on_a_silent_scheduler_with_exit_status_2(silent_scheduler, rank_files):
    for command in ("summary", "diff"):
        args = rank_files[:1] if command == "summary" else rank_files[:2]
        p = cli(command, *args, "--engine", "dask", "--scheduler", silent_scheduler, "--timeout", "3", timeout=150)
        assert_bad_input(p, f"cannot reach the Dask scheduler at {silent_scheduler}", "no answer within 3 s")


@pytest.mark.parametrize("address", ["garbage", "", " ", "tcp://host-without-port", "nosuch://host:1"])
def test_a_bad_scheduler_address_is_a_usage_error(address, rank_files):
    assert_bad_input(cli("summary", rank_files[0], "--engine", "dask", "--scheduler", address), "--scheduler needs")


@pytest.mark.parametrize("args, message", [
    (["--scheduler", ""], "go with --engine dask"),
    (["--engine", "dask", "--timeout", "0"], "--timeout must be"),
    (["--engine", "dask", "--timeout", "nan"], "--timeout must be"),
])
def test_engine_options_out_of_place_are_usage_errors(args, message, rank_files):
    assert_bad_input(cli("summary", rank_files[0], *args), message)


def test_dask_with_aggregates_says_it_read_them_here(tmp_path, rank_files):
    """Files that answer from their aggregate records are read here, and the command says why."""
    p = cli("summary", *rank_files, "--engine", "dask", "--workers", "1", "--format", "json")
    assert p.returncode == 0, p.stderr
    assert "here and not on Dask" in p.stderr and '"source": "aggregates"' in p.stdout


def test_dask_with_aggregates_starts_no_cluster(monkeypatch, rank_files, capsys):
    """When the aggregate records answer, summary and diff with --engine dask --workers N say they
    read them here and start no local cluster (it took seconds to start, for nothing)."""
    import dask.distributed

    from dftrace_dynamo.cli import main

    def no_cluster(*args, **kwargs):
        raise AssertionError("a local cluster was started")
    monkeypatch.setattr(dask.distributed, "LocalCluster", no_cluster)
    assert main(["summary", "--engine", "dask", "--workers", "2", "--format", "json", *rank_files]) == 0
    out = capsys.readouterr()
    assert "here and not on Dask" in out.err and '"source": "aggregates"' in out.out
    assert main(["diff", "--engine", "dask", "--workers", "2", "--format", "json", *rank_files[:2]]) in (0, 1)
    assert "here and not on Dask" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="a local cluster was started"):  # the events are scanned on Dask
        main(["summary", "--engine", "dask", "--workers", "2", "--source", "events", *rank_files])


def test_the_local_cluster_starts_once_for_both_sides_of_diff(monkeypatch):
    """diff maps both sides on the engine at once: the cluster it starts on first use is one."""
    import threading

    import dask.distributed

    started = []

    def cluster(**kwargs):
        started.append(kwargs)
        time.sleep(0.5)  # (a start takes seconds: both sides ask meanwhile)
        return object()
    monkeypatch.setattr(dask.distributed, "LocalCluster", cluster)
    monkeypatch.setattr(dask.distributed, "Client", lambda c: ("client of", c))
    engine = engines.Dask(workers=2)
    clients = []
    sides = [threading.Thread(target=lambda: clients.append(engine.client)) for _ in range(2)]
    for t in sides:
        t.start()
    for t in sides:
        t.join()
    assert len(started) == 1 and clients[0] is clients[1]
    engine._own = []  # (nothing real to close)
