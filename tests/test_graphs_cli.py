"""``profile``, ``explore`` and ``graph`` end to end through the ``dftrace-dynamo`` command."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from scripts.clitools import assert_bad_input, cli
from subproc import python

pytest.importorskip("transformers")

TINY_BERT = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 64, "vocab_size": 100}

CUSTOM = textwrap.dedent("""
    import torch
    import torch.nn as nn

    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.out = nn.Linear(8, 2)

        def forward(self, x):
            h = self.fc(x)
            if h.sum() > 0:  # data-dependent: symbolic_trace fails, Dynamo breaks the graph
                h = h.relu()
            return self.out(h)

    class Convs(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return self.conv(x)

    def broken():
        raise RuntimeError("checkpoint missing")
""")


@pytest.fixture(scope="module")
def bert_json(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "tiny_bert.json"
    path.write_text(json.dumps(TINY_BERT))
    return path


@pytest.fixture(scope="module")
def bert_profile_nodes(bert_json):
    """The nodes of ``profile --runs 0 --format json`` of the tiny BERT (one run, read by two tests)."""
    p = cli("profile", bert_json, "--seq-len", "8", "--runs", "0", "--format", "json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["nodes"]


@pytest.fixture(scope="module")
def custom_module(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pkg")
    (directory / "gated_model.py").write_text(CUSTOM)
    return directory


def main_status(args, capsys):
    """Runs the CLI in this process (bad input fails before any tracing), as
    :func:`cli` would: returncode, stdout, stderr."""
    from dftrace_dynamo.cli import main

    try:
        status = main([str(a) for a in args])
    except SystemExit as exc:  # argparse errors
        status = exc.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, status, out, err)


def test_profile_json_with_measured_times(bert_json):
    p = cli("profile", bert_json, "--seq-len", "8", "--batch-size", "2", "--runs", "2", "--format", "json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    summary = data["summary"]
    assert summary["method"] == "dynamo" and summary["fx_error"]
    assert summary["graphs"] == 1
    assert summary["params"] > 30_000 and summary["flops"] > 0
    assert summary["timing"] == "tracer, median of 2 run(s)"
    assert all(n["time_ns"] for n in data["nodes"])
    linears = [n for n in data["nodes"] if n["target"] == "torch.nn.functional.linear"]
    assert len(linears) == 2 * 6 + 1  # q, k, v, out, intermediate, output per layer + pooler


@pytest.mark.parametrize("where", ["current directory", "file path"])
def test_a_model_of_the_users_own_module_loads(custom_module, tmp_path, where):
    """``module:Name`` from the directory the user is in (as ``python -m`` imports), or
    ``path/to/file.py:Name`` from anywhere; no PYTHONPATH needed."""
    spec, cwd = (("gated_model:Convs", custom_module) if where == "current directory"
                 else (f"{custom_module / 'gated_model.py'}:Convs", tmp_path))
    p = cli("explore", spec, "--input-shape", "1", "3", "8", "8", cwd=cwd)
    assert p.returncode == 0, p.stderr
    assert "conv" in p.stdout
    missing = cli("explore", f"{tmp_path / 'nothing.py'}:Convs", cwd=tmp_path)
    assert_bad_input(missing, "cannot import", "no file")


def test_profile_table_custom_model_falls_back_to_dynamo(custom_module):
    p = cli("profile", "gated_model:Gated", "--showshape", "--runs", "1", "--peak-flops", "1T", "--mem-bw", "1G",
            cwd=custom_module, env={"PYTHONPATH": str(custom_module)})
    assert p.returncode == 0, p.stderr
    out = p.stdout
    # falling back to Dynamo is the normal path: no symbolic_trace error for the user
    assert "tracing:           dynamo\n" in out and "symbolic_trace" not in out + p.stderr
    assert "graph break(s)" in out and "break at" in out
    assert "machine balance 1000.00" in out
    assert "fc (Linear)" in out and "1x8" in out  # module rows and --showshape (input from the first Linear)


def test_explore_around_to_file(bert_json, tmp_path):
    target = tmp_path / "view.txt"
    p = cli("explore", bert_json, "--seq-len", "8", "--around", "50", "--context", "2", "--output", target)
    assert p.returncode == 0, p.stderr
    text = target.read_text()
    assert "Nodes 48..52 of" in text
    assert ">>   50. " in text
    assert p.stdout == ""


def test_graph_without_graphviz_and_code_export(bert_json, tmp_path):
    env = {"PATH": os.path.dirname(sys.executable)}  # no Graphviz 'dot' on this PATH
    p = cli("graph", bert_json, "--seq-len", "8", "-o", tmp_path / "bert.svg", "--code", tmp_path / "code", env=env)
    assert p.returncode == 0, p.stderr  # the DOT file is the result: set -e scripts go on
    assert (tmp_path / "bert.dot").exists() and not (tmp_path / "bert.svg").exists()
    assert "apt-get install graphviz" in p.stderr and "dot -Tsvg" in p.stderr
    (code,) = (tmp_path / "code").iterdir()
    assert code.name == "tiny_bert_graph_0.py"
    run = subprocess.run([sys.executable, str(code)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "(1, 8, 32)" in run.stdout


@pytest.mark.parametrize("args,fragment", [
    (["explore", "bert", "--around", "3", "--start", "1"], "--around cannot be combined with --start/--end"),
    (["explore", "bert", "--start", "50", "--end", "10"], "--end 10 is before --start 50"),
    (["explore", "bert", "--max-nodes", "0"], "--max-nodes must be >= 1"),
    (["profile", "bert", "--balance", "3", "--peak-flops", "1T", "--mem-bw", "1T"], "not both"),
    (["graph", "bert", "-o", "x.gif"], "unknown picture format"),
    (["profile", "bert", "--depth", "2", "--format", "csv"], "--depth applies to the table format"),
])
def test_conflicting_options_fail_fast_without_building_the_model(args, fragment):
    code = ("import sys; from dftrace_dynamo.cli import main; rc = main(sys.argv[1:]); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules)); sys.exit(rc)")
    start = time.monotonic()
    p = python(["-c", code, *args])
    elapsed = time.monotonic() - start
    assert_bad_input(p, fragment)
    assert p.stdout.strip() == "[]"  # checked before torch, transformers or the model load
    assert elapsed < 2.0, elapsed


def bad_json(tmp_path, **values):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**TINY_BERT, **values}))
    return path


@pytest.mark.parametrize("args,fragment", [
    (["profile", "gated_model:broken"], "gated_model:broken() failed: RuntimeError: checkpoint missing"),
    (["profile", "bert", "--config-set", "hidden_size=abc"], "expected int, got str"),
    (["profile", "bert", "--config-set", "num_attention_heads=0"], "num_attention_heads=0: must be positive"),
    (["profile", "bert", "--config-set", "hidden_act=nope"], "hidden_act='nope': unknown activation"),
    (["profile", "bert", "--input-shape", "1", "2", "3"], "input_ids (batch, tokens) takes 2 numbers"),
    (["profile", "gated_model:Convs", "--input-shape", "1", "3", "8"], "does not run on the example inputs"),
    (["profile", "gated_model:Convs", "--input-shape", "1", "5", "8", "8"], "expected input[1, 5, 8, 8] to have 3"),
])
def test_bad_models_and_inputs_are_one_line_exit_2(args, fragment, custom_module, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(custom_module))
    assert_bad_input(main_status(args, capsys), fragment)


def test_config_json_with_negative_sizes(tmp_path, capsys):
    p = main_status(["profile", bad_json(tmp_path, hidden_size=-32)], capsys)
    assert_bad_input(p, "config value hidden_size=-32: must be positive")


def test_t5_profiles(capsys):
    sizes = ["num_layers=1", "num_decoder_layers=1", "d_model=32", "d_ff=64", "num_heads=2", "d_kv=16",
             "vocab_size=100"]
    p = main_status(["profile", "t5", *[a for s in sizes for a in ("--config-set", s)], "--seq-len", "6",
                     "--runs", "0", "--format", "json"], capsys)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    modules = {n["module"] for n in data["nodes"]}
    assert "encoder.block.0.layer.0.SelfAttention.q" in modules
    assert "decoder.block.0.layer.1.EncDecAttention.q" in modules  # the decoder ran on decoder_input_ids
    assert data["summary"]["flops"] > 0


def test_gpt2_explore_shows_ops_not_parameters(capsys):
    p = main_status(["explore", "gpt2", "--config-set", "n_layer=1", "--config-set", "n_embd=32", "--config-set",
                     "n_head=2", "--config-set", "vocab_size=100", "--seq-len", "8", "--max-nodes", "10"], capsys)
    assert p.returncode == 0, p.stderr
    kinds = re.findall(r"^\s+\d+\. \[(\w+)\]", p.stdout, re.M)
    assert len(kinds) == 10 and kinds.count("call_function") + kinds.count("call_method") >= 7
    assert "wte.weight" in p.stdout  # named where the embedding uses it
    assert "parameter/buffer inputs, unnumbered (folded into their ops" in p.stdout


def test_profile_numbers_find_the_node_in_explore(bert_json, bert_profile_nodes):
    query = next(n for n in bert_profile_nodes if n["module"] == "encoder.layer.0.attention.self.query")
    e = cli("explore", bert_json, "--seq-len", "8", "--around", query["index"], "--context", "0")
    assert e.returncode == 0, e.stderr
    assert re.search(rf"^>>\s+{query['index']}\. \[call_function\] {query['label']} = torch.nn.functional.linear",
                     e.stdout, re.M), e.stdout
    assert "module: encoder.layer.0.attention.self.query (Linear)" in e.stdout


def test_nodes_are_numbered_from_0_without_gaps(bert_json, bert_profile_nodes):
    indices = [n["index"] for n in bert_profile_nodes]
    e = cli("explore", bert_json, "--seq-len", "8")
    assert e.returncode == 0, e.stderr
    listed = [int(n) for n in re.findall(r"^(?:>>|  )\s*(\d+)\. ", e.stdout, re.M)]
    assert listed == list(range(len(listed))) and f"Nodes 0..{len(listed) - 1} of {len(listed)}\n" in e.stdout
    # the profile's ops come after the model's inputs (input_ids, attention_mask...), in explore's numbers
    assert set(indices) <= set(listed) and 0 < min(indices) <= 3, indices[:5]
    assert "symbolic_trace" not in e.stdout + e.stderr


def test_profile_depth_table(bert_json):
    p = cli("profile", bert_json, "--seq-len", "8", "--runs", "0", "--depth", "3")
    assert p.returncode == 0, p.stderr
    table = p.stdout.split("Model summary")[0]
    assert re.search(r"^\s+1 \(BertLayer\)", table, re.M)  # encoder.layer.1, indented under encoder.layer
    assert "[linear]" not in table and "attention" not in table
    assert len(table.splitlines()) < 25


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot")
def test_graph_depth_png_with_real_graphviz(bert_json, tmp_path):
    p = cli("graph", bert_json, "--seq-len", "8", "--depth", "3", "-o", tmp_path / "bert.png")
    assert p.returncode == 0, p.stderr
    assert "warning" not in p.stderr
    size = re.search(r"wrote .*bert.png \((\d+)x(\d+) px\)", p.stderr)
    assert size and int(size.group(1)) < 3000 and int(size.group(2)) < 3000, p.stderr


@pytest.mark.parametrize("args,fragment", [
    (["profile", "no-such-model-xyz"], "unknown model 'no-such-model-xyz'"),
    (["profile", "bert", "--peak-flops", "1T"], "--peak-flops and --mem-bw go together"),
    (["profile", "bert", "--mem-bw", "fast"], "is not a positive number"),
    (["profile", "bert", "--runs", "-1"], "--runs must be >= 0"),
    (["explore", "bert", "--start", "-1"], "--start must be >= 0"),
    (["graph", "bert"], "give -o FILE"),
    (["graph", "bert", "-o", "x.jpg"], "unknown picture format"),
    (["profile", "bert", "--input-shape", "0"], "must be at least 1"),
])
def test_bad_input_is_one_line_exit_2(args, fragment, capsys):
    assert_bad_input(main_status(args, capsys), fragment)


def test_explore_range_outside_graph(bert_json, capsys):
    assert_bad_input(main_status(["explore", bert_json, "--seq-len", "8", "--start", "100000"], capsys),
                     "outside the graph")


def test_profile_with_tracing_enabled_explains_missing_times(custom_module, tmp_path):
    env = {"PYTHONPATH": str(custom_module), "DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": str(tmp_path / "t")}
    p = cli("profile", "gated_model:Gated", "--runs", "1", cwd=custom_module, env=env)
    assert p.returncode == 0, p.stderr
    assert "op times not measured: a trace is already open" in p.stderr
    assert "unset it" in p.stderr
    assert "Model summary" in p.stdout


def test_bad_input_through_the_command():
    p = cli("profile", "no-such-model-xyz")
    assert_bad_input(p, "dftrace-dynamo profile: error: unknown model")
