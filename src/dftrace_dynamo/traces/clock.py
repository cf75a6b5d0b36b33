"""Rank clock offsets for the readers: the ``clock`` record each rank writes (events/clock.py).

A rank's events are moved onto rank 0's clock by its measured offset when the
offset is larger than the measurement's error bound: ranks on one host read one
clock, their measured offset is within its bound and nothing moves, so the
merged view shows their true skew. The record is looked for in files whose name
has ``rank<R>`` (or whose aggregate records hold it), in their first
``SCAN_BYTES`` (it is written when the process group is set up or the trace
opens, near the start).
"""

import math

import orjson

from ..schema import ARG_CLOCK_ERROR, ARG_CLOCK_OFFSET, ARG_RANK
from .reader import MAX_LINE, Damage, is_number, iter_chunks, rank_of

MARK = f'"{ARG_CLOCK_OFFSET}"'.encode()
SCAN_BYTES = 256 << 20


def record(path):
    """The args of the first ``clock`` record of ``path``, or None."""
    buf, seen = b"", 0
    for chunk in iter_chunks(path, Damage(path)):
        seen += len(chunk)
        buf += chunk
        i = buf.find(MARK)
        if i < 0:
            buf = buf[buf.rfind(b"\n") + 1:]  # only a line in progress can still hold it
            if len(buf) > MAX_LINE:  # a line too long to read: keep what could start the mark
                buf = buf[-len(MARK):]
            if seen > SCAN_BYTES:
                return None
            continue
        end = buf.find(b"\n", i)
        if end < 0:
            if len(buf) > MAX_LINE:
                return None
            continue  # the rest of the line is in the next chunk
        return args_of(buf[buf.rfind(b"\n", 0, i) + 1:end])
    return None


def args_of(line):
    """The args of the clock record on ``line`` (the first holding its mark), or None."""
    try:
        args = orjson.loads(line.strip().rstrip(b",")).get("args")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return args if isinstance(args, dict) else None


def ranks(paths, known=None, read=False, only=None):
    """``{input index: rank}`` of the rank files (of the indices ``only``, if given): ``rank<R>``
    in the name, else (a process that set up its process group after its trace opened, as under
    ``torch.multiprocessing.spawn``) the rank of its ``clock`` record where ``known`` holds it, or
    (``read``) read from the file."""
    out, known = {}, known or {}
    for index, path in enumerate(paths):
        if only is not None and index not in only:
            continue
        rank = rank_of(path)
        if rank is None and (index in known or read):
            rank = ((known[index] if index in known else record(path)) or {}).get(ARG_RANK)
        if isinstance(rank, int) and not isinstance(rank, bool):
            out[index] = rank
    return out


MAX_OFFSET_NS = 86_400 * 10**9  # a day: two hosts of one job further apart is a broken record
MAX_ERROR_NS = 60 * 10**9  # a minute: the measurement takes microseconds


def implausible(off, err):
    """Why a clock record's offset and error bound (ns) cannot be applied, or None."""
    if off is None and err is None:
        return None
    if not (is_number(off) and is_number(err)):
        return f"offset {type(off).__name__} and error bound {type(err).__name__} are not both numbers"
    if not (math.isfinite(off) and math.isfinite(err)):
        return "offset or error bound is not finite"
    if err < 0:
        return "negative error bound"
    if abs(off) > MAX_OFFSET_NS or err > MAX_ERROR_NS:
        return "offset over a day or error bound over a minute"
    return None


def offsets_us(paths, known=None, warnings=None):
    """``{input index: (offset µs to subtract from its times, error bound µs)}`` for every rank file
    (:func:`ranks`) with a ``clock`` record; the offset is 0 where it is within its error bound.
    ``known``: ``{input index: args of its clock record or None}`` for the files not to read (their
    aggregate records hold a copy of every clock record). A record that cannot be right
    (:func:`implausible`) is not applied: one line for it goes to ``warnings``."""
    out, known = {}, known or {}
    for index in ranks(paths, known):
        path = paths[index]
        args = (known[index] if index in known else record(path)) or {}
        off, err = args.get(ARG_CLOCK_OFFSET), args.get(ARG_CLOCK_ERROR)
        why = implausible(off, err)
        if why:
            if warnings is not None:
                warnings.append(f"{path}: clock record ignored ({why}); its times are left as recorded")
        elif off is not None:
            out[index] = (round(off / 1000, 3) if abs(off) > err else 0.0, err / 1000)
    return out


def note(name, offset_us, error_us):
    """What the readers say about a rank whose events they move."""
    return (f"{name}: clock {offset_us / 1000:+,.3f} ms from rank 0's (measured when the process group was "
            f"set up, error at most {error_us / 1000:.3f} ms): its times are moved onto rank 0's clock")
