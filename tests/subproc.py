"""Fresh interpreters for tests: tracing configured only by what the test sets."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import zygote


def clean_env(extra=None):
    """This environment without DFTRACER_* (and RANK, which changes file names), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACER_") and k != "RANK"}
    env.update(extra or {})
    return env


def python(argv, cwd=None, env=None, timeout=300, fresh=False):
    """Runs ``python *argv`` in ``cwd`` with ``clean_env(env)``; returns the CompletedProcess.
    A program that imports torch is forked from an interpreter that has (tests/zygote.py), unless
    ``fresh``: for a program that reads its command line from ``/proc`` (the zygote's there). So
    are the ranks of a torchrun job (``-m torch.distributed.run``), through torchrun's ``PYTHON_EXEC``."""
    env = clean_env(env)
    if argv[:2] == ["-m", "torch.distributed.run"] and "PYTHON_EXEC" not in env and (ranks := zygote.launcher(env)):
        env["PYTHON_EXEC"] = ranks
    return ((not fresh and zygote.run(argv, cwd, env, timeout))
            or subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout))


def run_python(argv, cwd=None, env=None, timeout=300, fresh=False):
    """:func:`python`, which must succeed."""
    proc = python(argv, cwd, env, timeout, fresh)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def run_py(code, cwd, env=None, timeout=300):
    """Runs the (dedented) ``code`` with ``python -c`` in ``cwd``; returns the CompletedProcess."""
    return python(["-c", textwrap.dedent(code)], cwd, env, timeout)


def shell(command, cwd, env=None, timeout=600):
    """Runs the shell line ``command`` in ``cwd`` as a user would type it: ``python``,
    ``torchrun`` and ``dftrace-dynamo`` are this interpreter's; returns the CompletedProcess."""
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=clean_env({"PATH": path, **(env or {})}),
                          capture_output=True, text=True, timeout=timeout)


def preload_shim(directory, name, source):
    """Builds the C ``source`` into ``directory/name.so`` for ``LD_PRELOAD`` (skips without gcc)."""
    if not shutil.which("gcc"):
        pytest.skip(f"needs gcc to build the {name} shim")
    src, shim = directory / f"{name}.c", directory / f"{name}.so"
    src.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(shim), str(src), "-ldl"], check=True)
    return shim


# wall_step(ns) steps this process's wall clock (CLOCK_REALTIME) forward, as NTP or a VM resumed
# after a pause does; the monotonic clock goes on as it was. With NO_TSC set the tracer cannot read
# the kernel's clocksource, so its events read clock_gettime, not the TSC.
_WALL_STEP = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static long shift;
void wall_step(long ns) { __atomic_add_fetch(&shift, ns, __ATOMIC_SEQ_CST); }
int clock_gettime(clockid_t c, struct timespec *t) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real)
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(c, t);
    long s = __atomic_load_n(&shift, __ATOMIC_SEQ_CST);
    if (c == CLOCK_REALTIME && s) {
        t->tv_sec += s / 1000000000, t->tv_nsec += s % 1000000000;
        if (t->tv_nsec >= 1000000000)
            t->tv_sec += 1, t->tv_nsec -= 1000000000;
    }
    return rc;
}
FILE *fopen64(const char *path, const char *mode) { /* what fopen is with 64-bit file offsets */
    static FILE *(*real)(const char *, const char *);
    if (!real)
        real = (FILE *(*)(const char *, const char *))dlsym(RTLD_NEXT, "fopen64");
    if (getenv("NO_TSC") && strstr(path, "current_clocksource")) {
        errno = ENOENT;
        return NULL;
    }
    return real(path, mode);
}
"""


def wall_step_shim(directory):
    """The ``LD_PRELOAD`` shim above, built into ``directory``."""
    return preload_shim(directory, "wall_step", _WALL_STEP)

