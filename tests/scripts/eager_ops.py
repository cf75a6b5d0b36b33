"""Training loops whose ops run (partly) outside compiled graphs, for tests/test_eager_ops.py.

``python eager_ops.py SHAPE OUT.json [--trace PREFIX] [--profile]``: runs ITERS iterations of
SHAPE and writes the losses (float.hex, for bit-identical numerics) and, with ``--profile``
(untraced), torch.profiler's ground truth per iteration: the top-level registered ops (no
registered op among their ancestors: autograd's engine records are not ops) outside
compiled graphs, and those inside ``Adam.step``. With ``--trace`` the loop runs under
dftrace_dynamo (``initialize_log``), compiled models with ``backend="dftrace"``.

Shapes: ``lstm`` (an eager model: Linear, LSTM, a module sleeping SLEEP_S in a custom op,
the loss outside the model, Adam with foreach), ``accum`` (the same with two
micro-batches per optimizer step), ``two_opt`` (two models, two optimizers),
``graph_break`` (a compiled model with a graph break and an eager LSTM, the loss outside).
"""

import argparse
import json
import time

import torch
import torch.nn as nn

ITERS = 5
SLEEP_S = 0.02


SLEPT_NS = []  # the op's own measure of each call


@torch.library.custom_op("eagertest::sleep", mutates_args=())
def sleep(x: torch.Tensor) -> torch.Tensor:
    t0 = time.perf_counter_ns()
    time.sleep(SLEEP_S)
    y = x.clone()
    SLEPT_NS.append(time.perf_counter_ns() - t0)
    return y


@sleep.register_fake
def _(x):
    return torch.empty_like(x)


sleep.register_autograd(lambda ctx, g: g)


class Sleeper(nn.Module):
    def forward(self, x):
        return sleep(x)


class Model(nn.Module):
    def __init__(self, graph_break=False):
        super().__init__()
        self.l1, self.lstm, self.l2 = nn.Linear(8, 8), nn.LSTM(8, 8), nn.Linear(8, 1)
        self.sleeper, self.graph_break = Sleeper(), graph_break

    def forward(self, x):
        x = self.l1(x).relu()
        if self.graph_break:
            torch._dynamo.graph_break()
        y, _ = self.lstm(x)
        return self.l2(self.sleeper(y))


def loop(shape, compile_fn):
    torch.manual_seed(0)
    batches = [(torch.randn(5, 3, 8), torch.randn(5, 3, 1)) for _ in range(2 * ITERS)]
    models = [Model(graph_break=shape == "graph_break")] + ([Model()] if shape == "two_opt" else [])
    opts = [torch.optim.Adam(m.parameters(), lr=1e-2, foreach=True) for m in models]
    run = [compile_fn(m) if shape == "graph_break" else m for m in models]
    losses = []
    for i in range(ITERS):
        with torch.profiler.record_function(f"iter{i}"):
            for m, opt in zip(run, opts):
                opt.zero_grad()
                for x, y in batches[2 * i:2 * i + (2 if shape == "accum" else 1)]:
                    loss = (m(x) - y).pow(2).mean()  # the loss outside the model
                    loss.backward()
                    losses.append(loss.item().hex())
                opt.step()
    return losses, [p.detach().flatten().tolist() for m in models for p in m.parameters()]


def registered(name):
    """An operator's record: not autograd's engine or node records (``torch::autograd::...``)."""
    return "::" in name and not name.startswith(("autograd::", "torch::autograd::"))


def profile_truth(prof):
    """Per iteration: top-level registered ops, and those inside Adam.step."""
    events = prof.events()
    iters = sorted((e for e in events if e.name.startswith("iter")), key=lambda e: e.time_range.start)
    per_iter, in_adam = [0] * len(iters), [0] * len(iters)
    for e in events:
        if not registered(e.name):
            continue
        parent, in_step = e.cpu_parent, False
        while parent is not None and not registered(parent.name):
            in_step = in_step or parent.name.endswith("Adam.step")
            parent = parent.cpu_parent
        if parent is not None:
            continue
        for k, it in enumerate(iters):
            if it.time_range.start <= e.time_range.start <= it.time_range.end:
                per_iter[k] += 1
                in_adam[k] += in_step
    return per_iter, in_adam


def main():
    from side_by_side import profiled, traced  # a sibling when run as a script (tests import this module)

    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("out")
    ap.add_argument("--trace")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    out = {}
    if a.trace:
        out["losses"], out["params"] = traced(a.trace, lambda compile: loop(a.shape, compile))
    elif a.profile:
        (out["losses"], out["params"]), prof = profiled(lambda compile: loop(a.shape, compile), "eager")
        out["ops"], out["adam_ops"] = profile_truth(prof)
    else:
        out["losses"], out["params"] = loop(a.shape, lambda m: torch.compile(m, backend="eager"))
    out["slept_ns"] = SLEPT_NS
    with open(a.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
