"""Unmodified script using ``@torch.compile`` without arguments (inductor by
default) and ``nn.Module.compile()``: both must be routed by --compile-all."""

import torch


@torch.compile
def scaled(x):
    return torch.sin(x) * 2


module = torch.nn.Linear(4, 2)
module.compile(mode="reduce-overhead")
with torch.no_grad():
    print(scaled(torch.ones(3)).sum().item(), module(torch.ones(1, 4)).shape)
