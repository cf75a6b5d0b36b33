"""A training loop that does what real programs do around eager ops, for tests/test_eager_robust.py.

``python eager_robust.py OUT.json [--trace PREFIX]``: a compiled model with a graph break and an
eager ``nn.LSTM``, a loss module outside it, batches from a DataLoader with two worker
processes, a second thread calling the models while the loop runs, an exception raised inside a
nested eager module's forward (caught by the loop), ``torch._dynamo.reset()`` halfway (the model
compiled again) and an ``os.fork()`` child that runs the models. Writes the losses, the final
parameters' sums, what the child and the thread computed, and the exception's iteration.

Dynamo is not thread-safe: a frame looked up on one thread while another compiles or resets
crashes the process with SIGSEGV (in ``lookup``, its cache list or a guard check), untraced as
well (1 of 11 runs without the tracer, 3 of 29 with it, on a loaded machine). So the two threads
never run compiled models at once (``dynamo``); all else (loss, backward, the optimizer, eager
module calls) runs concurrently with the other thread's calls and compiles.
"""

import argparse
import json
import os
import threading

import torch
import torch.nn as nn

ITERS = 6
RAISE_AT = 2  # the iteration whose forward raises inside model.main.inner
RESET_AT = 3  # torch._dynamo.reset() before this iteration


FAIL = [False]


@torch._dynamo.disable
def check():
    if FAIL[0] and threading.current_thread() is threading.main_thread():
        raise ValueError("broken batch")


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        check()  # a graph break: eager code inside the compiled model
        return self.fc(x).tanh()


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.lstm, self.out = Inner(), nn.LSTM(8, 8), nn.Linear(8, 1)

    def forward(self, x):
        x = self.inner(x)
        torch._dynamo.graph_break()
        y, _ = self.lstm(x)  # eager: Dynamo skips LSTM
        return self.out(y)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = Block()

    def forward(self, x):
        return self.main(x)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return ITERS

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(5, 8, generator=g), torch.randn(5, 1, generator=g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--trace")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    backend = "eager"
    if args.trace:
        from dftrace_dynamo import dftracer
        from dftrace_dynamo.backend import tracer  # noqa: F401  (registers the backend)

        dftracer.initialize_log(args.trace, None, -1)
        backend = "dftrace"
    model = Model()
    compiled = torch.compile(model, backend=backend)
    criterion = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Data(), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    probe = torch.randn(5, 8, generator=torch.Generator().manual_seed(99))
    stop, seen, dynamo = threading.Event(), [], threading.Lock()

    def other_thread():
        while not stop.is_set():
            with torch.no_grad():
                with dynamo:
                    out = compiled(probe)
                seen.append(out.shape[0] + model(probe).shape[0])

    thread = threading.Thread(target=other_thread)
    thread.start()
    losses, failed_at = [], None
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        FAIL[0] = i == RAISE_AT
        try:
            with dynamo:
                if i == RESET_AT:
                    torch._dynamo.reset()
                    compiled = torch.compile(model, backend=backend)
                out = compiled(x)
            loss = criterion(out, y)
        except ValueError:
            failed_at = i
            FAIL[0] = False
            continue
        loss.backward()
        opt.step()
        losses.append(loss.item())
    stop.set()
    thread.join()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child runs the models and reports
        with torch.no_grad():
            value = float(compiled(probe).sum() + model(probe).sum())
        os.write(write, json.dumps(value).encode())
        os._exit(0)
    os.close(write)
    child = json.loads(os.read(read, 1000).decode())
    _, status = os.waitpid(pid, 0)
    with torch.no_grad():
        expected = float(compiled(probe).sum() + model(probe).sum())
    if args.trace:
        dftracer.finalize()
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "params": [float(p.detach().sum()) for p in model.parameters()],
                   "child": child, "child_status": status, "expected_child": expected,
                   "thread_calls": len(seen), "thread_ok": all(s == 10 for s in seen), "failed_at": failed_at}, f)


if __name__ == "__main__":
    main()
