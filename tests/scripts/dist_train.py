"""A tiny torchrun job for tests/test_distributed.py: DDP steps, eager collectives, functional
collectives in a compiled graph, a recompile on one rank, a large tensor in one step, an
evaluation of EVAL_MS on rank 0 that the others wait for at a barrier, or (EVAL_ALL) in their
own evaluation (with MARK, steps marked with step()), a pipeline of one stage per rank, or FSDP2
(MODE), with rank DELAY_RANK sleeping DELAY_MS a step (in ddp and fsdp, the time each sleep
really took goes to the JSON file SLEPT: on busy cores a sleep ends late). With LAZY, the trace
opens at the first compile, not at the start.

With SCENARIOS (a JSON list of {variable: value}, each with ``out``), the job runs them one
after another, each traced into ``<out>/run/job`` (none LAZY; SLEPT is ``<out>/slept.json``), as
jobs of their own would (the ranks start, import torch and join the group once)."""
import json
import os
import time

import torch
import torch.distributed as dist

import dftrace_dynamo
from dftrace_dynamo import step
from pipeline import iteration as pipeline_iteration

SCENARIOS = json.loads(os.environ.get("SCENARIOS", "[{}]"))
OWN_ENV = {key for scenario in SCENARIOS for key in scenario}


def prefix(scenario):
    return os.path.join(scenario["out"], "run", "job") if "out" in scenario else None


if not os.environ.get("LAZY"):  # else the trace opens at the first compile (DFTRACER_ENABLE=1)
    dftrace_dynamo.initialize_log(prefix(SCENARIOS[0]))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


def train():
    """The job of the settings in the environment."""
    MODE, STEPS = os.environ.get("MODE", "ddp"), int(os.environ.get("STEPS", "8"))
    DELAY = float(os.environ.get("DELAY_MS", "0")) / 1e3
    torch.manual_seed(0)
    slept = []

    def delay():
        """Rank DELAY_RANK (default 1) sleeps DELAY; the time it took is kept in ``slept``."""
        if rank == int(os.environ.get("DELAY_RANK", "1")) and DELAY:
            start = time.perf_counter()
            time.sleep(DELAY)
            slept.append(time.perf_counter() - start)

    if MODE == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))  # one bucket: 68 floats
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(STEPS):
            delay()
            loss = model(torch.randn(8, 16)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    elif MODE == "eval":  # rank 0 evaluates every 4th step, then every rank meets at a barrier
        net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        model = torch.compile(net, backend="dftrace")
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        for i in range(STEPS):
            opt.zero_grad()
            loss = model(torch.randn(8, 16)).sum()
            loss.backward()
            dist.all_reduce(loss.detach())
            opt.step()
            if os.environ.get("MARK"):  # steps marked at the end of each iteration
                step()
            if i % 4 == 3:
                if rank == 0 or os.environ.get("EVAL_ALL"):  # with EVAL_ALL the others evaluate at once
                    with torch.no_grad():
                        for _ in range(3):
                            model(torch.randn(8, 16))
                            time.sleep(float(os.environ["EVAL_MS"]) / 3e3 if rank == 0 else 0)
                        if os.environ.get("EVAL_ALL"):
                            dist.all_reduce(torch.ones(1))  # a metric: the others wait here, evaluating
                dist.barrier()
    elif MODE == "eager":
        for _ in range(STEPS):
            dist.all_reduce(torch.ones(1000))  # 4000 bytes
            dist.broadcast(torch.zeros(10, dtype=torch.float64), src=0)  # 80
            dist.all_gather([torch.empty(5, dtype=torch.int32) for _ in range(world)],
                            torch.full((5,), rank, dtype=torch.int32))  # 20
            dist.all_reduce(torch.ones(256), async_op=True).wait()  # 1024, async
            step()
    elif MODE == "recompile":
        fn = torch.compile(lambda x: (x * 2).sum(), backend="dftrace", dynamic=False)
        for i in range(STEPS):
            fn(torch.ones(8 if rank == 0 or i < 3 else 16))  # rank 1 recompiles at step 3
            step()
    elif MODE == "functional":
        import torch.distributed._functional_collectives as funcol

        fn = torch.compile(lambda x: funcol.all_reduce(x * 2, "sum", dist.group.WORLD) + 1, backend="dftrace")
        for _ in range(STEPS):
            fn(torch.ones(10))  # all_reduce and its wait_tensor in the graph, 40 bytes
            step()
    elif MODE == "pipeline":  # rank r is stage r of a chain: activations forward, gradients back
        stage = torch.compile(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()), backend="dftrace")
        opt = torch.optim.SGD(stage.parameters(), lr=0.01)

        def p2p(send, tensor, peer):  # dist.send/recv, or (BATCH) batch_isend_irecv as pipelines issue them
            if os.environ.get("BATCH"):
                for work in dist.batch_isend_irecv([dist.P2POp(dist.isend if send else dist.irecv, tensor, peer)]):
                    work.wait()
            else:
                (dist.send if send else dist.recv)(tensor, peer)

        for _ in range(STEPS):
            opt.zero_grad()
            pipeline_iteration(stage, torch.randn(8, 16), rank, world, p2p,
                               lambda: time.sleep(DELAY) if rank == int(os.environ.get("DELAY_RANK", "0")) else None)
            opt.step()
    elif MODE == "fsdp":  # FSDP2: each Linear and the model sharded, compiled (Dynamo skips FSDP's hooks,
        # and hands the backend no graph of the model: the activation between the Linears is compiled
        # on its own, the first graph call, after the first all-gather)
        from torch.distributed.fsdp import fully_shard

        class Act(torch.nn.Module):
            def forward(self, x):
                return torch.relu(x) * 2

        net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.compile(Act(), backend="dftrace"), torch.nn.Linear(32, 4))
        for layer in (net[0], net[2], net):
            fully_shard(layer)
        model = torch.compile(net, backend="dftrace")
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        for _ in range(STEPS):
            delay()
            model(torch.randn(8, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
    elif MODE == "memory":
        for i in range(STEPS):
            if i == 3:
                big = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, touched, freed in the step
                del big
            step()
    if slept and os.environ.get("SLEPT"):
        with open(os.environ["SLEPT"], "w") as f:
            json.dump(slept, f)
    dist.barrier()


for scenario in SCENARIOS:
    for key in OWN_ENV:
        os.environ.pop(key, None)
    os.environ.update({key: str(value) for key, value in scenario.items() if key != "out"})
    if "out" in scenario:
        os.environ["SLEPT"] = os.path.join(scenario["out"], "slept.json")
    if len(SCENARIOS) > 1:
        torch._dynamo.reset()
        dftrace_dynamo.initialize_log(prefix(scenario))  # (the first one is open already)
    train()
    if len(SCENARIOS) > 1:
        dftrace_dynamo.finalize()
dist.destroy_process_group()
