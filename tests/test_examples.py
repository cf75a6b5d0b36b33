"""The three examples of pydftracer's user guide (examples/*.py) run unchanged but for the import line and
write the traces their users expect: ATen op names, forward and backward events."""

import os

import pytest

import perfetto_tp
from backend_support import run_python
from tracefile import read_events, traces

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def run_example(name, cwd):
    run_python([os.path.join(EXAMPLES, name)], cwd, {"DFTRACER_ENABLE": "1"}, timeout=600)


@pytest.mark.parametrize("script, prefix, expected", [
    ("decorator_example.py", "dynamo_trace", ["function.convolution.default", "function.relu.default",
                                              "function.max_pool2d_with_indices.default",
                                              "function.view.default", "function.addmm.default"]),
    ("backend_example.py", "dynamo_trace", ["function.addmm.default", "function.relu.default",
                                            "function.addmm.default"]),
])
def test_inference_examples(tmp_path, script, prefix, expected):
    run_example(script, tmp_path)
    (path,) = traces(tmp_path, f"{prefix}-*.pfw.gz")
    events = read_events(path)
    names = [e["name"] for e in events if e.get("cat") == "dynamo"]
    assert [n for n in names if n in expected] == expected  # in execution order, each once
    assert perfetto_tp.error_stats(path) == []


def test_training_example_traces_forward_and_backward_of_every_step(tmp_path):
    run_example("training_example.py", tmp_path)
    (path,) = traces(tmp_path, "training-*.pfw.gz")
    events = read_events(path)
    graph_phases = [e["args"]["phase"] for e in events if e.get("cat") == "dynamo_graph"]
    assert graph_phases == ["forward", "backward"] * 10  # 5 epochs x 2 batches
    names = {e["name"] for e in events if e.get("cat") == "dynamo"}
    assert {"function.convolution.default", "function.convolution_backward.default",
            "function.mm.default"} <= names
    assert perfetto_tp.error_stats(path) == []
