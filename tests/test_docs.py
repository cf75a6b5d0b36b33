"""The documentation builds without a single warning."""

import pathlib
import subprocess
import sys

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def test_sphinx_builds_without_warnings(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(tmp_path)],
        capture_output=True, text=True,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert (tmp_path / "configuration.html").exists()
