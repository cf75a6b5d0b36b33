"""The tracer's own threads take no signal: one sent to the process reaches the program's threads."""

import shutil
import signal
import subprocess
import textwrap

import pytest

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


# Each thread the process creates writes, as its very first action, whether it is born with SIGINT
# blocked ("born <0|1>"): a thread that blocks signals itself once it runs has a window first.
BIRTH_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
struct start { void *(*fn)(void *); void *arg; };
static void *born(void *p) {
    struct start s = *(struct start *)p;
    free(p);
    sigset_t now;
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    char line[16];
    int n = snprintf(line, sizeof line, "born %d\n", sigismember(&now, SIGINT));
    (void)!write(2, line, (size_t)n);
    return s.fn(s.arg);
}
int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg) {
    static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
    if (!real)
        real = dlsym(RTLD_NEXT, "pthread_create");
    struct start *s = malloc(sizeof *s);
    s->fn = fn;
    s->arg = arg;
    return real(t, a, born, s);
}
"""


def test_the_writer_thread_is_born_with_signals_blocked(tmp_path):
    if not shutil.which("gcc"):
        pytest.skip("needs gcc to build the thread-birth shim")
    (tmp_path / "birth.c").write_text(BIRTH_SHIM)
    shim = tmp_path / "birth.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(shim), str(tmp_path / "birth.c"), "-ldl"],
                   check=True)
    code = "from dftrace_dynamo import dftracer\nprint('open', flush=True)\ndftracer.initialize_log('w').finalize()\n"
    p = python(["-c", code], tmp_path, {"LD_PRELOAD": str(shim), "DFTRACER_ENABLE": "1"}, timeout=120)
    assert p.returncode == 0, p.stderr
    births = [line for line in p.stderr.splitlines() if line.startswith("born ")]
    assert births and set(births) == {"born 1"}, p.stderr
