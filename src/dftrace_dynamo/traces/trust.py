"""Whether an aggregate record (:mod:`.aggregates`) still describes its trace file.

A record is used instead of the events only when both hold:

* **the file is the one it was made from**: the record cites (``covers``) the
  file's bytes before the compressed member (plain text: the chunk) that holds
  it, as a length and CRC-32, and the text of that member before its own line,
  likewise (docs/format.rst, "Aggregate records"). Checking them reads the
  file's compressed bytes once, decompressing nothing but the member already
  read to find the record: a file filtered, cut, joined or rewritten by another
  tool no longer matches.
* **every value is plausible**: of the right JSON type; counts positive and
  durations non-negative; min ≤ mean ≤ max and the sums of squares between;
  no duration longer than the file's time span, every step slice, compile and
  evaluation inside it (from the ``start`` record at the file's head to its
  ``end`` record, or in a file that was not closed the last events before the
  record); the per-step sums adding up to each other and to the totals.

A failed check is a :class:`Untrusted` with a reason; the caller reads the
events instead and says so in one line.
"""

import math
import zlib

import orjson

from ..schema import CAT_DFTRACER
from .reader import CHUNK, iter_chunks

HEAD_BYTES = 1 << 20  # text searched for the start record at a file's head
EARLY_S = 1.0  # an event may start this much before the start record (rounding, threads)
LATE_S = 0.01  # after the end record
KILLED_LATE_S = 10.0  # after the last events before a checkpoint (their member, then the next checkpoint)


MISMATCH = "stands for other bytes than the file holds (events changed, removed or added, or the file cut, " \
           "joined or rewritten)"


class Untrusted(ValueError):
    """A record that does not describe its file, and why (one phrase)."""


def is_int(v):
    return type(v) is int


def is_num(v):
    return type(v) in (int, float) and math.isfinite(v)


def crc(path, start, end):
    """CRC-32 of bytes ``start`` to ``end`` of the file, or None when it is shorter."""
    crc = 0
    with open(path, "rb") as f:
        f.seek(start)
        left = end - start
        while left > 0:
            chunk = f.read(min(left, 16 * CHUNK))
            if not chunk:
                return None
            crc = zlib.crc32(chunk, crc)
            left -= len(chunk)
    return crc


def check_covers(path, compressed, offset, line_at, text, covers):
    """Raises :class:`Untrusted` unless the file's bytes match what the record ``covers``.
    ``offset``: where the member (plain text: the piece) read starts in the file; ``line_at``:
    where the record's line starts in its decoded ``text``."""
    if not isinstance(covers, dict):
        raise Untrusted("does not say which bytes of the file it stands for (written by an older version)")
    size, digest, text_size, text_digest = (covers.get(k) for k in ("bytes", "crc32", "text_bytes", "text_crc32"))
    if not all(is_int(v) and v >= 0 for v in (size, digest, text_size, text_digest)):
        raise Untrusted("cites the file's bytes with values of the wrong type")
    if compressed:
        moved = offset != size or line_at != text_size or zlib.crc32(text[:line_at]) != text_digest
    else:
        moved = offset + line_at != size + text_size or crc(path, size, size + text_size) != text_digest
    if moved or crc(path, 0, size) != digest:
        raise Untrusted(MISMATCH)


def _ends(text):
    """The largest ts + dur of the events in ``text`` (µs), or None."""
    out = None
    for line in text.splitlines():
        line = line.strip().rstrip(b",")
        if not line.startswith(b"{") or b'"ts"' not in line:
            continue
        try:
            ev = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        ts, dur = ev.get("ts"), ev.get("dur") or 0
        if is_num(ts) and is_num(dur):
            out = max(out if out is not None else ts + dur, ts + dur)
    return out


def _start_ts(path):
    """The earliest time the file's ``start`` record (among its first :data:`HEAD_BYTES` of text)
    allows its events (its ``ts``, or its ``since`` when earlier), or None."""
    head = b""
    for chunk in iter_chunks(path):
        head += chunk
        if len(head) >= HEAD_BYTES or b'"name":"start"' in head:
            break
    at = head.find(b'"name":"start"', 0, HEAD_BYTES)  # (the chunks may hold more)
    if at < 0:
        return None
    line = head[head.rfind(b"\n", 0, at) + 1:head.find(b"\n", at) if head.find(b"\n", at) >= 0 else len(head)]
    try:
        ev = orjson.loads(line.strip().rstrip(b","))
    except orjson.JSONDecodeError:
        return None
    if not (isinstance(ev, dict) and ev.get("cat") == CAT_DFTRACER and is_num(ev.get("ts"))):
        return None
    # a file opened lazily holds events from before it opened, back to when the tracer loaded
    since = ev["args"].get("since") if isinstance(ev.get("args"), dict) else None
    return min(ev["ts"], since) if is_num(since) else ev["ts"]


def span(path, before, after, closed):
    """(first, last) µs that the events a record stands for lie within (None: unknown):
    from the file's start record to its end record (``after``: the text after the record),
    or in a file that was not closed, the last events before the record (``before``) and
    the time to the next checkpoint."""
    first = _start_ts(path)
    last = _ends(after) if closed else None
    if last is not None:
        last += LATE_S * 1e6
    else:
        last = _ends(before)
        last = None if last is None else last + KILLED_LATE_S * 1e6
    return (None if first is None else first - EARLY_S * 1e6), last


class Plausible:
    """Checks of a record's values against its file's time ``span`` ((first, last) µs, each may be
    None); each method raises :class:`Untrusted`."""

    def __init__(self, span):
        self.first, self.last = span
        self.length_us = self.last - self.first if None not in span else math.inf

    @staticmethod
    def fail(what):
        raise Untrusted(f"holds {what}")

    def rows(self, value, name, width=None):
        """``value`` as a list of lists (of ``width`` items)."""
        if not isinstance(value, list) or not all(isinstance(r, (list, tuple)) and (width is None or len(r) == width)
                                                  for r in value):
            self.fail(f"a {name} field that is not a list of rows as documented")
        return value

    def count(self, v, name, least=0):
        if not is_int(v) or v < least:
            self.fail(f"a {name} that is no count ({v!r})")

    def duration_us(self, v, name, none=False):
        if v is None and none:
            return
        if not is_num(v) or v < 0 or v > self.length_us:
            self.fail(f"a {name} outside the file's time span ({v!r} µs)")

    def event(self, ts, dur, name):
        """An event from ``ts`` for ``dur`` µs inside the file's time span."""
        if not is_num(ts) or not (dur is None or is_num(dur)):
            self.fail(f"a {name} with times of the wrong type")
        dur = dur or 0
        if dur < 0 or (self.first is not None and ts < self.first) or (self.last is not None and ts + dur > self.last):
            self.fail(f"a {name} outside the file's time span (ts {ts!r}, dur {dur!r} µs)")

    def stats(self, name, count, timed, ns, lo, hi, sq):
        """One group's statistics: ``timed`` durations summing to ``ns`` (integer ns, each rounded),
        least ``lo`` and largest ``hi`` (µs), sum of squares ``sq`` (µs², None: not kept)."""
        self.count(count, f"{name} count", 1)
        self.count(timed, f"{name} count of durations")
        if timed > count:
            self.fail(f"more {name} durations than events")
        if not timed:
            return
        if not is_int(ns) or not is_num(lo) or not is_num(hi) or (sq is not None and not is_num(sq)):
            self.fail(f"{name} statistics of the wrong type")
        for v in (lo, hi):
            if abs(v) > self.length_us:
                self.fail(f"a {name} duration outside the file's time span ({v!r} µs)")
        slack = 0.5 * timed + 1e-9 * abs(ns)  # each duration rounded to the ns
        if not lo <= hi or not timed * lo * 1000 - slack <= ns <= timed * hi * 1000 + slack:
            self.fail(f"{name} statistics where min ≤ mean ≤ max does not hold")
        if sq is not None:
            small, large = (0.0 if lo <= 0 <= hi else min(lo * lo, hi * hi)), max(lo * lo, hi * hi)
            if not timed * small * (1 - 1e-9) - 1e-9 <= sq <= timed * large * (1 + 1e-9) + 1e-9:
                self.fail(f"a {name} sum of squares that its min and max rule out")

    def base(self, slices, records, evaluation, runs, parts):
        """The step slices, compile records, evaluation slices, time spans and per-step sums of
        the step parts, as a scan of the events (or a version 1 record) holds them."""
        for row in self.rows(slices, "step slices", 6):
            if not all(is_int(v) for v in row[:2]) or not is_int(row[3]):
                self.fail("a step slice of the wrong type")
            self.event(row[4], row[5], "step slice")
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            self.fail("compile records that are not objects")
        for r in records:
            self.event(r.get("ts"), r.get("dur"), "compile event")
        if not isinstance(evaluation, list):
            self.fail("evaluation slices that are not a list")
        for d in evaluation:
            self.duration_us(d, "evaluation slice", none=True)
        for row in self.rows(runs, "time span"):
            if len(row) < 4 or not is_num(row[1]) or not is_num(row[2]) or row[1] > row[2]:
                self.fail("a time span of the wrong type")
            self.event(row[1], row[2] - row[1], "time span")
            if row[3] is not None and not isinstance(row[3], str):
                self.fail("a start record of the wrong type")
        for row in self.rows(parts, "step parts", 7):
            if not all(is_int(v) for v in row[:4]) or not isinstance(row[4], (bool, int)):
                self.fail("a step part of the wrong type")
            self.count(row[6], "step part's count of events", 1)
            self.duration_us(row[5], "step part's time", none=True)

    def _steps(self, rows, name):
        if not isinstance(rows, list) or not all(is_int(s) for s in rows):
            self.fail(f"{name} that are not step numbers")

    def writer_record(self, rec, sketch_key):
        """A version 2 record (the trace writer's), but for its copied events (read as events are,
        then :meth:`base`). ``sketch_key(us)``: the quantile sketch's bucket of a duration."""
        if rec.get("complete") is not True:
            raise Untrusted("says it could not keep everything it needs (bounds passed)")
        keys = self.rows(rec.get("keys"), "keys", 8)
        for kind, kernel, name, module, phase, graph, ktype, aten in keys:
            if kind not in (1, 2) or type(kernel) not in (int, bool) or not (name is None or isinstance(name, str)) \
                    or not all(v is None or isinstance(v, str) or is_num(v) for v in (module, phase, graph)) \
                    or not (ktype is None or isinstance(ktype, str)) or not (aten is None or isinstance(aten, list)):
                self.fail("a group key of the wrong type")
        self._steps(rec.get("apart"), "steps kept apart")
        totals = [0] * len(keys)
        for key, step, count, ns, lo, hi, zero, sq, buckets in self.rows(rec.get("groups"), "groups", 9):
            if not is_int(key) or not 0 <= key < len(keys) or not (step is None or is_int(step)) \
                    or not is_int(lo) or not is_int(hi) or lo < 0:
                self.fail("a group of the wrong type")
            self.stats("group", count, count, ns, lo / 1000, hi / 1000, sq)
            totals[key] += ns
            if keys[key][0] != 1:
                continue
            if not isinstance(buckets, list) or len(buckets) % 2 or not all(is_int(b) for b in buckets):
                self.fail("sketch buckets of the wrong type")
            self.count(zero, "count of zero durations")
            if any(n < 1 for n in buckets[1::2]) or sum(buckets[1::2]) + zero != count or (zero and lo):
                self.fail("sketch bucket counts that do not add up to the group's count")
            at = buckets[::2]
            if at and (min(at) < sketch_key(max(lo, 1) / 1000) or max(at) > sketch_key(hi / 1000)):
                self.fail("sketch buckets outside the group's min and max")
        by_step = {}
        for step, bwd, ns, count in self.rows(rec.get("op_steps"), "per-step op time", 4):
            if not is_int(step) or bwd not in (0, 1) or not is_int(ns) or ns < 0:
                self.fail("per-step op time of the wrong type")
            self.count(count, "per-step count of op events", 1)
            by_step[step] = by_step.get(step, 0) + ns
        if sum(by_step.values()) > sum(t for t, k in zip(totals, keys) if k[0] == 1):
            self.fail("more op time in its steps than in its groups")
        if rec.get("samples") is None:
            return
        sampled = {}
        for key, step, ns in self.rows(rec["samples"], "per-step samples", 3):
            if not is_int(key) or not 0 <= key < len(keys) or keys[key][0] != 1 or not is_int(step) \
                    or not is_int(ns) or ns < 0:
                self.fail("a per-step sample of the wrong type")
            sampled[step] = sampled.get(step, 0) + ns
        if sampled != {s: ns for s, ns in by_step.items() if ns or s in sampled}:
            self.fail("per-step samples that do not add up to the op time of their steps")

    def computed_record(self, rec, sketch_key):
        """A version 1 record (made from a full scan, :func:`.aggregates.compute`)."""
        warm = self.rows(rec.get("warmup"), "warm-up steps", 2)
        if not all(is_int(p) and is_int(s) for p, s in warm):
            self.fail("warm-up steps of the wrong type")
        for row in self.rows(rec.get("groups"), "groups", 15):
            kind, name, module, phase, graph, pid, kernel, step, bucket, count, timed, ns, lo, hi, sq = row
            if kind not in (1, 2) or not all(isinstance(v, str) for v in (name, module, phase, graph)) \
                    or not is_int(pid) or not isinstance(kernel, bool) or not (step is None or is_int(step)) \
                    or not (bucket is None or is_int(bucket)) or (bucket is not None) != (kind == 1 and timed > 0):
                self.fail("a group of the wrong type")
            self.stats("group", count, timed, ns, lo, hi, sq)
            if timed and kind == 1 and lo > 0 and not sketch_key(lo) <= bucket <= sketch_key(hi):
                self.fail("a sketch bucket outside its group's min and max")
        for row in self.rows(rec.get("process_names"), "process names", 2):
            if not is_int(row[0]) or not isinstance(row[1], str):
                self.fail("a process name of the wrong type")
        for row in self.rows(rec.get("kernels"), "kernels", 3):
            if not all(v is None or isinstance(v, str) for v in row):
                self.fail("a kernel of the wrong type")
        self.count(rec.get("unparsed"), "count of lines that are not events")
        self.base(rec.get("slices"), rec.get("records"), rec.get("evaluation"), rec.get("runs"), rec.get("parts"))
        if not (rec.get("clock") is None or isinstance(rec.get("clock"), dict)):
            self.fail("a clock record that is no object")
        if rec.get("rank_rows") is not None:
            self.rank_columns(rec["rank_rows"])
        if rec.get("samples") is None:
            return
        per_view = {}
        for view, pid, step, key, ns in self.rows(rec["samples"], "per-step samples", 5):
            if view not in ("op", "module", "phase") or not is_int(pid) or not is_int(step) \
                    or not isinstance(key, str) or not is_int(ns):
                self.fail("a per-step sample of the wrong type")
            cell = per_view.setdefault(view, {})
            cell[(pid, step)] = cell.get((pid, step), 0) + ns
        parts = {}
        for _, pid, step, kind, _, us, _ in rec["parts"]:
            if kind == 1:
                parts[(pid, step)] = parts.get((pid, step), 0) + us * 1000
        for view, cells in per_view.items():
            if cells.keys() != per_view["op"].keys() or any(ns != per_view["op"][k] for k, ns in cells.items()):
                self.fail(f"per-step {view} samples that do not add up to the op samples")
            if parts and any(abs(ns - parts.get(k, 0)) > 1 + 1e-9 * abs(ns) for k, ns in cells.items()):
                self.fail("per-step samples that do not add up to the op time of their steps")

    def rank_columns(self, columns):
        """The rank view's events as columns (kinds.RANK_COLUMNS)."""
        types = (is_int, is_int, lambda v: isinstance(v, str), is_int, is_int, is_num,
                 lambda v: v is None or is_num(v), lambda v: v is None or isinstance(v, str))
        if not isinstance(columns, list) or len(columns) != len(types) \
                or not all(isinstance(c, list) for c in columns) or len({len(c) for c in columns}) != 1:
            self.fail("rank events of uneven columns")
        for column, ok in zip(columns, types):
            if not all(ok(v) for v in column):
                self.fail("a rank event of the wrong type")
        for ts, dur in zip(columns[5], columns[6]):
            self.event(ts, dur, "rank event")
