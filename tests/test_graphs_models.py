"""Model loading for the CLI and example inputs from the forward signature."""

import json
import re
import sys

import pytest
import torch
import torch.nn as nn

from dftrace_dynamo.graphs.models import ModelError, load_model, make_inputs, parse_overrides

transformers = pytest.importorskip("transformers")

TINY_BERT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
             "vocab_size": 100}
TINY_T5 = {"num_layers": 1, "num_decoder_layers": 1, "d_model": 32, "d_ff": 64, "num_heads": 2, "d_kv": 16,
           "vocab_size": 100}


class TwoInputs(nn.Module):
    def forward(self, a, b):
        return a + b


def tiny_mlp():
    return nn.Sequential(nn.Linear(6, 3))


def test_transformers_by_model_type_with_overrides():
    loaded = load_model("bert", TINY_BERT)
    assert type(loaded.model).__name__ == "BertModel"
    assert loaded.model.config.num_hidden_layers == 2
    assert loaded.source == "transformers"
    assert not loaded.model.training


def test_transformers_from_local_config_json(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 100}))
    loaded = load_model(str(path))
    assert type(loaded.model).__name__ == "GPT2Model"
    assert loaded.model.config.n_layer == 2
    path.write_text("{}")
    with pytest.raises(ModelError, match="model_type"):
        load_model(str(path))
    path.write_text('{"model_type": "no-such-type"}')
    with pytest.raises(ModelError, match="cannot build a 'no-such-type' model"):
        load_model(str(path))


def test_factory_and_transformers_class():
    assert isinstance(load_model(f"{__name__}:tiny_mlp").model, nn.Sequential)
    head = load_model("transformers:BertForMaskedLM", TINY_BERT).model
    assert type(head).__name__ == "BertForMaskedLM"
    with pytest.raises(ModelError, match="cannot import"):
        load_model("no_such_module_xyz:Thing")
    with pytest.raises(ModelError, match=r"torch.nn:Linear\(\) failed: TypeError"):
        load_model("torch.nn:Linear")
    with pytest.raises(ModelError, match="not a torch.nn.Module"):
        load_model("collections:OrderedDict")


def torchvision_loads():
    try:
        import torchvision  # noqa: F401
    except Exception:  # not installed, or built for another torch
        return False
    return True


def test_unknown_name_says_what_is_accepted():
    tv = "a torchvision model name" if torchvision_loads() else "torchvision is not installed|does not load"
    with pytest.raises(ModelError, match=tv):
        load_model("resnet-not-a-model")


def test_torchvision_missing_is_reported_for_its_models():
    if torchvision_loads():
        assert load_model("resnet18").source == "torchvision"
        return
    with pytest.raises(ModelError, match=f"release built for torch {re.escape(torch.__version__)}") as info:
        load_model("resnet18")
    # an unpinned install would replace the installed torch
    assert "pip install torchvision" not in str(info.value)


def test_a_torchvision_that_does_not_match_torch_counts_as_missing(tmp_path, monkeypatch):
    (tmp_path / "torchvision").mkdir()
    (tmp_path / "torchvision" / "__init__.py").write_text(
        "raise RuntimeError('operator torchvision::nms does not exist')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    with pytest.raises(ModelError) as info:
        load_model("resnet18")
    message = str(info.value)
    assert "unknown model 'resnet18'" in message
    assert "torchvision does not load with torch" in message and "torchvision::nms does not exist" in message
    assert "pip install torchvision" not in message


@pytest.mark.parametrize("overrides,message", [
    ({"hidden_size": "abc"}, "hidden_size"),
    ({"hidden_size": -32}, "hidden_size=-32: must be positive"),
    ({"num_hidden_layers": -1}, "num_hidden_layers=-1"),
    ({"num_attention_heads": 0}, "num_attention_heads=0: must be positive"),
    ({"hidden_act": "nope"}, "hidden_act='nope': unknown activation"),
    ({"hidden_size": 30, "num_attention_heads": 4}, "cannot build a 'bert' model"),  # the model's own check
])
def test_bad_config_values_are_model_errors(overrides, message):
    with pytest.raises(ModelError, match=re.escape(message)):
        load_model("bert", {**TINY_BERT, **overrides})


def test_factory_that_raises_is_a_model_error():
    with pytest.raises(ModelError, match=r"failed: RuntimeError: no weights here"):
        load_model(f"{__name__}:broken_factory")


def broken_factory():
    raise RuntimeError("no weights here")


def test_encoder_decoder_models_get_decoder_inputs():
    t5 = load_model("t5", TINY_T5).model
    _, kwargs = make_inputs(t5, seq_len=6, batch_size=2)
    assert kwargs.keys() == {"input_ids", "attention_mask", "decoder_input_ids"}
    assert kwargs["decoder_input_ids"].shape == (2, 6) and kwargs["decoder_input_ids"].max() < 100


def test_input_shapes_are_checked_against_the_model():
    bert = load_model("bert", TINY_BERT).model
    with pytest.raises(ModelError, match="input_ids .* takes 2 numbers"):
        make_inputs(bert, input_shape=[1, 2, 3])
    with pytest.raises(ModelError, match="at most 512"):
        make_inputs(bert, seq_len=600)
    vit = load_model("vit", {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                             "intermediate_size": 64, "image_size": 32, "patch_size": 8}).model
    with pytest.raises(ModelError, match="takes 4 numbers"):
        make_inputs(vit, input_shape=[1, 3, 32])
    with pytest.raises(ModelError, match="takes 3 channels, not 1"):
        make_inputs(vit, input_shape=[1, 1, 32, 32])


def test_inputs_for_text_models():
    model = load_model("bert", TINY_BERT).model
    args, kwargs = make_inputs(model, seq_len=12, batch_size=3)
    assert args == ()
    assert kwargs.keys() == {"input_ids", "attention_mask"}
    assert kwargs["input_ids"].shape == (3, 12)
    assert kwargs["input_ids"].max() < 100
    assert kwargs["attention_mask"].dtype == torch.long


def test_inputs_for_image_models():
    vit = load_model("vit", {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                             "intermediate_size": 64, "image_size": 32, "patch_size": 8}).model
    _, kwargs = make_inputs(vit, batch_size=2)
    assert kwargs["pixel_values"].shape == (2, 3, 32, 32)
    _, kwargs = make_inputs(vit, input_shape=[1, 3, 64, 64])
    assert kwargs["pixel_values"].shape == (1, 3, 64, 64)


def test_inputs_from_the_first_layer_or_input_shape():
    assert make_inputs(tiny_mlp(), batch_size=4)[0][0].shape == (4, 6)
    conv = nn.Sequential(nn.Conv2d(5, 2, 3))
    assert make_inputs(conv, batch_size=2, image_size=16)[0][0].shape == (2, 5, 16, 16)
    emb = nn.Sequential(nn.Embedding(7, 4))
    ids = make_inputs(emb, seq_len=9)[0][0]
    assert ids.shape == (1, 9) and ids.dtype == torch.long and ids.max() < 7
    assert make_inputs(nn.ReLU(), input_shape=[2, 3])[0][0].shape == (2, 3)
    with pytest.raises(ModelError, match="--input-shape"):
        make_inputs(nn.ReLU())
    with pytest.raises(ModelError, match="forward"):
        make_inputs(TwoInputs())


def test_parse_overrides():
    assert parse_overrides(["a=1", "b=false", "c=gelu", "d=[1, 2]"]) == {"a": 1, "b": False, "c": "gelu", "d": [1, 2]}
    with pytest.raises(ModelError):
        parse_overrides(["novalue"])
