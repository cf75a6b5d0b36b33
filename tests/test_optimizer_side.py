"""Work for the optimizers outside their ``step()`` is the step view's optimizer time, each call an
optimizer slice of its own: gradient clipping (``clip_grad_norm_``) after the backward, a
learning-rate scheduler's step and the model's ``zero_grad()`` after the optimizer step, and a
trainer's optimizer wrapper around the optimizer's step (Lightning's ``LightningOptimizer.step``);
in a plain loop, under Lightning, and under the Hugging Face ``Trainer`` (``accelerate``'s clipping).
Ground truth: known sleeps inside each, with the program's own time marks around them; the step
view's parts never add up to more than the step's wall time, in both sources."""

import json

import pytest

from backend_support import run_py
from subproc import shell
from tracefile import read_events, traces

SLEEP_S = 0.01
GRID_US = 2.0  # ts is whole µs, and the writer's nesting may trim an event by 1 µs
PROGRAM = f"""
import json, time
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from dftrace_dynamo import _core, dftracer
from dftrace_dynamo.backend import tracer  # noqa: F401  (the backend: steps and eager ops)

sleeps = {{"clip": [], "scheduler": [], "zero_grad": []}}


def nap(what):
    start = _core.now_ns()
    time.sleep({SLEEP_S})
    sleeps[what].append((start, _core.now_ns()))


class Net(nn.Sequential):
    napping = False

    def parameters(self, recurse=True):  # Module.zero_grad walks them: a known time inside it
        if self.napping:
            nap("zero_grad")
        return super().parameters(recurse)


def slow(params):  # clip_grad_norm_ takes the parameters' list inside: a known time inside it
    yield from params
    nap("clip")


def factor(epoch):  # LambdaLR calls it in its step(): a known time inside it
    if epoch:
        nap("scheduler")
    return 1.0


log = dftracer.initialize_log("tr", None, -1)
torch.manual_seed(0)
model = Net(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scheduler = torch.optim.lr_scheduler.LambdaLR(opt, factor)
loader = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=4)
for x, y in loader:
    nn.functional.mse_loss(model(x), y).backward()
    torch.nn.utils.clip_grad_norm_(slow(model.parameters()), 0.5)
    opt.step()
    scheduler.step()
    model.napping = True
    model.zero_grad()
    model.napping = False
log.finalize()
json.dump(sleeps, open("sleeps.json", "w"))
"""
NAMES = {"clip": "clip_grad_norm_", "scheduler": "LambdaLR.step", "zero_grad": "Net.zero_grad"}


def _inside(inner, outer):
    return outer[0] - GRID_US <= inner[0] and inner[1] <= outer[1] + GRID_US


def _span(e):
    return e["ts"], e["ts"] + e["dur"]


def _steady(path, source):
    from dftrace_dynamo.traces.summary import summarize
    result = summarize([path], views=("step",), top=None, source=source)
    return [r for r in result["steps"]["rows"] if r["recorded"] and not r["warmup"]]


def _check_steps(path, naps, least):
    """Each steady step's optimizer time holds the sleeps inside it (at least ``least`` of them);
    the parts add up to no more than the wall time; both sources give the same steps."""
    slices = {e["args"]["step"]: _span(e) for e in read_events(path) if e.get("cat") == "step"}
    rows = _steady(path, "auto")
    assert len(rows) >= 4
    for r in rows:
        slept = [n for n in naps if _inside(n, slices[r["step"]])]
        assert len(slept) >= least, (r, slept)
        assert r["optimizer_us"] >= sum(b - a for a, b in slept) - GRID_US * len(slept), r
        assert sum(r[k] for k in ("data_us", "forward_us", "backward_us", "optimizer_us")) <= r["wall_us"] + 4, r
    for by_record, by_events in zip(rows, _steady(path, "events"), strict=True):
        for key in ("step", "wall_us", "forward_us", "backward_us", "optimizer_us", "gc_us", "trainer_us", "other_us"):
            assert by_record[key] == pytest.approx(by_events[key], abs=1.0), key


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("optimizer_side")
    run_py(PROGRAM, tmp, {"DFTRACER_EAGER_OPS": "1"})
    (path,) = traces(tmp, "tr-*")
    sleeps = json.loads((tmp / "sleeps.json").read_text())
    return path, {k: [(a / 1e3, b / 1e3) for a, b in v] for k, v in sleeps.items()}


@pytest.mark.parametrize("what", sorted(NAMES))
def test_clipping_scheduler_and_model_zero_grad_are_optimizer_slices_holding_their_time(loop, what):
    path, sleeps = loop
    events = read_events(path)
    steps = {e["args"]["step"]: _span(e) for e in events if e.get("cat") == "step"}
    slices = [e for e in events if e.get("cat") == "optimizer" and e["name"] == NAMES[what]]
    assert len(sleeps[what]) == len(steps), (what, len(steps))
    for nap in sleeps[what]:  # (LambdaLR's constructor steps once more, without a sleep)
        (e,) = [e for e in slices if _inside(nap, _span(e))]
        assert _inside(_span(e), steps[e["args"]["step"]]), (what, e)  # in the step it ran in


def test_the_sleeps_in_optimizer_side_work_are_the_steps_optimizer_time(loop):
    path, sleeps = loop
    _check_steps(path, [n for naps in sleeps.values() for n in naps], 3)


LIGHTNING = f"""
import json, time
import lightning as L
import torch
from torch import nn
from lightning.pytorch.plugins.precision import Precision
from dftrace_dynamo import _core

naps = []


class SlowPrecision(Precision):  # runs inside LightningOptimizer.step, before the optimizer's step
    def optimizer_step(self, optimizer, model, closure, **kwargs):
        start = _core.now_ns()
        time.sleep({SLEEP_S})
        naps.append((start, _core.now_ns()))
        return super().optimizer_step(optimizer, model, closure, **kwargs)


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


g = torch.Generator().manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(128, 32, generator=g), torch.randn(128, 1, generator=g))
trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, plugins=[SlowPrecision()])
trainer.fit(torch.compile(Regressor()), torch.utils.data.DataLoader(data, batch_size=16))
json.dump(naps, open("naps.json", "w"))
"""


def test_lightnings_optimizer_wrapper_is_optimizer_time(tmp_path):
    pytest.importorskip("lightning")
    (tmp_path / "lit.py").write_text(LIGHTNING)
    proc = shell("dftrace-dynamo run --out run --compile-all lit.py", tmp_path,
                 {"DFTRACER_EAGER_OPS": "1", "OMP_NUM_THREADS": "1"}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (path,) = traces(next((tmp_path / "run").iterdir()))  # the run's own directory
    naps = [(a / 1e3, b / 1e3) for a, b in json.loads((tmp_path / "naps.json").read_text())]
    events = read_events(path)
    wrappers = [e for e in events if e.get("cat") == "optimizer" and e["name"] == "LightningSGD.step"]
    inner = [e for e in events if e.get("cat") == "optimizer" and e["name"] == "SGD.step"]
    steps = {e["args"]["step"]: _span(e) for e in events if e.get("cat") == "step"}
    assert len(wrappers) == len(naps) == len(steps) == 8, (len(wrappers), len(naps), len(steps))
    for e, nap in zip(wrappers, naps):  # each holds its sleep and the optimizer's step, in its step
        assert _inside(nap, _span(e)), (e, nap)  # (the first too: the trace opens inside it)
        assert sum(_inside(_span(s), _span(e)) for s in inner) == 1, e
        assert _inside(_span(e), steps[e["args"]["step"]]), e
    _check_steps(path, naps, 1)


HF = f"""
import json, time
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
from dftrace_dynamo import _core

marks = {{"clip": [], "scheduler": []}}


class Data(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.ids, self.labels = torch.randint(0, 100, (n, 16), generator=g), torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {{"input_ids": self.ids[i], "labels": self.labels[i]}}


class Marked(Trainer):
    def _clip_grad_norm(self, model):  # the Trainer's clipping (accelerate's), between time marks
        start = _core.now_ns()
        out = super()._clip_grad_norm(model)
        marks["clip"].append((start, _core.now_ns()))
        return out


def factor(step):  # the Trainer's lr_scheduler.step() calls it: a known time inside it
    if step:
        start = _core.now_ns()
        time.sleep({SLEEP_S})
        marks["scheduler"].append((start, _core.now_ns()))
    return 1.0


torch.manual_seed(0)
config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=16, problem_type="single_label_classification")
model = BertForSequenceClassification(config)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
args = TrainingArguments(output_dir="hf-out", max_steps=6, per_device_train_batch_size=8, use_cpu=True,
                         save_strategy="no", report_to=[], disable_tqdm=True, torch_compile=True)
Marked(model=model, args=args, train_dataset=Data(64),
       optimizers=(opt, torch.optim.lr_scheduler.LambdaLR(opt, factor))).train()
json.dump(marks, open("marks.json", "w"))
"""


def test_hf_trainers_clipping_scheduler_and_optimizer_wrapper_are_optimizer_time(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    (tmp_path / "hf.py").write_text(HF)
    proc = shell("dftrace-dynamo run --out run --compile-all hf.py", tmp_path,
                 {"DFTRACER_EAGER_OPS": "1", "OMP_NUM_THREADS": "1"}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (path,) = traces(next((tmp_path / "run").iterdir()))
    marks = json.loads((tmp_path / "marks.json").read_text())
    marks = {k: [(a / 1e3, b / 1e3) for a, b in v] for k, v in marks.items()}
    events = read_events(path)
    optimizer = [e for e in events if e.get("cat") == "optimizer"]
    assert len(marks["clip"]) == len(marks["scheduler"]) == 6
    clips = [e for e in optimizer if e["name"] in ("get_total_norm", "clip_grads_with_norm_")]
    for clip in marks["clip"]:  # accelerate's norm, then its clipping, each a slice
        assert sorted(e["name"] for e in clips if _inside(_span(e), clip)) == ["clip_grads_with_norm_",
                                                                               "get_total_norm"], clip
    for nap in marks["scheduler"]:
        assert sum(e["name"] == "LambdaLR.step" and _inside(nap, _span(e)) for e in optimizer) == 1, nap
    # the Trainer steps accelerate's wrapper (its scheduler, made before the trace opened, too)
    wrappers = [_span(e) for e in optimizer if e["name"] == "AcceleratedOptimizer.step"]
    inner = [_span(e) for e in optimizer if e["name"] == "AdamW.step"]
    assert len(wrappers) == len(inner) == 6 and all(map(_inside, inner, wrappers)), (wrappers, inner)
    _check_steps(path, marks["scheduler"], 1)


def test_a_subclass_step_calling_super_is_one_optimizer_slice_holding_its_own_work(tmp_path):
    """torch hooks the step() of every optimizer class once one of its instances exists, so a
    subclass's step() calling ``super().step()`` runs the step hooks twice, nested: the optimizer
    slice is the outer call (a known sleep before ``super().step()`` is inside it), one a step."""
    import time

    import torch

    from backend_support import MLP, ops, recording
    from dftrace_dynamo import _core, create_backend

    class Lookahead(torch.optim.SGD):
        def step(self, closure=None):
            start = _core.now_ns()
            time.sleep(SLEEP_S)
            marks.append((start, _core.now_ns()))
            return super().step(closure)

    model, marks = MLP(), []
    torch.optim.SGD(model.parameters(), lr=0.1)  # SGD.step is hooked from now on
    opt = Lookahead(model.parameters(), lr=0.1)
    compiled = torch.compile(model, backend=create_backend())
    with recording(tmp_path) as rec:
        for _ in range(4):
            opt.zero_grad()
            compiled(torch.randn(4, 16)).sum().backward()
            opt.step()
        events = rec.events()
    slices = sorted((e for e in ops(events, "optimizer") if e["name"].endswith(".step")), key=lambda e: e["ts"])
    assert [e["name"] for e in slices] == ["Lookahead.step"] * 4
    assert [e["args"]["step"] for e in slices] == [0, 1, 2, 3]
    assert len(ops(events, "step")) == 4
    for e, (start, end) in zip(slices, marks, strict=True):
        assert e["ts"] <= start / 1e3 and end / 1e3 <= e["ts"] + e["dur"] + GRID_US, (e, start, end)
