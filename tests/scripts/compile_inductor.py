"""An unmodified inference script for ``dftrace-dynamo run --level inductor``: it compiles
with plain Inductor (default backend), then once more with Inductor's C++ wrapper, and
prints whether both outputs equal the eager ones."""

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
x = torch.randn(4, 16)
with torch.no_grad():
    want = model(x)
    first = torch.compile(model)(x)
    torch._dynamo.reset()
    second = torch.compile(model, options={"cpp_wrapper": True})(x)
print("close", torch.allclose(first, want, atol=1e-6) and torch.allclose(second, want, atol=1e-6))
