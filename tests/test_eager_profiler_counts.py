"""Per-step op counts against torch.profiler's top-level ops (issue 36's goal: ±2 %; measured equal).

Each program of tests/scripts/op_counts.py runs twice in fresh interpreters, same seed, same
iterations: under dftrace_dynamo with eager ops on (compiled models at ATen level) and untraced
under torch.profiler (CPU, ``record_shapes`` off; compiled models on ``aot_eager``, the AOTAutograd
graphs our ATen level instruments, run without our interceptors).

The mapping compared, per step:

* ours: every op event (``cat`` ``dynamo``) carrying ``args.step``: a compiled graph's op events
  (one per FX node that computes: ``function.addmm.default`` is one ``aten::addmm`` call;
  ``getitem`` and built tuples are no events and no dispatcher calls) and the eager op events
  (``args.level`` ``eager``: one per outermost registered op outside compiled graphs);
* torch.profiler's: the records of registered operators (``ns::name``, custom ops included; not
  autograd's ``autograd::engine::...`` / ``torch::autograd::...`` records) with no registered
  operator among their ancestors on their thread, outside Dynamo's compile records, cut into
  steps as our step slices cut the run: step N from iteration N's first training call (its
  DataLoader ``next()`` or ``zero_grad()``) to the next one's; step 0 from the trace's opening
  (the model's construction is in it), the last step until the trace closes.

Both count each dispatcher call of an op once, in forward, in backward (a compiled graph's
backward ops, autograd's eager backward ops, gradient accumulation) and in the optimizer
(foreach, fused and compiled steps, ``zero_grad``), so the counts are equal, not merely within 2 %;
the tests require equality (a single lost op fails them) and name the ops that differ.
"""

import collections
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import op_counts  # noqa: E402  (benchmarks/op_counts.py: runs both and reads the trace)
from scripts.op_counts import ITERS  # noqa: E402
from subproc import python  # noqa: E402


def differing(events, truth, step):
    ours, theirs = op_counts.by_name(events, step), collections.Counter(truth["names"][step])
    return {n: (ours[n], theirs[n]) for n in set(ours) | set(theirs) if ours[n] != theirs[n]}


def measured(tmp_path, program):
    traced, truth, events = op_counts.run(program, str(tmp_path), python)
    assert traced["losses"] == truth["losses"] and traced["params"] == truth["params"]  # numerics untouched
    assert len(truth["ops"]) == ITERS and min(truth["ops"]) > 40, truth["ops"]
    return truth, events, op_counts.per_step(events, ITERS)


@pytest.mark.parametrize("program", ["eager", "graph_break", "adam", "accum", "compiled_step"])
def test_per_step_op_counts_equal_profiler(tmp_path, program):
    """An all-eager model fed by a DataLoader; a compiled model with a graph break, an eager
    LSTM and the loss outside; a compiled CNN with Adam foreach and zeroed (not freed) grads;
    gradient accumulation with fused Adam and clipping; a compiled optimizer step: every step's
    op events equal torch.profiler's top-level ops of that step, none lies outside a step."""
    truth, events, (ours, none) = measured(tmp_path, program)
    assert none == 0
    for k in range(ITERS):
        assert ours[k] == truth["ops"][k], (k, ours, truth["ops"], differing(events, truth, k))


def test_per_step_op_counts_equal_profiler_with_evaluation(tmp_path):
    """Dynamic shapes (a recompile) and an evaluation after each optimizer step: each step's op
    events equal the profiler's top-level ops of the iteration outside its evaluation (the
    last step is left out: what follows the last evaluation is evaluation to the tracer)."""
    truth, events, (ours, none) = measured(tmp_path, "eval")
    for k in range(ITERS - 1):
        assert ours[k] == truth["ops"][k], (k, ours, truth["ops"], differing(events, truth, k))
    assert none >= truth["eval"] > 0
