"""Example 2 of pydftracer's user guide: DFTracer as a ``torch.compile`` backend.

Run: ``DFTRACER_ENABLE=1 python examples/backend_example.py``.
"""
import torch
from dftrace_dynamo import dftracer, dftracer_dynamo_backend

# Initialize logger
df_logger = dftracer.initialize_log("dynamo_trace.pfw", "/tmp/data", -1)


# Define your model
class MyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(784, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 10)
        )

    def forward(self, x):
        return self.layers(x)


# Compile with DFTracer backend
model = MyModel()
compiled_model = torch.compile(model, backend=dftracer_dynamo_backend)

# Run inference
input_tensor = torch.randn(32, 784)
output = compiled_model(input_tensor)

df_logger.finalize()
