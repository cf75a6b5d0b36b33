"""Checks a trace file against what Perfetto's JSON importer (v52) relies on.

Problems (Perfetto loses data or refuses the file):

* the first 128 decompressed bytes, whitespace removed, must start with
  ``[{"`` or ``{"`` (a file holding only ``[`` is "Unknown trace type");
* every line must be valid JSON: one broken line aborts the whole load;
* a ``]`` line must be the last one (an appended run gives ``][``; Perfetto
  ignores everything after the first ``]``);
* ``pid``/``tid`` must be integers in 0..2^32-1 (others become 0: threads merge);
* an ``X`` event needs a numeric ``ts`` and ``dur`` (without ``dur`` it is dropped);
* ``X`` events of one (pid, tid) must nest: a partial overlap drops the later
  one; nesting deeper than 512 is cut;
* a cut or corrupt gzip member / zstd frame (Perfetto v52 then fails to load
  the file).

Notes (reported, not failures): a cut last line (a crash; Perfetto drops it
silently), a missing closing ``]``.
"""

import math
from collections import defaultdict

from .reader import EventLines, is_number

MAX_DEPTH = 512
# The Perfetto web UI (v52, WASM trace processor, 4 GB address space) loaded a
# trace of 16 M nested region events using 3.8 GB and ran out of memory at 18 M.
UI_MAX_EVENTS = 16_000_000
SPLIT_EVENTS = 8_000_000  # suggested part size: half the limit, room for args-heavy events
_U32 = (1 << 32) - 1


def _ns(us):
    """µs → ns the way Perfetto does it: ``x * 1000`` in double, rounded half away."""
    return us * 1000 if isinstance(us, int) else math.floor(us * 1000 + 0.5)


class Report:
    """Problems (line number or None, message), notes and the event count of one file."""

    def __init__(self, path):
        self.path = path
        self.problems = []  # (line or None, message)
        self.notes = []
        self.warnings = []
        self.events = 0

    def problem(self, line, message):
        self.problems.append((line, message))


def _check_sniff(report, first_bytes):
    start = b"".join(first_bytes[:128].split())
    if not (start.startswith(b'[{"') or start.startswith(b'{"')):
        what = "only '['" if start == b"[" else repr(start[:20])
        report.problem(1, f"first 128 bytes hold {what}, not '[{{\"' or '{{\"': "
                          "Perfetto rejects the file ('Unknown trace type')")


def _check_event(report, lineno, ev, threads):
    for key in ("pid", "tid"):
        v = ev.get(key)
        if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _U32):
            report.problem(lineno, f"{key} {v!r} is not an integer in 0..2^32-1 "
                                   "(Perfetto uses 0 and merges threads)")
    if ev.get("ph") != "X":
        return
    ts, dur = ev.get("ts"), ev.get("dur")
    if not is_number(ts):
        report.problem(lineno, "X event without a numeric ts")
    elif not is_number(dur) or dur < 0:
        report.problem(lineno, "X event without a numeric dur >= 0 (Perfetto drops it)")
    else:
        start = _ns(ts)
        threads[(ev.get("pid"), ev.get("tid"))].append((start, start + _ns(dur), lineno))


def _check_nesting(report, threads):
    """Perfetto orders a thread's X events by start, longer first on ties, and
    keeps a stack of open slices: an event ending after its parent is dropped."""
    for (pid, tid), spans in threads.items():
        spans.sort(key=lambda s: (s[0], -s[1], s[2]))
        stack = []
        for start, end, lineno in spans:
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1]:
                report.problem(lineno, f"X event [{start}, {end}) ns overlaps line {stack[-1][2]} "
                                       f"[{stack[-1][0]}, {stack[-1][1]}) ns partially on pid {pid} "
                                       f"tid {tid} (Perfetto drops it)")
                continue
            if len(stack) == MAX_DEPTH:
                report.problem(lineno, f"X nesting deeper than {MAX_DEPTH} on pid {pid} tid {tid}")
                continue
            stack.append((start, end, lineno))


def validate(path):
    """Returns a :class:`Report` for one trace file."""
    report = Report(path)
    threads = defaultdict(list)
    lines = EventLines(path)
    for lineno, _, ev in lines:
        report.events += 1
        _check_event(report, lineno, ev, threads)
    if not lines.last_line:
        report.problem(None, "empty file: Perfetto rejects it")
        return report
    _check_sniff(report, lines.head)
    for lineno in lines.broken:
        if lineno == lines.last_line:
            report.notes.append(f"line {lineno}: cut last line (a crash); Perfetto drops it silently")
        else:
            report.problem(lineno, "not valid JSON: Perfetto aborts the whole load")
    for lineno in lines.not_events:
        report.problem(lineno, "JSON value that is not an event object")
    for lineno in lines.early_close:
        report.problem(lineno, "data after this ']' (two runs appended to one file?): "
                               "Perfetto stops reading here")
    if not lines.closed:
        report.notes.append("no closing ']' (fine for Perfetto; the writer did not finish)")
    for note in lines.damage.notes:
        report.problem(None, note.split(": ", 1)[1] + " (Perfetto v52 fails to load such a file; "
                             "dftrace-dynamo convert writes a repaired copy)")
    _check_nesting(report, threads)
    if report.events > UI_MAX_EVENTS:
        report.warnings.append(
            f"{report.events:,} events: more than the Perfetto web UI loads (about {UI_MAX_EVENTS // 10**6} M "
            f"events; it runs out of memory above that); cut it into parts with: dftrace-dynamo convert "
            f"{path} --split --max-events {SPLIT_EVENTS} -o DIR")
    report.problems.sort(key=lambda p: (p[0] is not None, p[0] or 0))
    return report
