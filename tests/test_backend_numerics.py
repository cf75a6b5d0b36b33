"""Tracing changes no numbers: outputs, gradients and mutated buffers are bit-identical
to eager and to the untraced backend of the same level (torch: "eager", aten: "aot_eager")."""

import copy

import pytest
import torch
import torch.utils.checkpoint

from backend_support import CNN, MLP, ops, recording
from dftrace_dynamo import create_backend

REFERENCE = {"torch": "eager", "aten": "aot_eager"}


@pytest.fixture(autouse=True)
def fresh_dynamo(tmp_path):
    with recording(tmp_path) as recorder:  # record for real: the hot path must not change results
        yield recorder


def run_step(model, backend, inputs, train=True):
    """Output, gradients and buffers after one forward (+ backward) of a fresh copy of ``model``."""
    model = copy.deepcopy(model)
    fn = model if backend is None else torch.compile(model, backend=backend)
    out = fn(*inputs)
    out = out if isinstance(out, torch.Tensor) else out[0]
    if train:
        (out.float() ** 2).sum().backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    # AOTAutograd gives zeros where eager leaves None (parameters feeding unused outputs)
    grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in model.parameters()]
    return out.detach(), grads, [b.clone() for b in model.buffers()]


def assert_identical(a, b):
    out_a, grads_a, bufs_a = a
    out_b, grads_b, bufs_b = b
    assert torch.equal(out_a, out_b)
    assert all(torch.equal(x, y) for x, y in zip(grads_a, grads_b))
    assert all(torch.equal(x, y) for x, y in zip(bufs_a, bufs_b))


def check(model, inputs, level, train=True):
    eager = run_step(model, None, inputs, train)
    reference = run_step(model, REFERENCE[level], inputs, train)
    traced = run_step(model, create_backend(level=level), inputs, train)
    assert_identical(traced, reference)
    assert_identical(traced, eager)


@pytest.mark.parametrize("level", ["torch", "aten"])
def test_mlp(level, fresh_dynamo):
    torch.manual_seed(0)
    check(MLP(), (torch.randn(8, 16),), level)
    events = ops(fresh_dynamo.events())
    assert any(e["args"]["phase"] == "backward" for e in events) == (level == "aten")


@pytest.mark.parametrize("level", ["torch", "aten"])
def test_cnn_with_batchnorm_in_train_mode_updates_buffers_identically(level):
    torch.manual_seed(0)
    check(CNN().train(), (torch.randn(4, 3, 8, 8),), level)


def _transformers():
    return pytest.importorskip("transformers")


def bert():
    tf = _transformers()
    cfg = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=100, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return tf.BertModel(cfg), (torch.randint(0, 100, (2, 12)),)


def gpt2():
    tf = _transformers()
    cfg = tf.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=64, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    return tf.GPT2LMHeadModel(cfg), (torch.randint(0, 100, (2, 12)),)


def vit():
    tf = _transformers()
    cfg = tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                       image_size=32, patch_size=8, num_channels=3, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
    return tf.ViTModel(cfg), (torch.randn(2, 3, 32, 32),)


@pytest.mark.parametrize("make", [bert, gpt2, vit], ids=["bert", "gpt2", "vit"])
@pytest.mark.parametrize("level", ["torch", "aten"])
def test_transformers_from_small_configs(make, level):
    torch.manual_seed(0)
    model, inputs = make()
    check(model.train(), inputs, level)


@pytest.mark.parametrize("level", ["torch", "aten"])
def test_autocast(level):
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(4, 16)

    def under_autocast(backend):
        fn = model if backend is None else torch.compile(model, backend=backend)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fn(x)

    out = under_autocast(create_backend(level=level))
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, under_autocast(REFERENCE[level]))


class Checkpointed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = MLP()
        self.out = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.out(torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False))


@pytest.mark.parametrize("level", ["torch", "aten"])
def test_activation_checkpointing(level):
    torch.manual_seed(0)
    check(Checkpointed(), (torch.randn(4, 16),), level)


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: self.fc(t).sin(), lambda t: self.fc(t).cos(), (x,))


@pytest.mark.parametrize("level", ["torch", "aten"])
def test_torch_cond_both_branches(level, fresh_dynamo):
    torch.manual_seed(0)
    model = Branchy()
    compiled = torch.compile(model, backend=create_backend(level=level))
    for x in (torch.ones(2, 4), -torch.ones(2, 4)):
        with torch.no_grad():
            assert torch.equal(compiled(x), model(x))
    names = {e["name"] for e in ops(fresh_dynamo.events())}
    assert ("function.cond" in names) or ("function.cond" in {n.split(".default")[0] for n in names})
