"""A small compiled training loop for tests/test_flight.py, traced in flight mode by its
environment. STEPS steps; at step SLOW_STEP it sleeps SLEEP_S in nap() (between the forward and
the backward); at DUMP_AT it calls dftrace_dynamo.dump(DUMP_REASON) (comma-separated steps); at
SIGNAL_AT it sends itself SIGUSR2; at RAISE_AT it raises ValueError("boom at step N"). MARKS:
a file where each step's (number, start, end) wall-clock marks are written (ns), as "steps", with
the wall-clock steps seen (wallclock.py)."""
import json
import os
import signal
import time

import torch

import dftrace_dynamo
import wallclock


def env_steps(name):
    return {int(s) for s in os.environ.get(name, "").split(",") if s}


def nap(seconds):
    time.sleep(seconds)


STEPS = int(os.environ.get("STEPS", "40"))
SLOW, SLEEP = env_steps("SLOW_STEP"), float(os.environ.get("SLEEP_S", "0.5"))
DUMPS, SIGNALS, RAISE = env_steps("DUMP_AT"), env_steps("SIGNAL_AT"), env_steps("RAISE_AT")
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
model = torch.compile(net, backend="dftrace")
opt = torch.optim.SGD(net.parameters(), lr=0.01)
x = torch.randn(8, 16)
marks, watch = [], wallclock.Watch()
for i in range(STEPS):
    start = time.time_ns()
    opt.zero_grad()
    loss = model(x).sum()
    if i in SLOW:
        nap(SLEEP)
    loss.backward()
    opt.step()
    if i in DUMPS:
        print("dump:", dftrace_dynamo.dump(os.environ.get("DUMP_REASON", "asked")), flush=True)
    if i in SIGNALS:
        os.kill(os.getpid(), signal.SIGUSR2)
    if i in RAISE:
        raise ValueError(f"boom at step {i}")
    time.sleep(0.005)
    marks.append((i, start, time.time_ns()))
    watch()
if os.environ.get("MARKS"):
    with open(os.environ["MARKS"], "w") as f:
        json.dump({"steps": marks, "wall_steps": watch.steps}, f)
