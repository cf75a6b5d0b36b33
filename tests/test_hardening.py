"""Nothing the program hands to the tracer raises into it; no secret reaches the trace; a write
that fails says so. Values that cannot be written are written in the documented form (or the
event dropped), counted in finalize()'s ``adjusted``, and the trace still loads in Perfetto and
passes dftracer_validate."""

import json
import os
import re
import shutil
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import perfetto_tp
from scripts.clitools import cli
from subproc import run_py, run_python
from test_core_disk_full import MESSAGE
from tracefile import dftracer_validate, read_events, read_lines, traces

from dftrace_dynamo import dftracer
from dftrace_dynamo.session import logger

ONCE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
NOW_US = logger.get_time()
SPECIAL = [float("nan"), float("inf"), -float("inf"), 1e30, 1e18, -1e6, -5.0, 5e-324, -5e-324,
           2.2250738585072014e-308, 0.0, -0.0, 2**70, -(2**70), 9.3e15]
NUMBERS = st.one_of(st.sampled_from(SPECIAL), st.floats(), st.integers(-(2**80), 2**80),
                    st.floats(-1e9, 1e9))
STARTS = st.one_of(NUMBERS, st.floats(NOW_US - 1e9, NOW_US + 1e9))


class Unprintable:
    def __str__(self):
        raise RuntimeError("the user's own bug")

    __repr__ = __str__


def nested(depth, leaf, dicts):
    for _ in range(depth):
        leaf = {"k": leaf} if dicts else [leaf]
    return leaf


def self_referencing(kind):
    if kind == "list":
        a = [1]
        a.append(a)
    else:
        a = {"x": 1}
        a["me"] = a
    return a


ARGS = st.one_of(
    st.builds(nested, st.integers(0, 1100), st.sampled_from([1, "s", None, Unprintable()]), st.booleans()),
    st.builds(self_referencing, st.sampled_from(["list", "dict"])),
    st.builds(Unprintable),
    st.sampled_from([float("nan"), 2**70, 10**5000]),  # 10**5000: repr() raises past 4300 digits
)


def loads_everywhere(path):
    assert perfetto_tp.error_stats(path) == []
    dftracer_validate(path)


@pytest.fixture
def trace(tmp_path):
    log = dftracer.initialize_log(str(tmp_path / "t"))
    before = logger.adjusted()
    yield log, before
    log.finalize()


def test_log_event_any_numbers_never_raise(tmp_path, trace):
    log, before = trace
    calls = []

    @ONCE
    @given(start=STARTS, dur=NUMBERS)
    def one(start, dur):
        calls.append((start, dur))
        dftracer.log_event("n", "user", start, dur, {"i": len(calls)})

    one()
    res = log.finalize()
    adjusted = {k: n - before.get(k, 0) for k, n in res["adjusted"].items()}
    (path,) = traces(tmp_path)
    events = [e for e in read_events(path) if e["name"] == "n"]
    # dropped (start or duration not writable) or written: every call is accounted for
    assert len(events) + adjusted.get("start", 0) + adjusted.get("duration", 0) == len(calls)
    for e in events:  # written as given: start to the µs, duration to the ns (negative: 0)
        start, dur = calls[e["args"]["i"] - 1]
        assert abs(e["ts"] - start) <= 1 and abs(e["dur"] - max(dur, 0)) <= 1e-3 + abs(dur) * 1e-12
    assert adjusted.get("negative duration", 0) == sum(1 for e in events if round(calls[e["args"]["i"] - 1][1] * 1000) < 0)
    loads_everywhere(path)


def test_the_issue_numbers_are_dropped_or_clamped_and_counted_once_each(tmp_path):
    p = run_py("""
        from dftrace_dynamo import dftracer
        log = dftracer.initialize_log("t")
        t = dftracer.get_time()
        for start, dur in [(t, float("nan")), (t, float("inf")), (t, 1e30), (1e18, 1), (-1e6, 1), (t, -5),
                           (t, -7), (t, 2)]:
            dftracer.log_event("e", "user", start, dur)
        print(log.finalize()["adjusted"])
    """, tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str({"duration": 3, "start": 2, "negative duration": 2})
    assert len(p.stderr.splitlines()) == 3  # one message per kind
    (path,) = traces(tmp_path)
    assert [e["dur"] for e in read_events(path) if e["name"] == "e"] == [0, 0, 2]
    loads_everywhere(path)


def test_hostile_args_never_raise_in_log_event_region_and_tags(tmp_path, trace):
    from dftrace_dynamo import _core
    from dftrace_dynamo.backend.tracer import Tags

    log, _ = trace
    tags, site = Tags(), _core.intern_site("op", "dynamo")
    n = []

    @ONCE
    @given(value=ARGS, key=st.sampled_from(["v", Unprintable(), 3]))
    def one(value, key):
        n.append(1)
        dftracer.log_event("e", "user", dftracer.get_time(), 1.0, {key: value, "i": len(n)})
        with dftracer.region("r", v=value, i=len(n)):
            pass
        tags.update(args={"v": value, "i": len(n)})
        _core.record(site, _core.now_ns(), _core.now_ns() + 1000, 0, tags.cell.id)

    one()
    log.finalize()
    (path,) = traces(tmp_path)
    events = read_events(path)
    for name in ("e", "r", "op"):
        assert [e["args"]["i"] for e in events if e["name"] == name] == list(range(1, len(n) + 1))
    text = "\n".join(read_lines(path))
    assert '"<unprintable Unprintable>"' in text and '"[...]"' in text and '"{...}"' in text
    loads_everywhere(path)


class RaisingEq(str):
    def __eq__(self, other):
        raise RuntimeError("the user's own __eq__")

    __hash__ = str.__hash__


class RaisingStr(str):
    def __str__(self):
        raise RuntimeError("the user's own __str__")


def test_str_subclass_keys_whose_eq_or_str_raise_never_reach_the_caller(tmp_path, trace):
    log, before = trace
    keys = [RaisingEq("hhash"), RaisingEq("a"), RaisingStr("b"), RaisingStr("hhash")]
    for i, key in enumerate(keys):
        dftracer.log_event("e", "user", dftracer.get_time(), 1.0, {key: i, "i": i})
    res = log.finalize()
    assert res["adjusted"].get("field hhash", 0) - before.get("field hhash", 0) == 2
    (path,) = traces(tmp_path)
    args = [e["args"] for e in read_events(path) if e["name"] == "e"]
    # written by their text; one named like the tracer's field keeps both, the user's renamed
    assert [{k: v for k, v in a.items() if k not in ("hhash", "step")} for a in args] == [
        {"user_hhash": 0, "i": 0}, {"a": 1, "i": 1}, {"b": 2, "i": 2}, {"user_hhash": 3, "i": 3}]
    assert all(len(a["hhash"]) == 16 for a in args)
    loads_everywhere(path)


CUT = re.compile(r"(.*)… \[cut: (\d+) of (\d+) characters kept\]", re.DOTALL)


def cut_text(text):
    """(the one character a cut text repeats, its length before the cut), checking the marker's count."""
    m = CUT.fullmatch(text)
    assert m and len(m[1]) == int(m[2]) and len(set(m[1])) == 1 and len(m[1].encode()) <= 2 << 20, text[-80:]
    return m[1][0], int(m[3])


def test_values_past_the_line_limit_are_cut_with_a_marker_and_every_reader_loads_the_file(tmp_path):
    p = run_py("""
        from dftrace_dynamo import dftracer
        class HugeStr:
            def __str__(self):
                return "s" * (17 << 20)
        log = dftracer.initialize_log("t")
        t = dftracer.get_time()
        dftracer.log_event("big", "user", t, 1.0, {"a": "x" * (17 << 20), "i": 0})
        dftracer.log_event("many", "user", t, 1.0, {"l": ["\\u00e9" * (400 << 10)] * 40, "i": 1})
        dftracer.log_event("n" * (17 << 20), "user", t, 1.0, {"i": 2})
        dftracer.log_event("keys", "user", t, 1.0, {"k" * (3 << 20): 1, "o": HugeStr(), "i": 3})
        dftracer.log_event("wide", "user", t, 1.0, {f"k{j}": "\\n" * (200 << 10) for j in range(100)})
        dftracer.log_event("small", "user", t, 1.0, {"a": "y" * 1000, "i": 5})
        print(log.finalize()["adjusted"].get("cut"))
    """, tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert int(p.stdout) >= 6
    assert len(p.stderr.splitlines()) == 1 and "cut" in p.stderr
    (path,) = traces(tmp_path)
    lines = read_lines(path)
    assert max(len(line.encode()) for line in lines) < 16 << 20
    events = [e for e in read_events(path) if e.get("cat") == "user"]
    assert len(events) == 6
    big, many, name, keys, wide, small = events
    assert cut_text(big["args"]["a"]) == ("x", 17 << 20) and big["args"]["i"] == 0
    # the list stops at 6 MiB of args, and so does the dict around it
    assert many["args"]["l"][-1] == "…" and many["args"]["…"] == "[cut: the args passed 6 MiB]"
    assert 6 << 20 < len("".join(many["args"]["l"]).encode()) < 7 << 20
    assert all(v == "\u00e9" * (400 << 10) for v in many["args"]["l"][:-1])
    assert cut_text(name["name"]) == ("n", 17 << 20)
    assert cut_text(keys["args"]["o"]) == ("s", 17 << 20) and keys["args"]["i"] == 3
    assert [cut_text(k) for k in keys["args"] if k.startswith("k")] == [("k", 3 << 20)]
    assert wide["args"]["…"] == "[cut: the args passed 6 MiB]" and len(wide["args"]) < 100
    assert small["args"] == {"hhash": small["args"]["hhash"], "a": "y" * 1000, "i": 5}
    loads_everywhere(path)


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_args_are_cut_at_the_documented_depth(tmp_path, trace, kind):
    log, _ = trace
    dftracer.log_event("e", "user", dftracer.get_time(), 1.0, {"d": nested(1000, 7, kind == "dict")})
    adjusted = log.finalize()["adjusted"]
    (path,) = traces(tmp_path)
    (e,) = [e for e in read_events(path) if e["name"] == "e"]
    value, depth = e["args"]["d"], 0
    while isinstance(value, (list, dict)):
        value, depth = value[0] if kind == "list" else value["k"], depth + 1
    assert depth == logger.ARGS_DEPTH and value == ("[...]" if kind == "list" else "{...}")
    assert adjusted["deep"] >= 1


# ---- secrets -----------------------------------------------------------------------------
# (argument words, the secret in them): the first 11 were written in clear before
CREDENTIALS = [
    (["postgres://alice:S3cr3t01@h/db"], "S3cr3t01"),
    (["https://bob:S3cr3t02@host/repo.git"], "S3cr3t02"),
    (["-p", "S3cr3t03"], "S3cr3t03"),
    (["-k", "S3cr3t04"], "S3cr3t04"),
    (["--pass", "S3cr3t05"], "S3cr3t05"),
    (["--pwd=S3cr3t06"], "S3cr3t06"),
    (["--auth", "Bearer", "S3cr3t07"], "S3cr3t07"),
    (["--authorization=Basic S3cr3t08"], "S3cr3t08"),
    (["--cookie", "sessionid=S3cr3t09"], "S3cr3t09"),
    (["--token", "--x=S3cr3t10"], "S3cr3t10"),
    (["--password", "-S3cr3t11"], "S3cr3t11"),
    (["--password", "S3cr3t12"], "S3cr3t12"),
    (["--password=S3cr3t13"], "S3cr3t13"),
    (["--api-key=S3cr3t14"], "S3cr3t14"),
    (["--token", "S3cr3t15"], "S3cr3t15"),
    (["--secret", "S3cr3t16"], "S3cr3t16"),
    (["db.password=S3cr3t17"], "S3cr3t17"),
    (["--Auth_Token", "S3cr3t18"], "S3cr3t18"),
    (["--credentials-file=/home/u/S3cr3t19.json"], "S3cr3t19"),
]
ARGV = [word for words, _ in CREDENTIALS for word in words]
SCRIPT = "from dftrace_dynamo import dftracer\ndftracer.initialize_log().finalize()\n"


def command_record(path, script):
    (cmd,) = [e for e in read_events(path) if e["name"] == "SH" and script in e["args"]["name"]]
    return cmd["args"]["name"]


@pytest.mark.parametrize("how", ["script", "run"])
@pytest.mark.parametrize("record_args", [False, True])
def test_credentials_on_the_command_line(tmp_path, how, record_args):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {"DFTRACER_RECORD_ARGS": "1"} if record_args else {}
    if how == "script":
        run_python([str(script), *ARGV], tmp_path, env=env, timeout=120)
        (path,) = traces(tmp_path)
    else:
        p = cli("run", "--out", tmp_path / "out", script, *ARGV, cwd=tmp_path, env=env)
        assert p.returncode == 0, p.stderr
        (path,) = traces(tmp_path / "out", "*/*.pfw*")
    cmd = command_record(path, "train.py")
    if record_args:
        assert cmd.split(";") == [str(script), *ARGV]
    else:
        text = "\n".join(read_lines(path))
        assert [s for _, s in CREDENTIALS if s in text] == []
        assert cmd.split(";")[:8] == [str(script), "***", "***", "-p", "***", "-k", "***", "--pass"]


def test_url_credentials_are_removed_from_the_script_path(tmp_path):
    script = "https://carol:S3cr3t20@host/w/train.py"  # relative: a directory "https:" in tmp_path
    os.makedirs(tmp_path / os.path.dirname(script))
    (tmp_path / script).write_text(SCRIPT)
    run_python([script], tmp_path, timeout=120)
    (path,) = traces(tmp_path)
    assert not any("S3cr3t20" in line for line in read_lines(path))
    assert command_record(path, "train.py") == "https://host/w/train.py"


# ---- failed writes -------------------------------------------------------------------------
DELETE_CHILD = textwrap.dedent("""
    import json, shutil, sys
    import dftrace_dynamo
    from dftrace_dynamo import _core
    dftrace_dynamo.initialize_log(logfile=sys.argv[1] + "/t")
    for i in range(20_000):
        with dftrace_dynamo.region("r", i=i):
            pass
        if i == 10_000:
            _core.flush()
            shutil.rmtree(sys.argv[1])
    _core.flush()
    print("at the write:", file=sys.stderr, flush=True)
    print(json.dumps(dftrace_dynamo.finalize()))
""")


def test_output_directory_deleted_mid_run_is_reported_when_writing_fails(tmp_path):
    out = run_python(["-W", "error", "-c", DELETE_CHILD, str(tmp_path / "out")], timeout=120)
    message, marker = out.stderr.splitlines()  # the message comes at the failed write, before finalize
    assert marker == "at the write:"
    m = MESSAGE.match(message)
    assert m and m.group(2) == "No such file or directory" and m.group(3) == "0" and int(m.group(4)) > 10_000
    res = json.loads(out.stdout)
    # the message counts what was lost when the write failed; finalize() every event recorded
    assert res["path"] is None and res["num_events"] == 0 and res["dropped"] == 20_000 >= int(m.group(4))


UNLINK_CHILD = textwrap.dedent("""
    import json, os, sys
    import dftrace_dynamo
    from dftrace_dynamo import _core
    log = dftrace_dynamo.initialize_log(logfile=sys.argv[1] + "/t")
    for i in range(20_000):
        with dftrace_dynamo.region("r", i=i):
            pass
        if i == 5_000:
            os.unlink(log.path)
            _core.flush()  # the write that finds the file gone
            print("at the write:", file=sys.stderr, flush=True)
    print(json.dumps(dftrace_dynamo.finalize()))
""")


def test_a_trace_file_unlinked_mid_run_counts_every_event_recorded(tmp_path):
    out = run_python(["-c", UNLINK_CHILD, str(tmp_path / "out")], timeout=120)
    message, marker = out.stderr.splitlines()
    assert marker == "at the write:"
    m = MESSAGE.match(message)
    assert m and m.group(2) == "No such file or directory", message
    assert (int(m.group(3)), int(m.group(4))) == (0, 5_001)  # what was recorded when the write failed
    res = json.loads(out.stdout)
    assert (res["num_events"], res["dropped"]) == (0, 20_000)  # kept 0, lost every one recorded


def test_log_path_with_invalid_utf8_bytes_traces(tmp_path):
    directory = os.fsdecode(bytes(tmp_path) + b"/d\xff\xfe")
    p = run_py("""
        from dftrace_dynamo import dftracer, region
        with region("r"):
            pass
        print(dftracer.finalize()["num_events"])
    """, tmp_path, env={"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": directory + "/t"})
    assert p.returncode == 0 and p.stderr == "" and p.stdout.strip() == "1", p.stderr
    (name,) = os.listdir(os.fsencode(directory))
    path = os.path.join(os.fsencode(directory), name)
    copy = tmp_path / "copy.pfw.gz"
    shutil.copy(path, copy)
    assert [e["name"] for e in read_events(str(copy)) if e.get("cat") == "region"] == ["r"]


# ---- tags --------------------------------------------------------------------------------
def test_tags_named_like_tracer_fields_keep_both(tmp_path):
    p = run_py("""
        import torch
        from dftrace_dynamo import dftracer
        from dftrace_dynamo.backend import create_backend
        dftracer.initialize_log("t")
        backend = create_backend()
        backend.update(args={"graph": "y", "phase": "mine", "epoch2": 1})
        f = torch.compile(lambda x: torch.relu(x) + 1, backend=backend)
        f(torch.ones(3))
        dftracer.finalize()
    """, tmp_path)
    assert p.returncode == 0, p.stderr
    assert len(p.stderr.splitlines()) == 2 and "'graph'" in p.stderr and "'user_phase'" in p.stderr
    (path,) = traces(tmp_path)
    ops = [e for e in read_events(path) if e.get("cat") == "dynamo" and e["ph"] == "X"
           and e["args"].get("level") != "eager"]  # the graph's ops
    assert ops and all(isinstance(e["args"]["graph"], int) and e["args"]["user_graph"] == "y" for e in ops)
    assert all(e["args"]["phase"] in ("forward", "inference") and e["args"]["user_phase"] == "mine" for e in ops)
    assert all(e["args"]["epoch2"] == 1 for e in ops)
