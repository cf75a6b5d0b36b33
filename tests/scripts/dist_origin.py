"""Topologies for the origin-of-a-wait tests (tests/test_origin.py), a torchrun job on gloo:
every rank runs a compiled model ``pre -> slow -> post`` (``slow`` holds a custom op that
sleeps SLEEP_MS on rank LATE, so the delay is an op of module ``slow`` in forward; WHERE=backward:
in the backward of ``slow``), or (WHERE=data) a DataLoader whose batches take SLEEP_MS on rank
LATE, or (WHERE=eager) a sleep of the training loop itself; with SECOND=rank:ms a second rank
is late by that much in ``slow``'s forward; with RECOMPILE=rank:step that rank's batch at that step
is 3 rows (a recompile of the model, which the others wait for). Then the ranks meet in TOPOLOGY:

* ``gather``: ``gather(dst=0)`` then ``all_reduce`` (the root waits for the late rank in the gather,
  so it arrives last at the all_reduce);
* ``chain``: a pipeline, stage r receives from r - 1 and sends to r + 1, the gradients back;
* ``reduce_scatter``: ``reduce_scatter_tensor`` then ``all_gather_into_tensor``;
* ``async``: an ``all_reduce(async_op=True)``, OVERLAP_MS of work (not on rank LATE), then its
  ``wait()``;
* ``scatter``: ``scatter(src=0)`` then ``all_reduce``;
* ``broadcast``: ``broadcast(src=LATE)`` (the root late), then ``all_reduce``;
* ``all_to_all``: ``all_to_all_single`` then ``all_reduce``;
* ``barrier``: ``barrier()`` then ``all_reduce``;
* ``all_reduce``: one ``all_reduce`` (each rank writes the seconds it spent in it per step to
  ``times-<rank>.json``)."""
import json
import os
import time

import torch
import torch.distributed as dist

import pipeline

import dftrace_dynamo

TOPOLOGY, WHERE = os.environ["TOPOLOGY"], os.environ.get("WHERE", "module")
STEPS, LATE, SLEEP = int(os.environ.get("STEPS", "8")), int(os.environ["LATE"]), float(os.environ["SLEEP_MS"]) / 1e3
dftrace_dynamo.initialize_log()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)


@torch.library.custom_op("origin_test::pause", mutates_args=())
def pause(x: torch.Tensor, seconds: float) -> torch.Tensor:
    time.sleep(seconds)
    return x.clone()


@pause.register_fake
def _(x, seconds):
    return torch.empty_like(x)


pause.register_autograd(lambda ctx, grad: (grad, None))


@torch.library.custom_op("origin_test::pause_backward", mutates_args=())
def pause_backward(x: torch.Tensor, seconds: float) -> torch.Tensor:
    """The identity, whose backward sleeps ``seconds`` (an op of the backward graph)."""
    return x.clone()


@pause_backward.register_fake
def _(x, seconds):
    return torch.empty_like(x)


def _save_seconds(ctx, inputs, output):
    ctx.seconds = inputs[1]


pause_backward.register_autograd(lambda ctx, grad: (pause(grad, ctx.seconds), None), setup_context=_save_seconds)


class Slow(torch.nn.Module):
    def __init__(self, seconds, backward_seconds):
        super().__init__()
        self.lin, self.seconds, self.backward_seconds = torch.nn.Linear(16, 16), seconds, backward_seconds

    def forward(self, x):
        return pause_backward(pause(self.lin(x), self.seconds), self.backward_seconds)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        if WHERE == "data" and rank == LATE:
            time.sleep(SLEEP)
        return torch.randn(16)


net = torch.nn.Sequential()
net.add_module("pre", torch.nn.Linear(16, 16))
second, second_ms = map(int, os.environ.get("SECOND", "-1:0").split(":"))
net.add_module("slow", Slow(SLEEP if WHERE == "module" and rank == LATE else second_ms / 1e3 if rank == second else 0.0,
                            SLEEP if WHERE == "backward" and rank == LATE else 0.0))
net.add_module("post", torch.nn.Linear(16, 16))
model = torch.compile(net, backend="dftrace")
opt = torch.optim.SGD(net.parameters(), lr=0.01)
batches = iter(torch.utils.data.DataLoader(Data(), batch_size=1))


def p2p(send, tensor, peer):
    (dist.send if send else dist.recv)(tensor, peer)


recompile_rank, recompile_step = map(int, os.environ.get("RECOMPILE", "-1:-1").split(":"))
times = []
for i in range(STEPS):
    x = next(batches)
    if (rank, i) == (recompile_rank, recompile_step):
        x = torch.cat([x, next(batches), next(batches)])
    opt.zero_grad()
    if WHERE == "eager" and rank == LATE:
        time.sleep(SLEEP)
    if TOPOLOGY == "chain":
        pipeline.iteration(model, torch.empty(1, 16) if rank > 0 else x, rank, world, p2p)
    else:
        loss = model(x).sum()
        loss.backward()
        t = torch.ones(world * 4) * rank
        if TOPOLOGY == "gather":
            dist.gather(t, [torch.empty_like(t) for _ in range(world)] if rank == 0 else None, dst=0)
            dist.all_reduce(t)
        elif TOPOLOGY == "reduce_scatter":
            out = torch.empty(4)
            dist.reduce_scatter_tensor(out, t)
            dist.all_gather_into_tensor(torch.empty(world * 4), out)
        elif TOPOLOGY == "async":  # the all_reduce in flight while the others work OVERLAP_MS
            work = dist.all_reduce(t, async_op=True)
            if rank != LATE:
                time.sleep(float(os.environ["OVERLAP_MS"]) / 1e3)
            work.wait()
        elif TOPOLOGY == "scatter":
            dist.scatter(t, list(torch.ones(world * 4).repeat(world, 1).unbind()) if rank == 0 else None, src=0)
            dist.all_reduce(t)
        elif TOPOLOGY == "broadcast":
            dist.broadcast(t, src=LATE)
            dist.all_reduce(t)
        elif TOPOLOGY == "all_to_all":
            dist.all_to_all_single(torch.empty_like(t), t)
            dist.all_reduce(t)
        elif TOPOLOGY == "barrier":
            dist.barrier()
            dist.all_reduce(t)
        else:
            start = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - start)
    opt.step()
if times:
    with open(f"times-{rank}.json", "w") as f:
        json.dump(times, f)
dist.barrier()
dist.destroy_process_group()
