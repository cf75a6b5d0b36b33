"""Example 3 of pydftracer's user guide: a traced training loop.

The guide leaves ``train_loader`` to the reader; here it is a tiny synthetic
MNIST-shaped data set so the example runs anywhere. Everything else is the
guide's code with only the import line changed.

Run: ``DFTRACER_ENABLE=1 python examples/training_example.py``.
"""
import torch
import torch.nn as nn
from dftrace_dynamo import dftracer, dynamo

# Initialize logger
df_logger = dftracer.initialize_log("training.pfw", "/tmp/data", -1)

# Tiny synthetic stand-in for an MNIST loader: 2 batches of 4 images 1x28x28.
generator = torch.Generator().manual_seed(0)
train_loader = [(torch.randn(4, 1, 28, 28, generator=generator), torch.randint(0, 10, (4,), generator=generator))
                for _ in range(2)]


# Model definition
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


# Training setup
model = ConvNet()
optimizer = torch.optim.Adam(model.parameters())
criterion = nn.CrossEntropyLoss()

# Training loop
for epoch in range(5):
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()

        # Forward pass (traced by Dynamo)
        output = model(data)

        # Compute loss and backward
        loss = criterion(output, target)
        loss.backward()

        # Optimizer step
        optimizer.step()

df_logger.finalize()
