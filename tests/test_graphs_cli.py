"""``profile``, ``explore`` and ``graph`` end to end through the ``dftrace-dynamo`` command."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from scripts.clitools import assert_bad_input, cli

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
""")


@pytest.fixture(scope="module")
def bert_json(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "tiny_bert.json"
    path.write_text(json.dumps(TINY_BERT))
    return path


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


def test_profile_table_custom_model_falls_back_to_dynamo(custom_module):
    p = cli("profile", "gated_model:Gated", "--showshape", "--runs", "1", "--peak-flops", "1T", "--mem-bw", "1G",
            cwd=custom_module, env={"PYTHONPATH": str(custom_module)})
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "tracing:           dynamo (symbolic_trace failed: TraceError" in out
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
    assert p.returncode == 1, p.stderr
    assert (tmp_path / "bert.dot").exists() and not (tmp_path / "bert.svg").exists()
    assert "apt-get install graphviz" in p.stderr and "dot -Tsvg" in p.stderr
    (code,) = (tmp_path / "code").iterdir()
    assert code.name == "tiny_bert_graph_0.py"
    run = subprocess.run([sys.executable, str(code)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "(1, 8, 32)" in run.stdout


@pytest.mark.parametrize("args,fragment", [
    (["profile", "no-such-model-xyz"], "unknown model 'no-such-model-xyz'"),
    (["profile", "bert", "--peak-flops", "1T"], "--peak-flops and --mem-bw go together"),
    (["profile", "bert", "--mem-bw", "fast"], "is not a positive number"),
    (["profile", "bert", "--runs", "-1"], "--runs must be >= 0"),
    (["explore", "bert", "--start", "0"], "--start must be >= 1"),
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
