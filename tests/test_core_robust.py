"""The C core under concurrency, back-pressure, fork and SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zlib

import pytest

import perfetto_tp
from dftrace_dynamo import _core
from subproc import run_py, wall_step_shim
from test_core_format import HEADER, HHASH, closed_core, events, open_trace, read_objects  # noqa: F401 (closed_core: autouse fixture)


def test_four_threads_exact_counts(tmp_path):
    site = _core.intern_site("op", "c")
    cell = _core.TagCell()
    ic = _core.Interceptor(abs, site, cell)
    n = 40_000
    tids = []
    start = threading.Barrier(4)

    def work():
        tids.append(threading.get_native_id())
        start.wait()
        for i in range(n):
            if i % 2:
                ic(-i)
            else:
                t = _core.now_ns()
                _core.record(site, t, t + 1)

    path = open_trace(tmp_path, 2, buffer_size=256 << 10)  # small rings: producers wait
    ths = [threading.Thread(target=work, name=f"w{k}") for k in range(4)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    res = _core.close()
    assert res["num_events"] == 4 * n and res["dropped"] == 0
    objs = read_objects(path)
    assert [o["id"] for o in objs] == list(range(1, len(objs) + 1))
    ev = events(objs)
    assert sorted({e["tid"] for e in ev}) == sorted(tids)
    for tid in tids:
        assert sum(e["tid"] == tid for e in ev) == n
    names = {o["tid"]: o["args"]["name"] for o in objs if o["name"] == "thread_name"}
    assert sorted(names.values()) == ["w0", "w1", "w2", "w3"]


def test_full_ring_waits_instead_of_dropping(tmp_path):
    site = _core.intern_site("op", "c")
    path = open_trace(tmp_path, 1, buffer_size=16 << 10)  # smallest ring: 256 records
    n = 200_000
    t = _core.now_ns()
    for i in range(n):
        _core.record(site, t + i * 1000, t + i * 1000 + 500)
    st = _core.stats()
    assert st["recorded"] == n and st["dropped"] == 0
    assert _core.close()["num_events"] == n
    assert len(events(read_objects(path))) == n


def test_ring_counters_count_pushes_past_half_full(tmp_path):
    """ring_kicks counts the pushes that find their ring half full (each wakes the writer); a ring
    that never fills that far counts none. Fresh threads: a ring is sized when its thread first records."""
    site = _core.intern_site("op", "c")

    def pushes(n, out):
        t = _core.now_ns()
        before = _core.stats()
        for i in range(n):
            _core.record(site, t + i, t + i + 1)
        out.append({k: _core.stats()[k] - before[k] for k in ("recorded", "ring_kicks", "ring_waits")})

    def in_thread(n):
        out = []
        th = threading.Thread(target=pushes, args=(n, out))
        th.start()
        th.join()
        return out[0]

    open_trace(tmp_path, 1, buffer_size=16 << 10)  # rings of 256 records: half full at 128
    assert in_thread(100) == {"recorded": 100, "ring_kicks": 0, "ring_waits": 0}
    got = in_thread(5000)
    assert got["recorded"] == 5000 and got["ring_kicks"] >= 1  # the first at the 129th push
    assert _core.close()["num_events"] == 5100
    # The default buffer gives a thread a ring of 65,536 records when no other thread holds one: in a
    # fresh interpreter (here, rings of threads earlier tests left alive take their share of the buffer).
    proc = run_py(f"""
        import json, threading
        from dftrace_dynamo import _core
        _core.open({str(tmp_path / "big.pfw.gz")!r}, 1, 16 << 20, {HEADER!r}, 42, {HHASH!r})
        site, out = _core.intern_site("op", "c"), []
        def pushes(n):
            t, before = _core.now_ns(), _core.stats()
            for i in range(n):
                _core.record(site, t + i, t + i + 1)
            out.append({{k: _core.stats()[k] - before[k] for k in ("recorded", "ring_kicks", "ring_waits")}})
        th = threading.Thread(target=pushes, args=(20_000,))
        th.start()
        th.join()
        print(json.dumps([out[0], _core.close()["num_events"]]))
        """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [{"recorded": 20_000, "ring_kicks": 0, "ring_waits": 0}, 20_000]


def test_short_lived_threads(tmp_path):
    site = _core.intern_site("op", "c")
    path = open_trace(tmp_path, 0, buffer_size=64 << 10)
    rings = _core.stats()["rings"]
    for k in range(60):
        th = threading.Thread(target=lambda: [_core.record(site, 1000 * j, 1000 * j + 1) for j in range(10)])
        th.start()
        th.join()
        if k % 20 == 0:
            _core.flush()
    res = _core.close()
    assert res["num_events"] == 600 and _core.stats()["pending"] == 0
    assert len(events(read_objects(path))) == 600
    # exited threads' rings are freed (join() can return before the OS thread is gone)
    for k in range(100):
        if _core.stats()["rings"] == rings:
            break
        time.sleep(0.02)
        open_trace(tmp_path, 0, name=f"again{k}")
        _core.close()
    assert _core.stats()["rings"] == rings


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_child_does_not_duplicate_parent_events(tmp_path):
    site = _core.intern_site("op", "c")
    parent_path = open_trace(tmp_path, 1, name="parent")
    t = _core.now_ns()
    for i in range(100):  # still buffered at fork time
        _core.record(site, t + i, t + i + 1)
    child_path = str(tmp_path / "child.pfw")
    pid = os.fork()
    if pid == 0:  # child: only _core, exit without running pytest's teardown
        st = _core.stats()  # the parent's buffered events are gone here
        ok = not _core.is_open() and _core.path() is None and st["pending"] == st["recorded"] == 0
        _core.record(site, 1, 2)  # no file: no-op
        _core.open(child_path, 0, 1 << 20, b"", os.getpid(), "0" * 16)
        for i in range(10):
            _core.record(site, 1000 * i, 1000 * i + 1)
        res = _core.close()
        os._exit(0 if ok and res["num_events"] == 10 else 1)
    for i in range(100):
        _core.record(site, t + 1000 + i, t + 1000 + i + 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _core.close()["num_events"] == 200
    parent = events(read_objects(parent_path))
    assert len(parent) == 200 and {e["pid"] for e in parent} == {42}
    child = events(read_objects(child_path))
    assert len(child) == 10 and {e["pid"] for e in child} == {pid}


KILL_CHILD = textwrap.dedent("""
    import sys, time
    from dftrace_dynamo import _core
    site = _core.intern_site("op", "c")
    _core.open(sys.argv[1], 1, 1 << 20, b"", 7, "0" * 16)
    while True:  # ~20 events per ms; prints the time of its latest event
        for _ in range(20):
            t = _core.now_ns()
            _core.record(site, t, t + 100)
        print(t, flush=True)
        time.sleep(0.001)
""")

def whole_members(data):
    """Decompresses gzip members up to the first incomplete one."""
    out = []
    while data:
        d = zlib.decompressobj(31)
        try:
            chunk = d.decompress(data)
        except zlib.error:
            break
        if not d.eof:
            break
        out.append(chunk)
        data = d.unused_data
    return b"".join(out)


def test_sigkill_keeps_events_up_to_about_a_second(tmp_path):
    path = str(tmp_path / "killed.pfw.gz")
    p = subprocess.Popen([sys.executable, "-c", KILL_CHILD, path], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 2.5
        last = None
        while time.monotonic() < deadline:
            last = int(p.stdout.readline())
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    with open(path, "rb") as f:
        text = whole_members(f.read()).decode()
    lines = text.splitlines()
    assert lines[0] == "["
    evs = [json.loads(line) for line in lines[1:]]
    ops = [e for e in evs if e["name"] == "op"]
    assert len(ops) > 1000
    assert max(e["ts"] for e in ops) * 1000 >= last - 1_500_000_000
    assert perfetto_tp.error_stats(path) == []
    n = perfetto_tp.rows(path, "select count(*) as n from slice where name = 'op'")[0]["n"]
    assert n >= len(ops)


def test_a_slow_thread_s_events_share_members(tmp_path):
    """A thread recording ~50 events a second: its events wait for 256 KiB of text (a member a
    second would hold a few dozen lines, mostly fixed cost), yet no longer than about 5 s (or
    the first aggregate checkpoint, which ends its member)."""
    site = _core.intern_site("op", "c")
    path = open_trace(tmp_path, 1)
    start, first = time.monotonic(), None
    while time.monotonic() - start < 9:
        for _ in range(5):
            t = _core.now_ns()
            _core.record(site, t, t + 100)
        time.sleep(0.1)
        with open(path, "rb") as f:
            written = whole_members(f.read()).count(b'"name":"op"')
        if written and first is None:
            first = time.monotonic() - start
    # one member a second: 1-1.25 s; here the first aggregate checkpoint (3 s) or 5 s ends it
    assert first is not None and 2.5 < first < 6.5, first
    assert _core.close()["num_events"] > 300


def test_flush_and_close_race_from_threads(tmp_path):
    site = _core.intern_site("op", "c")
    stop = threading.Event()

    def flusher():
        while not stop.is_set():
            t = _core.now_ns()
            _core.record(site, t, t + 1)
            _core.flush()

    for k in range(20):
        open_trace(tmp_path, k % 3, name=f"r{k}")
        ths = [threading.Thread(target=flusher) for _ in range(2)]
        for th in ths:
            th.start()
        time.sleep(0.005)
        res = _core.close()
        stop.set()
        for th in ths:
            th.join(timeout=10)
            assert not th.is_alive(), "flush() hung across close()"
        stop.clear()
        assert res["dropped"] == 0
        assert len(events(read_objects(res["path"]))) == res["num_events"]


@pytest.mark.parametrize("clock", ["tsc", "monotonic"])
def test_a_wall_clock_step_before_a_trace_opens_is_followed_when_asked(tmp_path, clock):
    """A wall clock stepped 50 ms forward after import: with no file open (no writer to follow
    it) now_ns() stays on the old epoch until follow_wall_clock(), then is on the new one, never
    having gone back; the file opened after is on it too. (What a rank's clock offset reads.)"""
    code = """
        import ctypes, json, sys, time
        from dftrace_dynamo import _core
        def apart():  # (now_ns() - time.time_ns(), the bracket's width) from the tightest of 50
            best = None
            for _ in range(50):
                b, n, a = time.time_ns(), _core.now_ns(), time.time_ns()
                if best is None or a - b < best[1]:
                    best = (n - b, a - b)
            return best
        first = _core.now_ns()
        ctypes.CDLL(None).wall_step(ctypes.c_long(50_000_000))
        stale = apart()
        _core.follow_wall_clock()
        after = _core.now_ns()
        followed = apart()
        _core.open(sys.argv[1], 0, 1 << 20, b"[\\n", 1, "h")
        opened = apart()
        _core.close()
        print(json.dumps([stale, followed, opened, after >= first]))
    """
    env = {"LD_PRELOAD": str(wall_step_shim(tmp_path)), **({"NO_TSC": "1"} if clock == "monotonic" else {})}
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(tmp_path / "t.pfw")],
                       env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    (stale, _), (followed, width), (opened, width2), forward = json.loads(p.stdout)
    assert -50.5e6 <= stale <= -49.5e6
    assert -100e3 <= followed and followed + width <= 100e3 and -100e3 <= opened and opened + width2 <= 100e3
    assert forward


def test_event_clock_stays_on_the_system_clock_and_never_goes_back(tmp_path):
    """With the TSC clock, the model is published again on every writer wake (here hundreds of
    times): time must stay monotonic across the switches and on the epoch timeline."""
    open_trace(tmp_path, 0, name="clock")
    try:
        assert _core.stats()["clock"] in ("tsc", "monotonic")
        last, worst, end = 0, 0, time.monotonic() + 1.5  # crosses about six writer wakes
        while time.monotonic() < end:
            for _ in range(1000):
                now = _core.now_ns()
                assert now >= last
                last = now
            # bracketed by two realtime reads: a preemption between the reads
            # widens the bracket instead of counting as clock error
            before, now, after = time.time_ns(), _core.now_ns(), time.time_ns()
            worst = max(worst, before - now, now - after)
            _core.flush()  # a writer wake: the model is published again, into the slot not in use
        assert worst < 1_000_000  # within a millisecond of the system's realtime clock
    finally:
        _core.close()
