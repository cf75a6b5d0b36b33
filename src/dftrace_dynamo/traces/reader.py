"""Finding trace files and reading them as decompressed bytes or lines.

Compression is recognised by magic bytes, not by name. A gzip file is a
sequence of independent members (a zstd file, of frames): every complete
member is used; a file cut inside a member (a crash, a copy in progress) gives
what can be decoded up to the cut, and a :class:`Damage` note says what was lost.

Every command reads a file through :func:`scan_text` (the C reader, ``_core.Scanner``, see
csrc/reader.c), which inflates whole gzip members itself (:data:`WINDOW` compressed bytes held
at a time, one member of at most 64 MiB decoded) and falls back to the decoding here for what
it cannot: the full scan takes the events as columns, the other readers (:func:`iter_chunks`,
:class:`Lines`, :class:`EventLines`: validate, merge, convert, split) the text as it is.

Memory does not grow with the file: it is decompressed :data:`FEED` bytes at
a time (at most 1 MiB of gzip output, 32 MiB of zstd output per step), blank
lines are skipped without being split off one by one, a line longer than
:data:`MAX_LINE` is skipped without being held, and of each kind of bad line
only the first :data:`KEEP` line numbers are kept (all are counted).
"""

import glob
import io
import math
import os
import re
import zlib

import orjson
import zstandard

from .. import _core
from ..schema import AGGREGATES_RECORD, CAT_DFTRACER

CHUNK = 1 << 20
# Compressed bytes per decoder call. Deflate expands at most 1032x and a zstd
# block of 4 bytes gives at most 128 KiB, so one call yields <= 1 MiB (gzip)
# or <= 32 MiB (zstd), however hostile the file.
FEED = 1 << 10
WINDOW = 64 << 20  # compressed bytes of a gzip file the C reader holds at a time (whole members)
MAX_LINE = 16 << 20  # longest line read, in bytes (longer ones are skipped, see too_long)
KEEP = 1000  # line numbers kept per kind of bad line
SUFFIXES = (".pfw", ".pfw.gz", ".pfw.zst")
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
MEMBER_START = {"gzip": GZIP_MAGIC + b"\x08", "zstd": ZSTD_MAGIC}  # gzip: + deflate method


class TraceError(Exception):
    """Bad input: the message is one line for the user, no traceback."""


I64 = 1 << 63  # Perfetto's time type is a signed 64-bit count of ns


class NotATrace(TraceError):
    """A file that does not start like a trace at all (not a damaged trace)."""


def kind_of(start):
    """What the first bytes of a file that is not a trace hold, in words: never the bytes
    themselves, which may be anything the user handed in (a password file)."""
    if not start:
        return "nothing"
    if start.startswith(GZIP_MAGIC) or start.startswith(ZSTD_MAGIC):
        return "compressed data inside the compression"
    try:
        text = start.decode("utf-8")
    except UnicodeDecodeError:
        return "binary data"
    if not text.isprintable():
        return "binary data"
    return "JSON of another kind" if text[:1] in "{[\"" else "plain text"


def is_number(v):
    """Whether a parsed JSON value is a number (``true``/``false`` are not)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def perfetto_ns(us):
    """µs → ns the way Perfetto does it: ``x * 1000`` in double, rounded half
    away; None when that is not a 64-bit integer (Perfetto's time type)."""
    ns = us * 1000 if isinstance(us, int) else us * 1000 + 0.5
    if not math.isfinite(ns) or not -I64 <= ns < I64:
        return None
    return ns if isinstance(ns, int) else math.floor(ns)


# The fields every reader relies on: the JSON type each must have when present (null counts as absent).
FIELD_TYPES = {"name": "a string", "cat": "a string", "ph": "a string", "pid": "an integer", "tid": "an integer",
               "ts": "a number", "dur": "a number", "args": "an object"}
_NONE = type(None)
_STR, _INT, _NUM, _OBJ = {str, _NONE}, {int, _NONE}, {int, float, _NONE}, {dict, _NONE}
_ACCEPTED = {"a string": _STR, "an integer": _INT, "a number": _NUM, "an object": _OBJ}
_PH = {str, int, _NONE}  # DFTracer 2.1+ writes ph as a number (PH_LETTERS)
# DFTracer 2.1+ (pydftracer 2.0.6 with the 2.2.0 core): ph numbers and the Chrome letters they
# replace; 0 (unknown) and 3 (aggregated records) have none
PH_LETTERS = {1: "X", 2: "C", 4: "M"}


def is_start_record(ev):
    """Whether the event ``ev`` is the ``start`` record (its args: run id, command line)."""
    return ev.get("name") == "start" and ev.get("cat") == CAT_DFTRACER


def is_aggregate_record(ev):
    """Whether the event ``ev`` is an aggregate record (see :mod:`.aggregates`): it stands for the
    events of its whole file, so a file holding other events (a part, a merge) must not carry it."""
    return ev.get("name") == AGGREGATES_RECORD and ev.get("cat") == CAT_DFTRACER


def _json_kind(v):
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    return {str: "a string", list: "an array", dict: "an object"}.get(type(v), "a value")


def wrong_field(ev):
    """``"'tid' is an array ([1,2]), not an integer"`` for the first field of
    :data:`FIELD_TYPES` that ``ev`` holds with the wrong JSON type; else None."""
    get = ev.get
    if (type(get("pid")) in _INT and type(get("tid")) in _INT and type(get("ts")) in _NUM  # per event: fast
            and type(get("dur")) in _NUM and type(get("name")) in _STR and type(get("cat")) in _STR
            and type(get("ph")) in _PH and type(get("args")) in _OBJ):
        return None
    for key, expected in FIELD_TYPES.items():
        v = get(key)
        if type(v) not in (_PH if key == "ph" else _ACCEPTED[expected]):
            shown = orjson.dumps(v).decode()
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            return f"'{key}' is {_json_kind(v)} ({shown}), not {expected}"
    return None


def too_long(size):
    """What is wrong with a line of ``size`` bytes (more than :data:`MAX_LINE`)."""
    return (f"a line of {size:,} bytes: longer than the {MAX_LINE >> 20} MiB a trace line may have "
            "(dftrace-dynamo does not read it)")


def find_traces(specs):
    """Files for command-line arguments: files, directories (searched
    recursively for ``*.pfw``, ``*.pfw.gz``, ``*.pfw.zst``) and glob patterns.
    Order is kept, duplicates dropped."""
    found = []
    for spec in specs:
        if os.path.isdir(spec):
            hits = sorted(
                os.path.join(root, name)
                for root, _, names in os.walk(spec)
                for name in names
                if name.endswith(SUFFIXES)
            )
            if not hits:
                raise TraceError(f"no trace files ({', '.join('*' + s for s in SUFFIXES)}) in directory {spec}")
        elif os.path.exists(spec):
            if not os.path.isfile(spec):
                raise TraceError(f"not a regular file: {spec}")
            hits = [spec]
        elif glob.has_magic(spec):
            hits = sorted(p for p in glob.glob(spec, recursive=True) if os.path.isfile(p))
            if not hits:
                raise TraceError(f"no files match {spec}")
        else:
            raise TraceError(f"no such file or directory: {spec}")
        found.extend(hits)
    return list(dict.fromkeys(os.path.normpath(p) for p in found))


def compression_of(path):
    """``"gzip"``, ``"zstd"`` or ``None`` from the first bytes of the file."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise TraceError(f"cannot read {path}: {e.strerror}") from None
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head == ZSTD_MAGIC:
        return "zstd"
    return None


class Damage:
    """What could not be read from one file, as one-line notes."""

    def __init__(self, path):
        self.path = path
        self.notes = []

    def add(self, note):
        self.notes.append(f"{self.path}: {note}")


def _members(f, size, damage, kind, pos=0):
    """Decodes concatenated independent gzip members / zstd frames read from
    ``f``, which starts at byte ``pos`` of a file of ``size`` bytes, :data:`FEED`
    bytes per step. Corrupt data is skipped up to the next member that starts a line."""
    new_decoder = (lambda: zlib.decompressobj(31)) if kind == "gzip" else zstandard.ZstdDecompressor().decompressobj
    base = pos
    dec, member_start = new_decoder(), pos
    while chunk := f.read(CHUNK):
        view, at = memoryview(chunk), 0
        while at < len(chunk):
            piece = view[at:at + FEED]
            try:
                out = dec.decompress(piece)
            except (zlib.error, zstandard.ZstdError) as e:
                resume = _next_member(f, member_start + 1 - base, kind)
                end = size if resume is None else resume + base
                damage.add(f"corrupt {kind} data in the member at byte {member_start} ({e}); skipped "
                           f"{end - member_start} bytes ({100 * (end - member_start) / size:.1f}% of the file)")
                if resume is None:
                    return
                f.seek(resume)
                pos = member_start = end
                dec, chunk = new_decoder(), b""
                break
            if out:
                yield out
            if dec.eof:  # the member ends inside this piece: the next one starts after it
                at += len(piece) - len(dec.unused_data)
                member_start = pos + at
                dec = new_decoder()
            else:
                at += len(piece)
        pos += len(chunk)
    if pos > member_start:
        damage.add(f"truncated: the {kind} member at byte {member_start} is cut after "
                   f"{pos - member_start} bytes; used what it decodes to, its end is lost")


def decode_members(data, kind, cap):
    """The decompressed text of the whole gzip members / zstd frames ``data``; None when they
    do not decode to their end, or give more than ``cap`` bytes."""
    damage, out, total = Damage(""), [], 0
    for chunk in _members(io.BytesIO(data), len(data), damage, kind):
        total += len(chunk)
        if total > cap or damage.notes:
            return None
        out.append(chunk)
    return None if damage.notes else b"".join(out)


def _next_member(f, start, kind):
    """Position in ``f`` of the next member/frame start at or after ``start``
    that decodes to the beginning of a line, or None."""
    magic = MEMBER_START[kind]
    while True:
        f.seek(start)
        window = f.read(CHUNK + (1 << 18))
        at = window.find(magic)
        while at >= 0 and not starts_a_line(window[at:at + (1 << 18)], kind):
            at = window.find(magic, at + 1)
        if at >= 0:
            return start + at
        if len(window) <= CHUNK:
            return None
        start += CHUNK


def starts_a_line(head, kind):
    """Whether compressed bytes ``head`` begin a gzip member / zstd frame that
    decodes to the beginning of a trace line (how the writers cut members)."""
    dec = zlib.decompressobj(31) if kind == "gzip" else zstandard.ZstdDecompressor().decompressobj()
    out = b""
    try:
        for at in range(0, len(head), FEED):
            out += dec.decompress(head[at:at + FEED])
            if len(out) >= 2 or dec.eof:
                break
    except (zlib.error, zstandard.ZstdError):
        return False
    return out[:2] == b'{"' or out[:1] in (b"[", b"]")


def tail_damage(path, kind, damage, window=16 << 20):
    """Checks only the last member/frame of a compressed file (the part a
    crash cuts) and adds a note to ``damage`` when it is incomplete."""
    magic = MEMBER_START[kind]
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        window = min(size, window)
        f.seek(size - window)
        data = f.read()
    pos = len(data)
    while (pos := data.rfind(magic, 0, pos)) > 0 and not starts_a_line(data[pos:pos + (1 << 18)], kind):
        pass
    if pos < 0 or (pos == 0 and window < size and not starts_a_line(data[:1 << 18], kind)):
        return  # no member start in the window: nothing to check cheaply
    for _ in _members(io.BytesIO(data[pos:]), size, damage, kind, size - window + pos):
        pass


def iter_chunks(path, damage=None):
    """Decompressed content of one file as byte chunks: the text the full scan reads, read the
    same way (:func:`scan_text`, the C reader in text mode: it holds no rows)."""
    damage = damage if damage is not None else Damage(path)
    scanner = _core.Scanner(-1, ())
    for _ in scan_text(path, scanner, damage, 1 << 62):
        if chunk := scanner.take_text():
            yield chunk


class _From:
    """The file ``f`` from byte ``start`` on, as :func:`_members` reads a part of a file."""

    def __init__(self, f, start):
        self.f, self.start = f, start

    def read(self, n):
        return self.f.read(n)

    def seek(self, pos):
        return self.f.seek(self.start + pos)


def scan_text(path, scanner, damage, rows):
    """Feeds the text of ``path`` to ``scanner`` (a ``_core.Scanner``), yielding whenever it
    holds ``rows`` rows (in text mode: a megabyte of text; the caller takes them) and once at
    the end. The scanner inflates the
    gzip members it can inflate whole; from the first one it cannot (cut, corrupt, larger than
    it takes) the file is decoded by :func:`_members`, which notes the damage in ``damage``
    exactly as for every other reader. zstd and plain files are decoded here."""
    kind = compression_of(path)
    with open(path, "rb") as f:
        size, pos = os.fstat(f.fileno()).st_size, 0
        wanted = min(CHUNK, WINDOW)  # at first (a reader of the first lines stops early), then WINDOW
        while kind == "gzip" and pos < size:
            f.seek(pos)
            window = f.read(wanted)
            at, failed = 0, False
            while at < len(window) and not failed:
                at, failed = scanner.feed_gzip(window, at, rows)
                if scanner.rows >= rows or scanner.text_full:
                    yield
            pos += at
            # a member cut by the window's end is read again from its start, once
            if failed and (at == 0 or len(window) < wanted) and not (len(window) == wanted < WINDOW):
                break
            wanted = WINDOW
        if pos < size:
            f.seek(pos)
            chunks = _members(_From(f, pos), size, damage, kind, pos) if kind else iter(lambda: f.read(CHUNK), b"")
            for chunk in chunks:
                scanner.feed(chunk)
                if scanner.rows >= rows or scanner.text_full:
                    yield
    scanner.finish()
    yield


class Counted:
    """Line numbers of one kind of bad line: all counted, the first :data:`KEEP` kept."""

    def __init__(self):
        self.count, self.first, self.last = 0, [], 0

    def add(self, lineno):
        self.count += 1
        self.last = lineno
        if len(self.first) < KEEP:
            self.first.append(lineno)


_TEXT = re.compile(rb"\S")
_BLANK_LINE = re.compile(rb"\n[ \t\r\x0b\x0c]*\n")


class Lines:
    """Iterates over the non-blank lines of one file as ``(line_number,
    line)`` (bytes, without the newline; a last line without newline, a cut
    file, as it is). Blank lines cost no Python step each; a line longer than
    :data:`MAX_LINE` is skipped as it streams by and noted in ``oversized``
    (a :class:`Counted`; ``oversized_sizes``: the sizes of its kept lines).
    After iteration: ``last_line`` (lines in the file), ``head`` (the first
    128 decompressed bytes) and ``damage``."""

    def __init__(self, path, damage=None):
        self.path = path
        self.damage = damage if damage is not None else Damage(path)
        self.oversized, self.oversized_sizes = Counted(), []
        self.last_line, self.head = 0, b""

    def _too_long(self, lineno, size):
        if len(self.oversized_sizes) < KEEP:
            self.oversized_sizes.append(size)
        self.oversized.add(lineno)

    def __iter__(self):
        lineno = 0  # lines ended before the current position
        pending, pending_len, skipping = [], 0, None  # a started line; bytes of a skipped one
        for chunk in iter_chunks(self.path, self.damage):
            if len(self.head) < 128:
                self.head += chunk[:128 - len(self.head)]
            at = 0
            if skipping is not None or pending:
                nl = chunk.find(b"\n")
                if nl < 0:
                    if skipping is not None:
                        skipping += len(chunk)
                    elif pending_len + len(chunk) > MAX_LINE:
                        skipping, pending, pending_len = pending_len + len(chunk), [], 0
                    else:
                        pending.append(chunk)
                        pending_len += len(chunk)
                    continue
                lineno += 1
                if skipping is not None or pending_len + nl > MAX_LINE:
                    self._too_long(lineno, (skipping or pending_len) + nl)
                else:
                    yield lineno, b"".join(pending) + chunk[:nl]
                pending, pending_len, skipping, at = [], 0, None, nl + 1
            if not at and chunk.isspace():
                lineno += chunk.count(b"\n")
                continue
            last = chunk.rfind(b"\n")
            if last > at and not chunk[at:at + 1].isspace() and not _BLANK_LINE.search(chunk, at, last + 1):
                # the usual case, no blank line up to the last newline: split at C speed
                for line in chunk[at:last].split(b"\n"):
                    lineno += 1
                    if len(line) > MAX_LINE:
                        self._too_long(lineno, len(line))
                    else:
                        yield lineno, line
                at = last + 1
            while m := _TEXT.search(chunk, at):
                start = chunk.rfind(b"\n", at, m.start()) + 1 or at
                lineno += chunk.count(b"\n", at, start)
                end = chunk.find(b"\n", m.start())
                if end < 0:  # the line goes on in the next chunk
                    if len(chunk) - start > MAX_LINE:
                        skipping = len(chunk) - start
                    else:
                        pending, pending_len = [chunk[start:]], len(chunk) - start
                    at = len(chunk)
                    break
                lineno += 1
                if end - start > MAX_LINE:
                    self._too_long(lineno, end - start)
                else:
                    yield lineno, chunk[start:end]
                at = end + 1
            else:  # blank to the end of the chunk
                lineno += chunk.count(b"\n", at)
        if skipping is not None:
            self._too_long(lineno + 1, skipping)
        elif pending:
            yield lineno + 1, b"".join(pending)
        self.last_line = lineno + (skipping is not None or bool(pending))


def oversized_error(paths):
    """A :class:`TraceError` naming the first line longer than :data:`MAX_LINE`
    in ``paths``, in ``validate``'s words; None when there is none."""
    for path in paths:
        lines = Lines(path)
        for _ in lines:
            if lines.oversized.count:
                break
        if lines.oversized.count:
            return TraceError(f"{path}: line {lines.oversized.first[0]}: {too_long(lines.oversized_sizes[0])}")
    return None


def wrong_type_error(path):
    """The :class:`TraceError` of the first event of ``path`` with a field of the wrong JSON
    type (:data:`FIELD_TYPES`), in ``validate``'s words; None when there is none."""
    try:
        for _ in EventLines(path):
            pass
    except TraceError as e:
        return e
    return None


def first_lines(path, n=2):
    """The first ``n`` non-blank lines (fewer for a short file)."""
    out = []
    for _, line in Lines(path):
        out.append(line)
        if len(out) == n:
            break
    return out


def is_perfetto_protobuf(path):
    """Whether ``path`` is a Perfetto protobuf trace (``convert --format perfetto``): it starts
    with a ``Trace.packet`` field, byte 0x0a, and is not JSON after leading whitespace."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return False
    return head[:1] == b"\n" and head.lstrip()[:1] not in (b"[", b"{", b"")


def check_trace(path):
    """Raises :class:`TraceError` unless the file starts like a trace (a JSON
    array or JSON object lines). Returns ``"array"`` for a strict JSON array
    (commas between objects), ``"lines"`` for the DFTracer layout."""
    if is_perfetto_protobuf(path):
        raise TraceError(f"{path} is a Perfetto protobuf trace (for the Perfetto UI); dftrace-dynamo reads "
                         "the .pfw files it was converted from: give those instead")
    lines = [line.strip() for line in first_lines(path)]
    if not lines:
        raise TraceError(f"{path}: empty file (or blank lines only), not a trace")
    start = lines[0]
    if start[:1] == b"[":
        body = start[1:].lstrip() or (lines[1] if len(lines) > 1 else b"")
        if body and body[:1] not in b"{]":
            raise NotATrace(f"{path}: not a trace file (a JSON array of something other than events)")
        return "array" if body.endswith(b",") else "lines"
    if start[:2] == b'{"':
        return "lines"
    raise NotATrace(f"{path}: not a trace file (expected '[' or JSON object lines, found {kind_of(start)})")


_RANK = re.compile(r"(?:^|[-_.])rank(\d+)(?=[-_.]|$)")


def rank_of(path):
    """The ``rank<R>`` number in a trace file name, or None."""
    m = _RANK.search(os.path.basename(path))
    return int(m.group(1)) if m else None


class EventLines:
    """Iterates over the events of one trace file, line by line, recording
    what is wrong on the way (for validate, merge, convert and split).

    Accepts the DFTracer layout (``[``, one object per line, ``]``), trailing
    commas (strict JSON arrays written one event per line) and a JSON array on
    one line. An event with a field of :data:`FIELD_TYPES` of the wrong JSON
    type raises :class:`TraceError`. After iteration, as :class:`Counted`:
    ``broken`` (lines that are not JSON; the last one may just be a cut last
    line, see ``last_line``), ``not_events`` (JSON lines that are not objects),
    ``early_close`` (``]`` lines followed by more data), ``oversized``
    (lines longer than :data:`MAX_LINE`, skipped) and ``numeric_ph`` (events with a
    DFTracer 2.1+ number for ``ph``; ``first_ph``: the first such number); ``closed`` (line number of
    the final ``]``, 0 when missing), ``text_lines`` (lines that are not
    blank), ``last_line``, ``head`` (first decompressed bytes) and ``damage``."""

    def __init__(self, path):
        self.path = path
        self.lines = Lines(path)
        self.damage, self.oversized = self.lines.damage, self.lines.oversized
        self.broken, self.not_events, self.early_close = Counted(), Counted(), Counted()
        self.numeric_ph, self.first_ph = Counted(), None
        self.closed, self.text_lines = 0, 0

    @property
    def last_line(self):
        return self.lines.last_line

    @property
    def head(self):
        return self.lines.head

    @property
    def oversized_sizes(self):
        return self.lines.oversized_sizes

    def __iter__(self):
        """Yields ``(line_number, raw_json_bytes, event_dict)``."""
        for lineno, line in self.lines:
            text = line.strip()
            self.text_lines += 1
            if self.closed:  # a second run appended after ']' (Perfetto stops at the ']')
                self.early_close.add(self.closed)
                self.closed = 0
                if text == b"[":
                    continue
            if self.text_lines == 1 and text.startswith(b"["):
                text = text[1:].lstrip()
                if not text:
                    continue
                if text.endswith(b"]"):  # a whole JSON array on one line
                    text = b"[" + text
            if text == b"]":
                self.closed = lineno
                continue
            if text.endswith(b","):
                text = text[:-1]
            try:
                value = orjson.loads(text)
            except orjson.JSONDecodeError:
                self.broken.add(lineno)
                continue
            if isinstance(value, dict):
                self._check(lineno, value)
                yield lineno, text, value
                continue
            for ev in value if isinstance(value, list) else [value]:
                if isinstance(ev, dict):
                    self._check(lineno, ev)
                    yield lineno, orjson.dumps(ev), ev
                else:
                    self.not_events.add(lineno)

    def _check(self, lineno, ev):
        wrong = wrong_field(ev)
        if wrong:
            raise TraceError(f"{self.path}: line {lineno}: event field {wrong}")
        if type(ev.get("ph")) is int:
            self.first_ph = self.first_ph if self.numeric_ph.count else ev["ph"]
            self.numeric_ph.add(lineno)

    def cut_last_line(self):
        """True when the last line is broken: what a crash mid-write leaves."""
        return self.broken.last == self.last_line > 0
