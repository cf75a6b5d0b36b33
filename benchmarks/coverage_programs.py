"""Step coverage with eager ops (issue 36's goal): training programs of different shapes, as users
write them (plain ``torch.compile``), tiny and with random weights, each run under
``dftrace-dynamo run --compile-all`` with ``DFTRACER_EAGER_OPS=1``; per program the steady steps'
wall time and the share ``summary`` leaves as ``other``, step and ``eval`` slice counts against the
program's own iterations and evaluations.

    python benchmarks/coverage_programs.py [NAME ...] [--iters 6] [--dir DIR]
    python benchmarks/coverage_programs.py --of RUN   # the same columns of another program's run

Programs: ``lstm`` (a word-level LSTM language model: an embedding compiled, a graph break, then
``nn.LSTM``, which Dynamo leaves eager, the loss outside the compiled model), ``dcgan`` (D then G
each iteration, ``netG(fixed_noise)`` sampled with grad after both optimizer steps every other
iteration), ``nanogpt`` (a small transformer, 2 micro-batches of gradient accumulation, evaluation
under ``no_grad`` at the top of every 3rd iteration), ``mnist`` (a CNN, a test pass after each of 2
epochs), ``vae`` (a variational auto-encoder, its loss outside), ``lbfgs``
(``LBFGS.step(closure)``). Each forward sleeps ``SLEEP_S`` in an eager module (a known time in a
known module). Run as ``coverage_programs.py --program NAME --truth FILE`` it is the program
itself (the runs' child), writing its marks (the trace's clock): ``iterations`` (start of each,
and the end of the last), ``evals`` and ``optimizer`` ((start, end) of each).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from dftrace_dynamo import _core  # the trace's clock: the marks compare with its events

SLEEP_S = 0.01
torch.manual_seed(0)


class Sleep(nn.Module):
    """Sleeps ``SLEEP_S`` in its forward: a known time in a known eager module."""

    @torch.compiler.disable
    def forward(self, x):
        time.sleep(SLEEP_S)
        return x


class Marks:
    def __init__(self):
        self.iterations, self.evals, self.optimizer = [], [], []

    def begin(self):
        self.iterations.append(_core.now_ns())

    def step(self, optimizer, closure=None):
        start = _core.now_ns()
        result = optimizer.step(closure) if closure else optimizer.step()
        self.optimizer.append((start, _core.now_ns()))
        return result

    def evaluate(self, fn):
        start = _core.now_ns()
        result = fn()
        self.evals.append((start, _core.now_ns()))
        return result


class LSTMLM(nn.Module):
    def __init__(self, vocab=50, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.sleep = Sleep()
        self.rnn = nn.LSTM(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        h = self.embed(x)
        print(end="")  # a graph break
        h = self.sleep(h)
        h, _ = self.rnn(h)
        return self.head(h)


def lstm(n, marks):
    model = LSTMLM()
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randint(0, 50, (n, 4, 9))
    for i in range(n):
        marks.begin()
        x, y = data[i, :, :-1], data[i, :, 1:]
        opt.zero_grad()
        logits = compiled(x)
        loss = F.cross_entropy(logits.reshape(-1, 50), y.reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        marks.step(opt)


class G(nn.Module):
    def __init__(self, nz=8):
        super().__init__()
        self.main = nn.Sequential(nn.ConvTranspose2d(nz, 8, 4, 1, 0), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.ConvTranspose2d(8, 1, 4, 2, 1), nn.Tanh())
        self.sleep = Sleep()

    def forward(self, z):
        return self.sleep(self.main(z))


class D(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Conv2d(1, 8, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(8, 1, 4, 1, 0),
                                  nn.Sigmoid())

    def forward(self, x):
        return self.main(x).view(-1)


def dcgan(n, marks):
    netG, netD = torch.compile(G()), torch.compile(D())
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    fixed_noise = torch.randn(4, 8, 1, 1)
    real = torch.rand(n, 4, 1, 8, 8) * 2 - 1
    criterion = nn.BCELoss()
    for i in range(n):
        marks.begin()
        netD.zero_grad()
        label = torch.full((4,), 1.0)
        errD_real = criterion(netD(real[i]), label)
        errD_real.backward()
        fake = netG(torch.randn(4, 8, 1, 1))
        label.fill_(0.0)
        errD_fake = criterion(netD(fake.detach()), label)
        errD_fake.backward()
        marks.step(optD)
        netG.zero_grad()
        label.fill_(1.0)
        errG = criterion(netD(fake), label)
        errG.backward()
        marks.step(optG)
        if i % 2 == 1:
            fake = netG(fixed_noise)  # with grad, as the example does: the iteration's own
            fake.detach().sum().item()


class Block(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=32, dim=16, ctx=8):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.Sequential(Block(dim), Block(dim))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
        self.sleep = Sleep()

    def forward(self, idx, targets=None):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        logits = self.head(self.ln(self.blocks(self.sleep(x))))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def nanogpt(n, marks, accumulation=2, every=3):
    model = GPT()
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 32, (4096,))

    def batch():
        ix = torch.randint(len(data) - 9, (4,))
        return torch.stack([data[i:i + 8] for i in ix]), torch.stack([data[i + 1:i + 9] for i in ix])

    @torch.no_grad()
    def estimate_loss():
        model.eval()
        losses = [compiled(*batch())[1].item() for _ in range(2)]
        model.train()
        return sum(losses)

    x, y = batch()
    for i in range(n):
        if i % every == 0:
            marks.evaluate(estimate_loss)
        marks.begin()
        for _ in range(accumulation):
            _, loss = compiled(x, y)
            x, y = batch()
            (loss / accumulation).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        marks.step(opt)
        opt.zero_grad(set_to_none=True)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 4, 3, 1), nn.Conv2d(4, 8, 3, 1)
        self.fc1, self.fc2 = nn.Linear(8 * 5 * 5, 16), nn.Linear(16, 10)
        self.sleep = Sleep()

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = self.sleep(torch.flatten(x, 1))
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def mnist(n, marks, epochs=2):
    from torch.utils.data import DataLoader, TensorDataset

    model = torch.compile(CNN())
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    train = DataLoader(TensorDataset(torch.randn(n * 4, 1, 14, 14), torch.randint(0, 10, (n * 4,))), batch_size=4)
    test = DataLoader(TensorDataset(torch.randn(8, 1, 14, 14), torch.randint(0, 10, (8,))), batch_size=4)

    def test_pass():
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in test:
                correct += model(x).argmax(dim=1).eq(y).sum().item()
        return correct

    for _ in range(epochs):
        model.train()
        for x, y in train:
            marks.begin()
            opt.zero_grad()
            loss = F.nll_loss(model(x), y)
            loss.backward()
            marks.step(opt)
        marks.evaluate(test_pass)


class VAE(nn.Module):
    def __init__(self, dim=64, hidden=16, z=4):
        super().__init__()
        self.fc1, self.fc21, self.fc22 = nn.Linear(dim, hidden), nn.Linear(hidden, z), nn.Linear(hidden, z)
        self.fc3, self.fc4 = nn.Linear(z, hidden), nn.Linear(hidden, dim)
        self.sleep = Sleep()

    def forward(self, x):
        h = F.relu(self.fc1(x))
        mu, logvar = self.fc21(h), self.fc22(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return torch.sigmoid(self.fc4(F.relu(self.fc3(self.sleep(z))))), mu, logvar


def vae(n, marks):
    model = torch.compile(VAE())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.rand(n, 4, 64)
    for i in range(n):
        marks.begin()
        opt.zero_grad()
        recon, mu, logvar = model(data[i])
        loss = F.binary_cross_entropy(recon, data[i], reduction="sum")
        loss = loss - 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        loss.backward()
        marks.step(opt)


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.sleep = nn.Linear(8, 8), nn.Linear(8, 1), Sleep()

    def forward(self, x):
        return self.fc2(self.sleep(torch.tanh(self.fc1(x))))


def lbfgs(n, marks):
    model = torch.compile(Regressor())
    opt = torch.optim.LBFGS(model.parameters(), max_iter=3)
    x, y = torch.randn(16, 8), torch.randn(16, 1)

    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    for _ in range(n):
        marks.begin()
        marks.step(opt, closure)


PROGRAMS = {f.__name__: f for f in (lstm, dcgan, nanogpt, mnist, vae, lbfgs)}


def program(name, iters, truth):
    torch.set_num_threads(1)
    marks = Marks()
    PROGRAMS[name](iters, marks)
    marks.iterations.append(_core.now_ns())
    with open(truth, "w") as f:
        json.dump({"iterations": marks.iterations, "evals": marks.evals, "optimizer": marks.optimizer}, f)


def measure(name, iters, directory):
    """One traced run of the program and its ``summary``: a row of the results table."""
    out, truth = os.path.join(directory, name), os.path.join(directory, f"{name}.json")
    env = {**os.environ, "DFTRACER_EAGER_OPS": "1", "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "dftrace_dynamo"]
    subprocess.run([*cli, "run", "--out", out, "--compile-all", os.path.abspath(__file__), "--program", name,
                    "--iters", str(iters), "--truth", truth], env=env, check=True, capture_output=True)
    doc = json.loads(subprocess.run([*cli, "summary", "--format", "json", out], env=env, check=True,
                                    capture_output=True, text=True).stdout)
    with open(truth) as f:
        marks = json.load(f)
    evals, *times = coverage(doc)
    return (name, len(doc["steps"]["rows"]), len(marks["iterations"]) - 1, evals, len(marks["evals"]), *times)


def coverage(doc):
    """Of a ``summary --format json`` document: the ``eval`` slices, the steady steps' mean wall
    time (ms), their mean ``gc``, ``trainer`` and ``other`` over their mean wall time and the median step's
    ``other`` share (%: a step that a loaded machine's scheduler paused is ``other`` far beyond the
    rest)."""
    steady = doc["steps"]["steady"]
    rows = [r for r in doc["steps"]["rows"] if r["recorded"] and not r["warmup"]]
    shares = sorted(100 * r["other_us"] / r["wall_us"] for r in rows if r["wall_us"])
    return ((doc.get("evaluation") or {}).get("count", 0), steady["mean_us"] / 1e3,
            *(100 * steady[f"{part}_mean_us"] / steady["mean_us"] for part in ("gc", "trainer", "other")),
            shares[len(shares) // 2] if shares else float("nan"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help=f"programs to run (default: all of {', '.join(PROGRAMS)})")
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--dir", default=None)
    p.add_argument("--of", metavar="RUN", help="only print the steps, eval slices, steady step ms, gc %%, trainer %%, other %% and "
                   "median other %% of the traces of RUN (a directory or file of another program's run)")
    p.add_argument("--program", choices=sorted(PROGRAMS), help=argparse.SUPPRESS)
    p.add_argument("--truth", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.program:
        return program(args.program, args.iters, args.truth)
    if args.of:
        cli = [sys.executable, "-m", "dftrace_dynamo", "summary", "--format", "json", args.of]
        doc = json.loads(subprocess.run(cli, check=True, capture_output=True, text=True).stdout)
        evals, *times = coverage(doc)
        return print("steps {} evals {} steady step ms {:.1f} gc % {:.1f} trainer % {:.1f} other % {:.1f} "
                     "median other % {:.1f}".format(len(doc["steps"]["rows"]), evals, *times))
    if set(args.names) - set(PROGRAMS):
        p.error(f"unknown program: {', '.join(sorted(set(args.names) - set(PROGRAMS)))}")
    directory = args.dir or tempfile.mkdtemp(prefix="coverage-")
    rule = "=========  =====  ==========  =====  ===========  ==============  ====  =========  =======  ==============="
    print(f"{rule}\nprogram    steps  iterations  evals  evaluations  steady step ms  gc %  trainer %  other %  "
          f"median other %\n{rule}")
    for name in args.names or PROGRAMS:
        row = measure(name, args.iters, directory)
        print("{:<9}  {:>5}  {:>10}  {:>5}  {:>11}  {:>14.1f}  {:>4.1f}  {:>9.1f}  {:>7.1f}  {:>15.1f}".format(*row),
              flush=True)
    print(rule)
    print(f"load average {os.getloadavg()[0]:.1f}; traces under {directory}")


if __name__ == "__main__":
    main()
