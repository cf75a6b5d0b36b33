"""Training programs for tests/test_eager_profiler_counts.py and benchmarks/op_counts.py: the
same iterations once under dftrace_dynamo and once under torch.profiler, counted per step.

``python op_counts.py PROGRAM OUT.json --trace PREFIX | --profile``

``--trace`` runs the program under dftrace_dynamo (``initialize_log``; compiled models with
``backend="dftrace"``, ATen level) and writes the losses (``float.hex``) and parameters.
``--profile`` runs it untraced under torch.profiler (CPU, ``record_shapes`` off) with compiled
models on ``backend="aot_eager"``: the graphs our ATen level instruments (AOTAutograd, min-cut
partitioner), run without our interceptors, so every graph op is a dispatcher call the profiler
records. It writes the losses, parameters and, per step, the top-level ops (see
:func:`top_level`), the ATen ones among them and the evaluations' top-level ops.

Programs (ITERS iterations each, every iteration in ``record_function("iterN")``):

``eager``
    an all-eager model (Linear, LSTM, LayerNorm) fed by a DataLoader, cross-entropy outside the
    model, SGD with momentum (per-parameter loop, no foreach on CPU), gradient clipping.
``graph_break``
    a compiled model with a graph break and an eager ``nn.LSTM`` (Dynamo does not trace RNNs),
    the loss outside it, SGD foreach.
``adam``
    a compiled CNN without a break, ``zero_grad(set_to_none=False)`` (foreach ``zero_``),
    Adam foreach, the loss outside.
``accum``
    gradient accumulation: three micro-batches through a compiled model with an eager LSTM per
    optimizer step, fused Adam (one ``aten::_fused_adam_`` per step), ``clip_grad_norm_``.
``compiled_step``
    a compiled MLP with dropout and a compiled optimizer step (``torch.compile(opt.step)``,
    AdamW foreach): the optimizer's ops are a graph's.
``eval``
    a compiled MLP fed a new batch size each iteration (``dynamic=True``: a recompile, then
    graphs with symbolic sizes), AdamW foreach, and an evaluation (``model.eval()``, a forward
    under ``no_grad``) after each optimizer step, inside ``record_function("eval")``.
"""

import argparse
import bisect
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

ITERS = 4
PROGRAMS = ("eager", "graph_break", "adam", "accum", "compiled_step", "eval")


class RNNModel(nn.Module):
    def __init__(self, graph_break=False):
        super().__init__()
        self.embed, self.lstm = nn.Linear(6, 8), nn.LSTM(8, 8, batch_first=True)
        self.norm, self.head = nn.LayerNorm(8), nn.Linear(8, 5)
        self.graph_break = graph_break

    def forward(self, x):
        h = torch.tanh(self.embed(x))
        if self.graph_break:
            torch._dynamo.graph_break()
        y, _ = self.lstm(h)
        return self.head(self.norm(y[:, -1]))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 8, 3, padding=1)
        self.bn, self.fc = nn.BatchNorm2d(8), nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.relu(self.bn(self.conv2(x)))
        return self.fc(x.flatten(1))


def run(program, compile_fn):
    """The program's losses (hex) and final parameters."""
    torch.manual_seed(0)
    losses = []
    if program == "eager":
        model = RNNModel()
        data = torch.utils.data.TensorDataset(torch.randn(4 * ITERS, 7, 6), torch.randint(0, 5, (4 * ITERS,)))
        loader = iter(torch.utils.data.DataLoader(data, batch_size=4))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=False)
        for i in range(ITERS):
            with torch.profiler.record_function(f"iter{i}"):
                x, y = next(loader)
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)
                opt.step()
                losses.append(loss.item().hex())
    elif program in ("graph_break", "accum"):
        model = RNNModel(graph_break=program == "graph_break")
        run_model = compile_fn(model)
        if program == "graph_break":
            opt = torch.optim.SGD(model.parameters(), lr=0.05, foreach=True)
        else:
            opt = torch.optim.Adam(model.parameters(), lr=0.01, fused=True)
        micro = 3 if program == "accum" else 1
        batches = [(torch.randn(4, 7, 6), torch.randint(0, 5, (4,))) for _ in range(micro * ITERS)]
        for i in range(ITERS):
            with torch.profiler.record_function(f"iter{i}"):
                opt.zero_grad()
                for x, y in batches[micro * i:micro * (i + 1)]:
                    loss = F.cross_entropy(run_model(x), y) / micro  # the loss outside the model
                    loss.backward()
                    losses.append(loss.item().hex())
                if program == "accum":
                    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
    elif program in ("compiled_step", "eval"):
        model = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Dropout(0.1), nn.Linear(8, 5))
        run_model = compile_fn(model, dynamic=program == "eval")
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)
        step = compile_fn(opt.step) if program == "compiled_step" else opt.step
        for i in range(ITERS):
            with torch.profiler.record_function(f"iter{i}"):
                opt.zero_grad()
                n = 3 + i if program == "eval" else 3  # new shapes: a recompile, then dynamic graphs
                x, y = torch.randn(n, 6), torch.randint(0, 5, (n,))
                loss = F.cross_entropy(run_model(x), y)
                loss.backward()
                step()
                losses.append(loss.item().hex())
                if program == "eval":
                    with torch.profiler.record_function("eval"), torch.no_grad():
                        model.eval()
                        losses.append(run_model(torch.randn(2, 6)).sum().item().hex())
                        model.train()
    else:
        model = CNN()
        run_model = compile_fn(model)
        opt = torch.optim.Adam(model.parameters(), lr=0.01, foreach=True)
        batches = [(torch.randn(4, 1, 8, 8), torch.randint(0, 5, (4,))) for _ in range(ITERS)]
        for i in range(ITERS):
            with torch.profiler.record_function(f"iter{i}"):
                opt.zero_grad(set_to_none=False)
                x, y = batches[i]
                loss = F.cross_entropy(run_model(x), y)
                loss.backward()
                opt.step()
                losses.append(loss.item().hex())
    return losses, [p.detach().flatten().tolist() for p in model.parameters()]


def is_op(name):
    """A registered operator's record (``aten::mm``, ``mylib::op``): not autograd's engine or
    node records (``autograd::engine::evaluate_function: ...``, ``torch::autograd::...``), nor
    unqualified records (``detach``, ``Optimizer.step#Adam.step``, ``iter0``)."""
    return "::" in name and not name.startswith(("autograd::", "torch::autograd::"))


def compiling(name):
    """Dynamo's and AOTAutograd's compile records: the fake-tensor ops inside are no work of the
    program (the tracer records none)."""
    return name in ("entire_frame_compile", "entire_backward_compile") or name.endswith("(dynamo_timed)")


def top_level(events):
    """Per step, as the tracer's step slices cut the run: the operator records with no operator
    among their ancestors on their thread (torch.profiler's top-level ops) that begin from the
    ``iterN`` record's start (step 0: from the profiler's start) until the next one's (the last:
    until the profiler stops), outside Dynamo's compiles and outside ``eval`` records; how many of
    them are ATen ops (``aten::``); their counts by name; and the top-level ops inside ``eval``."""
    starts = sorted(e.time_range.start for e in events if e.name.startswith("iter") and e.name[4:].isdigit())
    ops, aten, names, evals = [0] * len(starts), [0] * len(starts), [{} for _ in starts], 0
    for e in events:
        if not is_op(e.name):
            continue
        parent, in_eval = e.cpu_parent, False
        while parent is not None and not is_op(parent.name) and not compiling(parent.name):
            in_eval = in_eval or parent.name == "eval"
            parent = parent.cpu_parent
        if parent is not None:
            continue
        if in_eval:
            evals += 1
            continue
        k = max(bisect.bisect_right(starts, e.time_range.start) - 1, 0)
        ops[k] += 1
        aten[k] += e.name.startswith("aten::")
        names[k][e.name] = names[k].get(e.name, 0) + 1
    return ops, aten, names, evals


def main():
    from side_by_side import profiled, traced  # a sibling when run as a script (tests import this module)

    ap = argparse.ArgumentParser()
    ap.add_argument("program", choices=PROGRAMS)
    ap.add_argument("out")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--trace")
    mode.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    out = {}
    if a.trace:
        out["losses"], out["params"] = traced(a.trace, lambda compile: run(a.program, compile))
    else:
        (out["losses"], out["params"]), prof = profiled(lambda compile: run(a.program, compile), "aot_eager")
        out["ops"], out["aten"], out["names"], out["eval"] = top_level(prof.events())
    with open(a.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
