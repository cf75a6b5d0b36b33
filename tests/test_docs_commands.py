"""The commands of README.rst and docs/cli/*.rst are real: every ``dftrace-dynamo`` line of their
literal blocks parses with the command's own parser, every line of docs/cli/*.rst runs (on tiny
traces, written by tests/scripts/stepgen.py under the names the line uses) unless NOT_RUN says why,
and README's "trace your own training script" block runs as written on the recipes' train.py."""

import pathlib
import re
import shlex

import pytest

from dftrace_dynamo.cli import build_parser
from subproc import run_python, shell
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
    for line in block.splitlines():
        command = line.split("  #")[0].strip()
        p = shell(command, tmp_path, {"MPLBACKEND": "Agg"})
        assert p.returncode == 0, (command, p.stdout[-2000:], p.stderr[-2000:])
    assert (tmp_path / "modules.png").exists()


STEPGEN = ROOT / "tests" / "scripts" / "stepgen.py"
# lines of docs/cli/*.rst that this test does not run, and why
NOT_RUN = {
    "dftrace-dynamo demo": "tests/test_cli_demo.py runs it",
    "dftrace-dynamo run --compile-all train.py --steps 20": "test_readme_trace_your_own_script_runs runs it",
}
CLI_CASES = [(page, line) for page, line in CASES if page != "README.rst"]


def _not_run(line):
    return NOT_RUN.get(line) or ("it needs a running Dask scheduler" if "tcp://" in line else None)


def _inputs(line):
    """The paths a command line reads: positional words that name a directory or a trace file (not
    the word after ``-o``)."""
    words = shlex.split(line)[2:]
    return [w for before, w in zip(["", *words], words)
            if before != "-o" and not w.startswith("-") and (w.endswith("/") or ".pfw" in w or "/" in w)]


def _provide(path, cwd):
    """A tiny trace under the name ``path``: a run directory (its own run id), or one trace file,
    cut in its middle when its name says it crashed."""
    target = cwd / path
    if target.exists():
        return
    if path.endswith("/") or ".pfw" not in path:
        target.mkdir(parents=True)
        run_python([str(STEPGEN), str(target / "train"), "--steps", "6"], cwd, {"DFTRACER_RUN_ID": target.name})
        return
    scratch = cwd / ".made" / target.name
    scratch.mkdir(parents=True)
    made = run_python([str(STEPGEN), str(scratch / "t"), "--steps", "6"], cwd).stdout.strip()
    target.parent.mkdir(parents=True, exist_ok=True)
    if "crash" in target.name:
        data = pathlib.Path(made).read_bytes()
        target.write_bytes(data[: len(data) * 2 // 3])
    else:
        run_python(["-m", "dftrace_dynamo", "convert", made, "-o", str(target)])


def test_every_cli_page_line_is_run_or_says_why():
    assert {line for _, line in CLI_CASES if _not_run(line)} >= set(NOT_RUN)  # NOT_RUN names real lines
    assert sum(1 for _, line in CLI_CASES if not _not_run(line)) >= 10


@pytest.mark.parametrize("page, line", [c for c in CLI_CASES if not _not_run(c[1])])
def test_cli_page_command_runs(page, line, tmp_path):
    for path in _inputs(line):
        _provide(path, tmp_path)
    p = shell(line, tmp_path, {"MPLBACKEND": "Agg"}, timeout=300)
    # --fail-above exits 1 when the new run is slower, which two runs of the same work may be
    ok = (0, 1) if "--fail-above" in line else (0,)
    assert p.returncode in ok and "Traceback" not in p.stderr, (page, line, p.returncode, p.stderr[-2000:])
    outputs = [w for before, w in zip(shlex.split(line), shlex.split(line)[1:]) if before == "-o"]
    assert all((tmp_path / out).exists() for out in outputs), (line, outputs)
