"""docs/migration.rst holds: each row of its table, checked on the trace of pydftracer's first
user-guide example (examples/decorator_example.py), against the pydftracer trace the page shows and,
where pydftracer is installed, against a trace pydftracer writes here."""

import json
import os
import pathlib
import re
import socket
import sys

import pytest

from backend_support import run_python
from tracefile import read_events, read_lines, traces

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "decorator_example.py"
PAGE = (ROOT / "docs" / "migration.rst").read_text()
ARGV = ["--flag", "value"]  # the example ignores them; SH shows them
# the op events of the example, in order, as pydftracer's user guide shows them
GUIDE_OPS = ["function.convolution.default", "function.relu.default", "function.max_pool2d_with_indices.default",
             "function.getitem", "function.getitem", "function.view.default", "function.t.default",
             "function.addmm.default"]


def page_sample(caption):
    """The JSON records of the page's code block with this caption."""
    block = re.search(r":caption: " + re.escape(caption) + r"\n\n((?:   .*\n)+)", PAGE).group(1)
    return [json.loads(line) for line in block.split("\n") if line.strip().startswith("{")]


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("ours")
    run_python([str(EXAMPLE), *ARGV], cwd, {"DFTRACER_ENABLE": "1"}, timeout=600)
    (path,) = traces(cwd)
    return cwd, path, read_events(path)


def records(events, name):
    return [e for e in events if e.get("name") == name]


def ops(events):
    return [e for e in events if e.get("cat") == "dynamo"]


def test_file_name_and_place(ours):
    cwd, path, events = ours
    pid = events[0]["pid"]
    assert re.fullmatch(r"dynamo_trace-[0-9a-f]{16}-%d\.pfw\.gz" % pid, os.path.basename(path))
    assert os.path.dirname(path) == str(cwd)


def test_layout_and_ids(ours):
    _, path, events = ours
    lines = read_lines(path)
    assert lines[0] == "[" and lines[-1] == "]"
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))


def test_hh_fh(ours):
    cwd, _, events = ours
    (hh,), (fh,) = records(events, "HH"), records(events, "FH")
    assert hh["args"]["name"] == socket.gethostname() and fh["args"]["name"] == str(cwd)


def test_process_name_has_no_hhash(ours):
    _, _, events = ours
    (p,) = records(events, "process_name")
    assert p["args"] == {"name": f"decorator_example {p['pid']}"}
    assert all("hhash" in e["args"] for e in events if e["name"] != "process_name")


def test_sh_holds_argv_then_interpreter(ours):
    _, _, events = ours
    cmd, exe = records(events, "SH")
    assert cmd["args"]["name"] == ";".join([str(EXAMPLE), *ARGV])
    assert exe["args"]["name"] == sys.executable
    (start,) = records(events, "start")
    assert start["args"]["cmd_hash"] == cmd["args"]["value"] and start["args"]["exec_hash"] == exe["args"]["value"]


def test_start_args(ours):
    _, _, events = ours
    (start,) = records(events, "start")
    documented = records(page_sample("pydftracer 2.0.6"), "start")[0]["args"]
    assert set(start["args"]) == set(documented) - {"level"}
    assert start["args"]["p_idx"] == -1  # the example's process_id


def test_thread_name(ours):
    _, _, events = ours
    (t,) = records(events, "thread_name")
    assert t["args"] == {"hhash": t["args"]["hhash"], "name": "MainThread"}
    first_event = next(e for e in events if e["ph"] == "X" and e["name"] != "start" and e["tid"] == t["tid"])
    assert t["id"] < first_event["id"]


def test_op_names_category_ts_dur(ours):
    _, _, events = ours
    assert [e["name"] for e in ops(events)] == GUIDE_OPS
    assert all(isinstance(e["ts"], int) for e in events if "ts" in e)
    durs = [e["dur"] for e in ops(events)]
    assert all(round(d, 3) == d for d in durs) and any(d != int(d) for d in durs)


def test_op_args(ours):
    _, _, events = ours
    for e in ops(events):
        assert {"hhash", "graph", "node", "grad_enabled", "phase"} <= set(e["args"]) <= \
            {"hhash", "graph", "node", "module", "step", "grad_enabled", "phase"}, e
        # a training forward: the real grad mode, not pydftracer's constant 0
        assert (e["args"]["grad_enabled"], e["args"]["phase"]) == (1, "forward")
    modules = {e["name"]: e["args"].get("module") for e in ops(events)}
    assert modules["function.convolution.default"] == "conv" and modules["function.addmm.default"] == "fc"


def test_other_categories_and_end(ours):
    _, _, events = ours
    assert {e["cat"] for e in events} == {"dftracer", "dynamo", "dynamo_graph", "dynamo_compile", "module"}
    (end,) = records(events, "end")
    written = [e for e in events if e["ph"] == "X" and e["name"] not in ("start", "end")]
    assert end["args"]["num_events"] == len(written) and end["args"]["dropped"] == 0
    assert end["id"] - 1 == len(events) - 1  # pydftracer's count: every record before it


def test_page_sample_of_ours_matches_a_real_trace(ours):
    _, _, events = ours
    for sample in page_sample("dftrace_dynamo"):
        real = records(events, sample["name"])
        assert real, sample["name"]
        assert set(sample) == set(real[0]) and set(sample["args"]) == set(real[0]["args"]), sample["name"]


def test_page_sample_of_pydftracer_matches_the_table():
    sample = page_sample("pydftracer 2.0.6")
    (thread,) = records(sample, "thread_name")
    assert thread["args"]["name"] == str(thread["tid"]) and thread["args"]["value"] == "thread_name"
    for e in ops(sample):
        assert e["args"] == {"hhash": e["args"]["hhash"], "p_idx": -1, "grad_enabled": 0, "level": 1}
        assert isinstance(e["dur"], int)
    (end,) = records(sample, "end")
    assert end["args"]["num_events"] == end["id"] - 1
    assert "level" in records(sample, "start")[0]["args"]


@pytest.mark.parametrize("env, reason", [({}, "DFTRACER_ENABLE is unset and initialize_log() has not been called"),
                                         ({"DFTRACER_ENABLE": "0"}, "DFTRACER_ENABLE=0")])
def test_tracing_off_is_said_once_at_info_level(tmp_path, env, reason):
    # the example without initialize_log, two compiled functions
    code = EXAMPLE.read_text().replace('df_logger = dftracer.initialize_log("dynamo_trace.pfw", "/tmp/data", -1)', "")
    code = code.replace("df_logger.finalize()", "print(torch.compile(lambda x: x + 1, backend='dftrace')(sample).shape)")
    assert "initialize_log" not in code
    script = tmp_path / "example.py"
    script.write_text(code)
    p = run_python([str(script)], tmp_path, {**env, "DFTRACER_LOG_LEVEL": "INFO"})
    assert [line for line in p.stderr.splitlines() if "tracing is off" in line] == [
        f"dftrace_dynamo: tracing is off ({reason}): nothing is recorded"]
    assert traces(tmp_path) == []
    quiet = run_python([str(script)], tmp_path, env)  # default level: nothing said
    assert "tracing is off" not in quiet.stderr


def test_pydftracer_writes_what_the_table_says(tmp_path):
    pytest.importorskip("dftracer.python")
    script = tmp_path / "pyd_example.py"
    script.write_text(EXAMPLE.read_text().replace("from dftrace_dynamo import", "from dftracer.python import"))
    run_python([str(script), *ARGV], tmp_path,
               {"DFTRACER_ENABLE": "1", "DFTRACER_INC_METADATA": "1", "DFTRACER_DISABLE_IO": "1"}, timeout=600)
    (path,) = traces(tmp_path, "dynamo_trace*.pfw*")
    # whatever the core's layout ([ ... ] or bare lines), one JSON object per line
    events = [json.loads(line) for line in read_lines(path) if line.startswith("{")]
    (thread,) = records(events, "thread_name")
    assert thread["args"]["name"] == str(thread["tid"]) and thread["args"]["value"] == "thread_name"
    cmd = records(events, "SH")[0]["args"]["name"].split(";")
    assert cmd[-3:] == [str(script), *ARGV] and len(cmd) == 4  # the interpreter first
    op_events = ops(events)
    assert {e["name"] for e in op_events} >= set(GUIDE_OPS)
    assert all(isinstance(e["dur"], int) and e["args"]["grad_enabled"] == 0 for e in op_events)
    assert {e["cat"] for e in events} == {"dftracer", "dynamo"}
