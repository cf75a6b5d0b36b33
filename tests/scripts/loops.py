"""Training loops of common shapes, each timing its own iterations (the ground truth the step
tests compare the trace with).

    python loops.py SHAPE --out PREFIX --truth FILE.json [--iters N]

SHAPE: ``gan`` (D then G each step once per iteration), ``gan_sample`` (the same, G's samples
for D taken under ``no_grad`` before D's ``zero_grad()``), ``dcgan`` (PyTorch's DCGAN example:
each model's own ``zero_grad()``, G's samples taken with grad and detached for D's step, then
G's step through D), ``gan_loss_first`` (each loss computed before its optimizer's
``zero_grad()``), ``actor_critic`` (a rollout of the actor under ``no_grad``, the critic's step,
then the actor's through the critic, each loss before its ``zero_grad()``), ``untrained``
(a compiled backbone whose parameters require grad but no optimizer steps, then the trained head,
the loss before ``zero_grad()``), ``critic`` (5 critic steps per
generator step; an iteration is one generator step), ``validate`` (3 epochs of training, a
``no_grad`` validation pass after each), ``validate_eval_mode`` (the same, validating under
``model.eval()`` alone, grad enabled), ``validate_loss_fn`` (the same, through one compiled
function of the model and a loss module, which stays in training mode), ``frozen_norm``
(training a model kept in eval mode, as with frozen batch norm), ``distill`` (a frozen
teacher's forward under ``no_grad``, then the student's training), ``amp_skip`` (a
``GradScaler`` that skips the optimizer step of iterations 2 and 3: their loss overflows),
``skip_nonfinite`` (the loop itself skips the optimizer step of iterations 2 and 3, whose loss is
not finite), ``lbfgs`` (``LBFGS.step(closure)``, the closure calling ``zero_grad()`` and
``backward()`` several times inside the step),
``marked`` (``dftrace_dynamo.step()`` after ``optimizer.step()``), ``compiled_step`` (forward,
backward, ``optimizer.step()`` and ``zero_grad()`` in one compiled function: Dynamo traces the
optimizer's hooks), ``nanogpt`` (nanoGPT's loop: evaluation of the trained model at the top of
every ``--iters``-th iteration, ``zero_grad()`` at the end, no DataLoader), ``ema_eval`` (an
average of the model evaluated after each epoch, ``step(); zero_grad()`` on one line),
``replaced`` (fine-tuning phases, each with a new optimizer over the parameters of the last),
``sam`` (a SAM wrapper whose ``second_step`` steps the optimizer it wraps), ``region_load``
(``zero_grad()``, then the batch loaded inside a ``region``), ``region_fetch`` (the batch loaded
inside a ``region`` at the top of the body), ``accelerate`` (accelerate's
gradient accumulation, 4 batches per optimizer step; an iteration is one optimizer step). Each
iteration sleeps ``SLEEP_S`` so that its time is well above the noise
of a shared machine. The truth file holds ``iterations`` (start times, ns, of each iteration
and the end of the last one; for ``marked``, the time of each mark instead) and, for
``validate``, ``nanogpt`` and ``ema_eval``, ``evals`` ((start, end) of each validation pass), and
``wall_steps``: the machine's wall clock stepped during the run (tests/scripts/wallclock.py), which
the trace follows and these monotonic marks do not.
"""
import argparse
import contextlib
import functools
import json
import time

import torch
import torch.nn as nn

import dftrace_dynamo
from dftrace_dynamo import create_backend, dftracer

SLEEP_S = 0.05  # a scheduler slice on busy cores (4-8 ms) is well within 15 % of an iteration


def mlp(width=16):
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))


def two_models():
    """A critic (discriminator) and a generator compiled with one backend, and an SGD for each."""
    backend = create_backend()
    c, g = torch.compile(mlp(), backend=backend), torch.compile(mlp(), backend=backend)
    return c, g, torch.optim.SGD(c.parameters(), lr=1e-3), torch.optim.SGD(g.parameters(), lr=1e-3)


def gan(n, marks):
    d, g, opt_d, opt_g = two_models()
    for _ in range(n):
        marks.append(time.monotonic_ns())
        real, z = torch.randn(8, 16), torch.randn(8, 16)
        opt_d.zero_grad()
        loss_d = d(real).mean() - d(g(z).detach()).mean()
        loss_d.backward()
        opt_d.step()
        time.sleep(SLEEP_S / 2)
        opt_g.zero_grad()
        loss_g = -d(g(z)).mean()
        loss_g.backward()
        opt_g.step()
        time.sleep(SLEEP_S / 2)


def gan_sample(n, marks):
    """The generator's samples for the critic under ``no_grad`` at the top of the iteration, before
    the critic's ``zero_grad()``, then the generator's own step."""
    d, g, opt_d, opt_g = two_models()
    for _ in range(n):
        marks.append(time.monotonic_ns())
        with torch.no_grad():
            fake = g(torch.randn(8, 16))
        opt_d.zero_grad()
        (d(torch.randn(8, 16)).mean() - d(fake).mean()).backward()
        opt_d.step()
        time.sleep(SLEEP_S / 2)
        opt_g.zero_grad()
        (-d(g(torch.randn(8, 16))).mean()).backward()
        opt_g.step()
        time.sleep(SLEEP_S / 2)


def dcgan(n, marks):
    d, g, opt_d, opt_g = two_models()
    for _ in range(n):
        marks.append(time.monotonic_ns())
        d.zero_grad()
        d(torch.randn(8, 16)).mean().backward()
        fake = g(torch.randn(8, 16))
        (-d(fake.detach()).mean()).backward()
        opt_d.step()
        time.sleep(SLEEP_S / 2)
        g.zero_grad()
        d(fake).mean().backward()
        opt_g.step()
        time.sleep(SLEEP_S / 2)


def gan_loss_first(n, marks):
    d, g, opt_d, opt_g = two_models()
    for _ in range(n):
        marks.append(time.monotonic_ns())
        loss_d = d(torch.randn(8, 16)).mean() - d(g(torch.randn(8, 16)).detach()).mean()
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        time.sleep(SLEEP_S / 2)
        loss_g = -d(g(torch.randn(8, 16))).mean()
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
        time.sleep(SLEEP_S / 2)


def actor_critic(n, marks):
    critic, actor, opt_c, opt_a = two_models()
    for _ in range(n):
        marks.append(time.monotonic_ns())
        with torch.no_grad():
            state = actor(torch.randn(8, 16)).tanh()
        loss_c = critic(state).pow(2).mean()
        opt_c.zero_grad()
        loss_c.backward()
        opt_c.step()
        time.sleep(SLEEP_S / 2)
        loss_a = -critic(actor(state)).mean()
        opt_a.zero_grad()
        loss_a.backward()
        opt_a.step()
        time.sleep(SLEEP_S / 2)


def untrained(n, marks):
    backend = create_backend()
    backbone, head = torch.compile(mlp(), backend=backend), torch.compile(nn.Linear(16, 1), backend=backend)
    opt = torch.optim.SGD(head.parameters(), lr=1e-3)
    for _ in range(n):
        marks.append(time.monotonic_ns())
        loss = head(backbone(torch.randn(8, 16))).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(SLEEP_S)


def critic(n, marks):
    c, g, opt_c, opt_g = two_models()
    for _ in range(n):
        marks.append(time.monotonic_ns())
        for _ in range(5):
            opt_c.zero_grad()
            with torch.no_grad():
                fake = g(torch.randn(8, 16))
            (c(fake).mean() - c(torch.randn(8, 16)).mean()).backward()
            opt_c.step()
            time.sleep(SLEEP_S / 5)
        opt_g.zero_grad()
        (-c(g(torch.randn(8, 16))).mean()).backward()
        opt_g.step()


def validate(n, marks, evals, no_grad=True, loss_fn=False):
    from torch.utils.data import DataLoader, TensorDataset

    net = mlp()
    if loss_fn:
        compiled = torch.compile(lambda module, loss, x: loss(module(x), x), backend=create_backend())
        forward = functools.partial(compiled, net, nn.MSELoss())
    else:
        forward = torch.compile(net, backend=create_backend())
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    train = DataLoader(TensorDataset(torch.randn(8 * n, 16)), batch_size=8)
    val = DataLoader(TensorDataset(torch.randn(16, 16)), batch_size=8)
    for _ in range(3):
        net.train()
        for (x,) in train:
            marks.append(time.monotonic_ns())
            opt.zero_grad()
            forward(x).pow(2).mean().backward()
            opt.step()
            time.sleep(SLEEP_S)
        marks.append(time.monotonic_ns())  # the end of the epoch's last iteration
        net.eval()
        with torch.no_grad() if no_grad else contextlib.nullcontext():
            for (x,) in val:
                forward(x)
                time.sleep(5 * SLEEP_S)  # much longer than a training iteration
        evals.append((marks[-1], time.monotonic_ns()))


def frozen_norm(n, marks):
    model = torch.compile(nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1)),
                          backend=create_backend())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model.eval()  # batch norm statistics frozen; the weights train
    for _ in range(n):
        marks.append(time.monotonic_ns())
        opt.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
        time.sleep(SLEEP_S)


def distill(n, marks):
    backend = create_backend()
    teacher, student = torch.compile(mlp(), backend=backend), torch.compile(mlp(), backend=backend)
    teacher.eval()
    opt = torch.optim.SGD(student.parameters(), lr=1e-3)
    for _ in range(n):
        marks.append(time.monotonic_ns())
        x = torch.randn(8, 16)
        opt.zero_grad()
        with torch.no_grad():
            target = teacher(x)
            time.sleep(SLEEP_S)  # a teacher as slow as the rest of the iteration
        (student(x) - target).pow(2).mean().backward()
        opt.step()
        time.sleep(SLEEP_S)


def amp_skip(n, marks):
    model = torch.compile(mlp(), backend=create_backend())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    for i in range(n):
        marks.append(time.monotonic_ns())
        opt.zero_grad()
        loss = model(torch.randn(8, 16)).pow(2).mean()
        scaler.scale(loss * float("inf") if i in (2, 3) else loss).backward()
        scaler.step(opt)
        scaler.update()
        time.sleep(SLEEP_S)


def skip_nonfinite(n, marks):
    model = torch.compile(mlp(), backend=create_backend())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for i in range(n):
        marks.append(time.monotonic_ns())
        opt.zero_grad()
        loss = model(torch.randn(8, 16)).pow(2).mean() * (float("inf") if i in (2, 3) else 1.0)
        loss.backward()
        if torch.isfinite(loss):
            opt.step()
        time.sleep(SLEEP_S)


def lbfgs_closure():
    """A compiled mlp's LBFGS optimizer and the closure its ``step(closure)`` calls (forward and
    backward inside the optimizer's step)."""
    model = torch.compile(mlp(), backend=create_backend())
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    x, y = torch.randn(8, 16), torch.randn(8, 16)

    def closure():
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        return loss

    return opt, closure


def lbfgs(n, marks):
    opt, closure = lbfgs_closure()
    for _ in range(n):
        marks.append(time.monotonic_ns())
        opt.step(closure)
        time.sleep(SLEEP_S)


def marked(n, marks):
    model = torch.compile(mlp(), backend=create_backend())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
        marks.append(time.monotonic_ns())  # the step ends here, not at the loop's top
        dftrace_dynamo.step()
        time.sleep(SLEEP_S)


def compiled_step(n, marks):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    @torch.compile(backend=create_backend())
    def train_step(x):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    for _ in range(n):
        marks.append(time.monotonic_ns())
        train_step(torch.randn(8, 16))
        time.sleep(SLEEP_S)


def replaced(n, marks):
    """Fine-tuning in phases, each with an optimizer of its own: the head alone, then everything
    with a new optimizer per epoch (the earlier ones stay alive); ``zero_grad()`` at the top of
    each iteration, so a new optimizer's first one begins its phase. ``n`` iterations per phase."""
    model = mlp()
    compiled = torch.compile(model, backend=create_backend())
    phases = [lambda: torch.optim.SGD(model[2].parameters(), lr=1e-3)]
    phases += [lambda: torch.optim.AdamW(model.parameters(), lr=1e-4)] * 2
    optimizers = []
    for make in phases:
        optimizers.append(make())
        for _ in range(n):
            marks.append(time.monotonic_ns())
            optimizers[-1].zero_grad()
            compiled(torch.randn(8, 16)).pow(2).mean().backward()
            optimizers[-1].step()
            time.sleep(SLEEP_S)


class SAM(torch.optim.Optimizer):
    """Sharpness-aware minimisation as users write it (after github.com/davda54/sam): a wrapper
    whose ``second_step`` steps the optimizer it wraps, over the same parameter groups."""

    def __init__(self, params, base_optimizer, rho=0.05, **kwargs):
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def first_step(self, zero_grad=False):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.state[p]["e"] = p.grad * group["rho"]
                    p.add_(self.state[p]["e"])
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad=False):
        for group in self.param_groups:
            for p in group["params"]:
                if "e" in self.state[p]:
                    p.sub_(self.state[p]["e"])
        self.base_optimizer.step()
        if zero_grad:
            self.zero_grad()


def sam(n, marks):
    """SAM's two-pass loop: the wrapper itself never steps, the SGD it wraps does."""
    model = torch.compile(mlp(), backend=create_backend())
    opt = SAM(model.parameters(), torch.optim.SGD, lr=1e-3)
    for _ in range(n):
        marks.append(time.monotonic_ns())
        x = torch.randn(8, 16)
        model(x).pow(2).mean().backward()
        opt.first_step(zero_grad=True)
        model(x).pow(2).mean().backward()
        opt.second_step(zero_grad=True)
        time.sleep(SLEEP_S)


def nanogpt(n, marks, evals):
    """nanoGPT's loop: the model evaluated (``model.eval()``, ``no_grad``) at the top of every
    ``n``-th iteration from a batch function (no DataLoader), two accumulated micro-batches,
    ``zero_grad()`` at the end of the iteration."""
    net = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.1), nn.Linear(16, 16))
    model = torch.compile(net, backend=create_backend())
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)

    @torch.no_grad()
    def estimate_loss():
        net.eval()
        for _ in range(3):
            model(torch.randn(8, 16))
            time.sleep(2 * SLEEP_S)
        net.train()

    x = torch.randn(8, 16)
    for it in range(2 * n + 1):
        if it % n == 0:
            start = time.monotonic_ns()
            if it:
                marks.append(start)  # the end of the iteration before
            estimate_loss()
            evals.append((start, time.monotonic_ns()))
        if it == 2 * n:
            break
        marks.append(time.monotonic_ns())
        for _ in range(2):
            loss = model(x).pow(2).mean() / 2
            x = torch.randn(8, 16)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        time.sleep(SLEEP_S)


def ema_eval(n, marks, evals):
    """An exponential moving average of the model, evaluated over a few batches after each epoch;
    ``step()`` and ``zero_grad()`` on one line at the end of the iteration."""
    net = mlp()
    model, ema = torch.compile(net, backend=create_backend()), torch.optim.swa_utils.AveragedModel(net)
    averaged = torch.compile(ema, backend=create_backend())
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for _ in range(2):
        for _ in range(n):
            marks.append(time.monotonic_ns())
            model(torch.randn(8, 16)).pow(2).mean().backward()
            opt.step(); opt.zero_grad()  # noqa: E702 (one line, as users write it)
            ema.update_parameters(net)
            time.sleep(SLEEP_S)
        marks.append(time.monotonic_ns())
        with torch.no_grad():
            for _ in range(3):
                averaged(torch.randn(8, 16))
                time.sleep(2 * SLEEP_S)
        evals.append((marks[-1], time.monotonic_ns()))


def region_load(n, marks, zero_grad_first=True):
    """``zero_grad()`` at the top of the body, then the batch loaded inside a ``region`` (a sleep
    and a DataLoader ``next()``), as pydftracer users annotate their data loading; without
    ``zero_grad_first`` (``region_fetch``), ``zero_grad()`` at the end of the body: the region holds
    the batch that begins each step."""
    from torch.utils.data import DataLoader, TensorDataset

    net = mlp()
    model = torch.compile(net, backend=create_backend())
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    batches = iter(DataLoader(TensorDataset(torch.randn(8 * n, 16)), batch_size=8))
    for _ in range(n):
        marks.append(time.monotonic_ns())
        if zero_grad_first:
            opt.zero_grad()
        with dftrace_dynamo.region("load"):
            time.sleep(SLEEP_S)
            (x,) = next(batches)
        model(x).sum().backward()
        opt.step()
        if not zero_grad_first:
            opt.zero_grad()


def region_fetch(n, marks):
    region_load(n, marks, zero_grad_first=False)


def accelerate(n, marks):
    """accelerate's gradient accumulation (4 batches per optimizer step): the loop's ``step()``
    and ``zero_grad()`` go through its optimizer wrapper, ``zero_grad()`` at the end of the body,
    then logging (a sleep)."""
    from accelerate import Accelerator

    acc = Accelerator(gradient_accumulation_steps=4, cpu=True)
    net = mlp()
    net, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=1e-3))
    model = torch.compile(net, backend=create_backend())
    for i in range(4 * n):
        if i % 4 == 0:
            marks.append(time.monotonic_ns())
        with acc.accumulate(model):
            acc.backward(model(torch.randn(8, 16)).pow(2).mean())
            opt.step()
            opt.zero_grad()
        time.sleep(SLEEP_S / 4)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", choices=(
        "gan", "gan_sample", "dcgan", "gan_loss_first", "actor_critic", "untrained", "critic", "validate",
        "validate_eval_mode", "validate_loss_fn", "frozen_norm", "distill", "amp_skip", "skip_nonfinite", "lbfgs",
        "marked", "compiled_step", "nanogpt", "ema_eval", "replaced", "sam", "region_load", "region_fetch",
        "accelerate"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--truth", required=True)
    ap.add_argument("--iters", type=int, default=8)
    a = ap.parse_args()
    import wallclock  # beside this script; the tests import this module only for SLEEP_S

    watch = wallclock.Watch()
    log = dftracer.initialize_log(a.out, None, -1)
    torch.manual_seed(0)
    marks, evals = [], []
    if a.shape.startswith("validate"):
        validate(a.iters, marks, evals, no_grad=a.shape == "validate", loss_fn=a.shape == "validate_loss_fn")
    elif a.shape in ("nanogpt", "ema_eval"):
        globals()[a.shape](a.iters, marks, evals)
    else:
        globals()[a.shape](a.iters, marks)
        marks.append(time.monotonic_ns())
    log.finalize()
    watch()
    with open(a.truth, "w") as f:
        json.dump({"iterations": marks, "evals": evals, "wall_steps": watch.steps}, f)


if __name__ == "__main__":
    main()
