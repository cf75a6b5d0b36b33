"""A compile is reported in the step whose step slice holds it, as the warm-up rule places it."""

import json

from scripts.clitools import summary_json

PID = 7


def event(name, cat, ts, dur, **args):
    return {"name": name, "cat": cat, "pid": PID, "tid": PID, "ts": ts, "dur": dur, "ph": "X", "args": args}


def test_a_compile_inside_a_step_slice_is_in_that_step(tmp_path):
    # a GAN's first iteration: D compiles and steps, then G's first compile runs while step 0 is
    # still open (its events already carry step 1); step 0 ends where training starts again
    events = [
        event("start", "dftracer", 0, 0),
        event("step 0", "step", 10, 1000, step=0),
        event("dynamo compile Sequential", "dynamo_compile", 20, 300, step=0, kind="compile", frame="D"),
        event("SGD.step", "optimizer", 400, 10, step=0),
        event("dynamo compile Sequential", "dynamo_compile", 500, 300, step=1, kind="compile", frame="G"),
        event("SGD.step", "optimizer", 900, 10, step=1),
        *(event(f"step {s}", "step", 1010 + 100 * (s - 1), 100, step=s) for s in (1, 2, 3)),
        event("dynamo compile Sequential", "dynamo_compile", 1150, 10, step=2, kind="recompile", frame="G"),
    ]
    path = tmp_path / "gan.pfw"
    path.write_text("[\n" + "".join(json.dumps(e) + "\n" for e in events) + "]\n")
    doc, _ = summary_json(path)
    assert [(c["frame"], c["step"]) for c in doc["compile"]["compiles"]] == [("D", 0), ("G", 0)]
    assert [r["steps"] for r in doc["compile"]["recompiles"]] == [[2]]
    # the same steps as the warm-up rule's
    assert [(w["step"], w["reason"]) for w in doc["steps"]["warmup_steps"]] == [(0, "compiled"), (2, "recompiled")]
