"""A DataLoader whose dataset raises on some items, caught by the loop, for 2 epochs; each
``__getitem__`` is a region in its worker's trace, and appends its item to
``PREFIX.items.<pid>`` (the ground truth).

    python dataloader_raises.py PREFIX {before,after}   (import torch.utils.data before/after initialize_log)
"""
import os
import sys

from dftrace_dynamo import dftracer, region

if sys.argv[2] == "before":
    import torch.utils.data  # noqa: F401
dftracer.initialize_log(sys.argv[1])
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402


class Flaky(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        with region("getitem", cat="dataset", i=i):
            with open(f"{sys.argv[1]}.items.{os.getpid()}", "a") as f:  # what the worker really did
                f.write(f"{i}\n")
            if i % 10 == 7:
                raise ValueError(f"bad item {i}")
            return torch.full((2,), float(i))


loader = DataLoader(Flaky(), batch_size=2, num_workers=2)
for epoch in range(2):
    try:
        for batch in loader:
            pass
    except ValueError as exc:
        print("epoch", epoch, "stopped:", exc, flush=True)
