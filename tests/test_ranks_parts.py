"""The rank view names a step's time as the step view does: the eager forward (modules after a
graph break, modules Dynamo skips) is compute, garbage collection is ``gc``, trainer code is
``trainer``, and only what no event holds is ``other``.

Ground truth: time marks the test takes around ``gc.collect()`` and around a sleep no event
holds, in every step of two traced processes' worth of files; the step view of each file alone."""

import gc
import pathlib
import time

import pytest
import torch
import torch.nn as nn

from backend_support import recording
from dftrace_dynamo import _core, create_backend
from dftrace_dynamo.traces import aggregates, summary
from tracefile import write_rank_job

STEPS, SLEEP_S, CYCLES = 6, 0.02, 3000


class Net(nn.Module):
    """A compiled model whose LSTM Dynamo skips: graphs around it, the LSTM's ops eager."""

    def __init__(self):
        super().__init__()
        self.embed, self.rnn, self.head = nn.Linear(8, 8), nn.LSTM(8, 8), nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.rnn(self.embed(x).tanh())[0])


class Node:
    pass


def _train(directory):
    """STEPS steps of a model with graph breaks; per step, (start, end) of its gc.collect() and
    of a sleep outside every event, in µs of the trace's clock."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, backend=create_backend())
    marks = []
    with recording(directory) as rec:
        gc.disable()  # only the test's collections
        try:
            for _ in range(STEPS):
                opt.zero_grad()
                nn.functional.mse_loss(compiled(torch.randn(5, 3, 8)), torch.randn(5, 3, 1)).backward()
                for _ in range(CYCLES):  # cycles for the collection to find
                    a, b = Node(), Node()
                    a.other, b.other = b, a
                t0 = _core.now_ns()
                gc.collect()
                t1 = _core.now_ns()
                time.sleep(SLEEP_S)
                t2 = _core.now_ns()
                opt.step()
                marks.append(((t0 / 1e3, t1 / 1e3), (t1 / 1e3, t2 / 1e3)))
        finally:
            gc.enable()
        path = pathlib.Path(rec.path())
    # (the files of one process have one name: the rank view labels each by its name)
    return str(path.rename(path.with_name(f"{directory.name}-{path.name}"))), marks


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Two traced processes' files (one process traced twice: two files, one pid) and their marks."""
    runs = [_train(tmp_path_factory.mktemp(f"rank{r}")) for r in range(2)]
    return [p for p, _ in runs], [m for _, m in runs]


def _rank_rows(paths, source):
    info = summary.summarize(paths, views=["step", "rank"], source=source, all_runs=True)["ranks"]
    return {(r["rank"], r["step"]): r for r in info["rows"]}, [r["rank"] for r in info["ranks"]]


@pytest.mark.parametrize("source", ["events", "aggregates"])
def test_gc_and_the_eager_forward_have_their_names_in_the_rank_view(job, source):
    paths, marks = job
    rows, labels = _rank_rows(paths, source)
    assert len(labels) == 2 and len(rows) >= 2 * (STEPS - 2), rows
    for (label, step), row in rows.items():
        (g0, g1), (s0, s1) = marks[labels.index(label)][step]
        gc_us, sleep_us = g1 - g0, s1 - s0
        # the collection is gc (the slice starts and ends inside the marks), the sleep other
        assert 0.9 * gc_us - 50 <= row["gc_us"] <= gc_us, (source, row, gc_us)
        assert sleep_us <= row["other_us"] <= sleep_us + 0.5 * (row["wall_us"] - sleep_us), (source, row)
        parts = sum(row[k] for k in ("wait_us", "comm_us", "data_us", "compute_us", "gc_us", "trainer_us",
                                     "other_us"))
        assert parts == pytest.approx(row["wall_us"], abs=0.01), row


@pytest.mark.parametrize("source", ["events", "aggregates"])
def test_the_rank_view_splits_a_step_as_the_step_view_does(job, source):
    """Per file and steady step: data, compute (forward, backward, optimizer), gc, trainer and other
    equal the step view's parts of that file alone (no collectives: nothing waits)."""
    paths, _ = job
    rows, labels = _rank_rows(paths, source)
    for i, path in enumerate(paths):
        steps = summary.summarize([path], views=["step"], source=source)["steps"]["rows"]
        for s in steps:
            row = rows.get((labels[i], s["step"]))
            if row is None:  # the first and warm-up steps: not in the rank view
                continue
            assert row["wait_us"] == row["comm_us"] == 0, row
            expected = {"data_us": s["data_us"], "gc_us": s["gc_us"], "trainer_us": s["trainer_us"],
                        "other_us": s["other_us"],
                        "compute_us": s["forward_us"] + s["backward_us"] + s["optimizer_us"]}
            got = {k: row[k] for k in expected}
            # (within 1 µs: the rank view sums float µs of times near 1.8e15, 0.25 µs apart)
            assert got == pytest.approx(expected, abs=1.0), (source, s["step"], got, expected)
            assert s["forward_us"] > 0 and s["gc_us"] > 0


def _write_job(directory, slow):
    """Per rank and step (µs): a forward graph call, a garbage collection, trainer code, then an
    all_reduce; ``slow`` ({part: µs}) makes rank 1's part longer from step 2."""
    def emit(log, r, s):
        extra = slow if r == 1 and s >= 2 else {}
        t = 1_700_000_000_000_000.0 + s * 100_000
        fw, g, tr = 2_000 + extra.get("forward", 0), 1_000 + extra.get("gc", 0), 3_000 + extra.get("trainer", 0)
        log("graph 0", "dynamo_graph", t, t + fw, phase="forward", graph=0)
        log("gc", "gc", t + fw, t + fw + g, generation=2)
        log("Trainer.log", "trainer", t + fw + g, t + fw + g + tr)
        log("all_reduce", "comm", t + fw + g + tr, t + 50_000, group="pg0", bytes=4096)
        log(f"step {s}", "step", t, t + 50_100)
    return write_rank_job(directory, 3, 8, emit)


@pytest.mark.parametrize("part", ["gc", "trainer"])
def test_a_straggler_slower_in_gc_or_trainer_code_is_named_so(tmp_path, part):
    paths = _write_job(tmp_path, {part: 4_000})
    info = summary.summarize(paths, source="events")["ranks"]
    assert info["straggler"]["rank"] == "rank1"
    assert info["straggler"]["slower"] == {"phase": part, "excess_us": 4_000}
    row = next(r for r in info["rows"] if r["rank"] == "rank0" and r["step"] == 3)
    assert (row["compute_us"], row["gc_us"], row["trainer_us"]) == (2_000, 1_000, 3_000), row
    for p in paths:  # the rank columns of a computed aggregate record say the same
        aggregates.write(p)
    assert summary.summarize(paths, source="aggregates")["ranks"]["rows"] == info["rows"]
