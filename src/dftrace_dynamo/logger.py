"""Opening and closing the trace file: the DFTracer-compatible Python API.

The C writer (``_core``) does the recording; this module decides whether and
where a file opens (configuration, file name, metadata header) and closes it
at exit, on signals and across fork. Tracing failures never reach the user's
program: they turn tracing off with one message.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import hashlib
import os
import re
import signal
import socket
import sys
import threading
from typing import Optional

import orjson

from . import __version__, _core, config

_lock = threading.RLock()
_prefix: Optional[str] = None  # set while this process (or its fork parent) traces
_source = ""  # where _prefix came from, for messages
_p_idx = -1
_finalized = False  # finalize() was called, or opening failed: no lazy reopen
_signals_bound = False
_TRACE_SUFFIX = re.compile(r"(\.pfw)?(\.gz|\.zst)?$")
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_SURROGATES = re.compile("[\ud800-\udfff]")


class Logger:
    """What :func:`initialize_log` returns (DFTracer's ``df_logger``)."""

    @property
    def path(self) -> Optional[str]:
        return _core.path()

    def finalize(self) -> Optional[dict]:
        return finalize()

    def log_event(self, name: str, cat: str, start_us: float, dur_us: float, args: Optional[dict] = None) -> None:
        log_event(name, cat, start_us, dur_us, args)

    def get_time(self) -> float:
        return get_time()


def _hash16(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=8).hexdigest()


def _clean(text: str) -> str:
    # orjson refuses lone surrogates (e.g. undecodable bytes in argv or cwd)
    return _SURROGATES.sub("\ufffd", text)


def _process_name() -> str:
    """The script's name, or ``python`` for ``-c`` and the interactive prompt."""
    script = sys.argv[0] if sys.argv else ""
    if not script or script.startswith("-"):
        return "python"
    return os.path.splitext(os.path.basename(script))[0] or "python"


def trace_path(prefix: str, compression: int, pid: int, hhash: str, env=os.environ) -> str:
    """``<prefix>-<host hash>-<pid>.pfw.gz``; with RANK set also the rank and process name."""
    parts = [prefix]
    rank = env.get("RANK")
    if rank is not None and rank.strip():
        parts += [f"rank{_NAME_UNSAFE.sub('_', rank.strip())}", _NAME_UNSAFE.sub("_", _process_name())]
    parts += [hhash, str(pid)]
    return "-".join(parts) + config.COMPRESSION_SUFFIX[compression]


def _header(host: str, hhash: str, pid: int, tid: int, p_idx: int) -> bytes:
    """Metadata lines (ids 1..k) and the ``start`` event that open every file."""
    cwd = os.getcwd()
    cmd = ";".join(sys.argv) if sys.argv else sys.executable
    exe = sys.executable or "python"
    rank = os.environ.get("RANK")
    proc_name = f"rank {rank} ({_process_name()} {pid})" if rank else f"{_process_name()} {pid}"
    base = {"cat": "dftracer", "pid": pid, "tid": tid}

    def meta(name: str, args: dict) -> dict:
        return {"name": name, **base, "ph": "M", "args": args}

    def string_hash(name: str, value: str) -> dict:
        return meta(name, {"hhash": hhash, "name": _clean(value), "value": _hash16(value)})

    now = datetime.datetime.now()
    start_args = {
        "hhash": hhash, "cmd_hash": _hash16(cmd), "p_idx": p_idx, "cwd": _hash16(cwd),
        "exec_hash": _hash16(exe), "version": __version__, "date": now.strftime("%a %b %d %H:%M:%S %Y"),
        "ppid": os.getppid(),
    }
    if rank:
        start_args["rank"] = rank
    if os.environ.get("DFTRACER_RUN_ID"):  # set by dftrace-dynamo run: tells runs apart in summary
        start_args["run_id"] = os.environ["DFTRACER_RUN_ID"]
    records = [
        string_hash("HH", host),
        meta("process_name", {"name": _clean(proc_name)}),
        string_hash("FH", cwd),
        string_hash("SH", cmd),
        string_hash("SH", exe),
        {"name": "start", **base, "ts": _core.now_ns() // 1000, "dur": 0, "ph": "X", "args": start_args},
    ]
    return b"".join(orjson.dumps({"id": i, **r}) + b"\n" for i, r in enumerate(records, 1))


def _open(prefix: str, source: str, p_idx: int) -> bool:
    """Opens this process's file under ``prefix``; on failure reports once and returns False."""
    global _prefix, _source, _p_idx, _finalized
    cfg = config.get()
    pid = os.getpid()
    host = socket.gethostname()
    hhash = _hash16(host)
    suffix = config.COMPRESSION_SUFFIX[cfg.compression]
    try:
        directory = os.path.dirname(os.path.abspath(prefix))
        os.makedirs(directory, exist_ok=True)
        if not os.access(directory, os.W_OK):
            raise PermissionError(f"directory {directory} is not writable")
        path = trace_path(prefix, cfg.compression, pid, hhash)
        header = _header(host, hhash, pid, threading.get_native_id(), p_idx)
        base = path[: -len(suffix)]
        for attempt in range(100):  # a pid reused on this host must not clobber an old trace
            candidate = path if attempt == 0 else f"{base}.{attempt}{suffix}"
            try:
                _core.open(candidate, cfg.compression, cfg.write_buffer_size, header, pid, hhash)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"too many traces named {path}")
    except (OSError, RuntimeError, ValueError) as exc:
        _finalized = True
        config.report_disabled(f"cannot write the trace under {source}={prefix!r}: {exc}")
        return False
    _prefix, _source, _p_idx = prefix, source, p_idx
    _bind_signals(cfg)
    return True


def initialize_log(logfile: Optional[str] = None, data_dir: Optional[str] = None, process_id: int = -1) -> Logger:
    """Starts tracing into ``<logfile prefix>-<host hash>-<pid>.pfw.gz``.

    ``data_dir`` is accepted for DFTracer compatibility (this tool traces
    compute, not POSIX I/O). ``process_id`` is written as ``p_idx`` of the
    ``start`` event. With ``DFTRACER_ENABLE=0`` or a bad configuration value
    nothing is written and the returned logger does nothing.
    """
    global _finalized
    cfg = config.get()
    with _lock:
        if cfg.error or cfg.enable is False or _core.is_open():
            return Logger()
        _finalized = False
        if logfile:
            prefix, source = _TRACE_SUFFIX.sub("", str(logfile)), "initialize_log(logfile)"
        else:
            prefix, source = _configured_log(cfg)
        if _open(prefix, source, process_id):
            # spawned children (multiprocessing 'spawn', torchrun workers) trace too, to their own files
            os.environ.setdefault("DFTRACER_ENABLE", "1")
            os.environ.setdefault("DFTRACER_LOG_FILE", os.path.abspath(prefix))
    return Logger()


def _configured_log(cfg: config.Config) -> tuple[str, str]:
    """The log prefix from the configuration, and how to name it in messages."""
    return cfg.log_file, "DFTRACER_LOG_FILE" if cfg.log_file_from_env else "the default log file"


def ensure_open() -> bool:
    """Whether tracing is on, opening the default log first when ``DFTRACER_ENABLE=1``."""
    if _core.is_open():
        return True
    cfg = config.get()
    with _lock:
        if _core.is_open():
            return True
        if cfg.enable is not True or _finalized:
            return False
        return _open(*_configured_log(cfg), -1)


def enabled() -> bool:
    """Whether events are being recorded right now."""
    return _core.is_open()


def finalize() -> Optional[dict]:
    """Writes everything buffered, the ``end`` record and ``]``; later events are not recorded."""
    global _finalized, _prefix
    with _lock:
        _finalized = True
        _prefix = None
        return _core.close()


def get_time() -> float:
    """Microseconds since the epoch on the clock events use (for :func:`log_event`)."""
    return _core.now_ns() / 1000.0


def log_event(name: str, cat: str, start_us: float, dur_us: float, args: Optional[dict] = None) -> None:
    """Records one complete event measured by the caller (µs since the epoch, as :func:`get_time`)."""
    if ensure_open():
        start_ns = int(round(start_us * 1000))
        _core.log(str(name), str(cat), start_ns, start_ns + int(round(dur_us * 1000)), args)


class region(contextlib.ContextDecorator):
    """Marks a span (a step, an epoch, data loading) around traced ops.

    ``with region("step", step=3): ...`` or ``@region("load")``; the keyword
    arguments become the event's args.
    """

    def __init__(self, name: str, cat: str = "region", **args):
        self.name, self.cat, self.args = name, cat, args or None
        self._starts = threading.local()

    def __enter__(self):
        stack = self._starts.__dict__.setdefault("stack", [])
        stack.append(_core.now_ns() if ensure_open() else None)
        return self

    def __exit__(self, *exc):
        start = self._starts.stack.pop()
        if start is not None:
            _core.log(self.name, self.cat, start, _core.now_ns(), self.args)
        return False


def _after_fork_in_child() -> None:
    # the C core dropped the parent's buffer and file; the child gets its own
    global _lock
    _lock = threading.RLock()
    if _prefix is not None:
        _open(_prefix, _source, _p_idx)


def _bind_signals(cfg: config.Config) -> None:
    global _signals_bound
    if not cfg.bind_signals or _signals_bound or threading.current_thread() is not threading.main_thread():
        return
    _signals_bound = True
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        previous = signal.getsignal(sig)

        def handler(signum, frame, previous=previous):
            finalize()
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(sig, handler)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(finalize)
