"""The rank view inside optimizer closures (LBFGS, Lightning's default): a closure's forward and
backward are forward and backward time, nested in the optimizer slice, each instant counted once
(the innermost phase, as the step view counts it)."""

from dftrace_dynamo.traces import summary
from tracefile import write_rank_job

RANKS, STEPS, SLOW_RANK = 4, 8, 2
FORWARD, BACKWARD, OWN = 2_000.0, 3_000.0, 500.0  # µs of each closure part and the optimizer's own


def _write_job(directory, slow):
    """Per rank and step: ``LBFGS.step`` holding the closure's forward graph call and its
    ``backward`` (with the backward graph call inside), then an all_reduce; ``slow`` ({phase: µs})
    makes SLOW_RANK's phase longer from step 2 on. Returns the paths."""
    def emit(log, r, s):
        extra = slow if r == SLOW_RANK and s >= 2 else {}
        t0 = 1_700_000_000_000_000.0 + s * 40_000
        fw, bw = FORWARD + extra.get("forward", 0), BACKWARD + extra.get("backward", 0)
        own = OWN + extra.get("optimizer", 0)
        log("graph 0", "dynamo_graph", t0 + own, t0 + own + fw, phase="forward", graph=0)
        log("graph 0", "dynamo_graph", t0 + own + fw + 10, t0 + own + fw + bw - 10, phase="backward", graph=0)
        log("backward", "backward", t0 + own + fw, t0 + own + fw + bw)
        log("LBFGS.step", "optimizer", t0, t0 + own + fw + bw, optimizer="LBFGS")
        arrive = t0 + own + fw + bw
        end = t0 + 20_000
        log("all_reduce", "comm", arrive, end, group="pg0", bytes=4096)
        log(f"step {s}", "step", t0, end + 50)
    return write_rank_job(directory, RANKS, STEPS, emit)


def test_a_slower_closure_forward_is_forward_not_optimizer(tmp_path):
    paths = _write_job(tmp_path, {"forward": 4_000})
    straggler = summary.summarize(paths, source="events")["ranks"]["straggler"]
    assert straggler["rank"] == f"rank{SLOW_RANK}"
    assert straggler["slower"]["phase"] == "forward" and straggler["slower"]["excess_us"] == 4_000


def test_a_slower_closure_backward_is_backward(tmp_path):
    paths = _write_job(tmp_path, {"backward": 4_000})
    slower = summary.summarize(paths, source="events")["ranks"]["straggler"]["slower"]
    assert slower["phase"] == "backward" and slower["excess_us"] == 4_000


def test_the_optimizers_own_time_is_optimizer(tmp_path):
    paths = _write_job(tmp_path, {"optimizer": 4_000})
    slower = summary.summarize(paths, source="events")["ranks"]["straggler"]["slower"]
    assert slower["phase"] == "optimizer" and slower["excess_us"] == 4_000
