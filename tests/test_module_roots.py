"""Every model has a root of its own: two models never share a module path (a GAN's generator and
discriminator each hold a ``main`` Sequential), and ``summary --by module`` never adds different
modules together. Ground truth: the test's own time marks around each model's calls."""

import collections

import pytest
import torch
import torch.nn as nn

from backend_support import Enc
from backend_support import ops as all_ops
from backend_support import fresh_dynamo, rec  # noqa: F401 (fixtures)
from dftrace_dynamo import _core, create_backend
from scripts.clitools import summary_json


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh())

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1), nn.Sigmoid())

    def forward(self, x):
        return self.main(x).view(-1)


def ops(events, cat="dynamo"):
    """The events of ``cat`` of the compiled graphs (not the eager ops around them)."""
    return [e for e in all_ops(events, cat) if e["args"].get("level") != "eager"]


def timed(calls, who, fn, *args):
    start = _core.now_ns()
    out = fn(*args)
    calls.append((who, start / 1e3, _core.now_ns() / 1e3))
    return out


def dcgan(level, iters=3):
    """DCGAN's loop; the (model, start µs, end µs) of each forward call."""
    backend = create_backend(level=level)
    netG = torch.compile(Generator(), backend=backend)
    netD = torch.compile(Discriminator(), backend=backend)
    optD = torch.optim.Adam(netD.parameters(), lr=1e-3)
    optG = torch.optim.Adam(netG.parameters(), lr=1e-3)
    loss = nn.BCELoss()
    calls = []
    for _ in range(iters):
        real = torch.randn(8, 8)
        netD.zero_grad()
        out = timed(calls, "D", netD, real)
        loss(out, torch.ones(8)).backward()
        fake = timed(calls, "G", netG, torch.randn(8, 4))
        out = timed(calls, "D", netD, fake.detach())
        loss(out, torch.zeros(8)).backward()
        optD.step()
        netG.zero_grad()
        out = timed(calls, "D", netD, fake)
        loss(out, torch.ones(8)).backward()
        optG.step()
    return calls


def owner(e, calls):
    (who,) = {w for w, start, end in calls if start <= e["ts"] and e["ts"] + e["dur"] <= end} or {None}
    return who


@pytest.mark.parametrize("level", ["aten", "torch"])
def test_two_models_with_the_same_attribute_names_never_share_a_path(rec, level):
    calls = dcgan(level)
    path = rec.path()
    events = [e for e in ops(_events(path)) if e["args"].get("phase") == "forward"]
    paths = collections.defaultdict(set)
    for e in events:
        if e["args"].get("module"):
            paths[owner(e, calls)].add(e["args"]["module"])
    assert paths["G"] and paths["D"] and not paths["G"] & paths["D"], paths
    assert None not in paths
    # the model named second by its variable, the first keeps the user's named_modules() paths
    assert {p.split(".")[0] for p in paths["G"]} == {"netG"} and {p.split(".")[0] for p in paths["D"]} == {"main"}
    slices = [e for e in _events(path) if e.get("cat") == "module"]
    types = collections.defaultdict(set)
    for e in slices:
        types[e["name"]].add(e["args"]["module_type"])
    assert all(len(t) == 1 for t in types.values()), types  # main.0 is never both Linear kinds
    assert {"netG.main.0", "main.0", "netG.main.3", "main.3"} <= set(types)
    assert types["netG.main.3"] == {"Tanh"} and types["main.3"] == {"Sigmoid"}
    doc, _ = summary_json(path, "--by", "module", "--include-warmup")
    counts = {r["key"]: r["count"] for r in doc["views"]["module"]}
    every = collections.Counter(e["args"]["module"] for e in ops(_events(path)) if e["args"].get("module"))
    assert {k: counts[k] for k in every} == dict(every)


def _events(path, cache={}):
    if path not in cache:
        from tracefile import read_events

        cache[path] = read_events(path)
    return cache[path]


def test_models_no_name_holds_are_named_by_their_class_made_unique(rec):
    backend = create_backend(level="aten")
    classes = [Enc, type("Other", (Enc,), {}), type("Fc", (Enc,), {})]  # fc: taken by a path
    ensemble = [torch.compile(cls(), backend=backend) for cls in classes]  # held by a list only
    marks = []
    for i in range(3):
        timed(marks, i, ensemble[i], torch.randn(2, 4))
    events = ops(_events(rec.path()))
    by_member = {i: {e["args"].get("module") for e in events if owner(e, marks) == i} for i in range(3)}
    # a named model's own ops (the relu of its forward) carry its name
    assert by_member == {0: {None, "fc"}, 1: {"other", "other.fc"}, 2: {"fc_1", "fc_1.fc"}}
