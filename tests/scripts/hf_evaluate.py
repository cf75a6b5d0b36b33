"""A Hugging Face ``Trainer`` with ``torch_compile=True`` (only its training copy of the model is
compiled: evaluation runs eagerly), evaluating every 2 of 6 steps, without the tracer's callback;
its own marks (the trace's clock) around each ``evaluate()`` and each training step go to
``marks.json``. With ``SLEEP_AT=N``, its ``on_step_begin`` callback sleeps 30 ms in step N (marks
``sleep``)."""
import json
import os
import time
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments, TrainerCallback
from dftrace_dynamo import _core


class Data(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 100, (n, 16), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class Marks(TrainerCallback):
    def __init__(self):
        self.evals, self.steps, self.sleep = [], [], []

    def on_step_begin(self, args, state, control, **kw):
        self.steps.append([_core.now_ns(), None])
        if len(self.steps) - 1 == int(os.environ.get("SLEEP_AT", -1)):
            start = _core.now_ns()
            time.sleep(0.03)
            self.sleep.append([start, _core.now_ns()])

    def on_step_end(self, args, state, control, **kw):
        self.steps[-1][1] = _core.now_ns()


class Timed(Trainer):
    def evaluate(self, *a, **kw):
        start = _core.now_ns()
        out = super().evaluate(*a, **kw)
        marks.evals.append((start, _core.now_ns()))
        return out


torch.manual_seed(0)
config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=16, problem_type="single_label_classification")
model = BertForSequenceClassification(config)
args = TrainingArguments(output_dir="hf-out", max_steps=6, per_device_train_batch_size=8, eval_strategy="steps",
                         eval_steps=2, per_device_eval_batch_size=8, use_cpu=True, save_strategy="no", report_to=[],
                         disable_tqdm=True, torch_compile=True)
marks = Marks()
trainer = Timed(model=model, args=args, train_dataset=Data(64), eval_dataset=Data(16), callbacks=[marks])
trainer.train()
json.dump({"evals": marks.evals, "steps": marks.steps, "sleep": marks.sleep}, open("marks.json", "w"))
