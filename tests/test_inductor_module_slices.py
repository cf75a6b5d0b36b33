"""Module slices at level="inductor" for a module whose forward breaks into several graphs: its
forward hooks frame each call once, and its backward kernels are framed by it as at level="aten"."""

from collections import Counter

from backend_support import fresh_dynamo, rec  # noqa: F401 (fixtures)
from test_module_paths import Net, within, train


def test_a_broken_module_has_one_forward_slice_per_call_and_backward_slices(rec):
    train(Net(), "inductor")
    modules = [e for e in rec.events() if e.get("cat") == "module"]
    for step in (1, 2):  # step 0 compiled Slow's frames: its hooks go in during that call
        got = Counter((e["name"], e["args"].get("phase")) for e in modules if e["args"]["step"] == step)
        # slow: its hooks' slice (no graph; the call's phase) forward; in backward one per backward
        # graph of its code (the graph up to the break and the one after it), as at level="aten"
        # compiled: the compiled model's call (eager ops on by default), named by its variable
        assert got == {("compiled", "forward"): 1, ("a", "forward"): 1, ("slow.fc", "forward"): 1, ("slow", "forward"): 1, ("b", "forward"): 1,
                       ("b", "backward"): 1, ("slow.fc", "backward"): 1, ("slow", "backward"): 2,
                       ("a", "backward"): 1}, got
    slow_bwd = [e for e in modules if e["name"] == "slow" and e["args"].get("phase") == "backward"]
    fc_bwd = [e for e in modules if e["name"] == "slow.fc" and e["args"].get("phase") == "backward"]
    assert all(any(within(fc, s) for s in slow_bwd) for fc in fc_bwd)
