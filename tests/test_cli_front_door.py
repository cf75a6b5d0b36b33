"""What a new user meets first: --version, and what `run` says when a script traces nothing or fails."""

import re

from scripts.clitools import cli


def test_version():
    p = cli("--version")
    assert p.returncode == 0, p.stderr
    assert re.fullmatch(r"dftrace-dynamo \d+\.\d+\.\d+\S*\n", p.stdout), p.stdout


def test_script_traceback_shows_the_scripts_frames_only(tmp_path):
    (tmp_path / "boom.py").write_text("def f():\n    raise ValueError('boom')\n\nf()\n")
    p = cli("run", "--compile-all", "boom.py", cwd=tmp_path)
    assert p.returncode == 1
    frames = re.findall(r'^  File "([^"]+)"', p.stderr, re.M)
    assert frames == ["boom.py", "boom.py"], p.stderr
    assert "ValueError: boom" in p.stderr
    # the script failed: --compile-all would not help, and it was given
    assert "no trace written (the script exited with status 1)" in p.stderr and "try --compile-all" not in p.stderr
    assert not (tmp_path / "traces").exists()  # no empty directory left behind


def test_syntax_error_is_not_a_tracing_problem(tmp_path):
    (tmp_path / "bad.py").write_text("x = (\n")
    p = cli("run", "bad.py", cwd=tmp_path)
    assert p.returncode == 1
    assert "SyntaxError" in p.stderr and "runpy" not in p.stderr and "_launch" not in p.stderr
    assert "try --compile-all" not in p.stderr


def test_compile_all_given_is_not_suggested_again(tmp_path):
    (tmp_path / "plain.py").write_text("print('no torch.compile here')\n")
    p = cli("run", "--compile-all", "plain.py", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout == "no torch.compile here\n"
    assert "no trace written (the script called no torch.compile;" in p.stderr
    assert "try --compile-all" not in p.stderr
    without = cli("run", "plain.py", cwd=tmp_path)
    assert "try --compile-all" in without.stderr
    assert not (tmp_path / "traces").exists()
