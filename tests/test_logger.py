"""The Python tracing core: enable rules, configuration errors, file naming,
processes (fork, spawn, threads), signals and user regions."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import perfetto_tp
from subproc import clean_env, run_py, run_python
from tracefile import read_events, read_lines, traces


def op_events(events, cat="user"):
    return [e for e in events if e.get("cat") == cat]


EMIT = """
    import torch
    from dftrace_dynamo import dftracer
    log = dftracer.initialize_log("out/run.pfw", "/tmp/data", -1)
    for i in range(3):
        dftracer.log_event(f"ev{i}", "user", dftracer.get_time(), 1.5, {"i": i})
    y = torch.ones(3) * 2
    log.finalize()
    print("done", float(y.sum()))
"""


def test_seed_style_initialize_log_writes_one_gzip_file(tmp_path):
    p = run_py(EMIT, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "done 6.0" in p.stdout
    files = traces(tmp_path / "out")
    assert len(files) == 1
    name = os.path.basename(files[0])
    assert name.startswith("run-") and name.endswith(".pfw.gz") and name.count("-") == 2
    events = read_events(files[0])
    assert [e["name"] for e in op_events(events)] == ["ev0", "ev1", "ev2"]
    assert [e["args"]["i"] for e in op_events(events)] == [0, 1, 2]
    assert all(e["dur"] == 1.5 for e in op_events(events))
    by_name = {e["name"]: e for e in events}
    assert by_name["start"]["args"]["p_idx"] == -1
    assert by_name["end"]["args"]["num_events"] == 3 and by_name["end"]["args"]["dropped"] == 0
    assert {"HH", "FH", "SH", "process_name"} <= set(by_name)
    ids = [e["id"] for e in events]
    assert ids == list(range(1, len(events) + 1))
    assert read_lines(files[0])[-1] == "]"


def test_trace_loads_in_perfetto_with_process_and_thread_names(tmp_path):
    code = """
        import threading
        from dftrace_dynamo import dftracer, region
        threading.current_thread().name = "trainer"
        log = dftracer.initialize_log("t")
        with region("epoch", epoch=0):
            for s in range(3):
                with region("step", step=s):
                    with region("data", cat="io"):
                        pass
        log.finalize()
    """
    p = run_py(code, tmp_path, env={"DFTRACER_TRACE_COMPRESSION": "0"})
    assert p.returncode == 0, p.stderr
    (path,) = traces(tmp_path)
    assert path.endswith(".pfw")
    res = perfetto_tp.query(
        path,
        perfetto_tp.ERROR_STATS_SQL,
        "select s.name, s.depth from slice s where s.name in ('epoch','step','data') order by s.ts, s.depth",
        "select t.name from thread t join thread_track tt using(utid) join slice s on s.track_id = tt.id "
        "where s.name = 'epoch'",
        "select pid, name from process where pid > 0",
    )
    assert res[0]["rows"] == []
    assert res[1]["rows"] == [["epoch", 0]] + [["step", 1], ["data", 2]] * 3
    assert res[2]["rows"] == [["trainer"]]
    ((pid, name),) = res[3]["rows"]
    assert name == f"python {pid}"


@pytest.mark.parametrize(
    "env, variable",
    [
        ({"DFTRACER_ENABLE": "yes"}, "DFTRACER_ENABLE"),
        ({"DFTRACER_WRITE_BUFFER_SIZE": "-5"}, "DFTRACER_WRITE_BUFFER_SIZE"),
        ({"DFTRACER_TRACE_COMPRESSION": "lz4"}, "DFTRACER_TRACE_COMPRESSION"),
        ({"DFTRACER_LOG_LEVEL": "loud"}, "DFTRACER_LOG_LEVEL"),
        ({"DFTRACER_BIND_SIGNALS": "2"}, "DFTRACER_BIND_SIGNALS"),
        ({"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": "/proc/no/such/dir/trace"}, "DFTRACER_LOG_FILE"),
        ({"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": "afile/trace"}, "DFTRACER_LOG_FILE"),
    ],
)
def test_bad_configuration_turns_tracing_off_with_one_message(tmp_path, env, variable):
    (tmp_path / "afile").write_text("not a directory")
    code = """
        import torch
        from dftrace_dynamo import dftracer, region
        INIT
        with region("work"):
            y = torch.ones(4).sum()
        dftracer.log_event("x", "user", dftracer.get_time(), 1.0)
        print("result", float(y))
    """
    code = code.replace("INIT", "" if variable == "DFTRACER_LOG_FILE" else "dftracer.initialize_log('t.pfw')")
    p = run_py(code, tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    assert "result 4.0" in p.stdout
    messages = [line for line in p.stderr.splitlines() if "tracing is off" in line]
    assert len(messages) == 1, p.stderr
    assert variable in messages[0]
    assert traces(tmp_path) == [] and not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("process_id, p_idx", [("7", 7), ("2**70", -1), ("'rank0'", -1)])
def test_process_id_is_the_start_events_p_idx_or_ignored_with_one_message(tmp_path, process_id, p_idx):
    """A process_id DFTracer's readers cannot hold (p_idx is an int64) must not stop the program."""
    p = run_py(EMIT.replace('"/tmp/data", -1)', f'"/tmp/data", {process_id})'), tmp_path)
    assert p.returncode == 0 and "done 6.0" in p.stdout, p.stderr
    (path,) = traces(tmp_path / "out")
    (start,) = [e for e in read_events(path) if e["name"] == "start"]
    assert start["args"]["p_idx"] == p_idx
    if p_idx == -1:
        assert p.stderr.strip().splitlines() == [
            f"dftrace_dynamo: initialize_log: process_id={eval(process_id)!r} ignored (p_idx is a 64-bit "
            "integer): -1 is written"]
    else:
        assert p.stderr == ""


def test_enable_zero_switches_off_even_initialize_log(tmp_path):
    p = run_py(EMIT, tmp_path, env={"DFTRACER_ENABLE": "0"})
    assert p.returncode == 0 and "done" in p.stdout and p.stderr == ""
    assert not (tmp_path / "out").exists()


def test_unset_enable_without_initialize_log_writes_nothing(tmp_path):
    code = """
        from dftrace_dynamo import dftracer, region
        with region("r"):
            pass
        dftracer.log_event("x", "user", dftracer.get_time(), 1.0)
    """
    p = run_py(code, tmp_path)
    assert p.returncode == 0 and p.stderr == ""
    assert traces(tmp_path) == []


def test_enable_one_opens_log_lazily_under_log_file_and_closes_at_exit(tmp_path):
    code = """
        from dftrace_dynamo import region
        for i in range(5):
            with region("r", i=i):
                pass
    """
    p = run_py(code, tmp_path, env={"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": str(tmp_path / "logs" / "app")})
    assert p.returncode == 0, p.stderr
    (path,) = traces(tmp_path / "logs")
    assert os.path.basename(path).startswith("app-")
    events = read_events(path)
    assert [e["args"]["i"] for e in events if e["name"] == "r"] == list(range(5))
    assert events[-1]["name"] == "end" and events[-1]["args"]["num_events"] == 5


def test_rank_in_file_name_and_existing_files_never_overwritten(tmp_path):
    code = """
        import os
        from dftrace_dynamo.session import logger
        from dftrace_dynamo.session import config
        import socket
        pid = os.getpid()
        taken = logger.trace_path("t", config.COMPRESSION_GZIP, pid, logger._hash16(socket.gethostname()))
        open(taken, "w").write("old")
        log = logger.initialize_log("t")
        print(os.path.basename(taken)); print(os.path.basename(log.path))
        log.finalize()
    """
    p = run_py(code, tmp_path, env={"RANK": "3"})
    assert p.returncode == 0, p.stderr
    taken, used = p.stdout.split()
    assert "-rank3-" in taken
    assert used != taken and used.endswith(".1.pfw.gz")
    assert (tmp_path / taken).read_text() == "old"
    assert len(read_events(str(tmp_path / used))) > 0


def test_fork_child_gets_its_own_file_and_parent_events_are_written_once(tmp_path):
    code = """
        import os
        from dftrace_dynamo import dftracer, region
        log = dftracer.initialize_log("f")
        for i in range(10):
            with region("parent_before", i=i):
                pass
        pid = os.fork()
        if pid == 0:
            for i in range(7):
                with region("child", i=i):
                    pass
            dftracer.finalize()
            os._exit(0)
        os.waitpid(pid, 0)
        for i in range(4):
            with region("parent_after", i=i):
                pass
        log.finalize()
        print(os.getpid(), pid)
    """
    p = run_py(code, tmp_path)
    assert p.returncode == 0, p.stderr
    parent_pid, child_pid = map(int, p.stdout.split())
    files = traces(tmp_path)
    assert len(files) == 2
    by_pid = {}
    for f in files:
        events = read_events(f)
        names = [e["name"] for e in events if e.get("cat") == "region"]
        by_pid[events[0]["pid"]] = names
    assert by_pid[parent_pid] == ["parent_before"] * 10 + ["parent_after"] * 4
    assert by_pid[child_pid] == ["child"] * 7


def test_spawned_processes_and_threads_trace_to_their_own_files(tmp_path):
    code = """
        import multiprocessing as mp, threading
        from dftrace_dynamo import dftracer, region

        def work(n):
            for i in range(n):
                with region("spawned", i=i):
                    pass

        if __name__ == "__main__":
            log = dftracer.initialize_log("s")
            threads = [threading.Thread(target=work, args=(500,)) for _ in range(4)]
            for t in threads: t.start()
            for t in threads: t.join()
            ctx = mp.get_context("spawn")
            procs = [ctx.Process(target=work, args=(25,)) for _ in range(2)]
            for q in procs: q.start()
            for q in procs: q.join()
            log.finalize()
    """
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent(code))
    p = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=clean_env(), capture_output=True,
                       text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    spawned = [[e for e in read_events(f) if e["name"] == "spawned"] for f in traces(tmp_path)]
    assert sorted(len(s) for s in spawned) == [25, 25, 2000]
    (main,) = [s for s in spawned if len(s) == 2000]
    tids = {e["tid"] for e in main}
    assert len(tids) == 4 and all(0 < t < 2**32 for t in tids)


def test_bind_signals_finalizes_on_sigterm_then_terminates(tmp_path):
    code = """
        import time, sys
        from dftrace_dynamo import dftracer, region
        log = dftracer.initialize_log("sig")
        for i in range(3):
            with region("before_signal"):
                pass
        print("ready", flush=True)
        time.sleep(60)
    """
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path,
                            env=clean_env({"DFTRACER_BIND_SIGNALS": "1"}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGTERM
    (path,) = traces(tmp_path)
    lines = read_lines(path)
    assert lines[-1] == "]"
    events = read_events(path)
    assert [e["name"] for e in events].count("before_signal") == 3
    assert events[-1]["name"] == "end"


def test_a_sigterm_while_finalize_runs_lets_it_finish_then_terminates(tmp_path):
    """A Pool worker's exit finalizes its trace; the SIGTERM of ``Pool.terminate()`` may land
    then, inside a close hook holding a lock (the memory sampler's). Its handler must not run
    finalize again inside (that deadlocked): finalize completes, then the signal ends the
    process."""
    code = """
        import os, signal, threading, time
        import dftrace_dynamo
        from dftrace_dynamo import dftracer
        from dftrace_dynamo.session import logger

        lock = threading.Lock()

        def on_close():
            with lock:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)  # the handler runs here

        logger.add_hooks(lambda: None, on_close)
        log = dftracer.initialize_log("sig")
        dftrace_dynamo.log_event("work", "app", dftracer.get_time(), 5)
        log.finalize()
        print("not reached")
    """
    proc = run_py(code, tmp_path, env={"DFTRACER_BIND_SIGNALS": "1"}, timeout=60)
    assert proc.returncode == -signal.SIGTERM and "not reached" not in proc.stdout, proc.stderr
    (path,) = traces(tmp_path)
    events = read_events(path)
    assert read_lines(path)[-1] == "]" and events[-1]["name"] == "end"
    assert [e["name"] for e in events].count("work") == 1


def test_region_as_decorator_and_log_event_times(tmp_path):
    code = """
        import time
        from dftrace_dynamo import dftracer, region

        @region("load", cat="io", source="disk")
        def load():
            time.sleep(0.002)

        log = dftracer.initialize_log("r")
        load(); load()
        t0 = dftracer.get_time()
        dftracer.log_event("manual", "user", t0, 0.25)
        log.finalize()
        print(int(t0))
    """
    p = run_py(code, tmp_path)
    assert p.returncode == 0, p.stderr
    (path,) = traces(tmp_path)
    events = read_events(path)
    loads = [e for e in events if e["name"] == "load"]
    assert len(loads) == 2 and all(e["cat"] == "io" and e["args"]["source"] == "disk" for e in loads)
    assert all(2000 <= e["dur"] < 200000 for e in loads)
    (manual,) = [e for e in events if e["name"] == "manual"]
    assert manual["dur"] == 0.25 and isinstance(manual["ts"], int)
    assert abs(manual["ts"] - int(p.stdout)) <= 1
    assert abs(manual["ts"] - time.time() * 1e6) < 600e6  # on the epoch timeline


def test_bind_signals_a_caught_ctrl_c_keeps_tracing_an_uncaught_one_finalizes(tmp_path):
    code = """
        import os, signal, sys
        # a foreground program's Ctrl-C: a job started in the background (`cmd &`, nohup) inherits
        # SIGINT ignored, and an ignored signal stays ignored (test_bind_signals_leaves_ignored_signals)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from dftrace_dynamo import dftracer, region
        dftracer.initialize_log("caught")
        for i in range(10):
            with region("before", i=i):
                pass
        try:
            os.kill(os.getpid(), signal.SIGINT)
            signal.pause()
        except KeyboardInterrupt:
            print("caught", flush=True)
        for i in range(100):
            with region("after", i=i):
                pass
        if sys.argv[1:] == ["again"]:
            os.kill(os.getpid(), signal.SIGINT)  # not caught: the program ends
            signal.pause()
    """
    for mode in ("", "again"):
        directory = tmp_path / (mode or "once")
        directory.mkdir()
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)] + ([mode] if mode else []),
                           cwd=directory, env=clean_env({"DFTRACER_BIND_SIGNALS": "1"}), capture_output=True,
                           text=True, timeout=120)
        assert p.stdout == "caught\n", p.stderr
        assert p.returncode == (-signal.SIGINT if mode else 0), p.stderr
        (path,) = traces(directory)
        events = read_events(path)
        names = [e["name"] for e in events if e.get("cat") == "region"]
        assert names == ["before"] * 10 + ["after"] * 100
        assert events[-1]["name"] == "end" and read_lines(path)[-1] == "]"


def test_bind_signals_leaves_ignored_signals_ignored(tmp_path):
    """A program started with SIGINT ignored (a background job, nohup) keeps ignoring it."""
    code = """
        import os, signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        from dftrace_dynamo import dftracer, region
        dftracer.initialize_log("ignored")
        os.kill(os.getpid(), signal.SIGINT)
        with region("after"):
            pass
        print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN, flush=True)
    """
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path,
                       env=clean_env({"DFTRACER_BIND_SIGNALS": "1"}), capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stdout) == (0, "True\n"), p.stderr
    (path,) = traces(tmp_path)
    assert [e["name"] for e in read_events(path) if e.get("cat") == "region"] == ["after"]


def test_secret_options_are_redacted_from_the_command_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("from dftrace_dynamo import dftracer\ndftracer.initialize_log('r').finalize()\n")
    args = ["--api-key=sk-live-123", "--password", "hunter3", "--Auth_Token", "tok-9", "db.secret=s3cr3t",
            "--lr", "0.1", "--credentials-file=/home/u/creds.json", "--passwd=", "--keyfile", "--verbose", "data"]
    run_python([str(script), *args], tmp_path, timeout=120)
    (path,) = traces(tmp_path)
    text = read_lines(path)
    for secret in ("sk-live-123", "hunter3", "tok-9", "s3cr3t", "creds.json"):
        assert not any(secret in line for line in text), secret
    events = read_events(path)
    (cmd,) = [e for e in events if e["name"] == "SH" and "train.py" in e["args"]["name"]]
    # option names only (the word after a secret-looking one is hidden whatever it looks like)
    assert cmd["args"]["name"].split(";") == [
        str(script), "--api-key=***", "--password", "***", "--Auth_Token", "***", "db.secret=***", "--lr", "***",
        "--credentials-file=***", "--passwd=***", "--keyfile", "***", "***"]
