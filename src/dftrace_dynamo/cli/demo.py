"""``dftrace-dynamo demo``: train a small built-in CNN a few steps with ATen-level
tracing, write the trace, summarise it and say how to open it in Perfetto."""

import os
import sys
import time

DEFAULT_OUT = "dftrace-demo"


def register(subparsers):
    p = subparsers.add_parser(
        "demo", help="trace a few training steps of a small built-in CNN and summarise them",
        description="Trains a small CNN on random data (nothing is downloaded) for a few steps, "
                    "compiled with torch.compile(backend=create_backend(level='aten')), so every "
                    "ATen op of forward and backward is one event. Writes the trace under DIR, "
                    "prints its summary and how to open it in Perfetto.")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"directory for the trace (default ./{DEFAULT_OUT})")
    p.add_argument("--steps", type=int, default=5, metavar="N", help="training steps (default 5)")
    p.set_defaults(func=run)


def _train(out, steps):
    """Returns the trace path."""
    import torch
    from torch import nn

    from dftrace_dynamo import create_backend, dftracer

    class SmallCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 16, 3, padding=1)
            self.fc = nn.Linear(16 * 7 * 7, 10)

        def forward(self, x):
            x = nn.functional.max_pool2d(nn.functional.relu(self.conv1(x)), 2)
            x = nn.functional.max_pool2d(nn.functional.relu(self.conv2(x)), 2)
            return self.fc(x.flatten(1))

    torch.manual_seed(0)
    model = SmallCNN()
    images, labels = torch.randn(steps, 16, 1, 28, 28), torch.randint(0, 10, (steps, 16))
    log = dftracer.initialize_log(os.path.join(out, "demo"))
    backend = create_backend(name="demo-cnn", epoch=0, level="aten")
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        backend.update(step=step)
        loss = nn.functional.cross_entropy(compiled(images[step]), labels[step])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}")
    info = log.finalize()
    return info["path"] if info else None


def run(args):
    from dftrace_dynamo.session import logger
    from dftrace_dynamo.traces import report
    from dftrace_dynamo.traces.reader import TraceError
    from dftrace_dynamo.traces.summary import summarize

    if args.steps < 1:
        raise TraceError("--steps must be at least 1")
    os.environ["DFTRACER_ENABLE"] = "1"  # the demo always traces, whatever the shell says
    logger.make_dirs(args.out)
    start = time.perf_counter()
    path = _train(args.out, args.steps)
    if path is None:
        raise TraceError("no trace was written (see the message above)")
    print(f"traced {args.steps} training steps in {time.perf_counter() - start:.1f} s\n")
    result = summarize([path], ("op", "module", "phase"), top=8)
    sys.stdout.write(report.to_table(result))
    path = os.path.abspath(path)
    print(f"""
Trace: {path}

Open it in Perfetto: go to https://ui.perfetto.dev, click "Open trace file" in the
left menu and pick the file above (the .pfw.gz loads as it is; nothing is uploaded,
Perfetto runs in the browser). Each training step is a "step N" slice holding its
"graph N forward" slice, its "backward" slice (with "graph N backward" inside) and its
optimizer slice; ops sit in the slices of the modules that issued them (conv1, fc...).
Click an op to see its module, node, phase and step in the details panel.

More: dftrace-dynamo summary {path} --plot ops.png
      dftrace-dynamo validate {path}""")
    return 0
