"""Running the ``dftrace-dynamo`` command in the CLI tests."""

import json
import shutil
import subprocess
import sys

from subproc import clean_env

# The console script when installed on PATH, else the module (same entry point).
CLI = [shutil.which("dftrace-dynamo")] if shutil.which("dftrace-dynamo") else [sys.executable, "-m", "dftrace_dynamo"]


def cli(*args, cwd=None, env=None, timeout=300):
    """Runs the command with the variables ``env`` added to the environment;
    DFTRACER_* variables of the calling shell (initialize_log exports them in
    other tests) are left out so that they cannot change what the tests expect."""
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=clean_env(env),
                          timeout=timeout)


def assert_bad_input(p, *fragments):
    """Exit status 2 and exactly one line on stderr, holding every fragment; no traceback."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def summary_json(*args):
    """``summary --format json`` of ``args``, which must succeed: (the document, stderr)."""
    p = cli("summary", "--format", "json", "--top", "100", *args)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), p.stderr
