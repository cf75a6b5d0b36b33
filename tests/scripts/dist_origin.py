"""Topologies for the origin-of-a-wait tests (tests/test_origin.py): a torchrun job on gloo that
runs the scenarios of the JSON list SCENARIOS one after another, each traced into a run directory
of its own (``<out>/run/job``, Dynamo reset in between), as a job of its own would trace it (one
job for many scenarios: the ranks start, import torch and join the group once).

In a scenario (a dict: ``out``, ``topology``, ``late``, ``where``, ``sleep_ms``, optional
``steps`` (8), ``second``, ``recompile``, ``overlap_ms``) every rank runs a compiled model
``pre -> slow -> post`` (``slow`` holds a custom op that sleeps ``sleep_ms`` on rank ``late``,
so the delay is an op of module ``slow`` in forward; where=backward: in the backward of ``slow``),
or (where=data) a DataLoader whose batches take ``sleep_ms`` on rank ``late``, or (where=eager) a
sleep of the training loop itself; with second=[rank, ms] a second rank is late by that much in
``slow``'s forward; with recompile=[rank, step] that rank's batch at that step is 3 rows (a
recompile of the model, which the others wait for). Then the ranks meet in ``topology``:

* ``gather``: ``gather(dst=0)`` then ``all_reduce`` (the root waits for the late rank in the gather,
  so it arrives last at the all_reduce);
* ``chain``: a pipeline, stage r receives from r - 1 and sends to r + 1, the gradients back;
* ``reduce_scatter``: ``reduce_scatter_tensor`` then ``all_gather_into_tensor``;
* ``async``: an ``all_reduce(async_op=True)``, ``overlap_ms`` of work (not on rank ``late``), then
  its ``wait()``;
* ``scatter``: ``scatter(src=0)`` then ``all_reduce``;
* ``broadcast``: ``broadcast(src=late)`` (the root late), then ``all_reduce``;
* ``all_to_all``: ``all_to_all_single`` then ``all_reduce``;
* ``barrier``: ``barrier()`` then ``all_reduce``;
* ``all_reduce``: one ``all_reduce`` (each rank writes the seconds it spent in it per step to
  ``<out>/times-<rank>.json``)."""
import json
import os
import time

import torch
import torch.distributed as dist

import pipeline

import dftrace_dynamo

SCENARIOS = json.loads(os.environ["SCENARIOS"])
dftrace_dynamo.initialize_log(os.path.join(SCENARIOS[0]["out"], "run", "job"))  # before the group, like a plain job
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


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
    def __init__(self, seconds):
        self.seconds = seconds

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return torch.randn(16)


def p2p(send, tensor, peer):
    (dist.send if send else dist.recv)(tensor, peer)


def scenario(out, topology, late, where, sleep_ms, steps=8, second=(-1, 0), recompile=(-1, -1), overlap_ms=0):
    sleep = sleep_ms / 1e3
    torch._dynamo.reset()
    dftrace_dynamo.initialize_log(os.path.join(out, "run", "job"))  # the first one is open already
    torch.manual_seed(0)
    net = torch.nn.Sequential()
    net.add_module("pre", torch.nn.Linear(16, 16))
    net.add_module("slow", Slow(sleep if where == "module" and rank == late else second[1] / 1e3
                                if rank == second[0] else 0.0, sleep if where == "backward" and rank == late else 0.0))
    net.add_module("post", torch.nn.Linear(16, 16))
    model = torch.compile(net, backend="dftrace")
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    batches = iter(torch.utils.data.DataLoader(Data(sleep if where == "data" and rank == late else 0.0),
                                               batch_size=1))
    times = []
    for i in range(steps):
        x = next(batches)
        if [rank, i] == list(recompile):
            x = torch.cat([x, next(batches), next(batches)])
        opt.zero_grad()
        if where == "eager" and rank == late:
            time.sleep(sleep)
        if topology == "chain":
            pipeline.iteration(model, torch.empty(1, 16) if rank > 0 else x, rank, world, p2p)
        else:
            loss = model(x).sum()
            loss.backward()
            t = torch.ones(world * 4) * rank
            if topology == "gather":
                dist.gather(t, [torch.empty_like(t) for _ in range(world)] if rank == 0 else None, dst=0)
                dist.all_reduce(t)
            elif topology == "reduce_scatter":
                out_t = torch.empty(4)
                dist.reduce_scatter_tensor(out_t, t)
                dist.all_gather_into_tensor(torch.empty(world * 4), out_t)
            elif topology == "async":  # the all_reduce in flight while the others work overlap_ms
                work = dist.all_reduce(t, async_op=True)
                if rank != late:
                    time.sleep(overlap_ms / 1e3)
                work.wait()
            elif topology == "scatter":
                dist.scatter(t, list(torch.ones(world * 4).repeat(world, 1).unbind()) if rank == 0 else None, src=0)
                dist.all_reduce(t)
            elif topology == "broadcast":
                dist.broadcast(t, src=late)
                dist.all_reduce(t)
            elif topology == "all_to_all":
                dist.all_to_all_single(torch.empty_like(t), t)
                dist.all_reduce(t)
            elif topology == "barrier":
                dist.barrier()
                dist.all_reduce(t)
            else:
                start = time.perf_counter()
                dist.all_reduce(t)
                times.append(time.perf_counter() - start)
        opt.step()
    if times:
        with open(os.path.join(out, f"times-{rank}.json"), "w") as f:
            json.dump(times, f)
    dist.barrier()
    dftrace_dynamo.finalize()


for s in SCENARIOS:
    scenario(**s)
dist.destroy_process_group()
