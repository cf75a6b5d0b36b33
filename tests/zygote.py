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

A torchrun job's ranks come from the zygote too: :func:`launcher` gives the interpreter torchrun
starts them with (its ``PYTHON_EXEC``), a small program that hands ``-u SCRIPT ARGS`` with its
standard streams to the zygote, passes on the signals torchrun sends (it signals the launcher's
process group), and exits as the rank did; a rank that needs a new interpreter gets one by exec.

    python zygote.py SOCKET   (started by :func:`run`, one per test process)
"""

import atexit
import io
import json
import locale
import os
import re
import select
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
# precompiled packages, which no test uses): a test's own directory needs no zygote of its own;
# torch.cuda reads the NVML switch when asked (Lightning's import sets it in the test process)
_READ_LATER = {"TORCHINDUCTOR_CACHE_DIR", "PYTORCH_NVML_BASED_CUDA_CHECK"}
_NEVER = ("LD_PRELOAD", "LD_AUDIT")  # shims a test builds for one program
# what torchrun adds to its ranks' environment that matches _AT_START: torch reads it when it runs
_FROM_TORCHRUN = re.compile(r"TORCHELASTIC_|TORCH_NCCL_ASYNC_ERROR_HANDLING$")
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_IMPORT = r"(?:^|[\n;])[ \t]*(?:import[ \t]+(?:[\w.]+(?:[ \t]+as[ \t]+\w+)?[ \t]*,[ \t]*)*|from[ \t]+){}\b"
_IMPORTS = {name: re.compile(_IMPORT.format(name)) for name in ("torch", "dftrace_dynamo")}
_HEADER = 8
_exit = os._exit  # the programs' tracer may wrap os._exit (to write its trace): the interpreter's own exit does not


# -- the zygote -----------------------------------------------------------------------------------

def _recv_request(conn):
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    size = int.from_bytes(data[:_HEADER], "little")
    data = data[_HEADER:]
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("request cut short")
        data += chunk
    return json.loads(data), fds


def _program(request):
    """Runs the request's program in this (forked) process, and ends it."""
    argv, cwd = request["argv"], request["cwd"]
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(request["env"])
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sys.modules["torch"].seed()  # a new interpreter seeds torch's and NumPy's generators anew
    if request.get("unbuffered"):  # python -u
        for name in ("stdout", "stderr"):
            old = getattr(sys, name)
            setattr(sys, name, io.TextIOWrapper(io.FileIO(old.fileno(), "w", closefd=False), encoding=old.encoding,
                                                errors=old.errors, write_through=True))
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
        status = 0
    except SystemExit as e:  # as the interpreter reads sys.exit()'s argument
        status = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException as e:  # as the interpreter prints it: from the program's first frame
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code is not code:
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        status = 1
    _leave(main, status)


def _leave(main, status):
    """Ends the program as the interpreter would (non-daemon threads joined, atexit handlers run,
    files left open in its globals closed, standard streams flushed) without tearing down the
    modules it inherited from the zygote: that would touch, and so copy, every object they hold
    (over a second of CPU per program)."""
    threading._shutdown()
    atexit._run_exitfuncs()
    for value in list(main.__dict__.values()):
        if isinstance(value, io.IOBase):
            try:
                value.close()
            except Exception:
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    _exit(status & 0xFF)


def _serve(conn, listener):
    """In a fork per request: forks the program, sends its pid, waits, sends its exit status. The
    program is killed when the asker goes away (a launcher killed by torchrun)."""
    listener.close()
    request, fds = _recv_request(conn)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # to wait for the program
    pid = os.fork()
    if pid == 0:
        conn.close()
        if len(fds) == 2:  # stdout and stderr: stdin is empty, as with capture_output
            fds.insert(0, os.open(os.devnull, os.O_RDONLY))
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        _program(request)
    for fd in fds:
        os.close(fd)
    conn.sendall(b"%d\n" % pid)
    exited = os.pidfd_open(pid)
    while exited not in select.select([conn, exited], [], [])[0]:
        if not conn.recv(64):
            os.kill(pid, signal.SIGKILL)
            break
    _, status = os.waitpid(pid, 0)
    try:
        conn.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
    except OSError:
        pass
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
_MAX_ZYGOTES = 4
_lock = threading.Lock()


def _start(env):
    env = {k: v for k, v in env.items() if not k.startswith("DFTRACER_")}
    directory = tempfile.mkdtemp(prefix="zygote-")
    path, launcher = os.path.join(directory, "socket"), os.path.join(directory, "python")
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), path], env=env, cwd=directory,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    if proc.stdout.readline() != b"ready\n":
        proc.kill()
        proc.wait()
        return None
    with open(launcher, "w") as f:  # -S: the launcher needs nothing of site-packages
        f.write(f"#!{sys.executable} -S\nimport sys\nsys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
                f"import zygote\nzygote.launch({path!r}, {env!r})\n")
    os.chmod(launcher, 0o755)

    def stop():
        proc.kill()
        proc.wait()
        for name in (path, launcher):
            os.unlink(name)
        os.rmdir(directory)

    atexit.register(stop)
    return {"path": path, "env": env, "launcher": launcher}


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


def _off(env):
    return os.environ.get("TESTS_FRESH_INTERPRETERS") or any(k in env for k in _NEVER)


def _forkable(argv, cwd, env):
    if _off(env):
        return False
    text = _program_text(argv, cwd)
    return text is not None and _torch_first(text) and not re.search(r"\bresource\b", text)


def _ask(path, argv, cwd, env, fds, unbuffered=False):
    """Hands the program and its standard streams ``fds`` to the zygote at ``path``: (the connection,
    its replies, the program's pid), or None when the zygote is gone or could not fork."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    request = json.dumps({"argv": list(argv), "cwd": cwd, "env": env, "unbuffered": unbuffered}).encode()
    try:
        conn.connect(path)
        socket.send_fds(conn, [len(request).to_bytes(_HEADER, "little") + request], fds)
        replies = _Replies(conn)
        pid = replies.number()
    except OSError:
        pid = None
    if pid is None:
        conn.close()
        return None
    return conn, replies, pid


def run(argv, cwd, env, timeout):
    """The CompletedProcess of ``python *argv`` forked from a zygote, as ``subprocess.run(...,
    capture_output=True, text=True)`` gives it; None when this program needs a new interpreter
    (see the module's doc)."""
    cwd = os.path.abspath(cwd or os.getcwd())
    if not _forkable(argv, cwd, env) or (state := _zygote_for(env)) is None:
        return None
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        asked = _ask(state["path"], argv, cwd, env, [out.fileno(), err.fileno()])
        if asked is None:
            return None
        conn, replies, pid = asked
        with conn:
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


def launcher(env):
    """The interpreter for the ranks of a torchrun job started with ``env`` (torchrun's
    ``PYTHON_EXEC``), or None when they get new ones (the zygote is off or cannot be had)."""
    if _off(env):
        return None
    state = _zygote_for(env)
    return state and state["launcher"]


def launch(path, start_env):
    """The launcher's program: ``sys.argv[1:]`` (torchrun's ``-u SCRIPT ARGS``) as this process,
    forked from the zygote at ``path`` (started with ``start_env``), or by exec in a new interpreter."""
    argv = sys.argv[1:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_EXEC"}
    unbuffered = argv[:1] == ["-u"]
    program, cwd = argv[unbuffered:], os.getcwd()
    own = {k: v for k, v in env.items() if not _FROM_TORCHRUN.match(k)}
    asked = (program and _forkable(program, cwd, env) and _same_start(own, {"env": start_env})
             and _ask(path, program, cwd, env, [0, 1, 2], unbuffered))
    if not asked:
        os.execve(sys.executable, [sys.executable, *argv], env)
    _, replies, pid = asked

    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    status = replies.number()
    if status is not None and status < 0:  # ended by a signal: so does this process
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(1 if status is None else status)


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
