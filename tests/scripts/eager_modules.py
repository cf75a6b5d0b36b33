"""Training loops whose eager ops run inside known modules, for tests/test_eager_module_paths.py.

``python eager_modules.py SHAPE OUT.json [--trace PREFIX]``: runs ITERS iterations and
writes, per iteration, the test's own time marks (``_core.now_ns``) around each known eager module
call. Without ``--trace`` (untraced) it writes torch.profiler's ground truth instead: per
iteration, the top-level registered ops (not the profiler's own) by the marked module call (a
``record_function`` around it) that holds the op, ``""`` for the rest. With
``--trace`` the loop runs under dftrace_dynamo, compiled models with ``backend="dftrace"``.

Shapes: ``break`` (a compiled model whose ``main`` Block breaks the graph, then runs an
``nn.LSTM`` Dynamo skips and a Linear; the loss is an ``nn.MSELoss`` module called outside the
model), ``gan`` (two eager models, ``netG`` and ``netD``, each with a ``main`` Sequential).
"""

import argparse
import json

import torch
import torch.nn as nn

ITERS = 4
MARKS = []  # (iteration, who, start ns, end ns)
_ITER = [0]


def now():
    from dftrace_dynamo import _core

    return _core.now_ns()


def mark(who, fn, *args):
    start = now()
    with torch.profiler.record_function(f"module:{who}"):  # the profile's truth
        out = fn(*args)
    MARKS.append((_ITER[0], who, start, now()))
    return out


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.lstm, self.l2 = nn.Linear(8, 8), nn.LSTM(8, 8), nn.Linear(8, 1)

    def forward(self, x):
        x = self.l1(x).relu()
        torch._dynamo.graph_break()
        y, _ = mark("main.lstm", self.lstm, x)  # eager: after the break, and Dynamo skips LSTM
        return mark("main.l2", self.l2, y)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = Block()

    def forward(self, x):
        return self.main(x)


def break_loop(compile_fn):
    torch.manual_seed(0)
    batches = [(torch.randn(5, 3, 8), torch.randn(5, 3, 1)) for _ in range(ITERS)]
    model = Net()
    compiled = compile_fn(model)
    criterion = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for i, (x, y) in enumerate(batches):
        _ITER[0] = i
        with torch.profiler.record_function(f"iter{i}"):
            opt.zero_grad()
            loss = mark("criterion", criterion, compiled(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item().hex())
    return losses


def gan_loop(compile_fn):
    torch.manual_seed(0)
    netG = nn.Sequential()
    netG.main = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
    netD = nn.Sequential()
    netD.main = nn.Sequential(nn.Linear(8, 1), nn.Sigmoid())
    optG, optD = (torch.optim.SGD(m.parameters(), lr=0.01) for m in (netG, netD))
    losses = []
    for i in range(ITERS):
        _ITER[0] = i
        with torch.profiler.record_function(f"iter{i}"):
            optD.zero_grad()
            fake = mark("netG", netG, torch.randn(6, 4))
            lossD = mark("netD", netD, fake.detach()).mean()
            lossD.backward()
            optD.step()
            optG.zero_grad()
            lossG = -mark("netD", netD, fake).mean()
            lossG.backward()
            optG.step()
            losses.append(lossG.item().hex())
    return losses


def registered(name):
    return "::" in name and not name.startswith(("autograd::", "torch::autograd::", "profiler::"))


def profile_truth(prof):
    """Per iteration: {module or "": count} of the top-level registered ops (autograd's engine
    records are not ops), the module the innermost marked call that holds the op."""
    events = prof.events()
    iters = sorted((e for e in events if e.name.startswith("iter")), key=lambda e: e.time_range.start)
    calls = [e for e in events if e.name.startswith("module:")]
    counts = [{} for _ in iters]
    for e in events:
        if not registered(e.name):
            continue
        parent = e.cpu_parent
        while parent is not None and not registered(parent.name):
            parent = parent.cpu_parent
        if parent is not None:
            continue
        holders = [c for c in calls if c.time_range.start <= e.time_range.start <= c.time_range.end]
        module = max(holders, key=lambda c: c.time_range.start).name[len("module:"):] if holders else ""
        for k, it in enumerate(iters):
            if it.time_range.start <= e.time_range.start <= it.time_range.end:
                counts[k][module] = counts[k].get(module, 0) + 1
    return counts


def main():
    loops = {"break": break_loop, "gan": gan_loop}
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", choices=sorted(loops))
    ap.add_argument("out", help="the JSON file written")
    ap.add_argument("--trace", help="trace under dftrace_dynamo with this prefix (else: torch.profiler's truth)")
    a = ap.parse_args()
    loop = loops[a.shape]
    out = {}
    if a.trace:
        from dftrace_dynamo import dftracer
        from dftrace_dynamo.backend import tracer  # noqa: F401

        dftracer.initialize_log(a.trace, None, -1)
        out["losses"] = loop(lambda m: torch.compile(m, backend="dftrace"))
        dftracer.finalize()
    else:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        with prof:
            out["losses"] = loop(lambda m: torch.compile(m, backend="eager"))
        out["ops"] = profile_truth(prof)
    out["marks"] = MARKS
    with open(a.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
