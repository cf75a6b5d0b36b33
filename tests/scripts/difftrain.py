"""A small traced training loop for the diff and analysis-engine tests: an MLP of modules ``l1``,
``l2``, ``l3`` compiled with the tracing backend (``--level``, default ``aten``), SGD, one
thread, a step slice per iteration. ``--extra W`` makes ``l2`` alone slower: its forward also
multiplies its input by a (width x W) buffer whose result is added times 0, so the op graph is
the same for every W and only the time of ``l2``'s ops changes.

``--turns R W``: take turns with another run, step by step: wait for a byte on file
descriptor R before each step, write one to W after it. Two runs that alternate so see the
same load of a shared machine, and neither slows the other down; each step is marked with
``step_context``, so the wait belongs to no step.

    python difftrain.py PREFIX [--steps 30] [--level aten|torch|inductor] [--extra W] [--turns R W]
"""
import argparse
import os

import torch
import torch.nn as nn

from dftrace_dynamo import create_backend, dftracer, step_context

WIDTH, BATCH = 256, 64


class Padded(nn.Linear):
    def __init__(self, extra):
        super().__init__(WIDTH, WIDTH)
        self.register_buffer("pad", torch.randn(WIDTH, extra))

    def forward(self, x):
        return super().forward(x) + 0 * (x @ self.pad).sum(dim=1, keepdim=True)


class Net(nn.Module):
    def __init__(self, extra):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(WIDTH, WIDTH), Padded(extra), nn.Linear(WIDTH, 10)

    def forward(self, x):
        return self.l3(self.l2(self.l1(x).relu()).relu())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prefix")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--level", default="aten")
    ap.add_argument("--extra", type=int, default=0)
    ap.add_argument("--turns", type=int, nargs=2, metavar=("R", "W"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.turns:  # both runs on one core, so that neither gets a quieter one
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.manual_seed(0)
    log = dftracer.initialize_log(a.prefix, None, -1)
    model = Net(a.extra)
    compiled = torch.compile(model, backend=create_backend(level=a.level))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(BATCH, WIDTH), torch.randint(0, 10, (BATCH,))
    for _ in range(a.steps):
        if a.turns:
            os.read(a.turns[0], 1)
        with step_context():
            opt.zero_grad()
            nn.functional.cross_entropy(compiled(x), y).backward()
            opt.step()
        if a.turns:
            os.write(a.turns[1], b"x")
    log.finalize()


if __name__ == "__main__":
    main()
