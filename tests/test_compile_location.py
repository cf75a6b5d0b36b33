"""Compile events name the user's code: a recompile in a GAN loop is located at the user's line
and names the model, not torch's wrapper around it."""

import inspect

import torch
import torch.nn as nn

from backend_support import fresh_dynamo, rec  # noqa: F401 (fixtures)
from dftrace_dynamo import create_backend
from dftrace_dynamo.backend import compile_events


def test_a_gan_recompile_is_located_at_the_users_line_and_names_the_model(rec):
    G = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    D = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    backend = create_backend(level="torch")
    cg, cd = torch.compile(G, backend=backend), torch.compile(D, backend=backend)
    with compile_events.collect() as records:
        fake = cg(torch.randn(8, 4))
        cd(fake.detach()).mean().backward()
        line = inspect.currentframe().f_lineno + 1
        cd(fake).mean().backward()  # D on a tensor that requires grad: a recompile
    recompiles = [r for r in records if r["kind"] == "recompile" and "requires_grad" in r["reason"]]
    assert recompiles, [(r["kind"], r.get("reason")) for r in records]
    for r in recompiles:
        assert r["location"] == f"{__file__}:{line}"
        assert (r["frame"], r["module"]) == ("Sequential", "D")
    compiles = [r for r in records if r["kind"] == "compile" and r.get("frame")]
    assert {r["module"] for r in compiles} == {"G", "D"}
    assert all(r["location"].startswith(__file__) for r in compiles)
