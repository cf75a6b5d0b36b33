"""Test programs that import torch, started from an interpreter that already has: a fork of it
instead of a new interpreter. Importing torch, Dynamo, AOTAutograd and Inductor costs about 6 s of
CPU here, nearly all of a typical test program; the suite starts a few hundred of them.

The child is the program as ``python SCRIPT ARGS`` or ``python -c CODE ARGS`` would run it: its
own ``__main__``, ``sys.argv``, ``sys.path[0]``, environment, working directory, standard streams
and exit (atexit handlers, non-daemon threads, the exit status; an uncaught exception prints its
traceback from the program's first frame and exits 1). The tracer is never imported before the
fork: every child configures it from its own environment. A program is forked only when its text
imports torch before the tracer and sets no resource limits, from a zygote started with the same
values of every variable that torch, its libraries or the interpreter read at start (a few
zygotes per test process); any other program, and one given a shim to preload, gets a new
interpreter.

    python zygote.py SOCKET   (started by :func:`run`, one per test process)
"""

import atexit
import json
import locale
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback

PRELOAD = ("torch", "torch._dynamo", "torch._functorch.aot_autograd", "torch._inductor.compile_fx")
# read before a program's first line (by the interpreter, the C runtime, torch's import)
_AT_START = re.compile(r"(PYTHON|TORCH|PYTORCH|OMP_|MKL_|KMP_|LD_|CUDA|GLIBC_|MALLOC_)")
_AT_START_NAMES = {"TMPDIR", "HOME", "USER", "LOGNAME", "XDG_CACHE_HOME", "TRITON_CACHE_DIR"}
# Inductor reads its cache directory when a compile needs it (Dynamo's import keeps it only for
# precompiled packages, which no test uses): a test's own directory needs no zygote of its own
_READ_LATER = {"TORCHINDUCTOR_CACHE_DIR"}
_NEVER = ("LD_PRELOAD", "LD_AUDIT")  # shims a test builds for one program
_IMPORT = r"(?:^|[\n;])[ \t]*(?:import[ \t]+(?:[\w.]+(?:[ \t]+as[ \t]+\w+)?[ \t]*,[ \t]*)*|from[ \t]+){}\b"
_IMPORTS = {name: re.compile(_IMPORT.format(name)) for name in ("torch", "dftrace_dynamo")}
_HEADER = 8


# -- the zygote -----------------------------------------------------------------------------------

def _recv_request(conn):
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 2)
    size = int.from_bytes(data[:_HEADER], "little")
    data = data[_HEADER:]
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("request cut short")
        data += chunk
    return json.loads(data), fds


def _program(request):
    """Runs the request's program in this (forked) process; leaves by SystemExit only."""
    argv, cwd = request["argv"], request["cwd"]
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(request["env"])
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sys.modules["torch"].seed()  # a new interpreter seeds torch's and NumPy's generators anew
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __spec__=None, __package__=None, __loader__=None)
    if argv[0] == "-c":
        source, filename = argv[1], "<string>"
        sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
    else:
        filename = os.path.abspath(argv[0])
        with open(filename, encoding="utf-8") as f:
            source = f.read()
        main.__file__, main.__cached__ = filename, None
        sys.argv, sys.path[0] = list(argv), os.path.dirname(os.path.realpath(filename))
    sys.modules["__main__"] = main
    code = compile(source, filename, "exec")
    try:
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:  # as the interpreter prints it: from the program's first frame
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code is not code:
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        raise SystemExit(1) from None
    raise SystemExit(0)


def _serve(conn, listener):
    """In a fork per request: forks the program, sends its pid, waits, sends its exit status."""
    listener.close()
    request, fds = _recv_request(conn)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # to wait for the program
    pid = os.fork()
    if pid == 0:
        conn.close()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (null, *fds):
            os.close(fd)
        _program(request)
    for fd in fds:
        os.close(fd)
    conn.sendall(b"%d\n" % pid)
    _, status = os.waitpid(pid, 0)
    conn.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
    os._exit(0)


def serve(path):
    for name in PRELOAD:
        __import__(name)
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    listener.settimeout(5)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the request forks reap themselves
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    while os.getppid() == parent:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        if threading.active_count() == 1 and os.fork() == 0:
            try:
                _serve(conn, listener)
            except SystemExit:  # the program's process leaves from here
                raise
            except BaseException:
                traceback.print_exc()
                os._exit(1)
        conn.close()


# -- the test process's side ----------------------------------------------------------------------

_zygotes = []  # one per set of values read at start that the programs asked for
_MAX_ZYGOTES = 3
_lock = threading.Lock()


def _start(env):
    env = {k: v for k, v in env.items() if not k.startswith("DFTRACER_")}
    directory = tempfile.mkdtemp(prefix="zygote-")
    path = os.path.join(directory, "socket")
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), path], env=env, cwd=directory,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    if proc.stdout.readline() != b"ready\n":
        proc.kill()
        proc.wait()
        return None

    def stop():
        proc.kill()
        proc.wait()
        os.unlink(path)
        os.rmdir(directory)

    atexit.register(stop)
    return {"path": path, "env": env}


def _program_text(argv, cwd):
    if argv[0] == "-c" and len(argv) >= 2:
        return argv[1]
    if argv[0].startswith("-"):
        return None
    try:
        with open(os.path.join(cwd, argv[0]), encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _torch_first(text):
    """Whether the program imports torch before the tracer (the zygote has torch, never the tracer)."""
    torch, tracer = (m.start() if (m := _IMPORTS[name].search(text)) else None for name in ("torch", "dftrace_dynamo"))
    return torch is not None and (tracer is None or torch < tracer)


def _same_start(env, state):
    keys = {k for k in (*env, *state["env"]) if (_AT_START.match(k) or k in _AT_START_NAMES) and k not in _READ_LATER}
    return all(env.get(k) == state["env"].get(k) for k in keys)


def _zygote_for(env):
    """The zygote whose start ``env`` would repeat, started if there is none (None: no more may be)."""
    with _lock:
        for state in _zygotes:
            if state is None or _same_start(env, state):
                return state
        if len(_zygotes) == _MAX_ZYGOTES:
            return None
        _zygotes.append(_start(env))
        return _zygotes[-1]


def run(argv, cwd, env, timeout):
    """The CompletedProcess of ``python *argv`` forked from a zygote, as ``subprocess.run(...,
    capture_output=True, text=True)`` gives it; None when this program needs a new interpreter
    (see the module's doc)."""
    if os.environ.get("TESTS_FRESH_INTERPRETERS"):
        return None
    cwd = os.path.abspath(cwd or os.getcwd())
    text = _program_text(argv, cwd)
    if text is None or not _torch_first(text) or re.search(r"\bresource\b", text):
        return None
    state = None if any(k in env for k in _NEVER) else _zygote_for(env)
    if state is None:
        return None
    request = json.dumps({"argv": list(argv), "cwd": cwd, "env": env}).encode()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(state["path"])
        except OSError:  # the zygote is gone
            return None
        socket.send_fds(conn, [len(request).to_bytes(_HEADER, "little") + request], [out.fileno(), err.fileno()])
        replies = _Replies(conn)
        pid = replies.number()
        if pid is None:  # the zygote could not fork
            return None
        conn.settimeout(timeout)
        try:
            status, timed_out = replies.number(), False
        except TimeoutError:  # as subprocess.run: the program is killed, its output kept
            os.kill(pid, signal.SIGKILL)
            conn.settimeout(None)
            status, timed_out = replies.number(), True
        if status is None:
            raise RuntimeError(f"the zygote lost the program {argv[:2]}")
        output = [_decode(f) for f in (out, err)]
    cmd = [sys.executable, *argv]
    if timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout, output=output[0], stderr=output[1])
    return subprocess.CompletedProcess(cmd, status, *output)


class _Replies:
    """The zygote's numbered lines (a timed-out read may be taken up again)."""

    def __init__(self, conn):
        self.conn, self.data = conn, b""

    def number(self):
        while b"\n" not in self.data:
            chunk = self.conn.recv(64)
            if not chunk:
                return None
            self.data += chunk
        line, self.data = self.data.split(b"\n", 1)
        return int(line)


def _decode(f):
    f.seek(0)
    text = f.read().decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")  # text mode's universal newlines


if __name__ == "__main__":
    serve(sys.argv[1])
