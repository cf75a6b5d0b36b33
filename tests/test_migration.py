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

import perfetto_tp
from backend_support import run_python
from scripts.clitools import cli, summary_json
from tracefile import read_events, read_lines, traces

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "decorator_example.py"
PAGE = (ROOT / "docs" / "migration.rst").read_text()
PAGE_TEXT = " ".join(PAGE.split())  # for phrases, whatever the line breaks
ARGV = ["--flag", "value"]  # the example ignores them; SH shows the option, not its value
# the op events of the example, in order, as pydftracer's user guide shows them
GUIDE_OPS = ["function.convolution.default", "function.relu.default", "function.max_pool2d_with_indices.default",
             "function.getitem", "function.getitem", "function.view.default", "function.t.default",
             "function.addmm.default"]
# ours: a getitem that picks an output of a multi-output op computes nothing, it is no op event
OUR_OPS = [name for name in GUIDE_OPS if name != "function.getitem"]


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
    """The compiled graphs' op events (not the eager ops)."""
    return [e for e in events if e.get("cat") == "dynamo" and e.get("args", {}).get("level") != "eager"]


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
    # memory counter samples carry numbers only (Perfetto reads each arg as a series)
    assert all("hhash" in e["args"] for e in events if e["name"] != "process_name" and e["ph"] != "C")


def test_sh_holds_argv_then_interpreter(ours):
    _, _, events = ours
    cmd, exe = records(events, "SH")
    assert cmd["args"]["name"] == ";".join([str(EXAMPLE), "--flag", "***"])  # values are not recorded
    assert exe["args"]["name"] == sys.executable
    (start,) = records(events, "start")
    assert start["args"]["cmd_hash"] == cmd["args"]["value"] and start["args"]["exec_hash"] == exe["args"]["value"]


def test_start_args(ours):
    _, _, events = ours
    (start,) = records(events, "start")
    documented = records(page_sample("pydftracer 2.0.6"), "start")[0]["args"]
    assert set(start["args"]) == set(documented) | {"p_idx", "since"}
    assert start["args"]["since"] <= start["ts"]
    assert start["args"]["version"] == "0.1.0"
    assert start["args"]["p_idx"] == -1  # the example's process_id


def test_thread_name(ours):
    _, _, events = ours
    (t,) = [r for r in records(events, "thread_name") if r["tid"] == r["pid"]]  # and the memory sampler's
    assert t["args"] == {"hhash": t["args"]["hhash"], "name": "MainThread"}
    first_event = next(e for e in events if e["ph"] == "X" and e["name"] != "start" and e["tid"] == t["tid"])
    assert t["id"] < first_event["id"]


def test_op_names_category_ts_dur(ours):
    _, _, events = ours
    assert [e["name"] for e in ops(events)] == OUR_OPS
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
    # gc: a slice for each garbage collection that ran in the step windows (compiling allocates: some may)
    assert {e["cat"] for e in events} - {"gc"} == {"dftracer", "dynamo", "dynamo_graph", "dynamo_compile", "module",
                                                   "memory"}
    (end,) = records(events, "end")
    written = [e for e in events if e["ph"] in ("X", "C") and e["name"] not in ("start", "end")]
    assert end["args"]["num_events"] == len(written) and end["args"]["dropped"] == 0
    assert end["id"] - 1 == len(events) - 1  # pydftracer's count: every record before it


def test_page_sample_of_ours_matches_a_real_trace(ours):
    _, _, events = ours
    for sample in page_sample("dftrace_dynamo"):
        real = records(events, sample["name"])
        assert real, sample["name"]
        assert set(sample) == set(real[0]) and set(sample["args"]) == set(real[0]["args"]), sample["name"]


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


PYD_SCRIPT = EXAMPLE.read_text().replace("from dftrace_dynamo import", "from dftracer.python import")
# pydftracer's forward graph holds a detach of the ReLU output that ours has not
PYD_OPS = GUIDE_OPS[:2] + ["function.detach.default"] + GUIDE_OPS[2:]


def run_pydftracer(cwd, env, argv=ARGV):
    """The example with pydftracer's import line, run in ``cwd``: its trace files."""
    pytest.importorskip("dftracer.python")
    script = cwd / "pyd_example.py"
    script.write_text(PYD_SCRIPT)
    run_python([str(script), *argv], cwd, env, timeout=600, fresh=True)  # pydftracer reads /proc/self/cmdline
    return script, traces(cwd, "*-app.pfw*")


def json_records(path):
    # pydftracer's layout: one object per line, no brackets
    return [json.loads(line) for line in read_lines(path) if line.strip()]


@pytest.fixture(scope="module")
def pyd(ours):
    cwd = ours[0]  # the same host and directory as ours, to compare the hashes
    script, (path,) = run_pydftracer(cwd, {"DFTRACER_ENABLE": "1", "DFTRACER_INC_METADATA": "1"})
    return cwd, script, path, json_records(path)


def page_imports(tool):
    return re.findall(r"``(from %s import [\w, ]+)``" % re.escape(tool), PAGE)


def test_the_pages_import_lines_work_in_both_tools():
    pytest.importorskip("dftracer.python")
    before, after = page_imports("dftracer.python"), page_imports("dftrace_dynamo")
    assert len(before) == len(after) == 2
    for line in before + after:
        exec(line, {})
    assert "pydftracer has no such name" in PAGE_TEXT
    with pytest.raises(ImportError):
        exec("from dftracer.python import dftracer_dynamo_backend", {})


CALL_FORMS = """
import torch
from {tool} import dftracer, dynamo

log = dftracer.initialize_log("forms.pfw", None, -1)
def f(x):
    return torch.sin(x) + 1
x = torch.randn(3)
for compiled in (dynamo.compile(f_py=f), dynamo.compile(f, False), dynamo.compile(autograd=False)(f)):
    assert torch.equal(compiled(x), f(x))
log.finalize()
"""


def test_pydftracers_call_forms(tmp_path):
    pytest.importorskip("dftracer.python")
    (tmp_path / "pyd.py").write_text(CALL_FORMS.format(tool="dftracer.python"))
    run_python(["pyd.py"], tmp_path, {"DFTRACER_ENABLE": "1"})  # what pydftracer accepts...
    (tmp_path / "ours.py").write_text(CALL_FORMS.format(tool="dftrace_dynamo"))
    run_python(["ours.py"], tmp_path, {"DFTRACER_ENABLE": "1"})  # ...ours accepts, at the same levels
    (path,) = traces(tmp_path, "forms-*-[0-9]*.pfw.gz")
    levels = [e["args"]["level"] for e in read_events(path) if e.get("cat") == "dynamo_graph"]
    assert levels == ["aten", "torch", "torch"]


def test_pydftracer_sample_of_the_page_matches_a_real_trace(pyd):
    _, _, _, real = pyd
    for sample in page_sample("pydftracer 2.0.6"):
        match = next((e for e in real if e["name"] == sample["name"]), None)
        assert match, sample["name"]
        assert set(sample) == set(match) and set(sample["args"]) == set(match["args"]), sample["name"]
        assert type(sample["ph"]) is type(match["ph"]) is int
        assert type(sample["args"].get("version")) is type(match["args"].get("version"))


def test_pydftracer_layout_and_file(pyd):
    cwd, _, path, events = pyd
    assert re.fullmatch(r"dynamo_trace-[0-9a-f]{16}-app\.pfw\.gz", os.path.basename(path))
    assert (cwd / "dft.log").exists()
    assert read_lines(path)[0].startswith("{")  # no "["
    assert all(("id" in e) == (e["ph"] == 1) for e in events) and {e["ph"] for e in events} == {1, 4}
    counted = [e["id"] for e in events if "id" in e]
    assert counted == list(range(1, len(counted) + 1))
    (end,) = records(events, "end")
    assert end["args"]["num_events"] == end["id"] - 1
    assert [e["args"]["name"] for e in records(events, "CM")] == ["time_metric"]


def test_hosts_and_directories_hash_differently(ours, pyd):
    _, _, theirs = ours
    _, _, _, pyd_events = pyd
    for name in ("HH", "FH"):
        (a,), (b,) = records(theirs, name), records(pyd_events, name)
        assert a["args"]["name"] == b["args"]["name"] and a["args"]["value"] != b["args"]["value"], name


def test_pydftracer_sh_start_thread_name(pyd):
    _, script, _, events = pyd
    cmd, program = records(events, "SH")
    assert cmd["args"]["name"].split(";") == [sys.executable, str(script), *ARGV]  # the interpreter as typed
    assert program["args"]["name"] == script.name
    (start,) = records(events, "start")
    assert start["args"]["version"] == 20003 and not {"p_idx", "level"} & set(start["args"])
    (thread,) = records(events, "thread_name")
    assert thread["args"]["name"] == str(thread["tid"]) and thread["args"]["value"] == "thread_name"
    assert events.index(thread) < events.index(start)


def test_pydftracer_ops(pyd):
    _, _, _, events = pyd
    assert [e["name"] for e in ops(events)] == PYD_OPS
    for e in ops(events):
        assert isinstance(e["dur"], int) and isinstance(e["ts"], int)
        assert e["args"] == {"hhash": e["args"]["hhash"], "grad_enabled": 0}
    assert {e["cat"] for e in events} == {"dftracer", "dynamo"}
    assert "records nine ops, ``function.detach.default`` among them" in PAGE_TEXT


def test_pydftracer_without_inc_metadata_writes_no_args(tmp_path):
    _, (path,) = run_pydftracer(tmp_path, {"DFTRACER_ENABLE": "1"})
    events = json_records(path)
    assert not records(events, "FH") and not records(events, "SH")
    assert [e["name"] for e in ops(events)] == PYD_OPS and all("args" not in e for e in ops(events))


def test_perfetto_shows_ours_and_nothing_of_pydftracers_until_converted(ours, pyd):
    count = "select count(*) as n from slice"
    assert perfetto_tp.rows(pyd[2], count) == [{"n": 0}]
    assert perfetto_tp.rows(ours[1], count)[0]["n"] >= len(OUR_OPS)
    converted = pyd[0] / "converted.pfw.gz"
    assert cli("convert", pyd[2], "-o", converted).returncode == 0
    names = [r["name"] for r in perfetto_tp.rows(converted, "select name from slice order by ts")]
    assert [n for n in names if n.startswith("function.")] == PYD_OPS and {"start", "end"} <= set(names)
    assert "``dftrace-dynamo convert`` writes a copy that Perfetto shows" in PAGE_TEXT


def test_tracing_off_with_enable_unset(tmp_path):
    # pydftracer: no trace, only its debug log; ours: initialize_log traces
    _, written = run_pydftracer(tmp_path, {})
    assert written == [] and (tmp_path / "dft.log").exists()
    run_python([str(EXAMPLE)], tmp_path, {})
    assert len(traces(tmp_path, "dynamo_trace-*-[0-9]*.pfw.gz")) == 1


def test_summary_reads_pydftracers_trace(pyd):
    doc, _ = summary_json(pyd[2])
    assert doc["op_events"] == len(PYD_OPS)
    assert {row["key"] for row in doc["views"]["op"]} >= {"function.convolution.default", "function.addmm.default"}


def test_validate_says_perfetto_shows_pydftracers_trace_empty(pyd):
    p = cli("validate", pyd[2])
    assert p.returncode == 1, p.stdout + p.stderr
    assert "1 problem" in p.stdout and "line 1: 'ph' is a number (4): Perfetto opens this file as an empty trace" \
        in p.stdout, p.stdout


def test_configuration_names_where_the_meanings_differ():
    pytest.importorskip("dftracer.python")
    p = run_python(["-c", "from dftracer.python import env; print(env.DFTRACER_LOG_LEVEL)"], None, {})
    assert p.stdout.strip() == "ERROR"
    page = " ".join((ROOT / "docs" / "configuration.rst").read_text().split())
    assert "DFTracer defaults to ``ERROR``" in page and "``DFTRACER_INC_METADATA``: in DFTracer, ``1`` is needed" in page


@pytest.mark.parametrize("autograd, level", [(True, "aten"), (False, "torch")])
def test_create_backend_takes_pydftracers_positional_autograd(autograd, level):
    from dftrace_dynamo import create_backend

    backend = create_backend(None, None, None, None, None, True, autograd)  # pydftracer 2.0.6's order
    assert backend.level == level
    assert create_backend(level="torch").level == "torch"
