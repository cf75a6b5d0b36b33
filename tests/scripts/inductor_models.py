"""Compiles a CNN (training step + inference), a tiny BERT (inference) and two identical
MLPs with level="inductor", and the same models with plain Inductor; writes RESULT_JSON:
the kernel calls each generated graph makes (from its source), cache keys, FX graph cache
hits and whether outputs/gradients are bit-identical to plain Inductor.

Usage: python inductor_models.py TRACE_PREFIX RESULT_JSON (DFTRACER_ENABLE=1 in the env).
"""

import collections
import copy
import json
import re
import sys

import torch
from torch._dynamo.utils import counters
from torch._inductor import compile_fx as cfx

import dftrace_dynamo

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from backend_support import CNN, MLP  # noqa: E402

CALL = re.compile(r"^\s+(?:[\w, ]+ = )?(cpp_fused_\w+|extern_kernels\.\w+|torch\.ops\.\w+\.\w+\.\w+)\(", re.M)
graphs = []  # (is_backward, is_inference, cache_key, source) of every graph Inductor compiled for us
real_inner = cfx.compile_fx_inner


def spy(gm, inputs, **kwargs):
    out = real_inner(gm, inputs, **kwargs)
    graphs.append({"backward": bool(kwargs.get("is_backward")), "cache_key": out.cache_key,
                   "source": out.source_code})
    return out


def kernel_calls(source):
    body = source[source.index("    def call(self, args):"):]
    names = [n.removeprefix("torch.ops.").removesuffix(".default") for n in CALL.findall(body)]
    return dict(collections.Counter(names))


def bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=32)
    return BertModel(cfg).eval()


def mlp_a(model, x):
    return model(x)


def mlp_b(model, x):
    return model(x)


def train_then_infer(model, x):
    """Two training steps (forward + backward) and one inference call: (last output, inference output)."""
    for _ in range(2):
        out = model(x)
        out.sum().backward()
    with torch.no_grad():
        return out, model(x)


def main(prefix, result_path):
    dftrace_dynamo.initialize_log(prefix)
    torch.manual_seed(0)
    result = {"models": {}}
    cnn = CNN()
    plain_cnn = copy.deepcopy(cnn)
    x = torch.randn(2, 3, 8, 8)
    traced, plain = (torch.compile(m, backend=b, options=o) for m, b, o in
                     ((cnn, "dftrace", {"level": "inductor"}), (plain_cnn, "inductor", None)))
    cfx.compile_fx_inner = spy
    first = len(graphs)
    out, inf = train_then_infer(traced, x)
    result["models"]["cnn"] = graphs[first:]
    cfx.compile_fx_inner = real_inner
    ref, ref_inf = train_then_infer(plain, x)
    result["cnn_equal"] = (torch.equal(out, ref) and torch.equal(inf, ref_inf)
                           and all(torch.equal(a.grad, b.grad) for a, b in
                                   zip(cnn.parameters(), plain_cnn.parameters())))

    model = bert()
    ids = torch.randint(0, 64, (2, 8))
    cfx.compile_fx_inner = spy
    first = len(graphs)
    traced = torch.compile(model, backend="dftrace", options={"level": "inductor"})
    with torch.no_grad():
        for _ in range(2):
            out = traced(ids).last_hidden_state
    result["models"]["bert"] = graphs[first:]
    cfx.compile_fx_inner = real_inner
    with torch.no_grad():
        ref = torch.compile(model, backend="inductor")(ids).last_hidden_state
    result["bert_equal"] = torch.equal(out, ref)

    # two graphs (two functions, same code) sharing one generated module: called once and twice
    cfx.compile_fx_inner = spy
    first = len(graphs)
    mlp = MLP()
    ca, cb = (torch.compile(f, backend="dftrace", options={"level": "inductor"}) for f in (mlp_a, mlp_b))
    y = torch.randn(4, 16)
    with torch.no_grad():
        ca(mlp, y)
        cb(mlp, y)
        cb(mlp, y)
    result["models"]["mlp_pair"] = graphs[first:]
    cfx.compile_fx_inner = real_inner

    for model_graphs in result["models"].values():
        for g in model_graphs:
            g["calls"] = kernel_calls(g.pop("source"))
    result["fxgraph_cache_hit"] = counters["inductor"]["fxgraph_cache_hit"]
    dftrace_dynamo.finalize()
    with open(result_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
