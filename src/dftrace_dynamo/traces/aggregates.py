"""Aggregates stored in a trace file, so that ``summary`` and ``diff`` need not read every event.

One metadata record (``"ph":"M"``, ``"name":"dftrace_aggregates"``, ``cat``
``dftracer``) holds in ``args`` what the summary needs of the file (see
docs/format.rst, "Aggregate records"): per op/graph group (name, module path,
phase, graph, process, kernel or not; kept per step for the warm-up steps, all
other steps together) its count, timed count, exact sum (integer ns), min, max,
sum of squares and the quantile sketch buckets (:mod:`.sketch`); the step
slices and their per-step sums, the compile records, the evaluation slices, the
events the rank view reads, the per-step samples of ``diff`` and the run's
time span. A file may hold several such records (checkpoints): the last one
counts.

This is the *source* stage of ``summary`` for the records: :func:`trusted` gives a file's
record only when :mod:`.trust` finds it still describing the file (:func:`verified`) and each
of its values plausible; :mod:`.partials` turns it into a partial. It is looked for in the last
few members of the file (:data:`SEARCH_MEMBERS`), each decoded once; in a file that was not
closed, further back (:data:`KILLED_BYTES`). :func:`compute` and :func:`write` make a version 1
record from a full scan of the file and store it in it. The trace writer writes version 2
records itself (csrc/aggregates.c).
"""

import os
import zlib

import orjson

from ..schema import AGGREGATES_RECORD, CAT_DFTRACER
from . import clock, kernels, sketch, trust
from .events import BUCKETED, NS, load, rank_columns, warm_condition
from .kinds import GRAPH, OP, PROCESS_NAME
from .reader import MAX_LINE, MEMBER_START, TraceError, compression_of, decode_members, starts_a_line
from .writer import compress

NAME = AGGREGATES_RECORD
VERSION = 1  # the records compute() makes
WRITER_VERSION = 2  # the records the trace writer writes (csrc/aggregates.c)
MARKER = b'"name":"' + NAME.encode() + b'"'
EVENTS = b',"events":['  # the last key of a writer's record
MAX_SAMPLES = 100_000  # per-step samples kept at most (else diff reads the events)
# the record is looked for in the last SEARCH_MEMBERS members (plain text: SEARCH_BYTES) of a
# file: a file without one (the common case) costs a summary only that much more decoding
SEARCH_BYTES, SEARCH_MEMBERS = 8 << 20, 4
KILLED_BYTES = 64 << 20  # searched for the last checkpoint of a file that was not closed


def compute(path):
    """The aggregate record (its ``args``) of the trace file ``path``, from a full scan."""
    con, base, info = load([path], [0], rank_rows=False)
    groups = con.execute(f"""
        SELECT kind, name, module, phase, graph, pid, extra IS NOT NULL AND kind = {OP},
               CASE WHEN {warm_condition(info["warmup_keys"])} THEN step END, b, count(*), count(dur), sum({NS}),
               min(dur), max(dur), sum(dur * dur)
        FROM {BUCKETED} WHERE kind IN ({OP}, {GRAPH}) GROUP BY ALL ORDER BY ALL""").fetchall()
    samples = con.execute(f"""
        SELECT grouping(name, module, phase), pid, step, name, module, phase, sum(coalesce({NS}, 0)) FROM ev
        WHERE kind = {OP} AND step IS NOT NULL
        GROUP BY GROUPING SETS ((pid, step, name), (pid, step, module), (pid, step, phase)) ORDER BY ALL""").fetchall()
    names = dict(con.execute(f"SELECT pid, any_value(aname) FROM ev WHERE kind = {PROCESS_NAME} GROUP BY pid")
                 .fetchall())
    info_rows = kernels.view(con, f"kind = {OP}", None)
    rank_rows = rank_columns(con) if base["slices"] else None
    con.close()
    views = {0b011: "op", 0b101: "module", 0b110: "phase"}  # grouping() bits of the columns left out
    return {
        "version": VERSION,
        "warmup": sorted([int(p), int(s)] for _, p, s in info["warmup_keys"]),
        "groups": groups,
        "process_names": [[p, n] for p, n in names.items()],
        "kernels": [[r["key"], r["kernel_type"], r["fused_ops"]] for r in info_rows],
        "samples": [[views[m], pid, step, name if m == 0b011 else module if m == 0b101 else phase, ns]
                    for m, pid, step, name, module, phase, ns in samples] if len(samples) <= MAX_SAMPLES else None,
        **{k: base[k] for k in ("runs", "unparsed", "evaluation", "records", "slices", "parts")},
        "rank_rows": rank_rows,
        "clock": clock.record(path),  # the rank view then reads no file for it
        "nested_parts": True,  # parts holds the rows of the parts nested in optimizer events
        "eager_parts": True,  # and those of the eager forward
        "gc_parts": True,  # and those of garbage collection
        "trainer_parts": True,  # and those of trainer code
    }


def trusted(path):
    """:func:`verified`'s record of ``path`` (a writer's copied events as the JSON text of their
    array) when each of its values is plausible too; None without one; :class:`.trust.Untrusted`
    when it does not describe the file."""
    record = verified(path, raw_events=True)
    if record is not None:
        _plausible(record)
    return record


def _plausible(record):
    """Raises :class:`.trust.Untrusted` unless each value of a :func:`verified` ``record`` is plausible
    (a writer's copied events are checked once read, in :mod:`.partials`)."""
    plausible = trust.Plausible(record["span"])
    if record.get("version") == WRITER_VERSION:
        plausible.writer_record(record, sketch.key)
    elif record.get("version") == VERSION:
        plausible.computed_record(record, sketch.key)
    else:
        raise trust.Untrusted(f"has a version this reader does not know ({record.get('version')!r})")


def _members_from_end(path, kind, budget=SEARCH_BYTES, members=SEARCH_MEMBERS):
    """(offset, end, text) of the file's last ``members`` members/frames that start a line, last
    first, within its last ``budget`` bytes, each decoded once; a plain file is one piece from
    its first whole line in that window to its end."""
    size = os.path.getsize(path)
    start = max(0, size - budget)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    if kind is None:
        first = 0 if start == 0 else data.find(b"\n") + 1
        yield start + first, size, data[first:]
        return
    end = pos = len(data)
    while (pos := data.rfind(MEMBER_START[kind], 0, pos)) >= 0:
        if starts_a_line(data[pos:pos + (1 << 18)], kind):
            # a member that large holds no record a reader would take, and must not fill the memory
            text = decode_members(data[pos:end], kind, 2 * MAX_LINE)
            if text is not None:  # else a false start inside compressed data
                yield start + pos, start + end, text
                end = pos
                members = members and members - 1
                if members == 0:
                    return


def _locate(path):
    """Where the last aggregate record of the trace file ``path`` stands, or None without one:
    (its line, the file offset of the member (plain text: the piece) read, where the line starts
    in that member's ``text``, the text after the member, whether the file was closed). In a
    closed file only the ``end`` record may follow it (:class:`.trust.Untrusted` otherwise: an
    event the record does not hold follows). A file that was not closed (its process was killed)
    is searched further back, up to :data:`KILLED_BYTES` from its end, for its last checkpoint."""
    def last(budget, members):  # (offset, text of the last member holding a record or None, text after it, closed)
        closed, after = None, b""
        for offset, _, piece in _members_from_end(path, kind, budget, members):
            closed = piece.rstrip().endswith(b"]") if closed is None else closed
            if MARKER in piece:
                return offset, piece, after, closed
            after = piece + after
        return None, None, after, closed

    kind = compression_of(path)
    offset, text, after, closed = last(SEARCH_BYTES, SEARCH_MEMBERS)
    if text is None and closed is False:
        offset, text, after, _ = last(KILLED_BYTES, None)
    if text is None:
        return None
    at = text.rfind(MARKER)
    end = text.find(b"\n", at) if text.find(b"\n", at) >= 0 else len(text)
    closed = closed is not False
    if closed and not all(_is_end(line) for line in (text[end:] + after).splitlines()):
        raise trust.Untrusted("is followed by events it does not hold")
    line_at = text.rfind(b"\n", 0, at) + 1
    return text[line_at:end].rstrip(b",\r"), offset, line_at, text, after, closed, kind


def _parse(line, raw_events):
    """The ``args`` of a record ``line`` (see :func:`read`); :class:`.trust.Untrusted` when it is not JSON
    as documented."""
    try:
        args = raw_events and _without_events(line) or orjson.loads(line)["args"]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        raise trust.Untrusted("is not JSON as documented (cut or edited?)") from None
    if not isinstance(args, dict):
        raise trust.Untrusted("is not JSON as documented (cut or edited?)")
    return args


def read(path, raw_events=False):
    """The last aggregate record (its ``args``, with ``closed``: whether the file was closed) of
    the trace file ``path``, or None when it has none that :func:`_locate` finds or it is no JSON.
    Unchecked: :func:`verified` says whether it describes the file. ``raw_events``: a writer's
    record keeps its copied events as the JSON text of their array."""
    try:
        found = _locate(path)
        return found and dict(_parse(found[0], raw_events), closed=found[5])
    except (OSError, trust.Untrusted):
        return None


def verified(path, raw_events=False):
    """:func:`read`'s record when the file still holds the bytes it stands for (its ``covers``),
    with ``span``, the time span its events must lie in (:func:`.trust.span`); None without one;
    :class:`.trust.Untrusted` when there is one that does not describe the file. Its values are
    checked apart (:class:`.trust.Plausible`)."""
    try:
        found = _locate(path)
    except OSError:
        return None
    if found is None:
        return None
    line, offset, line_at, text, after, closed, kind = found
    record = _parse(line, raw_events)
    trust.check_covers(path, kind is not None, offset, line_at, text, record.get("covers"))
    return dict(record, closed=closed, span=trust.span(path, text[:line_at], after, closed))


def _without_events(line):
    """The ``args`` of a writer's record ``line`` with its copied events left as the JSON text of
    their array (the writer writes them last; parsing them is most of the cost of reading a
    record, and DuckDB reads them anyway), or None when the line is not laid out so."""
    at = line.find(EVENTS)
    if at < 0 or not line.endswith(b"]}}"):
        return None
    try:  # the line up to the events, closed: parses only when they are a key of args
        args = orjson.loads(line[:at] + b"}}")["args"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    if not isinstance(args, dict) or args.get("version") != WRITER_VERSION:
        return None
    return dict(args, events=line[at + len(EVENTS) - 1:-2])


def _is_end(line):
    """Whether ``line`` may follow the last record of a closed file: blank, ``]`` or the ``end`` record."""
    line = line.strip().rstrip(b",")
    if line in (b"", b"]"):
        return True
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return isinstance(event, dict) and event.get("name") == "end" and event.get("cat") == CAT_DFTRACER


def write(path, record=None):
    """Stores the aggregate ``record`` (default: :func:`compute`) in the trace file ``path``, as a
    line just before its closing ``]`` (a compressed file's last member/frame is rewritten)."""
    record = record if record is not None else compute(path)
    kind = compression_of(path)
    pids = [p for p, _ in record.get("process_names") or []] + [g[5] for g in record.get("groups") or [] if len(g) > 5]
    pid = pids[0] if pids else 0
    size = os.path.getsize(path)
    # the last member (plain text: the tail) when it holds the closing ']', else the file's end
    offset, end, text = next(_members_from_end(path, kind), (size, size, b""))
    at = text.rfind(b"]")
    if end != size or at < 0 or text[at + 1:].strip():  # not closed (a running or killed process)
        offset, text, at = size, b"", 0
    # the bytes it stands for, as the trace writer cites them
    record = dict(record, covers={"bytes": offset, "crc32": trust.crc(path, 0, offset), "text_bytes": at,
                                  "text_crc32": zlib.crc32(text[:at])})

    def encode(args):
        return orjson.dumps({"name": NAME, "cat": CAT_DFTRACER, "ph": "M", "pid": pid, "tid": 0, "args": args}) + b"\n"

    line = encode(record)
    if len(line) > MAX_LINE:  # every reader skips longer lines: without the samples (diff reads the events)
        line = encode(dict(record, samples=None))
    if len(line) > MAX_LINE:
        raise TraceError(f"{path}: its aggregates take {len(line) >> 20} MiB, more than a line may hold")
    text = compress(text[:at] + line + text[at:], kind)
    with open(path, "r+b") as f:
        f.truncate(offset)
        f.seek(offset)
        f.write(text)
