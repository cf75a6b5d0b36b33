"""A Lightning ``fit`` of a ``torch.compile``\\ d module, 2 epochs of 4 batches, validation after each,
without the tracer's profiler; its own marks (the trace's clock) go to ``marks.json``: each training
batch's start and end (``on_train_batch_start``/``_end``) and each validation pass's (the call
and return of its evaluation loop's ``run()``: after ``on_validation_end`` it may work for
milliseconds more, the first time it logs). With ``SLEEP_AT=N``, its
``on_train_batch_end`` sleeps 30 ms after batch N (marks ``sleep``)."""
import json
import os
import time

import lightning as L
from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop
import torch
from torch import nn

from dftrace_dynamo import _core


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Marks(L.Callback):
    def __init__(self):
        self.batches, self.validations, self.sleep = [], [], []

    def on_train_batch_start(self, *args):
        self.batches.append([_core.now_ns(), None])

    def on_train_batch_end(self, *args):
        self.batches[-1][1] = _core.now_ns()
        if len(self.batches) - 1 == int(os.environ.get("SLEEP_AT", -1)):
            start = _core.now_ns()
            time.sleep(0.03)
            self.sleep.append([start, _core.now_ns()])



def loader(n):
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(n, 32, generator=g), torch.randn(n, 1, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=16)


def marked(run):
    def validation(*args, **kwargs):
        marks.validations.append([_core.now_ns(), None])
        try:
            return run(*args, **kwargs)
        finally:
            marks.validations[-1][1] = _core.now_ns()

    return validation


_EvaluationLoop.run = marked(_EvaluationLoop.run)  # around the tracer's own patch, if any
torch.manual_seed(0)
marks = Marks()
model = torch.compile(Regressor())
trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                    callbacks=[marks])
trainer.fit(model, loader(64), loader(32))
json.dump({"batches": marks.batches, "validations": marks.validations, "sleep": marks.sleep},
          open("marks.json", "w"))
