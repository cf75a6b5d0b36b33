"""No Dynamo-internal component (``_torchdynamo_inline``, ``__self__``, ``___stack0``, ``L__self__``,
``_orig_mod``) in a module path: module stacks as Dynamo writes them map to ``named_modules()``
paths, from the objects the compiled frame holds, or from the text where it holds none."""

import re

import pytest
import torch
import torch.nn as nn

from backend_support import ops
from backend_support import fresh_dynamo, rec  # noqa: F401 (fixtures)
from dftrace_dynamo import create_backend
from dftrace_dynamo import naming
from dftrace_dynamo.backend import sites

INTERNAL = re.compile(r"_torchdynamo_inline|__self__|___stack|L__self__|_orig_mod|L\[")


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
        self.head = nn.Linear(64, 1)

    def forward(self, x):
        return self.head(self.body(x))

    def training_step(self, x):
        return self(x).sum()


def compiled_like_lightning(model, backend):
    """What Lightning does with a torch.compile'd LightningModule (``from_compiled``): its
    ``forward`` and ``training_step`` become compiled bound methods."""
    ctx = torch.compile(model, backend=backend).dynamo_ctx
    model.forward = ctx(model.forward)
    return ctx(model.training_step)


# (nn_module_stack paths of one node, innermost last) -> the module paths the trace gives
STACKS = [
    (["L['self']", "L['self'].forward._torchdynamo_inline.__self__.head"], ["regressor", "head"]),
    (["L['self'].forward._torchdynamo_inline.__self__.body", "L['self'].body.0"], ["body", "body.0"]),
    (["L['self'].forward._torchdynamo_inline.__self__.body", "L['self'].body[1]"], ["body", "body.1"]),
    (["L['___stack0']"], ["head"]),  # a resume function's local
    (["L['wrapped']._orig_mod.body._modules['1']"], ["body.1"]),  # a compiled submodule
    # not held by the frame: the text without Dynamo's components
    (["L['gone'].forward._torchdynamo_inline.__self__.head"], ["head"]),
    (["L['___stack1']"], ["linear"]),
    (["L__self___body_0"], ["body.0"]),
    (["L['self']._orig_mod.head"], ["head"]),
]
TYPES = {"L['self']": Regressor, "L['___stack1']": nn.Linear}  # (the names the trace gives them)


def stacked_graph(stacks):
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    for stack in stacks:
        node = graph.call_function(torch.relu, (x,))
        node.meta["nn_module_stack"] = {f"k{i}": (path, TYPES.get(path, nn.Module)) for i, path in enumerate(stack)}
    graph.output(x)
    return torch.fx.GraphModule(nn.Module(), graph)


def test_stacks_with_dynamo_internal_components_give_user_paths():
    model = Regressor()
    compiled_like_lightning(model, "eager")  # the frame's self: its forward is a compiled method
    gm = stacked_graph([paths for paths, _ in STACKS])
    sites.user_stacks(gm, {"self": model, "___stack0": model.head, "wrapped": torch.compile(model.body)}, {})
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    found = [[name for _, name, _ in sites.module_stack(n)] for n in nodes]
    assert found == [names for _, names in STACKS]
    assert [sites.module_of(n)[0] for n in nodes] == [names[-1] for _, names in STACKS]


def test_graph_tools_name_the_same_modules_from_the_text():
    """capture/profile/explore/draw read the stacks without the frame's objects."""
    from dftrace_dynamo.graphs.names import module_stack

    gm = stacked_graph([["L['self']", "L['self'].forward._torchdynamo_inline.__self__.head"],
                        ["L['self'].forward._torchdynamo_inline.__self__.body", "L['self'].body[1]"],
                        ["L['wrapped']._orig_mod.body._modules['1']"], ["L__self___body_0"]])
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert [[path for path, _ in module_stack(n)] for n in nodes] == [["head"], ["body", "body.1"], ["body.1"],
                                                                       ["body.0"]]


@pytest.mark.parametrize("path, user", [
    ("forward._torchdynamo_inline.__self__.head", "head"),
    ("body.forward._torchdynamo_inline.__self__.0", "body.0"),
    ("_orig_mod.body.___stack0.1", "body.1"),
    ("L__self__.head", "head"),
    ("encoder.layer.0", "encoder.layer.0"),
])
def test_user_path_drops_internal_components(path, user):
    assert naming.user_path(path) == user


@pytest.mark.parametrize("level", ["torch", "aten"])
def test_compiled_bound_methods_give_the_models_paths(rec, level):
    torch.manual_seed(0)
    model = Regressor()
    step = compiled_like_lightning(model, create_backend(level=level))
    for _ in range(2):
        step(torch.randn(4, 32)).backward()
    events = rec.events()
    modules = {e["args"].get("module") for e in ops(events)} - {None}
    assert modules == {"body.0", "body.1", "head"}
    names = {e["name"] for e in events if e.get("cat") == "module"}
    assert names and not any(INTERNAL.search(n) for n in names), names
