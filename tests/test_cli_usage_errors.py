"""Usage errors and odd inputs as a new user makes them: one line naming what is wrong, pointing
at the right --help, a documented exit status, nothing created where it was not asked for, and
never a byte of the file handed in echoed back."""

import os
import zlib

import pytest

from scripts.clitools import assert_bad_input, cli
from subproc import run_py
from tracefile import traces


@pytest.mark.parametrize("args, fragments", [
    (["profile", "bert", "--bogus"], ["unrecognized arguments: --bogus", "(see dftrace-dynamo profile --help)"]),
    (["convert", "--bogus", "notes.txt"], ["unrecognized arguments: --bogus", "dftrace-dynamo convert --help"]),
    (["summary", "x.pfw", "--nope=3"], ["unrecognized arguments: --nope=3", "dftrace-dynamo summary --help"]),
    (["validate", "--bogus", "x.pfw"], ["unrecognized arguments: --bogus", "dftrace-dynamo validate --help"]),
])
def test_an_unknown_option_is_named_with_the_subcommands_help(tmp_path, args, fragments):
    (tmp_path / "notes.txt").write_text("meeting notes\n")
    assert_bad_input(cli(*args, cwd=tmp_path), *fragments)


SECRET = b"root:*:20228:0:99999:7:::\ndaemon:*:20228:0:99999:7:::\n"


@pytest.mark.parametrize("name, content, kind", [
    ("notes.txt", b"meeting notes: the plan\n", "plain text"),
    ("shadow", SECRET, "plain text"),
    ("blob.pfw", bytes(range(256)) * 4, "binary data"),
    ("inner.pfw.gz", zlib.compress(zlib.compress(SECRET, wbits=31), wbits=31), "compressed data"),
    ("other.pfw", b'["a", "b"]\n', "JSON of another kind"),
])
@pytest.mark.parametrize("command", ["validate", "summary"])
def test_a_file_that_is_not_a_trace_is_one_line_exit_2_and_never_echoed(tmp_path, name, content, kind, command):
    path = tmp_path / name
    path.write_bytes(content)
    line = assert_bad_input(cli(command, path), "not a trace file")
    if name != "other.pfw":
        assert kind in line
    for secret in (b"root", b"meeting", b"daemon", b"\\x", b"99999"):
        assert secret.decode() not in line.replace(str(tmp_path), "")


def test_validate_says_not_a_trace_once_per_file_and_still_checks_the_traces(tmp_path):
    (tmp_path / "notes.txt").write_text("meeting notes\n")
    good = tmp_path / "good.pfw"
    good.write_text('[\n{"name":"a","ph":"X","ts":1,"dur":1,"pid":1,"tid":1}\n]\n')
    p = cli("validate", tmp_path / "notes.txt", good)
    assert p.returncode == 2
    assert p.stderr.splitlines() == [f"dftrace-dynamo validate: error: {tmp_path / 'notes.txt'}: not a trace file "
                                     "(expected '[' or JSON object lines, found plain text)"]
    assert p.stdout.startswith(f"{good}: OK (1 events)\n")


def test_validate_of_a_zstd_trace_names_the_perfetto_release_that_reads_it(tmp_path):
    p = run_py("""
        from dftrace_dynamo import dftracer
        log = dftracer.initialize_log("t")
        log.log_event("a", "b", log.get_time(), 1.0)
        log.finalize()
    """, tmp_path, env={"DFTRACER_TRACE_COMPRESSION": "zstd"})
    assert p.returncode == 0, p.stderr
    (path,) = traces(tmp_path)
    v = cli("validate", path)
    assert v.returncode == 0, v.stdout
    (warning,) = [line for line in v.stdout.splitlines() if "warning:" in line]
    assert "Perfetto reads zstd from v58" in warning and "v52" in warning and "convert" in warning


def test_graph_output_in_a_missing_directory_creates_nothing(tmp_path):
    missing = f"/nonexistent-dftrace-test-{os.getpid()}"
    p = cli("graph", "bert", "-o", f"{missing}/dir/x.svg", cwd=tmp_path)
    assert_bad_input(p, f"{missing}/dir", "does not exist")
    assert not os.path.exists(missing)
    p = cli("graph", "bert", "-o", "sub/x.dot", cwd=tmp_path)
    assert_bad_input(p, "does not exist")
    assert os.listdir(tmp_path) == []
