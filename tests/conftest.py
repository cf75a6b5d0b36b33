"""initialize_log() exports DFTRACER_ENABLE / DFTRACER_LOG_FILE for spawned
children; inside the test process that must not leak from one test into the
subprocesses of the next."""

import os

import pytest


@pytest.fixture(autouse=True)
def _restore_dftracer_environment():
    saved = {k: v for k, v in os.environ.items() if k.startswith("DFTRACER_")}
    yield
    for key in [k for k in os.environ if k.startswith("DFTRACER_")]:
        del os.environ[key]
    os.environ.update(saved)
