"""What DuckDB does on its own inside summary: its progress bar never reaches the output, and
running out of memory is one line and exit status 2."""

import duckdb
import pytest

from dftrace_dynamo.cli import main
from dftrace_dynamo.traces import events
from test_hostile_traces import OP, write


@pytest.fixture
def duckdb_settings(monkeypatch):
    """Makes every DuckDB connection run the SET statements this returns a list for."""
    settings, connect = [], duckdb.connect

    def configured(*args, **kwargs):
        con = connect(*args, **kwargs)
        for setting in settings:
            con.execute(f"SET {setting}")
        return con
    monkeypatch.setattr(duckdb, "connect", configured)
    return settings


def test_no_progress_bar_in_the_output(tmp_path):
    # DuckDB prints its bar into the output (--format json too) once a query has run for 2 s
    trace = write(tmp_path / "t.pfw", OP)
    for progress in (None, lambda pct: None):
        con, out, _ = events.load([str(trace)], [0], progress=progress)
        assert con.execute("SELECT current_setting('enable_progress_bar_print')").fetchone() == (False,)
        con.close()


def test_out_of_memory_is_one_line(tmp_path, duckdb_settings, capsys):
    duckdb_settings += ["memory_limit = '8MB'", "temp_directory = ''"]
    trace = write(tmp_path / "t.pfw", OP)
    assert main(["summary", "--source", "events", str(trace)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "summary: error: out of memory reading the traces" in err, err
