"""A small traced training loop at ``level="inductor"`` for the analysis-engine and aggregate
tests: an MLP of modules ``l1``, ``l2``, ``l3`` (module slices on), Inductor kernel events,
SGD, a step slice per iteration and one evaluation pass.

    python kerneltrain.py PREFIX [--steps 6]
"""
import argparse

import torch
import torch.nn as nn

from dftrace_dynamo import create_backend, dftracer, step_context

WIDTH, BATCH = 64, 16


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, 10)

    def forward(self, x):
        return self.l3(self.l2(self.l1(x).relu()).relu())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prefix")
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    log = dftracer.initialize_log(a.prefix, None, -1)
    model = Net()
    compiled = torch.compile(model, backend=create_backend(level="inductor"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(BATCH, WIDTH), torch.randint(0, 10, (BATCH,))
    for _ in range(a.steps):
        with step_context():
            opt.zero_grad()
            nn.functional.cross_entropy(compiled(x), y).backward()
            opt.step()
    log.finalize()


if __name__ == "__main__":
    main()
