"""The training loop of pydftracer's user guide (ConvNet with ``@dynamo.compile``, Adam,
CrossEntropyLoss) on a synthetic DataLoader, for the step tests.

    python steps_train.py [--out PREFIX] [--steps N] [--workers W]
"""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from dftrace_dynamo import dftracer, dynamo


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    @dynamo.compile
    def forward(self, x):
        x = self.conv1(x)
        x = torch.nn.functional.relu(x)
        x = self.conv2(x)
        x = torch.nn.functional.relu(x)
        x = torch.nn.functional.max_pool2d(x, 2)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = torch.nn.functional.relu(x)
        x = self.fc2(x)
        return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0)
    a = ap.parse_args()
    df_logger = dftracer.initialize_log(a.out, None, -1)
    torch.manual_seed(0)
    batch = 2
    data = TensorDataset(torch.randn(a.steps * batch, 1, 28, 28), torch.randint(0, 10, (a.steps * batch,)))
    train_loader = DataLoader(data, batch_size=batch, num_workers=a.workers)
    model = ConvNet()
    optimizer = torch.optim.Adam(model.parameters())
    criterion = nn.CrossEntropyLoss()
    for data, target in train_loader:
        optimizer.zero_grad()
        output = model(data)
        loss = criterion(output, target)
        loss.backward()
        optimizer.step()
    print("trained", flush=True)
    df_logger.finalize()


if __name__ == "__main__":
    main()
