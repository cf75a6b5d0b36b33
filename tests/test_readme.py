"""The README's two commands: the main job installs what the page shows and its Python part
runs as written; the test command is the one CI runs."""

import glob
import os
import pathlib
import re
import tomllib

from subproc import shell
from tracefile import read_events

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.rst").read_text()
COMMANDS = re.findall(r"^    (python3 -m venv .*)$", README, re.M)


def test_readme_has_the_two_commands():
    assert len(COMMANDS) == 2, COMMANDS
    main, tests = COMMANDS
    # torch pinned before the package, so that pip never replaces it
    assert 'pip install torch==2.13.0 && pip install -e ".[all]" && dftrace-dynamo demo' in main
    assert tests.endswith('pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest')


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci[-1] == COMMANDS[1]


def test_all_extra_installs_what_the_readme_shows():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert set(extras["all"]) == {"matplotlib", "transformers", "pydot", "sphinx"}
    for extra in ("plot", "transformers", "graph", "docs"):
        assert set(extras[extra]) <= set(extras["all"]), extra
    # torch warns on every import when numpy is missing
    assert "numpy" in project["dependencies"]


def test_main_job_runs_as_documented(tmp_path):
    job = COMMANDS[0].rsplit(" && ", 1)[1]
    p = shell(job, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Failed to initialize NumPy" not in p.stderr
    (path,) = glob.glob(str(tmp_path / "dftrace-demo" / "demo-*-*.pfw.gz"))
    assert os.path.basename(path) in p.stdout + p.stderr  # it says where the trace is
    events = read_events(path)
    phases = {e["args"].get("phase") for e in events if e.get("cat") == "dynamo"
              and e["args"].get("level") != "eager"}  # the compiled graphs' ops
    assert phases == {"forward", "backward"}
    assert "ui.perfetto.dev" in p.stdout + p.stderr
