"""The origin of a wait (traces.origin): torchrun jobs on gloo where one rank is late by a known
sleep in a known place, and the others wait for it through chains of collectives and
point-to-point operations. The rank view names the rank where the delay began, what each
rank it delays loses per step, and what in it was slower than on its peers.

The scenarios of one world size run one after another in one torchrun job, each traced into its
own run directory (tests/scripts/dist_origin.py): the ranks start and import torch once."""

import json
import pathlib
import statistics

import pytest

from backend_support import TorchrunBatches
from dftrace_dynamo.traces import origin
from scripts.clitools import cli, summary_json

SCRIPT = pathlib.Path(__file__).parent / "scripts" / "dist_origin.py"

CHARGED = [
    ("gather", 3, 2, "module", 50, None),  # the root waits in the gather, then arrives last at the all_reduce
    ("chain", 3, 0, "module", 60, None),  # stage 0 late: stage 2 waits for stage 1, which waited for 0
    # the last stage late: stage 0 waits for gradients through stage 1 (150 ms: the peers' eager code,
    # which busy cores stretch by 10-15 ms, is subtracted from the late stage's)
    ("chain", 3, 2, "eager", 150, None),
    # a slow data loader (80 ms: data-late runs of 30-40 ms named no straggler on busy cores)
    ("reduce_scatter", 2, 1, "data", 80, None),
    ("scatter", 3, 1, "module", 40, None),  # a receiver of the root's scatter late
    ("broadcast", 3, 2, "eager", 70, None),  # the root of the broadcast late
    ("chain", 4, 2, "module", 50, None),  # 4 stages, a middle one late: waits both ways through the others
    ("all_reduce", 4, 3, "backward", 40, None),  # 4 ranks, the delay in a module's backward
    ("all_to_all", 3, 0, "data", 80, None),
    ("barrier", 3, 1, "module", 100, None),
    # mixed: rank 0's data 80 ms late, rank 1's forward 20 ms: rank 1 waits 60, rank 2 80, both for rank 0
    ("all_reduce", 3, 0, "data", 80, (1, 20)),
]
ASYNC = dict(topology="async", late=1, where="eager", sleep_ms=80, overlap_ms=40)  # 2 ranks
RECOMPILE = dict(topology="all_reduce", late=1, where="module", sleep_ms=40, recompile=(0, 4))  # 2 ranks


def _charged_name(case):
    return "-".join(map(str, case[:5])) + (f"-second{case[5][0]}{case[5][1]}" if case[5] else "")


# name -> (world size, scenario)
SCENARIOS = {_charged_name(c): (c[1], dict(topology=c[0], late=c[2], where=c[3], sleep_ms=c[4],
                                            **({"second": c[5]} if c[5] else {}))) for c in CHARGED}
SCENARIOS.update({"async": (2, ASYNC), "recompile": (2, RECOMPILE)})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """``run_dir(name)``: the directory scenario ``name`` ran in (its traces in ``run/``)."""
    return TorchrunBatches(SCRIPT, tmp_path_factory.mktemp("origin"), SCENARIOS).dir


@pytest.mark.parametrize("topology, nproc, late, where, sleep_ms, second", CHARGED,
                         ids=[_charged_name(c) for c in CHARGED])
def test_the_wait_is_charged_where_the_delay_began(run_dir, topology, nproc, late, where, sleep_ms, second):
    run = run_dir(_charged_name((topology, nproc, late, where, sleep_ms, second))) / "run"
    info = summary_json(run, "--by", "rank")[0]["ranks"]
    s = info["straggler"]
    assert s is not None and s["rank"] == f"rank{late}", info
    # every other rank loses the delay to it, each (not the sum over them): the median over them
    # of the delay less their own
    own = {second[0]: second[1]} if second else {}
    lost_ms = statistics.median(sleep_ms - own.get(r, 0) for r in range(nproc) if r != late)
    assert s["waiting_ranks"] == nproc - 1, s
    # (and a pipeline's downstream stages also wait for the late stage's own forward)
    assert 0.8 * lost_ms * 1e3 <= s["wait_caused_median_us"] <= 1.5 * lost_ms * 1e3, s
    slower = s["slower"]
    if where in ("module", "backward"):
        phase = "forward" if where == "module" else "backward"
        assert (slower["phase"], slower["module"]) == (phase, "slow"), slower
        assert 0.8 * sleep_ms * 1e3 <= slower["module_excess_us"] <= 1.2 * sleep_ms * 1e3, slower
    else:
        assert slower["phase"] == {"eager": "eager code", "data": "data"}[where], slower
        assert 0.8 * sleep_ms * 1e3 <= slower["excess_us"] <= 1.2 * sleep_ms * 1e3, slower
    # no rank that only passed the delay on is charged with it (a pipeline stage keeps the
    # small waits its own compute causes downstream)
    caused = {r["rank"]: r["wait_caused_median_us"] for r in info["ranks"]}
    assert all(v < 0.5 * sleep_ms * 1e3 for r, v in caused.items() if r != f"rank{late}"), caused
    line = next(x for x in cli("summary", run, "--by", "rank").stdout.splitlines()
                if x.startswith("straggler:"))
    each = "the rank it delays waits" if nproc == 2 else f"each of the {nproc - 1} ranks it delays waits"
    assert line.startswith(f"straggler: rank{late}, {each}"), line
    assert f"slower than its peers in {slower['phase']}" in line, line


def test_an_async_collectives_wait_is_the_time_blocked_in_wait(run_dir):
    """Both ranks issue an async all_reduce, rank 1 80 ms late; rank 0 works 40 ms, then both
    ``wait()``. Rank 0 is blocked 40 ms (not the 80 ms from its issue to the completion), rank 1
    not at all; rank 0's all_reduce is in flight during its 40 ms of work (overlap)."""
    sleep_ms, overlap_ms = ASYNC["sleep_ms"], ASYNC["overlap_ms"]
    info = summary_json(run_dir("async") / "run", "--by", "rank")[0]["ranks"]
    wait = {r: statistics.median(x["wait_us"] for x in info["rows"] if x["rank"] == r) for r in ("rank0", "rank1")}
    overlap = {r["rank"]: r["overlap_us"] for r in info["ranks"]}
    expected = (sleep_ms - overlap_ms) * 1e3
    assert 0.8 * expected <= wait["rank0"] <= 1.2 * expected and wait["rank1"] < 0.1 * expected, wait
    assert 0.8 * overlap_ms * 1e3 <= overlap["rank0"] <= 1.2 * overlap_ms * 1e3, overlap
    assert overlap["rank1"] < 0.2 * overlap_ms * 1e3, overlap
    s = info["straggler"]
    assert s["rank"] == "rank1" and 0.8 * expected <= s["wait_caused_median_us"] <= 1.2 * expected, s


def test_charges_follow_the_chain_of_waits():
    """The rule on known numbers ({rank: (arrival, wait)} per operation, ms). A gather whose root
    (0) waits 60 for rank 3, then an all_reduce that rank 0 reaches last: every other rank lost
    60 to rank 3, rank 0 nothing to anyone. A chain 0 -> 1 -> 2 where 0 sends 40 late and stage
    1 computes 2 before sending on: 1 and 2 lose 40 to rank 0, 2 loses 2 to rank 1."""
    gather = [{0: (0, 60), 1: (0, 0), 2: (0, 0), 3: (60, 0)},
              {0: (61, 0), 1: (1, 60), 2: (1, 60), 3: (60.5, 0.5)}]
    assert origin.charges(gather) == {(3, 0): 60, (3, 1): 60, (3, 2): 60}
    chain = [{0: (40, 0), 1: (0, 40)}, {1: (42, 0), 2: (0, 42)}]
    assert origin.charges(chain) == {(0, 1): 40, (0, 2): 40, (1, 2): 2}
    assert origin.per_neighbour(origin.charges(chain), range(3)) == {0: (40, 2), 1: (2, 1), 2: (0.0, 0)}


def test_waits_for_another_ranks_compile_are_warm_up(run_dir):
    """Rank 1 is 40 ms late every step; rank 0 recompiles the model at step 4 (a batch of another
    shape), and rank 1 waits for that compile in the all_reduce, far longer than 40 ms. That
    step is warm-up for every rank: the rank table's mean waits are those of the steady steps
    (rank 0 waits 40 ms for rank 1, rank 1 nothing), not raised by the compile."""
    sleep_ms, step = RECOMPILE["sleep_ms"], RECOMPILE["recompile"][1]
    # the wait for the compile is real: rank 1 sat in that all_reduce far longer than the delay
    blocked = json.loads((run_dir("recompile") / "times-1.json").read_text())
    assert blocked[step] > 3 * sleep_ms / 1e3, blocked
    info = summary_json(run_dir("recompile") / "run", "--by", "rank")[0]["ranks"]
    assert step not in {r["step"] for r in info["rows"]}, info["rows"]
    mean = {r["rank"]: r["wait_us"] for r in info["ranks"]}
    assert 0.8 * sleep_ms * 1e3 <= mean["rank0"] <= 1.2 * sleep_ms * 1e3, mean
    assert mean["rank1"] < 0.2 * sleep_ms * 1e3, mean
    s = info["straggler"]
    assert s["rank"] == "rank1" and 0.8 * sleep_ms * 1e3 <= s["wait_caused_median_us"] <= 1.2 * sleep_ms * 1e3, s
