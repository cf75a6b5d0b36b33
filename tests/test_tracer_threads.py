"""The tracer's own threads take no signal: one sent to the process reaches the program's threads."""

import signal
import textwrap

from subproc import python

PROGRAM = """
    import os, signal, threading, time
    from dftrace_dynamo import dftracer
    dftracer.initialize_log("threads")
    import dftrace_dynamo.events.memory  # the memory sampler starts
    time.sleep(0.3)
    ours = [t for t in threading.enumerate() if t.name.startswith("dftrace")]
    for t in ours:
        with open(f"/proc/self/task/{t.native_id}/status") as f:
            blocked = int(next(l for l in f if l.startswith("SigBlk:")).split()[1], 16)
        print(t.name, blocked & (1 << (signal.SIGINT - 1)) != 0, blocked & (1 << (signal.SIGTERM - 1)) != 0)
"""


def test_the_tracers_threads_block_signals(tmp_path):
    # a SIGINT taken by one of our threads just as the main thread enters signal.pause() would
    # leave the program waiting there: Python runs the handler in the main thread only
    p = python(["-c", textwrap.dedent(PROGRAM)], tmp_path,
               {"DFTRACER_BIND_SIGNALS": "1", "DFTRACER_ENABLE": "1"}, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = [line.rsplit(" ", 2) for line in p.stdout.splitlines()]
    assert "dftrace memory" in {name for name, _, _ in rows}, p.stdout
    assert all(sigint == sigterm == "True" for _, sigint, sigterm in rows), p.stdout
