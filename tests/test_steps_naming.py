"""``Dynamo.update(step=n)`` at the start of an iteration names that iteration's step, after the
previous step's optimizer step as before its first one, and never puts a step on evaluation events."""

import torch

from backend_support import MLP, eager_ops, graphs, inside, ops
from backend_support import fresh_dynamo, rec  # noqa: F401 (fixtures)
from dftrace_dynamo import create_backend


def loop(backend, first, evaluate_before=None):
    """Iterations numbered ``first``..``first + 3``, each named at its start; before iteration
    ``evaluate_before`` (once named), an evaluation that names a step in its middle too."""
    torch.manual_seed(0)
    model = MLP()
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for k in range(first, first + 4):
        backend.update(step=k)
        if k == evaluate_before:
            model.eval()
            with torch.no_grad():
                compiled(torch.randn(4, 16))
                backend.update(step=k)  # a callback naming steps while evaluation runs
                compiled(torch.randn(4, 16))
            model.train()
        opt.zero_grad()
        compiled(torch.randn(4, 16)).sum().backward()
        opt.step()


def steps_of(events):
    """[(step slice name, steps carried by the events inside it)] in time order."""
    slices = sorted(ops(events, "step"), key=lambda e: e["ts"])
    return [(s["name"], {e["args"].get("step") for e in events if e.get("ph") == "X" and e is not s
                         and e.get("cat") not in ("step", "eval")
                         and inside(e, s)})
            for s in slices]


def test_update_at_the_start_of_each_iteration_names_its_step(rec):
    loop(create_backend(level="torch"), first=0)
    events = rec.events()
    assert steps_of(events) == [(f"step {k}", {k}) for k in range(4)]
    assert [e["args"]["step"] for e in ops(events, "optimizer") if e["name"] == "SGD.step"] == [0, 1, 2, 3]


def test_update_with_a_resumed_count_and_an_evaluation_between_steps(rec):
    loop(create_backend(level="torch"), first=100, evaluate_before=102)
    events = rec.events()
    (ev,) = ops(events, "eval")
    held = [e for e in events if e.get("ph") == "X" and e is not ev and inside(e, ev)]
    eval_graphs = [g for g in graphs(held) if g["args"]["grad_enabled"] == 0]
    assert len(eval_graphs) == 2
    assert all("step" not in e["args"] for e in held), [e for e in held if "step" in e["args"]]
    assert len(ops(held, "dynamo")) > 0  # its ops are there, without a step
    # the model's initialisation (eager ops, before the first step was named) keeps step 0: only
    # later events carry a name (Dynamo.update)
    init = [e for e in eager_ops(events) if e["args"].get("step") == 0]
    assert all(e["ts"] < min(g["ts"] for g in graphs(events)) for e in init)
    events = [e for e in events if e not in init]
    assert steps_of(events) == [(f"step {k}", {k}) for k in range(100, 104)]
