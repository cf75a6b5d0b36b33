"""Worker processes that recorded nothing leave no trace file; those that recorded something keep theirs."""

import textwrap

from subproc import run_python
from tracefile import read_events, traces

SCRIPT = """
    import os
    import time

    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from dftrace_dynamo import dftracer, region


    class Traced(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            with region("item", i=i):
                return i


    def settle(worker_id):
        time.sleep(0.3)  # workers live an epoch: long enough for memory samples (every 0.1 s)


    if __name__ == "__main__":
        dftracer.initialize_log("trace")
        data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
        model = torch.compile(torch.nn.Linear(4, 1), backend="dftrace")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):  # 2 workers x 2 epochs: 4 processes that record nothing
            for x, y in DataLoader(data, batch_size=4, num_workers=2, worker_init_fn=settle):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
        assert sorted(int(i) for i in DataLoader(Traced(), num_workers=2)) == [0, 1, 2, 3]
        print("main pid", os.getpid())
"""

# what a file holds whatever the process did: its header, start and end, memory samples
BOOKKEEPING = {"dftracer", "memory"}


def test_dataloader_workers_that_recorded_nothing_leave_no_file(tmp_path):
    (tmp_path / "main.py").write_text(textwrap.dedent(SCRIPT))
    main_pid = int(run_python(["main.py"], tmp_path, timeout=300).stdout.split("main pid")[1])
    files = [read_events(path) for path in traces(tmp_path)]
    workers = [events for events in files if events[0]["pid"] != main_pid]
    own = [[e for e in events if e.get("cat") not in BOOKKEEPING] for events in workers]
    # the two workers of the traced dataset, each with its items; no file of the 4 others
    assert len(files) == 3 and len(own) == 2 and all(own), [len(events) for events in workers]
    items = sorted(e["args"]["i"] for events in own for e in events if e["name"] == "item")
    assert items == [0, 1, 2, 3]
