"""A torchrun job for tests/test_flight.py: STEPS compiled training steps with an all_reduce of
the loss; at step STALL_AT rank STALL_RANK sleeps STALL_S in stall_here() before its all_reduce,
so the others wait in theirs. Each rank writes its wall-clock marks (ns) to MARKS.<rank>.json:
when the stall began and ended (stall), or when its all_reduce was issued and returned (wait),
and the wall-clock steps seen (wall_steps, wallclock.py)."""
import json
import os
import time

import torch
import torch.distributed as dist

import wallclock

STEPS, STALL_AT = int(os.environ.get("STEPS", "12")), int(os.environ.get("STALL_AT", "8"))
STALL_RANK, STALL_S = int(os.environ.get("STALL_RANK", "1")), float(os.environ.get("STALL_S", "8"))


def stall_here(seconds):
    time.sleep(seconds)


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
model = torch.compile(net, backend="dftrace")
opt = torch.optim.SGD(net.parameters(), lr=0.01)
marks, watch = {}, wallclock.Watch()
for i in range(STEPS):
    opt.zero_grad()
    loss = model(torch.randn(8, 16)).sum()
    loss.backward()
    if i == STALL_AT and rank == STALL_RANK:
        marks["stall"] = [time.time_ns()]
        stall_here(STALL_S)
        marks["stall"].append(time.time_ns())
    t0 = time.time_ns()
    dist.all_reduce(loss.detach())
    if i == STALL_AT:
        marks.setdefault("wait", [t0, time.time_ns()])
    opt.step()
    watch()
marks["wall_steps"] = watch.steps
with open(f"{os.environ['MARKS']}.{rank}.json", "w") as f:
    json.dump(marks, f)
dist.barrier()
dist.destroy_process_group()
