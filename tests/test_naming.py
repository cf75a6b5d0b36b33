"""Table tests for the shared abbreviation rules (seed 004)."""

import pytest

from dftrace_dynamo.naming import ELLIPSIS, abbreviate, truncate

CASES = [
    # plain FX names are kept
    ("layer1.0.conv1", "layer1.0.conv1"),
    ("add_1", "add_1"),
    ("x", "x"),
    # seed 004 examples
    ("g__model___model_0_conv", "model.0.conv"),
    ("getattr_getattr_L__yolo_model___model_23_cv3_0___0_____0___conv", "model.23.cv3.0[0][0].conv"),
    # old Dynamo mangling
    ("L__self___layer1_0_conv1", "layer1.0.conv1"),
    ("l__self___layer1_0_downsample_0", "layer1.0.downsample.0"),
    ("getattr_L__self___layer1___0___conv1", "layer1[0].conv1"),
    ("L__self___conv_1x1", "conv_1x1"),
    # torch >= 2.3 placeholder names
    ("l_self_modules_layer1_modules_0_modules_conv1_parameters_weight_", "layer1.0.conv1.weight"),
    ("L_self_modules_bn_buffers_running_mean_", "bn.running_mean"),
    ("l_fn_modules_0_modules_0_parameters_bias_", "0.0.bias"),
    ("l_x_", "x"),
    ("l_input_ids_", "input_ids"),
    ("L_kwargs_input_ids_", "input_ids"),
    ("L['kwargs']['attention_mask']", "attention_mask"),
    # source style (nn_module_stack, guards)
    ("L['self'].layer1[0].conv1", "layer1.0.conv1"),
    ("L['self']._modules['layer1']._modules['0']._modules['conv1']", "layer1.0.conv1"),
    ("L['self'].encoder.layer.1.attention", "encoder.layer.1.attention"),
    ("L['fn'].0.0", "0.0"),
    ("L['self'].md['a']", "md.a"),
    ("L['x']", "x"),
    ('G["model"].head', "head"),
    # real paths with repeated components are kept (ResNet's embedder.embedder)
    ("model.model.0", "model.model.0"),
    ("L['self'].model.model.3", "model.model.3"),
    ("L['self'].embedder.embedder.convolution", "embedder.embedder.convolution"),
    ("l_self_modules_embedder_modules_embedder_modules_convolution_parameters_weight_",
     "embedder.embedder.convolution.weight"),
    ("seq.0.0", "seq.0.0"),
]


@pytest.mark.parametrize("name,expected", CASES)
def test_abbreviate_table(name, expected):
    assert abbreviate(name, max_len=None) == expected


@pytest.mark.parametrize(
    "text,max_len,expected",
    [
        ("abcdefghij", 10, "abcdefghij"),
        ("abcdefghijk", 10, "abc...hijk"),
        ("abcdefghijk", 9, "abc...ijk"),
        ("abcdefghijk", 4, "...k"),
        ("abcdefghijk", 2, "ab"),
        ("abcdefghijk", None, "abcdefghijk"),
    ],
)
def test_truncate_middle(text, max_len, expected):
    out = truncate(text, max_len)
    assert out == expected
    if max_len is not None:
        assert len(out) <= max_len


def test_abbreviate_truncates_after_rewriting():
    name = "l_self_modules_" + "_modules_".join(f"block{i}" for i in range(20)) + "_parameters_weight_"
    out = abbreviate(name, max_len=30)
    assert len(out) == 30
    assert out.startswith("block0.block1")
    assert out.endswith("block19.weight")
    assert ELLIPSIS in out


def test_default_max_len_applies():
    assert len(abbreviate("x" * 500)) < 500


from hypothesis import given, strategies as st  # noqa: E402

# "modules"/"buffers" as module names are ambiguous in the mangled spelling itself.
_IDENT = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True).filter(lambda s: s not in ("modules", "buffers"))


@given(st.text(max_size=200), st.integers(min_value=0, max_value=80))
def test_never_longer_than_max_len(text, max_len):
    assert len(abbreviate(text, max_len=max_len)) <= max_len


@given(st.lists(st.one_of(_IDENT, st.integers(0, 99).map(str)), min_size=1, max_size=6))
def test_fx_paths_map_to_themselves_from_every_spelling(parts):
    path = ".".join(parts)
    assert abbreviate(path, max_len=None) == path
    if not parts[0].isdigit():
        source = "L['self']" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in parts)
        assert abbreviate(source, max_len=None) == path
        mangled = "l_self_" + "_".join(f"modules_{p}" for p in parts) + "_"
        assert abbreviate(mangled, max_len=None) == path
