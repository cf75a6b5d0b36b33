"""fork() while the tracer is busy: the child never hangs on a lock a parent thread held, and a
child that ends with ``os._exit`` right after its work keeps every event it recorded."""

import os

import pytest

from subproc import preload_shim, run_py
from tracefile import read_events, traces

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")

# Every clock read of the writer thread sleeps 1 ms: the writer holds its locks (the clock
# model's above all) hundreds of times longer than it does on a normal machine.
SLOW_WRITER_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>
static int (*real)(clockid_t, struct timespec *);
int clock_gettime(clockid_t c, struct timespec *t) {
    if (!real)
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    char name[16] = {0};
    prctl(PR_GET_NAME, name);
    if (strcmp(name, "dftrace-writer") == 0)
        usleep(1000);
    return real(c, t);
}
"""

# Forks N children one after another while a thread keeps the writer busy; each child records
# one event and ends. A child still running after WAIT s is hung: it is killed, and so is the run.
FORKS = """
    import os, signal, sys, threading, time
    from dftrace_dynamo import dftracer
    log = dftracer.initialize_log("t")
    stop = False

    def busy():
        while not stop:
            t = log.get_time()
            log.log_event("busy", "t", t, 1.0)

    threading.Thread(target=busy, daemon=True).start()
    n, hung, done = int(sys.argv[1]), 0, 0
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            log.log_event("child", "t", log.get_time(), 1.0)
            os._exit(0)
        deadline = time.monotonic() + 30
        while not os.waitpid(pid, os.WNOHANG)[0]:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                hung += 1
                break
            time.sleep(0.002)
        if hung:
            break
        done += 1
    stop = True
    print(done, hung, os.getpid())
"""


def test_hundreds_of_forks_with_the_writer_busy_and_slowed_never_hang(tmp_path):
    shim = preload_shim(tmp_path, "slow_writer", SLOW_WRITER_SHIM)
    out = tmp_path / "out"
    out.mkdir()
    n = 300
    p = run_py(FORKS.replace("sys.argv[1]", str(n)), out, env={"LD_PRELOAD": str(shim)}, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    done, hung, parent = map(int, p.stdout.split())
    assert (done, hung) == (n, 0)
    # every child wrote its own whole file with its one event
    children = [f for f in traces(out) if not f.endswith(f"-{parent}.pfw.gz")]
    assert len(children) == n
    for f in children[:: n // 10]:
        assert [e["name"] for e in read_events(f) if e.get("cat") == "t"] == ["child"]


def test_a_fork_while_another_thread_holds_the_tracers_python_locks_does_not_hang(tmp_path):
    # steps opens the child's file under its lock; comm closes it under its own
    code = """
        import os, threading, time
        from dftrace_dynamo import dftracer
        from dftrace_dynamo.events import comm, steps
        log = dftracer.initialize_log("t")
        held, release = threading.Event(), threading.Event()

        def hold():
            with steps._lock, comm._lock:
                held.set()
                release.wait()

        threading.Thread(target=hold).start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            log.log_event("child", "t", log.get_time(), 1.0)
            dftracer.finalize()
            os._exit(0)
        deadline = time.monotonic() + 30
        while not os.waitpid(pid, os.WNOHANG)[0]:
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                print("hung")
                break
            time.sleep(0.01)
        release.set()
        log.finalize()
        print(pid)
    """
    p = run_py(code, tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "hung" not in p.stdout
    child = [f for f in traces(tmp_path) if f.endswith(f"-{p.stdout.split()[-1]}.pfw.gz")]
    assert len(child) == 1
    assert [e["name"] for e in read_events(child[0]) if e.get("cat") == "t"] == ["child"]


EXIT_CHILDREN = """
    import os
    from dftrace_dynamo import dftracer
    log = dftracer.initialize_log("t")
    pids = []
    for c in range(5):
        pid = os.fork()
        if pid == 0:
            try:
                os._exit("bad")  # raises, as ever, and tracing goes on
            except TypeError:
                pass
            for i in range(50):
                log.log_event(f"child{c}", "t", log.get_time(), 1.0, {"i": i})
            {exit}
        pids.append(pid)
    for pid in pids:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 3
"""


@pytest.mark.parametrize("exit_call", ["os._exit(3)", "import os as o; e = o._exit; e(3)"])
def test_os_exit_right_after_recording_in_a_fork_child_keeps_every_event(tmp_path, exit_call):
    p = run_py(EXIT_CHILDREN.replace("{exit}", exit_call), tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stderr == ""
    by_name = {}
    for f in traces(tmp_path):
        for e in read_events(f):
            if e.get("cat") == "t":
                by_name.setdefault(e["name"], []).append(e["args"]["i"])
    assert by_name == {f"child{c}": list(range(50)) for c in range(5)}  # 250 of 250, in order
