"""Every value of every DFTRACER_* variable gives tracing or one message, and
the program runs on; log file settings name directories the way users write them."""

import os
import subprocess
import sys
import textwrap

import pytest

from subproc import clean_env, run_py
from tracefile import read_events, read_lines, traces

from dftrace_dynamo.session import config

VARIABLES = ["DFTRACER_ENABLE", "DFTRACER_LOG_FILE", "DFTRACER_INC_METADATA", "DFTRACER_TRACE_COMPRESSION",
             "DFTRACER_WRITE_BUFFER_SIZE", "DFTRACER_BIND_SIGNALS", "DFTRACER_LOG_LEVEL", "DFTRACER_CUDA_EVENTS",
             "DFTRACER_INIT", "DFTRACER_DATA_DIR", "DFTRACER_DISABLE_IO"]
VALUES = ["\u00b2", "64\u00b2", "\uff11", "99999999999999999999", "1000G", "-1", "0x10", " 1 ", "yes",
          "\udcff", "x" * 5000, "\u2028"]

PROGRAM = """
    from dftrace_dynamo import dftracer, region
    dftracer.initialize_log()
    for i in range(3):
        with region("r", i=i):
            pass
    print("result", 3)
"""


def check_every_value(tmp_path, variable, values):
    """Runs PROGRAM once per value of ``variable``, all at once: each traces (a whole file) or
    gives one short line naming the variable; the program always runs to its end."""
    runs = []
    for n, value in enumerate(values):
        cwd = tmp_path / str(n)
        cwd.mkdir()
        env = clean_env({"DFTRACER_ENABLE": "1", variable: value})
        runs.append((value[:40], cwd, subprocess.Popen([sys.executable, "-c", textwrap.dedent(PROGRAM)], cwd=cwd,
                                                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                       text=True)))
    for value, cwd, proc in runs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (value, err[-2000:])
        assert out.splitlines() == ["result 3"], (value, err[-2000:])
        lines = err.splitlines()
        assert len(lines) <= 1, (value, err[-2000:])
        assert all(len(line) <= 500 and "Exceeds the limit" not in line for line in lines), (value, err[:1000])
        files = traces(cwd) + traces(cwd, "**/*.pfw*")
        if files:  # tracing: a whole, closed file
            (path,) = files
            assert [e["args"]["i"] for e in read_events(path) if e["name"] == "r"] == [0, 1, 2]
            assert read_lines(path)[-1] == "]"
        else:  # a bad value: tracing off, the one line says which variable
            assert len(lines) == 1 and variable in lines[0], (value, err[-2000:])
        if lines:
            assert lines[0].startswith("dftrace_dynamo: ") and variable in lines[0], (value, err[-2000:])


@pytest.mark.parametrize("variable", VARIABLES)
def test_any_value_traces_or_gives_one_message_and_the_program_runs(tmp_path, variable):
    check_every_value(tmp_path, variable, VALUES)

def test_a_buffer_bigger_than_the_machine_is_capped_with_a_message(tmp_path):
    p = run_py(PROGRAM, tmp_path, env={"DFTRACER_WRITE_BUFFER_SIZE": "1000G"})
    assert p.returncode == 0
    (line,) = p.stderr.splitlines()
    assert "DFTRACER_WRITE_BUFFER_SIZE='1000G' is more than this machine can hold; using" in line
    (path,) = traces(tmp_path)
    events = read_events(path)
    assert [e["args"]["i"] for e in events if e["name"] == "r"] == [0, 1, 2]
    assert events[-1]["args"]["dropped"] == 0


@pytest.mark.parametrize("value, directory, prefix", [
    ("~/traces/run", "home/traces", "run-"),
    ("out/", "out", "trace-"),
    ("existing", "existing", "trace-"),
    ("a/../b/t", "b", "t-"),
    ("logs/.pfw.gz", "logs", "trace-"),
])
def test_log_file_forms(tmp_path, value, directory, prefix):
    (tmp_path / "home").mkdir()
    (tmp_path / "existing").mkdir()
    p = run_py(PROGRAM, tmp_path, env={"DFTRACER_LOG_FILE": value, "HOME": str(tmp_path / "home")})
    assert p.returncode == 0 and p.stderr == "", p.stderr
    (path,) = traces(tmp_path / directory)
    assert os.path.basename(path).startswith(prefix)
    assert len([e for e in read_events(path) if e["name"] == "r"]) == 3
    assert not (tmp_path / "a").exists()
    assert not list(tmp_path.rglob("-*"))  # no file named from an empty prefix, at any depth


def test_no_limit_on_files_per_prefix_and_process(tmp_path):
    code = """
        from dftrace_dynamo import dftracer, region
        for i in range(150):
            log = dftracer.initialize_log("loop")
            with region("r", i=i):
                pass
            log.finalize()
    """
    p = run_py(code, tmp_path)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    files = traces(tmp_path)
    assert len(files) == 150
    assert sorted(e["args"]["i"] for f in files for e in read_events(f) if e["name"] == "r") == list(range(150))


def test_compression_2_writes_zstd_as_documented(tmp_path):
    p = run_py(PROGRAM, tmp_path, env={"DFTRACER_TRACE_COMPRESSION": "2"})
    assert p.returncode == 0 and p.stderr == "", p.stderr
    (path,) = traces(tmp_path)
    assert path.endswith(".pfw.zst")
    assert [e["args"]["i"] for e in read_events(path) if e["name"] == "r"] == [0, 1, 2]


def test_non_ascii_digits_in_steps_are_refused(tmp_path):
    p = run_py(PROGRAM, tmp_path, env={"DFTRACER_ENABLE": "1", "DFTRACER_STEPS": "\u0663"})
    assert p.returncode == 0 and p.stdout.strip() == "result 3"
    (line,) = p.stderr.splitlines()
    assert "DFTRACER_STEPS='\u0663' is not valid" in line and traces(tmp_path) == []


@pytest.mark.parametrize("name, closest", [("DFTRACER_ENABLED", "DFTRACER_ENABLE"),
                                           ("DFTRACER_LOGFILE", "DFTRACER_LOG_FILE"),
                                           ("DFTRACER_STEP", "DFTRACER_STEPS")])
def test_a_misspelled_variable_names_the_closest_one(tmp_path, name, closest):
    p = run_py(PROGRAM, tmp_path, env={name: "1"})
    assert p.returncode == 0 and p.stdout.strip() == "result 3"
    assert p.stderr.splitlines() == [f"dftrace_dynamo: {name} is not a variable dftrace_dynamo reads and is "
                                     f"ignored (did you mean {closest}?)"]


def test_dftracer_own_variables_draw_no_message(tmp_path):
    p = run_py(PROGRAM, tmp_path, env={"DFTRACER_DISABLE_POSIX": "1", "DFTRACER_TIME_METRIC": "US"})
    assert p.returncode == 0 and p.stderr == ""


@pytest.mark.parametrize("value, size", [("16MB", 16 << 20), ("16M", 16 << 20), ("512KiB", 512 << 10),
                                         ("1000000", 1000000)])
def test_buffer_size_says_what_it_became(tmp_path, value, size):
    p = run_py(PROGRAM, tmp_path, env={"DFTRACER_WRITE_BUFFER_SIZE": value, "DFTRACER_LOG_LEVEL": "INFO"})
    assert p.returncode == 0
    assert f"dftrace_dynamo: DFTRACER_WRITE_BUFFER_SIZE={value!r}: {size} bytes ({size / 2**20:g} MiB)" in \
        p.stderr.splitlines()


HUGE_VALUES = ["9" * 4301, "1" * 100_000, "x" * 100_000, "0-" + "9" * 5000, "1-2:" + "7" * 5000, "d/" * 50_000,
               "\udcff" * 2000]


@pytest.mark.parametrize("variable", config.VARIABLES)
def test_a_huge_value_of_any_variable_gives_one_short_line_and_the_program_runs(tmp_path, variable):
    check_every_value(tmp_path, variable, HUGE_VALUES)
    if variable == "DFTRACER_LOG_FILE":
        assert os.listdir(tmp_path / "5") == []  # a path too long to make leaves no directory behind

def test_directories_the_tracer_creates_are_not_writable_by_everyone_under_umask_000(tmp_path):
    code = "import os; os.umask(0); exec(" + repr(textwrap.dedent(PROGRAM)) + ")"
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=clean_env({"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": "a/b/c/t"}))
    assert p.returncode == 0 and p.stderr == "", p.stderr
    for d in ("a", "a/b", "a/b/c"):
        assert os.stat(tmp_path / d).st_mode & 0o777 == 0o755, d
    (path,) = traces(tmp_path / "a/b/c")
    assert os.stat(path).st_mode & 0o777 == 0o644
