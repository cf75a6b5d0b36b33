"""The dftrace-dynamo command itself: subcommand discovery, --help, bad usage."""

import importlib
import subprocess
import sys

import pytest

from scripts.clitools import CLI, assert_bad_input, cli

from dftrace_dynamo import cli as cli_pkg

OWN = ["demo", "run", "summary", "merge", "convert", "validate"]


def test_subcommand_list_includes_the_planned_ones():
    assert set(OWN + ["profile", "explore", "graph"]) <= set(cli_pkg.SUBCOMMANDS)


@pytest.mark.parametrize("name", OWN)
def test_help_on_every_subcommand(name):
    p = cli(name, "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: dftrace-dynamo {name}")


def test_top_level_help_lists_subcommands():
    p = cli("--help")
    assert p.returncode == 0
    for name in OWN:
        assert f"    {name} " in p.stdout


def test_python_dash_m_is_the_same_command():
    p = subprocess.run([sys.executable, "-m", "dftrace_dynamo", "validate", "--help"],
                       capture_output=True, text=True)
    assert p.returncode == 0 and "usage: dftrace-dynamo validate" in p.stdout


def test_console_script_is_declared():
    text = open(cli_pkg.__file__.replace("src/dftrace_dynamo/cli/__init__.py", "pyproject.toml")).read()
    assert 'dftrace-dynamo = "dftrace_dynamo.cli:main"' in text


def test_help_does_not_import_heavy_modules():
    code = ("import sys; from dftrace_dynamo.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'duckdb', 'matplotlib') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.stdout.strip() == "[]", p.stdout + p.stderr


@pytest.mark.parametrize("args, fragment", [
    (["summary", "--top", "x"], "invalid int value"),
    (["summary"], "the following arguments are required: TRACE"),
    (["nosuchcommand"], "invalid choice"),
    (["merge", "a.pfw"], "-o/--output"),
    ([], "required: COMMAND"),
])
def test_bad_usage_is_one_line_exit_2(args, fragment):
    assert_bad_input(cli(*args), fragment)


def test_missing_subcommand_module_is_skipped(monkeypatch):
    monkeypatch.setattr(cli_pkg, "SUBCOMMANDS", ["summary", "not_written_yet"])
    parser = cli_pkg.build_parser()
    choices = parser._subparsers._group_actions[0].choices
    assert list(choices) == ["summary"]


def test_import_error_inside_a_subcommand_propagates(monkeypatch):
    real = importlib.import_module

    def fake(name, *a):
        if name == "dftrace_dynamo.cli.summary":
            raise ModuleNotFoundError("No module named 'somedep'", name="somedep")
        return real(name, *a)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(ModuleNotFoundError, match="somedep"):
        cli_pkg.build_parser()


def test_broken_pipe_is_quiet(tmp_path):
    # 3000 overlapping events: far more validate output than a pipe buffer holds
    lines = ['{"name":"x","ph":"X","pid":1,"tid":1,"ts":%d,"dur":2}' % i for i in range(3000)]
    (tmp_path / "overlap.pfw").write_text("[\n" + "\n".join(lines) + "\n]\n")
    p = subprocess.run(" ".join([*CLI, "validate", "--max-problems", "5000", str(tmp_path / "overlap.pfw")])
                       + " | head -1", shell=True, capture_output=True, text=True)
    assert p.stdout.startswith(str(tmp_path / "overlap.pfw") + ": 1,500 problems")
    assert p.stderr == ""
