"""A 2-process torchrun job (gloo, CPU, DDP): one trace per rank, named by rank, each
loading in Perfetto with every rank's forward and backward events."""

import os
import textwrap

import perfetto_tp
from backend_support import run_torchrun
from tracefile import read_events, traces

SCRIPT = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from dftrace_dynamo import Dynamo


    class Net(torch.nn.Module):  # user code: Dynamo compiles its frame under DDP's
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(8, 16)
            self.fc2 = torch.nn.Linear(16, 2)

        def forward(self, x):
            return self.fc2(self.fc1(x).relu())

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(Net())
    tracer = Dynamo(name="ddp", epoch=0, step=0)
    compiled = tracer.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        tracer.update(step=step)
        opt.zero_grad()
        compiled(torch.randn(4, 8) + rank).sum().backward()
        opt.step()
    weights = [p.detach().clone() for p in model.parameters()]
    gathered = [None, None]
    dist.all_gather_object(gathered, [w.sum().item() for w in weights])
    assert gathered[0] == gathered[1], gathered  # DDP kept the replicas in sync
    dist.barrier()  # no rank tears its connections down while the other is still gathering
    dist.destroy_process_group()
"""


def test_torchrun_two_ranks_write_one_trace_each(tmp_path):
    script = tmp_path / "train_ddp.py"
    script.write_text(textwrap.dedent(SCRIPT))
    run_torchrun(script, tmp_path, tmp_path / "ddp")
    files = traces(tmp_path, "ddp-*.pfw*")
    assert len(files) == 2
    for rank, path in enumerate(files):
        assert os.path.basename(path).startswith(f"ddp-rank{rank}-train_ddp-")
        events = read_events(path)
        graph_events = [e for e in events if e.get("cat") == "dynamo_graph"]
        phases = [e["args"]["phase"] for e in graph_events]
        assert phases.count("forward") == 3 and phases.count("backward") == 3
        assert sorted({e["args"]["step"] for e in graph_events}) == [0, 1, 2]
        op_count = len([e for e in events if e.get("cat") == "dynamo"])
        assert op_count > 0
        assert perfetto_tp.error_stats(path) == []
        loaded = perfetto_tp.rows(path, "select count(*) n from slice where category = 'dynamo'")
        assert loaded == [{"n": op_count}]
