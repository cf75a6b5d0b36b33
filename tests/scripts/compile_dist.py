"""A torchrun job for the ``dftrace-dynamo run`` tests: every rank compiles its model with a
backend of its own choosing ("eager", or none with NO_COMPILE), trains 3 steps with an
all_reduce, and prints its rank and its arguments."""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
if not os.environ.get("NO_COMPILE"):
    model = torch.compile(model, backend="eager")
for _ in range(3):
    loss = model(torch.randn(3, 4)).sum()
    loss.backward()
    dist.all_reduce(loss.detach())
print(f"rank {dist.get_rank()} args {sys.argv[1:]}")
dist.destroy_process_group()
