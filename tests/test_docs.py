"""The documentation builds without a single warning and speaks the product's language."""

import pathlib
import re
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


ROOT = DOCS.parent
# material of the project's own making that users never see
INTERNAL = re.compile(r"\bseeds?\b|REFERENCE\.md|\.\./shared|/work/shared", re.I)


def user_facing_files():
    for pattern in ("src/**/*.py", "src/**/*.c", "src/**/*.h", "csrc/*", "docs/**/*.rst", "docs/conf.py",
                    "README.rst", "benchmarks/*.rst", "examples/*.py"):
        yield from (p for p in ROOT.glob(pattern) if p.is_file() and "_build" not in p.parts)


def test_no_file_mentions_internal_material():
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
            for p in user_facing_files()
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if INTERNAL.search(line)]
    assert hits == [], "\n".join(hits)


def test_internal_material_pattern():
    # random seeds are no internal material; the project's notes are
    assert not INTERNAL.search("torch.manual_seed(0)")
    assert INTERNAL.search("the threshold of seed 004") and INTERNAL.search("see REFERENCE.md")


def test_benchmark_results_parse_as_rst():
    # results files are read on GitHub and by docutils: a table cell wider than
    # its column turns the whole table into an error paragraph
    import docutils.core
    import docutils.utils

    bad = []
    for p in sorted((ROOT / "benchmarks").glob("*.rst")):
        try:
            docutils.core.publish_doctree(p.read_text(), source_path=str(p),
                                          settings_overrides={"report_level": 5, "halt_level": 3})
        except docutils.utils.SystemMessage as e:
            bad.append(str(e))
    assert bad == [], "\n".join(bad)
