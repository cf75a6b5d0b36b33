"""Finding trace files and reading them as decompressed bytes or lines.

Compression is recognised by magic bytes, not by name. A gzip file is a
sequence of independent members (a zstd file, of frames): every complete
member is used; a file cut inside a member (a crash, a copy in progress) gives
what can be decoded up to the cut, and a :class:`Damage` note says what was lost.
"""

import glob
import io
import os
import re
import zlib

import orjson
import zstandard

CHUNK = 1 << 20
SUFFIXES = (".pfw", ".pfw.gz", ".pfw.zst")
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
MEMBER_START = {"gzip": GZIP_MAGIC + b"\x08", "zstd": ZSTD_MAGIC}  # gzip: + deflate method


class TraceError(Exception):
    """Bad input: the message is one line for the user, no traceback."""


def is_number(v):
    """Whether a parsed JSON value is a number (``true``/``false`` are not)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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
    ``f``, which starts at byte ``pos`` of a file of ``size`` bytes. Corrupt
    data is skipped up to the next member that starts a line."""
    new_decoder = (lambda: zlib.decompressobj(31)) if kind == "gzip" else zstandard.ZstdDecompressor().decompressobj
    base = pos
    dec, member_start = new_decoder(), pos
    while data := f.read(CHUNK):
        pos += len(data)
        while data:
            try:
                out = dec.decompress(data)
            except (zlib.error, zstandard.ZstdError) as e:
                resume = _next_member(f, member_start + 1 - base, kind)
                end = size if resume is None else resume + base
                damage.add(f"corrupt {kind} data in the member at byte {member_start} ({e}); skipped "
                           f"{end - member_start} bytes ({100 * (end - member_start) / size:.1f}% of the file)")
                if resume is None:
                    return
                f.seek(resume)
                pos = member_start = end
                dec, data = new_decoder(), b""
                continue
            if out:
                yield out
            if dec.eof:
                data = dec.unused_data
                member_start = pos - len(data)
                dec = new_decoder()
            else:
                data = b""
    if pos > member_start:
        damage.add(f"truncated: the {kind} member at byte {member_start} is cut after "
                   f"{pos - member_start} bytes; used what it decodes to, its end is lost")


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
    try:
        if kind == "gzip":
            out = zlib.decompressobj(31).decompress(head, 64)
        else:
            out = zstandard.ZstdDecompressor().decompressobj().decompress(head)[:64]
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


def iter_chunks(path, damage=None, offset=0, size=None):
    """Decompressed content of one file as byte chunks. When ``path`` is a
    part of a larger file, ``offset`` (where it starts) and ``size`` (of the
    whole file) make the damage notes refer to the whole file."""
    damage = damage if damage is not None else Damage(path)
    kind = compression_of(path)
    with open(path, "rb") as f:
        if kind:
            yield from _members(f, size or os.fstat(f.fileno()).st_size, damage, kind, offset)
        else:
            while chunk := f.read(CHUNK):
                yield chunk


def iter_lines(path, damage=None):
    """``(line_number, line)`` pairs, lines as bytes without the newline; a
    last line without newline (a cut file) is yielded as it is."""
    rest, lineno = b"", 0
    for chunk in iter_chunks(path, damage):
        parts = chunk.split(b"\n")
        parts[0] = rest + parts[0]
        rest = parts.pop()
        for line in parts:
            lineno += 1
            yield lineno, line
    if rest:
        yield lineno + 1, rest


def head(path, size=4096):
    """The first ``size`` decompressed bytes (fewer for a short file)."""
    out = b""
    for chunk in iter_chunks(path, Damage(path)):
        out += chunk
        if len(out) >= size:
            break
    return out[:size]


def check_trace(path):
    """Raises :class:`TraceError` unless the file starts like a trace (a JSON
    array or JSON object lines). Returns ``"array"`` for a strict JSON array
    (commas between objects), ``"lines"`` for the DFTracer layout."""
    start = head(path).lstrip()
    if not start:
        raise TraceError(f"{path}: empty file, not a trace")
    if start[:1] == b"[":
        body = start[1:].lstrip()
        if body and body[:1] not in b"{]":
            raise TraceError(f"{path}: not a trace file (a JSON array of something other than events)")
        first = body.split(b"\n", 1)[0].rstrip()
        return "array" if first.endswith(b",") else "lines"
    if start[:2] == b'{"':
        return "lines"
    raise TraceError(f"{path}: not a trace file (expected '[' or JSON object lines, "
                     f"found {start[:16]!r})")


_RANK = re.compile(r"(?:^|[-_.])rank(\d+)(?=[-_.]|$)")


def rank_of(path):
    """The ``rank<R>`` number in a trace file name, or None."""
    m = _RANK.search(os.path.basename(path))
    return int(m.group(1)) if m else None


class EventLines:
    """Iterates over the events of one trace file, line by line, recording
    what is wrong on the way (for validate, merge and convert).

    Accepts the DFTracer layout (``[``, one object per line, ``]``), trailing
    commas (strict JSON arrays written one event per line) and a JSON array on
    one line. After iteration: ``broken`` (line numbers that are not JSON;
    the last one may just be a cut last line, see ``last_line``), ``not_events``
    (JSON lines that are not objects), ``early_close`` (``]`` lines followed by
    more data), ``closed`` (line number of the final ``]``, 0 when missing),
    ``head`` (first decompressed bytes) and ``damage``."""

    def __init__(self, path):
        self.path = path
        self.damage = Damage(path)
        self.broken, self.not_events, self.early_close = [], [], []
        self.closed, self.last_line, self.head = 0, 0, b""

    def __iter__(self):
        """Yields ``(line_number, raw_json_bytes, event_dict)``."""
        for lineno, line in iter_lines(self.path, self.damage):
            self.last_line = lineno
            if len(self.head) < 128:
                self.head += line + b"\n"
            text = line.strip()
            if not text:
                continue
            if self.closed:  # a second run appended after ']' (Perfetto stops at the ']')
                self.early_close.append(self.closed)
                self.closed = 0
                if text == b"[":
                    continue
            if lineno == 1 and text.startswith(b"["):
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
                self.broken.append(lineno)
                continue
            if isinstance(value, dict):
                yield lineno, text, value
                continue
            for ev in value if isinstance(value, list) else [value]:
                if isinstance(ev, dict):
                    yield lineno, orjson.dumps(ev), ev
                else:
                    self.not_events.append(lineno)

    def cut_last_line(self):
        """True when the last line is broken: what a crash mid-write leaves."""
        return bool(self.broken) and self.broken[-1] == self.last_line
