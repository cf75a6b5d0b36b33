"""Shared pieces of the backend tests: small models, a trace recorder, event filters."""

import contextlib
import gc
import glob
import json
import os
import textwrap

import pytest
import torch
import torch.nn as nn

from subproc import python, run_python
from tracefile import read_events, traces


class MLP(nn.Module):
    def __init__(self, width=16, depth=3):
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.GELU())])
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        return self.head(self.layers(x))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(x.view(x.size(0), -1))


class Recorder:
    """Opens a trace under ``directory``; ``events()`` finalizes it and returns its events."""

    def __init__(self, directory):
        from dftrace_dynamo.session import logger

        self.directory = directory
        self._logger = logger
        logger.initialize_log(str(directory / "trace"))
        assert logger.enabled()

    def path(self):
        self._logger.finalize()
        (path,) = traces(self.directory)
        return path

    def events(self):
        return read_events(self.path())


@contextlib.contextmanager
def recording(directory):
    """A Recorder under ``directory`` with Dynamo's caches fresh before and after."""
    torch._dynamo.reset()
    recorder = Recorder(directory)
    try:
        yield recorder
    finally:
        recorder._logger.finalize()
        torch._dynamo.reset()


class Enc(nn.Module):
    """A small model of one submodule, ``fc``: one relu of its own over a Linear."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


def ops(events, cat="dynamo"):
    """The complete events of ``cat``; of ``"dynamo"``: the compiled graphs' op events (eager ops,
    ``args.level == "eager"``, are :func:`eager_ops`)."""
    return [e for e in events if e.get("cat") == cat and e.get("ph") == "X"
            and not (cat == "dynamo" and is_eager(e))]


def is_eager(e):
    return e.get("args", {}).get("level") == "eager"


def eager_ops(events):
    """The op events of ops that ran outside compiled graphs."""
    return [e for e in events if e.get("cat") == "dynamo" and e.get("ph") == "X" and is_eager(e)]


def inside(e, s):
    """``e`` nests in the slice ``s`` as Perfetto nests it: a slice is [ts, ts + dur), so an
    instant at ``s``'s end belongs to what follows."""
    end = s["ts"] + s["dur"]
    return s["ts"] <= e["ts"] < end and e["ts"] + e.get("dur", 0) <= end


def graphs(events):
    return ops(events, "dynamo_graph")


def compile_records(events):
    return ops(events, "dynamo_compile")


def executed_nodes(gm):
    """The graph's ops (after instrumentation: without the module-slice boundary calls, nor the
    nodes that pick an output of a multi-output op: a ``getitem`` on a tuple computes nothing)."""
    import operator

    from dftrace_dynamo.backend import modules

    def picks(n):
        value = n.args[0].meta.get("val", n.args[0].meta.get("example_value")) if n.args else None
        return n.target is operator.getitem and isinstance(value, (tuple, list))

    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")
            and not modules.is_span(n) and not picks(n)]


# Gloo can abort a rank in C++ while it tears down at exit, after the job's work is done (a
# known torch/gloo flake; our C extension has no C++ and cannot raise it): such a job runs again.
GLOO_TEARDOWN_ABORT = "terminate called without an active exception"


def run_torchrun(script, cwd, log_prefix, timeout=600, nproc=2, args=()):
    """``script args`` as an ``nproc``-rank torchrun job on this host, tracing into ``log_prefix``-*."""
    argv = ["-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone", str(script), *map(str, args)]
    env = {"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": str(log_prefix), "OMP_NUM_THREADS": "1"}
    proc = python(argv, cwd, env, timeout)
    if proc.returncode != 0 and GLOO_TEARDOWN_ABORT in proc.stderr:
        for path in glob.glob(f"{log_prefix}-*"):
            os.remove(path)
        proc = python(argv, cwd, env, timeout)
    # the first worker's traceback, which torchrun's own report at the end leaves out
    first = proc.stderr.find("Traceback")
    assert proc.returncode == 0, (proc.stderr[first:first + 4000] if first >= 0 else "") + proc.stderr[-3000:]
    return proc


class TorchrunBatches:
    """Scenarios ``{name: (world size, settings)}`` of ``script``, run as one torchrun job per world
    size, the first time one of them is asked for: ``script`` reads the JSON list SCENARIOS (the
    settings of each, with ``dir(name)`` as ``out``) and traces each into ``<out>/run/job``."""

    def __init__(self, script, base, scenarios):
        self.script, self.base, self.scenarios, self.failed = script, base, scenarios, {}

    def dir(self, name):
        """The directory scenario ``name`` ran in (its traces in ``run/``), after running its job."""
        nproc = self.scenarios[name][0]
        if nproc not in self.failed:
            self.failed[nproc] = "the job failed (see the first test of this world size)"
            batch = [dict(settings, out=str(self.base / n)) for n, (w, settings) in self.scenarios.items()
                     if w == nproc]
            for settings in batch:
                os.mkdir(settings["out"])
            # (the glob: a rerun after gloo's teardown abort starts every scenario afresh)
            with pytest.MonkeyPatch.context() as m:
                m.setenv("SCENARIOS", json.dumps(batch))
                run_torchrun(self.script, self.base, self.base / "*" / "run" / "job", nproc=nproc,
                             timeout=300 + 120 * len(batch))
            self.failed[nproc] = None
        assert self.failed[nproc] is None, self.failed[nproc]
        return self.base / name


def run_py(code, cwd, env=None, timeout=300):
    """Runs ``code`` in a fresh interpreter; it must succeed (``subproc.run_py`` when it may not)."""
    return run_python(["-c", textwrap.dedent(code)], cwd, env, timeout)


# fixtures of the backend tests: import them by name
@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Dynamo's caches emptied around each test (autouse in the modules that import it)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def rec(tmp_path):
    """A trace open under tmp_path for the test, closed after it. The models of earlier tests that
    only a reference cycle keeps are collected first: a model registered while no trace was open
    belongs to the next trace file (its lazy open), and would name this test's paths."""
    gc.collect()
    recorder = Recorder(tmp_path)
    yield recorder
    recorder._logger.finalize()
