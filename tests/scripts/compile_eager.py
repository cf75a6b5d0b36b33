"""An unmodified training script for the ``dftrace-dynamo run`` tests: it picks
its own torch.compile backend ("eager"), prints its arguments, writes to
stderr and exits with the status given as its first argument."""

import sys

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
compiled = torch.compile(model, backend="eager")
loss = compiled(torch.randn(3, 4)).sum()
loss.backward()
print("args", sys.argv[1:])
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
