"""initialize_log() exports DFTRACER_ENABLE / DFTRACER_LOG_FILE for spawned
children; inside the test process that must not leak from one test into the
subprocesses of the next. Traces that several test files read are made once
per test process (session fixtures)."""

import os

import pytest

from subproc import run_python


@pytest.fixture(autouse=True)
def _restore_dftracer_environment():
    saved = {k: v for k, v in os.environ.items() if k.startswith("DFTRACER_")}
    yield
    for key in [k for k in os.environ if k.startswith("DFTRACER_")]:
        del os.environ[key]
    os.environ.update(saved)


@pytest.fixture(scope="session")
def training(tmp_path_factory):
    """A real traced training loop at level inductor: steps, module slices, kernel events (read-only:
    the engine and aggregate tests read it)."""
    d = tmp_path_factory.mktemp("train")
    run_python([os.path.join(os.path.dirname(__file__), "scripts", "difftrain.py"), str(d / "train"), "--steps", "5",
                "--level", "inductor"], env={"DFTRACER_ENABLE": "1"}, timeout=600)
    return sorted(str(p) for p in d.glob("train-*.pfw*"))
