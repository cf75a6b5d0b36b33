"""Fresh interpreters for tests: tracing configured only by what the test sets."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest


def clean_env(extra=None):
    """This environment without DFTRACER_* (and RANK, which changes file names), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACER_") and k != "RANK"}
    env.update(extra or {})
    return env


def python(argv, cwd=None, env=None, timeout=300):
    """Runs ``python *argv`` in ``cwd`` with ``clean_env(env)``; returns the CompletedProcess."""
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=clean_env(env), capture_output=True, text=True,
                          timeout=timeout)


def run_python(argv, cwd=None, env=None, timeout=300):
    """:func:`python`, which must succeed."""
    proc = python(argv, cwd, env, timeout)
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
