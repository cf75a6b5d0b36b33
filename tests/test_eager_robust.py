"""Eager ops never break the program: DataLoader worker processes, a second
thread calling the same models, an exception raised inside a module's forward, a Dynamo reset and
a forked child (tests/scripts/eager_robust.py), against the same program run untraced."""

import json
import os

from backend_support import eager_ops, inside, ops
from subproc import python
from scripts.eager_robust import ITERS, RAISE_AT, RESET_AT
from tracefile import read_events, traces

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "eager_robust.py")


def test_threads_workers_fork_reset_and_exceptions_with_eager_ops_on(tmp_path):
    # a crash shows its stacks and signal (a SIGSEGV's stderr is empty otherwise)
    for name, env in (("plain", {"DFTRACER_ENABLE": "0"}), ("traced", {"DFTRACER_EAGER_OPS": "1"})):
        argv = [SCRIPT, str(tmp_path / f"{name}.json")] + (["--trace", str(tmp_path / "tr")] if name == "traced" else [])
        proc = python(argv, tmp_path, {**env, "PYTHONFAULTHANDLER": "1"}, timeout=600)
        assert proc.returncode == 0, (name, proc.returncode, proc.stderr[-6000:])
    plain, traced = (json.loads((tmp_path / f"{k}.json").read_text()) for k in ("plain", "traced"))
    assert traced == {**plain, "thread_calls": traced["thread_calls"]}  # bit-identical numerics
    assert traced["failed_at"] == RAISE_AT and traced["child_status"] == 0 and traced["thread_ok"]
    assert traced["child"] == traced["expected_child"]
    main = [read_events(p) for p in traces(tmp_path, "tr-*")]
    main = next(ev for ev in main if any(e.get("cat") == "optimizer" for e in ev))
    eager = eager_ops(main)
    pid = {e["pid"] for e in ops(main, "optimizer")}
    tids = {e["tid"] for e in ops(main, "optimizer")}
    assert {e["pid"] for e in eager} == pid and {e["tid"] for e in eager} == tids  # the loop's thread only
    # after the exception, the reset and the other thread's compiles, eager ops still carry the
    # module they ran in, in every trained step: the loss module's ops the loss's, the LSTM's the
    # LSTM's, and the ops outside any module call (the loss's gradient seed, SGD's updates) none
    steps = {e["args"]["step"] for e in ops(main, "optimizer")}
    assert len(steps) == ITERS - 1 and RESET_AT < ITERS, steps
    for step in steps:
        mine = [e for e in eager if e["args"].get("step") == step]
        by_name = {e["name"]: e["args"].get("module") for e in mine if e["args"].get("phase") == "forward"}
        assert by_name.get("aten::mse_loss") == "criterion", (step, by_name)
        assert by_name.get("aten::lstm") == "main.lstm", (step, by_name)
        assert by_name.get("aten::ones_like", "none") is None, (step, by_name)
        updates = [e["args"].get("module") for e in mine if e["name"] == "aten::add_"]
        assert updates and not any(updates), (step, updates)
    lstm = [s for s in ops(main, "module") if s["name"] == "main.lstm" and s["args"].get("step") in steps]
    assert len(lstm) == ITERS - 1
    assert all(any(inside(e, s) for s in lstm) for e in eager if e["name"] == "aten::lstm"
               and e["args"].get("step") in steps)
