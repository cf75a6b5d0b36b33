"""Every DFTRACER_* environment variable, read and validated in one place.

Names and meanings follow DFTracer where they overlap. A bad value never
raises: it turns tracing off and :func:`get` reports the reason once.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import re
import sys
from typing import Mapping, Optional

log = logging.getLogger("dftrace_dynamo")

# GZIP: the writer's own encoder for trace lines; GZIP_GENERAL: a general deflate (libdeflate or
# zlib level 1), which searches for repeats anywhere: several times the writer's CPU
COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_ZSTD, COMPRESSION_GZIP_GENERAL = 0, 1, 2, 3
COMPRESSION_SUFFIX = {COMPRESSION_NONE: ".pfw", COMPRESSION_GZIP: ".pfw.gz", COMPRESSION_ZSTD: ".pfw.zst",
                      COMPRESSION_GZIP_GENERAL: ".pfw.gz"}
DEFAULT_LOG_FILE = "./trace"
DEFAULT_BUFFER_SIZE = 16 * 1024 * 1024
MIN_BUFFER_SIZE = 64 * 1024
LOG_LEVELS = {"ERROR": logging.ERROR, "WARN": logging.WARNING, "WARNING": logging.WARNING,
              "INFO": logging.INFO, "DEBUG": logging.DEBUG}
_BOOL = {"0": False, "1": True}
_COMPRESSION = {"0": COMPRESSION_NONE, "1": COMPRESSION_GZIP, "gzip": COMPRESSION_GZIP,
                "2": COMPRESSION_ZSTD, "zstd": COMPRESSION_ZSTD, "gzip-general": COMPRESSION_GZIP_GENERAL}
_SIZE_UNITS = {"": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024**2, "MB": 1024**2,
               "MIB": 1024**2, "G": 1024**3, "GB": 1024**3, "GIB": 1024**3}
_SIZE = re.compile(r"([0-9]+)([A-Z]*)", re.ASCII)
_INIT_MODES = ("FUNCTION", "PRELOAD")
# every variable read here, DFTRACER_RUN_ID (set by dftrace-dynamo run), and DFTracer's own
# that this tool has no use for: a DFTracer set-up must not draw a message
VARIABLES = ("DFTRACER_ENABLE", "DFTRACER_LOG_FILE", "DFTRACER_INC_METADATA", "DFTRACER_MODULE_SLICES",
             "DFTRACER_TRACE_COMPRESSION", "DFTRACER_WRITE_BUFFER_SIZE", "DFTRACER_BIND_SIGNALS",
             "DFTRACER_LOG_LEVEL", "DFTRACER_CUDA_EVENTS", "DFTRACER_INIT", "DFTRACER_DATA_DIR",
             "DFTRACER_DISABLE_IO", "DFTRACER_STEPS", "DFTRACER_RECORD_ARGS", "DFTRACER_RUN_ID",
             "DFTRACER_FLIGHT", "DFTRACER_FLIGHT_SLOW", "DFTRACER_FLIGHT_HANG", "DFTRACER_FLIGHT_BYTES",
             "DFTRACER_FLIGHT_DUMPS", "DFTRACER_EAGER_OPS", "DFTRACER_TRAINER_SLICES")
_DFTRACER_ONLY = ("DFTRACER_DISABLE_POSIX", "DFTRACER_DISABLE_STDIO", "DFTRACER_TIME_METRIC",
                  "DFTRACER_DISABLE_TIDS")


class ConfigError(ValueError):
    """A DFTRACER_* variable holds a value we do not accept."""


SHOWN_CHARS = 80  # of a value echoed in a message
_MAX_DIGITS = 19  # of a number we read (int64): longer ones are refused, never handed to int()


def shown(value: str) -> str:
    """``repr(value)``, cut to its first SHOWN_CHARS characters (saying how long it was): a
    message about a value must stay one readable line."""
    text = repr(value[:SHOWN_CHARS + 1])  # escapes make it longer than the value
    if len(value) <= SHOWN_CHARS and len(text) <= SHOWN_CHARS + 2:
        return text
    return f"{text[:SHOWN_CHARS]}… ({len(value):,} characters)"


def cut(text: str, limit: int = 2 * SHOWN_CHARS) -> str:
    """``text`` (an error's message that may quote a value) as one line of at most ``limit``
    characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + f"… ({len(text):,} characters)"


@dataclasses.dataclass(frozen=True)
class Config:
    enable: Optional[bool] = None  # None: unset, on once initialize_log() is called
    log_file: str = DEFAULT_LOG_FILE
    log_file_from_env: bool = False
    inc_metadata: bool = False
    module_slices: bool = True  # DFTRACER_MODULE_SLICES: module events around the ops of each call
    eager_ops: bool = True  # DFTRACER_EAGER_OPS: op events of the ops that run outside compiled graphs
    trainer_slices: bool = True  # DFTRACER_TRAINER_SLICES: a slice per call of a trainer's loop code
    compression: int = COMPRESSION_GZIP
    write_buffer_size: int = DEFAULT_BUFFER_SIZE
    bind_signals: bool = False
    log_level: int = logging.WARNING
    cuda_events: bool = False
    init: str = "FUNCTION"
    data_dirs: tuple = ()
    disable_io: bool = False
    steps: Optional[tuple] = None  # DFTRACER_STEPS windows; None: every step
    record_args: bool = False  # DFTRACER_RECORD_ARGS: the command line's values in the SH record
    flight: Optional["Flight"] = None  # DFTRACER_FLIGHT: the flight recorder's settings; None: off
    flight_error: Optional[str] = None  # a bad DFTRACER_FLIGHT* value: the whole trace is written
    error: Optional[str] = None  # why tracing is off, when a value was bad
    warning: Optional[str] = None  # a value that was adjusted, and how


@dataclasses.dataclass(frozen=True)
class Flight:
    """The flight recorder's settings (DFTRACER_FLIGHT*)."""
    steps: int  # the last N steps kept in memory
    slow: float = 3.0  # a steady step longer than slow x the running median dumps
    hang: float = 300.0  # seconds without a step ending that dump (0: never)
    max_bytes: int = 256 * 1024 * 1024  # the kept members' bytes (compressed, as written)
    max_dumps: int = 10  # dumps per trace file; later triggers are reported once and ignored


def _number(env: Mapping[str, str], name: str, default, kind, low, accepted: str):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:  # a long text is no number we read (int() of thousands of digits is slow or refused)
        value = kind(raw.strip()) if len(raw.strip()) <= 2 * _MAX_DIGITS else None
    except ValueError:
        value = None
    if value is None or value != value or value in (float("inf"),) or value < low:
        raise ConfigError(f"{name}={shown(raw)} is not valid (accepted: {accepted})")
    return value


def _flight(env: Mapping[str, str]) -> Optional[Flight]:
    """DFTRACER_FLIGHT and its companions; None when DFTRACER_FLIGHT is unset or 0."""
    steps = _number(env, "DFTRACER_FLIGHT", 0, int, 0, "a number of steps >= 1, or 0 for off")
    slow = _number(env, "DFTRACER_FLIGHT_SLOW", 3.0, float, 1.0, "a factor >= 1, e.g. 3")
    hang = _number(env, "DFTRACER_FLIGHT_HANG", 300.0, float, 0.0, "seconds >= 0, 0 for never")
    max_bytes = _size(env, "DFTRACER_FLIGHT_BYTES", Flight.max_bytes)
    dumps = _number(env, "DFTRACER_FLIGHT_DUMPS", 10, int, 1, "a number of dumps >= 1")
    return Flight(steps, slow, hang, max_bytes, dumps) if steps else None


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return _BOOL[raw.strip()]
    except KeyError:
        raise ConfigError(f"{name}={shown(raw)} is not valid (accepted: 0 or 1)") from None


def _size(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    match = _SIZE.fullmatch(raw.strip().upper())
    if not match or match[2] not in _SIZE_UNITS:
        raise ConfigError(f"{name}={shown(raw)} is not valid (accepted: a number of bytes >= "
                          f"{MIN_BUFFER_SIZE}, optionally with K, M or G)")
    digits = match[1].lstrip("0") or "0"
    if len(digits) > _MAX_DIGITS:  # more than any machine holds (and past what int() reads)
        return max_buffer_size() + 1
    value = int(digits) * _SIZE_UNITS[match[2]]
    if value < MIN_BUFFER_SIZE:
        raise ConfigError(f"{name}={shown(raw)} is too small (accepted: at least {MIN_BUFFER_SIZE} bytes)")
    return value


def max_buffer_size() -> int:
    """The most event memory this machine is asked for: a quarter of its physical memory."""
    try:
        return max(MIN_BUFFER_SIZE, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4)
    except (ValueError, OSError):
        return 1 << 32


def _choice(env: Mapping[str, str], name: str, table: Mapping[str, object], default, accepted: str,
            key=str.lower):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return table[key(raw.strip())]
    except KeyError:
        raise ConfigError(f"{name}={shown(raw)} is not valid (accepted: {accepted})") from None


# ---- step windows (DFTRACER_STEPS) ----------------------------------------
STEPS_GRAMMAR = "comma-separated A-B, A, A- or A-B:K (every K-th step), e.g. 10-12,100- or 0-:100"
# not '٣' (int() reads any digit), nor more digits than a step number has
_STEP_ITEM = re.compile(r"^(\d{1,%d})(?:(-)(\d{0,%d})(?::(\d{1,%d}))?)?$" % ((_MAX_DIGITS,) * 3), re.ASCII)


def parse_steps(text: str) -> Optional[tuple]:
    """``"10-12,100-"`` -> ``((10, 12, 1), (100, None, 1))``: (first, last or None, stride) windows.

    Empty text means every step (``None``); a bad item raises ``ValueError`` naming the grammar.
    """
    if not text.strip():
        return None
    windows = []
    for item in text.split(","):
        m = _STEP_ITEM.match(item.strip())
        if not m:
            raise ValueError(f"{shown(text)} is not valid (accepted: {STEPS_GRAMMAR})")
        first = int(m[1])
        last = first if m[2] is None else (int(m[3]) if m[3] else None)
        stride = int(m[4]) if m[4] is not None else 1
        if (last is not None and last < first) or stride < 1:
            raise ValueError(f"{shown(text)} is not valid (accepted: {STEPS_GRAMMAR}; A <= B, K >= 1)")
        windows.append((first, last, stride))
    return tuple(windows)


def step_selected(windows: Optional[tuple], step: int) -> bool:
    """Whether ``step`` lies in one of the windows (``None``: every step)."""
    if windows is None:
        return True
    return any(step >= a and (b is None or step <= b) and (step - a) % k == 0 for a, b, k in windows)


def _steps(env: Mapping[str, str], name: str) -> Optional[tuple]:
    raw = env.get(name)
    try:
        return parse_steps(raw or "")
    except ValueError as exc:
        raise ConfigError(f"{name}={exc}") from None
# ---------------------------------------------------------------------------


def load(env: Mapping[str, str] = os.environ) -> Config:
    """Parses the variables; a bad value gives a Config with ``error`` set and tracing off."""
    try:
        enable_raw = env.get("DFTRACER_ENABLE")
        enable = None if enable_raw is None or enable_raw.strip() == "" else _flag(env, "DFTRACER_ENABLE", False)
        log_file = env.get("DFTRACER_LOG_FILE", "").strip()
        init = _choice(env, "DFTRACER_INIT", {m: m for m in _INIT_MODES}, "FUNCTION", "FUNCTION or PRELOAD",
                       key=str.upper)
        data_dir = env.get("DFTRACER_DATA_DIR", "").strip()
        buffer_size = _size(env, "DFTRACER_WRITE_BUFFER_SIZE", DEFAULT_BUFFER_SIZE)
        warning, cap = None, max_buffer_size()
        if buffer_size > cap:
            # more than the machine holds: every ring allocation would fail and drop every event
            buffer_size = cap
            warning = (f"DFTRACER_WRITE_BUFFER_SIZE={shown(env['DFTRACER_WRITE_BUFFER_SIZE'])} is more than this "
                       f"machine can hold; using {buffer_size >> 20}M (a quarter of its memory)")
        return Config(
            enable=enable,
            log_file=log_file or DEFAULT_LOG_FILE,
            log_file_from_env=bool(log_file),
            inc_metadata=_flag(env, "DFTRACER_INC_METADATA", False),
            module_slices=_flag(env, "DFTRACER_MODULE_SLICES", True),
            eager_ops=_flag(env, "DFTRACER_EAGER_OPS", True),
            trainer_slices=_flag(env, "DFTRACER_TRAINER_SLICES", True),
            compression=_choice(env, "DFTRACER_TRACE_COMPRESSION", _COMPRESSION, COMPRESSION_GZIP,
                                "0 for none, 1 or gzip, gzip-general, 2 or zstd"),
            write_buffer_size=buffer_size,
            bind_signals=_flag(env, "DFTRACER_BIND_SIGNALS", False),
            log_level=_choice(env, "DFTRACER_LOG_LEVEL", LOG_LEVELS, logging.WARNING,
                              "ERROR, WARN, INFO or DEBUG", key=str.upper),
            cuda_events=_flag(env, "DFTRACER_CUDA_EVENTS", False),
            init=init,
            data_dirs=tuple(d for d in data_dir.split(":") if d),
            disable_io=_flag(env, "DFTRACER_DISABLE_IO", False),
            record_args=_flag(env, "DFTRACER_RECORD_ARGS", False),
            warning=warning,
            steps=_steps(env, "DFTRACER_STEPS"),
            **_flight_fields(env),
        )
    except ConfigError as exc:
        return Config(enable=False, error=str(exc))


def _flight_fields(env: Mapping[str, str]) -> dict:
    """A bad flight value is not a bad trace: tracing goes on in its normal mode (the whole trace)."""
    try:
        return {"flight": _flight(env)}
    except ConfigError as exc:
        return {"flight_error": f"{exc}; the flight recorder is off and the whole trace is written"}


def unknown_variables(env: Mapping[str, str] = os.environ) -> list:
    """A message for each set ``DFTRACER_*``-like name that nothing reads (a misspelling is
    otherwise silently ignored), naming the closest real variable when there is one."""
    messages = []
    for name in sorted(env):
        if not name.upper().startswith("DFTRACE") or name in VARIABLES or name in _DFTRACER_ONLY:
            continue
        close = difflib.get_close_matches(name.upper(), VARIABLES, n=1, cutoff=0.75)
        hint = f"did you mean {close[0]}?" if close else "see the list in the configuration docs"
        messages.append(f"{cut(name, SHOWN_CHARS)} is not a variable dftrace_dynamo reads and is ignored ({hint})")
    return messages


def buffer_size_note(env: Mapping[str, str], cfg: Config) -> Optional[str]:
    """What a DFTRACER_WRITE_BUFFER_SIZE value became, in bytes (suffixes are powers of 1024)."""
    raw = env.get("DFTRACER_WRITE_BUFFER_SIZE", "").strip()
    if not raw or cfg.error:
        return None
    return f"DFTRACER_WRITE_BUFFER_SIZE={shown(raw)}: {cfg.write_buffer_size} bytes ({cfg.write_buffer_size / 2**20:g} MiB)"


_config: Optional[Config] = None


def get() -> Config:
    """The process's configuration, read once; a bad value is reported here, once."""
    global _config
    if _config is None:
        _config = load()
        _setup_logging(_config.log_level)
        for message in unknown_variables():
            log.warning("%s", message)
        if _config.error:
            report_disabled(_config.error)
        elif _config.warning:
            log.warning("%s", _config.warning)
        if _config.flight_error and not _config.error:
            log.warning("%s", _config.flight_error)
        note = buffer_size_note(os.environ, _config)
        if note:
            log.info("%s", note)
    return _config


def _setup_logging(level: int) -> None:
    log.setLevel(level)
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("dftrace_dynamo: %(message)s"))
        log.addHandler(handler)
        log.propagate = False


def report_disabled(reason: str) -> None:
    """The one message a user gets when tracing cannot run; their program goes on."""
    _setup_logging(log.level or logging.WARNING)
    log.error("tracing is off: %s", reason)
