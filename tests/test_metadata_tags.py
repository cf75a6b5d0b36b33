"""User tags named like the DFTRACER_INC_METADATA args never replace the tracer's values."""

from subproc import run_py
from tracefile import read_events, traces


def test_a_tag_named_like_a_metadata_arg_keeps_both(tmp_path):
    p = run_py("""
        import torch
        from dftrace_dynamo import dftracer
        from dftrace_dynamo.backend import create_backend
        dftracer.initialize_log("t")
        backend = create_backend()
        backend.update(args={"flops": 1, "input_shapes": "mine"})
        f = torch.compile(lambda a, b: torch.mm(a, b) + 1, backend=backend)
        f(torch.ones(4, 8), torch.ones(8, 2))
        dftracer.finalize()
    """, tmp_path, env={"DFTRACER_INC_METADATA": "1"})
    assert p.returncode == 0, p.stderr
    (path,) = traces(tmp_path)
    (mm,) = [e for e in read_events(path) if e.get("cat") == "dynamo" and e["name"] == "function.mm.default"]
    assert mm["args"]["flops"] == 2 * 4 * 8 * 2 and mm["args"]["user_flops"] == 1
    assert mm["args"]["input_shapes"] == [[4, 8], [8, 2]] and mm["args"]["user_input_shapes"] == "mine"
