"""initialize_log() exports DFTRACER_ENABLE / DFTRACER_LOG_FILE for spawned
children; inside the test process that must not leak from one test into the
subprocesses of the next. Traces that several test files read are made once
per test run, shared by the xdist workers (session fixtures)."""

import os
import shutil

import pytest
from filelock import FileLock  # a dependency of torch

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
    d = once_per_run(tmp_path_factory, "train", lambda d: run_python(
        [os.path.join(os.path.dirname(__file__), "scripts", "difftrain.py"), str(d / "train"), "--steps", "5",
         "--level", "inductor"], env={"DFTRACER_ENABLE": "1"}, timeout=600))
    return sorted(str(p) for p in d.glob("train-*.pfw*"))


def once_per_run(tmp_path_factory, name, make):
    """Directory ``name``, filled by ``make(directory)`` once per test run: under xdist each worker
    has its own session, so the first to take the lock makes it and the others wait, then read it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's directory, above each worker's own
    d, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(d, ignore_errors=True)  # what a failed attempt left
            d.mkdir()
            make(d)
            done.touch()
    return d
