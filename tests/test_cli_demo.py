"""dftrace-dynamo demo: the README's first command."""

import re

import perfetto_tp
from scripts.clitools import assert_bad_input, cli
from tracefile import read_events


def test_demo_trains_traces_summarises_and_explains_perfetto(tmp_path):
    p = cli("demo", "--out", tmp_path, "--steps", "2")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert re.search(r"^step 1: loss \d", out, re.M)
    assert "Top ops by total time" in out and "By module path" in out
    assert "https://ui.perfetto.dev" in out and '"Open trace file"' in out
    path = re.search(r"^Trace: (\S+)$", out, re.M).group(1)
    assert path.startswith(str(tmp_path)) and path.endswith(".pfw.gz")
    events = read_events(path)
    op_events = [e for e in events if e.get("ph") == "X" and "node" in e.get("args", {})]
    # step 0 compiled: a warm-up step, left out of the summary's statistics
    assert "steps: 2; warm-up, left out of every statistic (--include-warmup counts it): step 0 compiled" in out
    assert "Steps (ms;" in out
    eager = [e for e in events if e.get("ph") == "X" and e.get("args", {}).get("level") == "eager"]  # loss, optimizer
    assert f": {len([e for e in op_events + eager if e['args'].get('step') == 1]):,} op events" in out
    assert {e["args"]["phase"] for e in op_events} == {"forward", "backward"}
    assert {e["args"]["step"] for e in op_events} == {0, 1}
    assert {"conv1", "conv2", "fc"} <= {e["args"].get("module") for e in op_events}
    assert "function.convolution_backward.default" in {e["name"] for e in op_events}
    assert perfetto_tp.error_stats(path) == []
    assert cli("validate", path).returncode == 0


def test_demo_bad_steps(tmp_path):
    assert_bad_input(cli("demo", "--out", tmp_path, "--steps", "0"), "--steps")
