"""Opening and closing the trace file: the DFTracer-compatible Python API.

The C writer (``_core``) does the recording; this module decides whether and
where a file opens (configuration, file name, metadata header) and closes it
at exit, on signals and across fork. Tracing failures never reach the user's
program: they turn tracing off with one message.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import functools
import hashlib
import itertools
import math
import multiprocessing
import operator
import os
import re
import secrets
import signal
import socket
import sys
import threading
import time
from multiprocessing import util as mp_util
from typing import Optional

import orjson

from .. import __version__, _core
from ..schema import ARG_HHASH, ARG_RANK, ARG_RUN_ID, CAT_DFTRACER
from . import config, hooks, threads

_lock = threading.RLock()
_prefix: Optional[str] = None  # set while this process (or its fork parent) traces
_source = ""  # where _prefix came from, for messages
_p_idx = -1
_finalized = False  # finalize() was called, or opening failed: no lazy reopen
# every module that holds events for a file not yet open imports this one first: no event of the
# process starts before this time (the start record's ``since``, which readers bound records by;
# the wall clock, which the trace's clock is mapped onto at import)
_LOADED_US = time.time_ns() // 1000
_signals_bound = False
_exit_hooked_pid: Optional[int] = None  # the multiprocessing child whose exit closes the trace
_sigterm_watch = None  # the wakeup fd of this process's SIGTERM watcher
_fork_sigterm = None  # the SIGTERM handler this forked child installed as it opened its file
_ending = False  # a signal's default action is finalizing the trace, to end the process then
_finalizing = False  # finalize() runs (a signal handler must not run it again inside)
_pending_signal = 0  # a signal whose default action waits for the running finalize()
_serial = itertools.count(1)  # names for a file whose first-choice name is taken
_off_noted = False  # note_off() has logged
_TRACE_SUFFIX = re.compile(r"(\.pfw)?(\.gz|\.zst)?$")
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
# Layers above (step tracking) hear when a file opens and just before it closes.
_open_hooks: list = []
_close_hooks: list = []
_SURROGATES = re.compile("[\ud800-\udfff]")
# what the command line keeps by default: option names (--name, -n), never a value
_OPTION_NAME = re.compile(r"--|--[A-Za-z][\w.-]*|-[A-Za-z]", re.ASCII)
_NAME_EQ = re.compile(r"(?:--?)?[A-Za-z_][\w.-]*=", re.ASCII)  # --name=, name= (Hydra): the name is kept
# options whose next word is hidden even when it looks like an option name (--password --x)
_SECRET_OPTION = re.compile(r"-{0,2}[\w.-]*(?:pass|pwd|token|secret|key|credential|auth|cookie)[\w.-]*",
                            re.IGNORECASE)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s]*@")  # scheme://user:password@
REDACTED = "***"
# args named like a field the tracer writes on the same event keep their value under this prefix
USER_PREFIX = "user_"
_LOG_OWN_FIELDS = frozenset({ARG_HHASH})  # log_event/region events: the only field besides their args
# the C writer's limit on nested lists/dicts inside args (csrc/core.h DFT_ARGS_DEPTH)
ARGS_DEPTH = 16
_MAX_NS = 2**63 - 1  # the latest time a reader takes (int64 ns: the year 2262)
_MAIN_PID = os.getpid()  # a fork child sees its parent's value
_background: list = []  # add_background()
_background_at_open = 0
_adjusted: dict = {}  # kind -> count of values written in another form (or events dropped)
_arg_issues_seen: dict = {}  # _core.arg_issues() counts already reported


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


def host_hash() -> str:
    """The ``hhash`` every record of this host's trace files carries."""
    return _hash16(socket.gethostname())


def _clean(text: str) -> str:
    # orjson refuses lone surrogates (e.g. undecodable bytes in argv or cwd)
    return _SURROGATES.sub("\ufffd", text)


def _process_name() -> str:
    """The script's name, or ``python`` for ``-c`` and the interactive prompt."""
    script = sys.argv[0] if sys.argv else ""
    if not script or script.startswith("-"):
        return "python"
    return os.path.splitext(os.path.basename(script))[0] or "python"


def process_rank(env=os.environ) -> Optional[str]:
    """This process's rank: ``RANK`` (torchrun and most launchers), else the rank in an initialized
    ``torch.distributed`` default group (``torch.multiprocessing.spawn``, launchers that pass the
    rank to ``init_process_group`` themselves). Never imports torch."""
    rank = env.get("RANK")
    if rank is not None and rank.strip():
        return rank.strip()
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return str(dist.get_rank())
    except Exception:  # a torch.distributed in a state we cannot read: no rank
        pass
    return None


def trace_path(prefix: str, compression: int, pid: int, hhash: str, env=os.environ) -> str:
    """``<prefix>-<host hash>-<pid>.pfw.gz``; with a rank (:func:`process_rank`) also the rank and
    process name."""
    parts = [prefix]
    rank = process_rank(env)
    if rank is not None:
        parts += [f"rank{_NAME_UNSAFE.sub('_', rank)}", _NAME_UNSAFE.sub("_", _process_name())]
    parts += [hhash, str(pid)]
    return "-".join(parts) + config.COMPRESSION_SUFFIX[compression]


def strip_userinfo(text: str) -> str:
    """``text`` without the ``user:password@`` of any URL in it."""
    return _USERINFO.sub(r"\1", text)


def redact(argv: list) -> list:
    """What the ``SH`` record keeps of ``argv``: the script (or executable) and option names.

    Every value is replaced by ``***``: a positional word, the value of
    ``--name=value`` or ``name=value``, a single-dash word longer than one
    letter (``-dashvalue``, ``-Xmx4g``) and the word after an option whose name
    looks secret (``--password``, ``--token``, ``--auth``...), whatever it
    looks like. URL credentials are removed from the script path.
    """
    out, hide_next = [strip_userinfo(argv[0])] if argv else [], False
    for arg in argv[1:]:
        name_eq = _NAME_EQ.match(arg)
        if hide_next or not (name_eq or _OPTION_NAME.fullmatch(arg)):
            out.append(REDACTED)
        else:
            out.append(name_eq[0] + REDACTED if name_eq else arg)
        hide_next = not name_eq and _SECRET_OPTION.fullmatch(arg) is not None and not hide_next
    return out


def command_line(argv: list, record_args: bool) -> str:
    """The ``SH`` command line: ``argv`` joined with ``;``, redacted unless ``record_args``
    (DFTRACER_RECORD_ARGS=1); the executable when there is no ``argv``."""
    if not argv:
        return strip_userinfo(sys.executable)
    return ";".join(argv if record_args else redact(argv))


def _header(host: str, hhash: str, pid: int, tid: int, p_idx: int) -> bytes:
    """Metadata lines (ids 1..k) and the ``start`` event that open every file."""
    cwd = strip_userinfo(os.getcwd())
    cmd = command_line(sys.argv, config.get().record_args)
    exe = strip_userinfo(sys.executable or "python")
    rank = process_rank()
    proc_name = f"rank {rank} ({_process_name()} {pid})" if rank else f"{_process_name()} {pid}"
    base = {"cat": CAT_DFTRACER, "pid": pid, "tid": tid}

    def meta(name: str, args: dict) -> dict:
        return {"name": name, **base, "ph": "M", "args": args}

    def string_hash(name: str, value: str) -> dict:
        return meta(name, {ARG_HHASH: hhash, "name": _clean(value), "value": _hash16(value)})

    now = datetime.datetime.now()
    start_args = {
        ARG_HHASH: hhash, "cmd_hash": _hash16(cmd), "p_idx": p_idx, "cwd": _hash16(cwd),
        "exec_hash": _hash16(exe), "version": __version__, "date": now.strftime("%a %b %d %H:%M:%S %Y"),
        "ppid": os.getppid(), "since": _LOADED_US,
    }
    if rank:
        start_args[ARG_RANK] = rank
    # set by dftrace-dynamo run, else torchrun's job id: tells runs apart in summary, and keeps a
    # job's ranks together whatever their clocks say
    run_id = os.environ.get("DFTRACER_RUN_ID") or os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id:
        start_args[ARG_RUN_ID] = _clean(run_id)
    records = [
        string_hash("HH", host),
        meta("process_name", {"name": _clean(proc_name)}),
        string_hash("FH", cwd),
        string_hash("SH", cmd),
        string_hash("SH", exe),
        {"name": "start", **base, "ts": _core.now_ns() // 1000, "dur": 0, "ph": "X", "args": start_args},
    ]
    return b"".join(json_line({"id": i, **r}) for i, r in enumerate(records, 1))


# an escaped backslash just before a closing quote (even run of backslashes)
_END_BACKSLASH = re.compile(rb'(?<!\\)((?:\\\\)*)\\\\"')


def json_line(record: dict) -> bytes:
    """One JSON line; a string's final backslash is written ``\\u005c``, as the C writer does,
    because Perfetto's JSON reader mis-reads ``\\\\"``."""
    return _END_BACKSLASH.sub(rb'\1\\u005c"', orjson.dumps(record)) + b"\n"


def _open(prefix: str, source: str, p_idx: int) -> bool:
    """Opens this process's file under ``prefix``; on failure reports once and returns False."""
    global _prefix, _source, _p_idx, _finalized
    cfg = config.get()
    pid = os.getpid()
    host = socket.gethostname()
    hhash = _hash16(host)
    suffix = config.COMPRESSION_SUFFIX[cfg.compression]
    try:
        path_prefix = _resolve_prefix(prefix)
        directory = os.path.dirname(path_prefix)
        make_dirs(directory)
        if not os.access(directory, os.W_OK):
            raise PermissionError(f"directory {directory} is not writable")
        path = trace_path(path_prefix, cfg.compression, pid, hhash)
        header = _header(host, hhash, pid, threading.get_native_id(), p_idx)
        flight = cfg.flight  # kept in memory, written only in dumps (events.flight)
        _core.flight_set(flight.steps if flight else 0, flight.max_bytes if flight else 0)
        for candidate in _names(path, suffix):
            try:
                _core.open(candidate, cfg.compression, cfg.write_buffer_size, header, pid, hhash)
                break
            except FileExistsError:
                continue
    except (OSError, RuntimeError, ValueError) as exc:
        _finalized = True
        # the OS's message quotes the path: both are cut to one readable line
        config.report_disabled(f"cannot write the trace under {source}={config.shown(prefix)}: "
                               f"{config.cut(str(exc))}")
        return False
    _prefix, _source, _p_idx = path_prefix, source, p_idx
    hooks.install(GROUP)
    _bind_signals(cfg)
    _hook_worker_exit()
    from . import dataloaders  # never imports torch itself

    dataloaders.install_when_imported()
    for hook in _open_hooks:
        hook()
    return True


DIR_MODE = 0o755  # of the directories the tracer creates (the umask may take more away, never add)
_PATH_MAX = os.pathconf("/", "PC_PATH_MAX") if hasattr(os, "pathconf") else 4096


def make_dirs(directory: str) -> None:
    """``os.makedirs`` where every directory created gets :data:`DIR_MODE`: under ``umask 000``
    makedirs would make them writable by everyone (its mode reaches only the last one). On failure
    the directories it made are removed again."""
    if len(os.fsencode(directory)) >= _PATH_MAX:  # no call would take it: say so before walking up it
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), directory)
    missing = []
    while directory and not os.path.isdir(directory):
        missing.append(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    made = []
    try:
        for path in reversed(missing):
            try:
                os.mkdir(path, DIR_MODE)
                made.append(path)
            except FileExistsError:  # made meanwhile by another process of the job
                pass
    except OSError:  # a path that cannot be made (too long, not writable) leaves nothing behind
        for path in reversed(made):
            with contextlib.suppress(OSError):
                os.rmdir(path)
        raise


def _resolve_prefix(value: str) -> str:
    """The absolute file-name prefix that a log file setting means.

    ``~`` is expanded; a value ending in ``/`` or naming a directory means the
    default prefix in that directory; a trailing ``.pfw``/``.gz``/``.zst`` is dropped.
    """
    value = os.path.expanduser(value)
    if value.endswith(os.sep) or os.path.isdir(value):
        value = os.path.join(value, os.path.basename(config.DEFAULT_LOG_FILE))
    directory, name = os.path.split(os.path.abspath(value))
    return os.path.join(directory, _TRACE_SUFFIX.sub("", name) or os.path.basename(config.DEFAULT_LOG_FILE))


def _names(path: str, suffix: str):
    """``path``, then fresh variants of it: a pid reused on this host, or a log
    re-opened by this process, must not clobber an older trace."""
    yield path
    base = path[: -len(suffix)]
    for _ in range(8):
        yield f"{base}.{next(_serial)}{suffix}"
    while True:  # names planted ahead of the serial numbers cannot stop tracing
        yield f"{base}.{secrets.token_hex(6)}{suffix}"


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
            prefix, source = str(logfile), "initialize_log(logfile)"
        else:
            prefix, source = _configured_log(cfg)
        if _open(prefix, source, _process_index(process_id)):
            # spawned children (multiprocessing 'spawn', torchrun workers) trace too, to their own files
            os.environ.setdefault("DFTRACER_ENABLE", "1")
            os.environ.setdefault("DFTRACER_LOG_FILE", _prefix)
    return Logger()


def _process_index(process_id) -> int:
    """``process_id`` as the ``p_idx`` DFTracer's readers expect (an int64), else -1 and a warning:
    a bad value must not stop the program."""
    try:
        value = operator.index(process_id)
        if -2**63 <= value < 2**63:
            return value
    except TypeError:
        pass
    config.log.warning("initialize_log: process_id=%s ignored (p_idx is a 64-bit integer): -1 is written",
                       _repr(process_id))
    return -1


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
            note_off()
            return False
        return _open(*_configured_log(cfg), -1)


def note_off() -> None:
    """Says once, at INFO level, that nothing is recorded, and why."""
    global _off_noted
    if _off_noted:
        return
    _off_noted = True
    cfg = config.get()
    if cfg.error:
        reason = cfg.error
    elif cfg.enable is False:
        reason = "DFTRACER_ENABLE=0"
    elif _finalized:
        reason = "the trace was finalized or could not be opened"
    else:
        reason = "DFTRACER_ENABLE is unset and initialize_log() has not been called"
    config.log.info("tracing is off (%s): nothing is recorded", reason)


def attempted() -> bool:
    """Whether this process has opened a trace file, or tried to (a failure was reported)."""
    return _finalized or _prefix is not None or _core.is_open()


def enabled() -> bool:
    """Whether a trace file is open (its events are recorded unless writing it failed, which
    has then been reported once)."""
    return _core.is_open()


def finalize() -> Optional[dict]:
    """Writes everything buffered, the ``end`` record and ``]``; later events are not recorded."""
    global _finalized, _prefix, _finalizing
    with _lock:
        _finalized = True
        _prefix = None
        _finalizing = True
        try:
            if _core.is_open():
                for hook in _close_hooks:
                    hook()
            result = _core.close()
            if result is not None:
                result["adjusted"] = adjusted()
                if result["num_events"] <= _background_since_open() and result["path"] and _in_child():
                    # a worker that recorded nothing (a DataLoader worker each epoch) leaves no file
                    with contextlib.suppress(OSError):
                        os.unlink(result["path"])
                        result["path"] = None
            return result
        finally:
            _finalizing = False
            if _pending_signal:  # it came while this ran: its default action now
                signal.signal(_pending_signal, signal.SIG_DFL)
                os.kill(os.getpid(), _pending_signal)


def _in_child() -> bool:
    """Whether this process is a fork or a multiprocessing child of the traced program."""
    return os.getpid() != _MAIN_PID or multiprocessing.parent_process() is not None


def add_background(count) -> None:
    """``count()`` is how many events a background sampler (memory counters) has recorded in this
    process so far: a child's file that holds nothing else is removed at finalize."""
    _background.append(count)


def _background_count() -> int:
    return sum(count() for count in _background)


def _background_since_open() -> int:
    return _background_count() - _background_at_open


def _note_background_at_open() -> None:
    global _background_at_open
    _background_at_open = _background_count()  # a fork child inherits its parent's counts


def _holder(name, cat, start, end, args) -> bool:
    return False


def set_holder(hold) -> None:
    """``hold(name, cat, start, end, args)`` may take a region's slice as it ends, to record it later
    (True); steps set it: slices held back for the step they begin must stay in the order they end."""
    global _holder
    _holder = hold


def add_hooks(on_open, on_close) -> None:
    """``on_open()`` runs after each trace file opens, ``on_close()`` before it closes; both must not raise."""
    _open_hooks.append(on_open)
    _close_hooks.append(on_close)


add_hooks(_note_background_at_open, lambda: None)  # the first open hook: before any sampler starts


def get_time() -> float:
    """Microseconds since the epoch on the clock events use (for :func:`log_event`)."""
    return _core.now_ns() / 1000.0


def _adjust(kind: str, message: str, *args) -> None:
    """Counts a value written in another form (or an event dropped); the first of each kind is
    reported, the count is in :func:`finalize`'s result."""
    _adjusted[kind] = _adjusted.get(kind, 0) + 1
    if _adjusted[kind] == 1:
        config.log.warning(message + " (reported once; finalize() counts them under 'adjusted')", *args)


_ARG_ISSUES = {
    "deep": f"an arg value nested deeper than {ARGS_DEPTH} lists or dicts is written as the string "
            "'[...]' or '{...}'",
    "self_reference": "an arg value that contains itself is written as the string '[...]' or '{...}' there",
    "unprintable": "an arg value (or key) whose str() raised is written as '<unprintable TYPE>'",
    "cut": "a name, key or text value longer than 2 MiB is cut there, and an event's args stop after "
           "6 MiB, each with a marker '… [cut: ...]'",
}


def note_arg_issues() -> None:
    """Reports, once per kind, arg values the C writer wrote in another form."""
    for kind, n in _core.arg_issues().items():
        if n > _arg_issues_seen.get(kind, 0):
            if not _arg_issues_seen.get(kind):
                config.log.warning("%s (reported once; finalize() counts them under 'adjusted')",
                                   _ARG_ISSUES[kind])
            _arg_issues_seen[kind] = n


def adjusted() -> dict:
    """Values written in another form, and events dropped, since the process started, by kind."""
    return {**_adjusted, **{k: n for k, n in _core.arg_issues().items() if n}}


def own_fields(args: Optional[dict], fields: frozenset) -> Optional[dict]:
    """``args`` with each name in ``fields`` (one the tracer writes on the same event) renamed
    ``user_<name>``: the tracer's field and the user's value both stay."""
    if not args:
        return args
    # keys are compared as the plain text the writer writes: a str subclass's own __eq__ or
    # __hash__ (which may raise) is never called, nor is any key hashed again
    items = [(k, str.__str__(k) if issubclass(type(k), str) else None, v) for k, v in args.items()]
    clashes = [name for _, name, _ in items if name in fields]
    if not clashes:
        return args
    for name in clashes:
        _adjust(f"field {name}", "%r is a field the tracer writes itself: the value given for it is written "
                "as %r", name, USER_PREFIX + name)
    return {(USER_PREFIX + name if name in fields else k): v for k, name, v in items}


def _unprintable(value) -> str:
    return f"<unprintable {type(value).__name__}>"


def _repr(value) -> str:
    """``repr(value)`` for a message: one line, cut; ``<unprintable TYPE>`` where repr() raises (an int
    past 4300 digits, the user's own bug)."""
    try:
        return config.cut(repr(value), config.SHOWN_CHARS)
    except Exception:
        return _unprintable(value)


def _text(value) -> str:
    """A name or category as text; one whose str() raises is ``<unprintable TYPE>``."""
    if isinstance(value, str):
        return value
    try:
        return str(value)
    except Exception:
        _adjust("unprintable name", "a log_event or region name (or category) whose str() raised is "
                "written as '<unprintable TYPE>'")
        return _unprintable(value)


def _event_ns(name, start_us, dur_us) -> Optional[tuple]:
    """``(start_ns, end_ns)`` of a log_event, or None when it cannot be written (counted)."""
    try:
        if not (math.isfinite(start_us) and 0 <= start_us * 1000 <= _MAX_NS):
            raise ValueError
        whole = math.floor(start_us)  # exact ns: start_us * 1000 would round at epoch magnitude
        start_ns = whole * 1000 + round((start_us - whole) * 1000)
    except (TypeError, ValueError, OverflowError):
        _adjust("start", "log_event(%s): start %s is not a time between 1970 and 2262 in µs: the event is "
                "dropped", _repr(name), _repr(start_us))
        return None
    try:
        dur_ns = round(dur_us * 1000)  # NaN and inf raise
        if start_ns + dur_ns > _MAX_NS:
            raise OverflowError
    except (TypeError, ValueError, OverflowError):
        _adjust("duration", "log_event(%s): duration %s is not a number of µs that ends before 2262: the "
                "event is dropped", _repr(name), _repr(dur_us))
        return None
    if dur_ns < 0:
        _adjust("negative duration", "log_event(%s): negative duration %s: written as 0", _repr(name),
                _repr(dur_us))
        dur_ns = 0
    return start_ns, start_ns + dur_ns


def log_event(name: str, cat: str, start_us: float, dur_us: float, args: Optional[dict] = None) -> None:
    """Records one complete event measured by the caller (µs since the epoch, as :func:`get_time`).

    Never raises: see :ref:`bad values` for what is written, or dropped, instead.
    """
    if ensure_open():
        times = _event_ns(name, start_us, dur_us)
        if times is None:
            return
        if args is not None and not isinstance(args, dict):
            args = {"args": args}
        if _core.log(_text(name), _text(cat), *times, own_fields(args, _LOG_OWN_FIELDS), timed=True):
            note_arg_issues()


class region(contextlib.ContextDecorator):
    """Marks a span (a step, an epoch, data loading) around traced ops.

    ``with region("step", step=3): ...`` or ``@region("load")``; the keyword
    arguments become the event's args.
    """

    def __init__(self, name: str, cat: str = "region", **args):
        self.name, self.cat, self.args = name, cat, own_fields(args, _LOG_OWN_FIELDS) or None
        self._starts = threading.local()

    def __enter__(self):
        stack = self._starts.__dict__.setdefault("stack", [])
        stack.append(_core.now_ns() if ensure_open() else None)
        return self

    def __exit__(self, *exc):
        start = self._starts.stack.pop()
        if start is not None:
            name, cat, end = _text(self.name), _text(self.cat), _core.now_ns()
            record(name, cat, start, end, self.args)
        return False


def record(name: str, cat: str, start: int, end: int, args: Optional[dict] = None) -> None:
    """Records a slice (ns) that just ended on this thread, after the slices steps hold back (see
    :func:`set_holder`) where some are."""
    if not _holder(name, cat, start, end, args) and _core.log(name, cat, start, end, args):
        note_arg_issues()


def _after_fork_in_child() -> None:
    # the C core dropped the parent's buffer and file; the child gets its own
    global _lock, _sigterm_watch, _fork_sigterm
    _lock = threading.RLock()
    if _sigterm_watch is not None:  # the parent's watcher thread is not here: its pipe must not hear our signals
        write_fd, _sigterm_watch = _sigterm_watch, None
        with contextlib.suppress(ValueError):  # signal calls need the main thread
            previous = signal.set_wakeup_fd(-1)
            if previous != write_fd:
                signal.set_wakeup_fd(previous)
            hooks.remove_one(_SIGTERM_HOOK)
    if _prefix is not None:
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            # before the file exists: a Pool worker killed while it starts up leaves none unfinished
            _fork_sigterm = _chain_signal(signal.SIGTERM)
        _open(_prefix, _source, _p_idx)


def _hook_worker_exit() -> None:
    """Closes the trace when this multiprocessing child ends.

    Such a child ends with ``os._exit``: atexit never runs there, but
    multiprocessing's own finalizers do. ``Pool.terminate()`` (and leaving a
    ``with Pool`` block) sends SIGTERM, which then finalizes too, where
    SIGTERM still has its default action.
    """
    global _exit_hooked_pid
    if multiprocessing.parent_process() is None or _exit_hooked_pid == os.getpid() or not _core.is_open():
        return
    _exit_hooked_pid = os.getpid()
    mp_util.Finalize(None, finalize, exitpriority=-100)  # after the child's other finalizers
    current = signal.getsignal(signal.SIGTERM)
    # ours since the fork, or none yet; a handler of the program's own is left alone
    handler = _chain_signal(signal.SIGTERM) if current == signal.SIG_DFL else (
        current if current is _fork_sigterm else None)
    if handler is not None:
        _watch_sigterm(handler)


def _watch_sigterm(handler) -> None:
    """Makes sure a SIGTERM reaches ``handler``.

    Python runs handlers between bytecodes of the main thread: a SIGTERM that
    lands just before that thread blocks (a Pool worker about to wait for its
    next task) would wait forever, and so would ``Pool.terminate()``. Python
    also writes every caught signal to its wakeup fd; a thread reading it sends
    SIGTERM to the main thread again until the handler has run.
    """
    global _sigterm_watch
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    if previous != -1:  # the program's own
        signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        return
    _sigterm_watch = write_fd
    main = threading.main_thread().ident

    def watch():
        while signal.SIGTERM not in os.read(read_fd, 64):
            pass
        while signal.getsignal(signal.SIGTERM) is handler and not _ending:
            time.sleep(0.05)
            signal.pthread_kill(main, signal.SIGTERM)

    threads.start(watch, "dftrace-sigterm")


def _after_multiprocessing_fork() -> None:
    # Process._bootstrap has just dropped the finalizers the child inherited or registered
    global _exit_hooked_pid
    _exit_hooked_pid = None
    _hook_worker_exit()


def _bind_signals(cfg: config.Config) -> None:
    global _signals_bound
    if not cfg.bind_signals or _signals_bound or threading.current_thread() is not threading.main_thread():
        return
    _signals_bound = True
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        _chain_signal(sig)


def _chain_signal(sig: int):
    """Handles ``sig`` before the handler it had; returns the new handler, or None.

    Where that handler ends the process (the default action) the trace is
    finalized first. A Python handler of the program's own (SIGINT's
    KeyboardInterrupt included) runs after a flush, and tracing goes on if
    the program does; an exit it causes finalizes through atexit. Ignored
    signals, handlers set outside Python and threads other than the main
    one are left alone.
    """
    previous = signal.getsignal(sig)
    if previous in (signal.SIG_IGN, None) or threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        global _ending, _pending_signal
        if callable(previous):
            _core.flush()
            previous(signum, frame)
            return
        if _ending:  # a repeat (the SIGTERM watcher's) while finalize runs: it must not re-enter
            return
        _ending = True
        if _finalizing:  # it interrupted finalize (a worker's exit): that ends the process when done
            _pending_signal = signum
            return
        finalize()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    hook = hooks.declare(hooks.Signal(f"signal {signal.Signals(sig).name}", SIGNAL_GROUP, sig, handler))
    hooks.install_one(hook.name)
    return handler if hook.handler is handler else None


_EXIT_WAIT_S = 5.0  # how long os._exit waits for another thread's finalize (or open) to end


def _finalize_before_exit(exit_):
    """``os._exit`` that finalizes the trace first: atexit does not run there, and a forked child
    (a framework's worker, a ``multiprocessing`` child) commonly ends that way right after its work."""

    @functools.wraps(exit_)
    def _exit(status):
        try:
            operator.index(status)  # a bad status raises below, with the trace still open
            if not _finalizing and _lock.acquire(timeout=_EXIT_WAIT_S):
                try:
                    finalize()
                finally:
                    _lock.release()
        except Exception:  # tracing never stands between the program and its exit
            pass
        exit_(status)

    return _exit


GROUP, SIGNAL_GROUP = "process", "signals"
_SIGTERM_HOOK = f"signal {signal.SIGTERM.name}"
for _hook in (hooks.AtExit("finalize at exit", GROUP, finalize),
              hooks.Patch("finalize at os._exit", GROUP, lambda: os, "_exit", _finalize_before_exit),
              hooks.AtFork("trace file of a forked child", GROUP, _after_fork_in_child),
              hooks.AfterProcessFork("multiprocessing child exit", GROUP, _after_multiprocessing_fork)):
    hooks.declare(_hook)
