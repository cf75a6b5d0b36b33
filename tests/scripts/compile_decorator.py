"""Unmodified script using ``@torch.compile`` without arguments (inductor by
default) and ``nn.Module.compile(mode=...)``: both must be routed by --compile-all."""

import torch


@torch.compile
def scaled(x):
    return torch.sin(x) * 2


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x).relu()


head = Head()
head.compile(mode="reduce-overhead")
with torch.no_grad():
    print(scaled(torch.ones(3)).sum().item(), head(torch.ones(1, 4)).shape)
