"""The commands of README.rst and docs/cli/*.rst are real: every ``dftrace-dynamo`` line of their
literal blocks parses with the command's own parser, and README's "trace your own training script"
block runs as written on the recipes' train.py."""

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from dftrace_dynamo.cli import build_parser
from subproc import clean_env
from test_recipes import FILES

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.rst", *sorted((ROOT / "docs" / "cli").glob("*.rst"))]


def literal_lines(text):
    """The lines of the page's literal blocks (``::`` and code-block), dedented, without ``$``."""
    out, indent = [], None
    for line in text.splitlines():
        if indent is not None:
            if line.strip() and not line.startswith(" " * indent):
                indent = None
            elif line.strip():
                out.append(line[indent:].removeprefix("$ "))
                continue
            else:
                continue
        if line.rstrip().endswith("::") or line.startswith(".. code-block::"):
            indent = 4 if line.rstrip().endswith("::") else 3
    return out


def commands(page):
    text = page.read_text()
    for line in literal_lines(text):
        line = line.split("  #")[0].strip()
        # commands, not synopses (TRACE..., [options], a|b) nor output ("dftrace-dynamo run: ...")
        if line.startswith("dftrace-dynamo ") and not re.search(r"\.\.\.|\||\[|\b[A-Z]{2,}\b|^\S+ \S+:", line):
            yield line


CASES = [(page.name, line) for page in PAGES for line in commands(page)]


def test_the_pages_have_commands():
    assert len(CASES) > 15 and any(page == "README.rst" for page, _ in CASES)


@pytest.mark.parametrize("page, line", CASES)
def test_command_parses(page, line, capsys):
    try:
        build_parser().parse_args(shlex.split(line)[1:])
    except SystemExit as e:  # --help and --version exit 0; a bad option exits 2
        assert e.code == 0, (page, line, capsys.readouterr().err)


def test_readme_trace_your_own_script_runs(tmp_path):
    block = re.search(r"Trace your own training script, unchanged::\n\n((?:    .*\n)+)",
                      (ROOT / "README.rst").read_text()).group(1)
    (tmp_path / "train.py").write_text(FILES["train.py"])
    env = clean_env({"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
                     "MPLBACKEND": "Agg"})
    for line in block.splitlines():
        command = line.split("  #")[0].strip()
        p = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, (command, p.stdout[-2000:], p.stderr[-2000:])
    assert (tmp_path / "modules.png").exists()
