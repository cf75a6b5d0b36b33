"""A small transformer trained under torchrun (gloo, CPU) for tests/test_convert_perfetto.py:
an encoder layer compiled with the dftrace backend (ATen ops inside nested module slices), its
gradients all-reduced by hand (comm events), Adam, ``step()`` marks and a 64 MiB buffer touched
in step 2 so the memory counter moves.

    torchrun --nproc_per_node=2 transformer_train.py [STEPS]
"""
import sys
import time

import torch
import torch.distributed as dist

import dftrace_dynamo
from dftrace_dynamo import step

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 6
dftrace_dynamo.initialize_log()
dist.init_process_group("gloo")
torch.manual_seed(0)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.encoder = torch.nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(32, 64)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)))


net = Model()
model = torch.compile(net, backend="dftrace")
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
for i in range(STEPS):
    tokens = torch.randint(0, 64, (4, 16))
    loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    opt.zero_grad()
    loss.backward()
    for p in net.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    if i == 2:
        big = torch.ones(64 << 20, dtype=torch.uint8)
        time.sleep(0.25)  # the memory sampler (every 0.1 s) sees it
        del big
    time.sleep(0.05)
    step()
dist.barrier()
dist.destroy_process_group()
