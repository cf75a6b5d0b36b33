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

Also a problem, though Perfetto may load it: a line longer than
:data:`.reader.MAX_LINE`, which no dftrace-dynamo command reads. A number for
``ph`` (DFTracer 2.1+, :data:`.reader.PH_LETTERS`) is one problem for the whole
file: Perfetto opens such a file as an empty trace (``convert`` writes a copy it shows). An event
field of the wrong JSON type (:data:`.reader.FIELD_TYPES`) is refused with a
:class:`.reader.TraceError`, as by every other reader.
"""

from collections import defaultdict

from .perfetto_proto import load_pb2
from .reader import (I64, KEEP, EventLines, compression_of, is_number, is_perfetto_protobuf, kind_of, perfetto_ns,
                     too_long)

MAX_DEPTH = 512
# The Perfetto web UI (v52, WASM trace processor, 4 GB address space) loaded a
# trace of 16 M nested region events using 3.8 GB and ran out of memory at 18 M.
UI_MAX_EVENTS = 16_000_000
SPLIT_EVENTS = 8_000_000  # suggested part size: half the limit, room for args-heavy events
# zstd-compressed traces: readers before this Perfetto release refuse them
ZSTD_NOTE = ("zstd-compressed: Perfetto reads zstd from v58 on (earlier releases, and this tool's trace processor "
             "v52, cannot open it) and dftracer-utils not at all; for those, write gzip "
             "(DFTRACER_TRACE_COMPRESSION=1) or convert it: dftrace-dynamo convert FILE -o FILE.pfw.gz")
# The same trace processor loads about 1.4x as many events from a protobuf trace (convert --format
# perfetto) as from the JSON: its tables take most of the memory in both (benchmarks/results_perfetto.rst)
UI_MAX_PROTO_EVENTS = UI_MAX_EVENTS * 7 // 5
_U32 = (1 << 32) - 1


def _order(problem):
    return (problem[0] is not None, problem[0] or 0)


class Report:
    """The problems (line number or None, message) of one file, file-wide ones
    and then by line: all counted (``count``), the first ``keep`` kept; its
    notes and event count."""

    def __init__(self, path, keep=KEEP):
        self.path = path
        self.keep = keep
        self.problems = []  # (line or None, message)
        self.count = 0
        self.notes = []
        self.warnings = []
        self.events = 0

    def problem(self, line, message):
        self.count += 1
        self.problems.append((line, message))
        if len(self.problems) > 2 * self.keep + 64:
            self._trim()

    def counted(self, lines, message):
        """One problem per kept line number of ``lines`` (a :class:`.reader.Counted`), all counted."""
        for lineno in lines.first:
            self.problem(lineno, message)
        self.count += lines.count - len(lines.first)

    def _trim(self):
        self.problems.sort(key=_order)
        del self.problems[self.keep:]


def _check_sniff(report, first_bytes):
    start = b"".join(first_bytes[:128].split())
    if not (start.startswith(b'[{"') or start.startswith(b'{"')):
        what = "only '['" if start == b"[" else kind_of(start)
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
    elif (start := perfetto_ns(ts)) is None or (length := perfetto_ns(dur)) is None or start + length >= I64:
        report.problem(lineno, f"X event at ts {ts} with dur {dur} ends beyond 2^63 ns, Perfetto's time range")
    else:
        threads[(ev.get("pid"), ev.get("tid"))].append((start, start + length, lineno))


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


def _packets(f, report):
    """``(offset, bytes)`` of each ``Trace.packet`` of the protobuf file ``f``; a cut or foreign field is a problem."""
    at = 0
    while head := f.read(1):
        if head != b"\x0a":
            report.problem(None, f"byte {at}: field tag {head[0]:#04x} where a packet (0x0a) should start: "
                                 "not a Perfetto trace from here on")
            return
        size, shift, got = 0, 0, 1
        while (b := f.read(1)) and b[0] & 0x80:
            size |= (b[0] & 0x7F) << shift
            shift += 7
            got += 1
        size |= (b[0] if b else 0) << shift
        data = f.read(size) if b else b""
        if not b or len(data) < size:
            report.problem(None, f"cut at byte {at + got + len(data) + bool(b)}: the packet at byte {at} is "
                                 "incomplete (Perfetto drops it and reports the trace as truncated)")
            return
        yield at, data
        at += got + 1 + size


def validate_protobuf(path, keep=KEEP):
    """A :class:`Report` for a Perfetto protobuf trace: every packet parses, a track event's
    sequence holds its interned strings and default track, its track is described, each slice end
    closes a slice. ``events``: slices, instants and counter values."""
    pb = load_pb2()
    report = Report(path, keep)
    tracks, sequences, depth = set(), {}, defaultdict(int)
    with open(path, "rb") as f:
        for at, data in _packets(f, report):
            try:
                p = pb.TracePacket.FromString(data)
            except Exception as e:  # noqa: BLE001  the message's own error type differs by protobuf backend
                report.problem(None, f"byte {at}: packet does not parse ({e})")
                continue
            if p.HasField("track_descriptor"):
                tracks.add(p.track_descriptor.uuid)
            seq = sequences.setdefault(p.trusted_packet_sequence_id, {"names": set(), "keys": set(), "track": None})
            if p.incremental_state_cleared or p.sequence_flags & 1:
                seq.update(names=set(), keys=set(), track=None)
            if p.HasField("trace_packet_defaults"):
                seq["track"] = p.trace_packet_defaults.track_event_defaults.track_uuid
            for entry in p.interned_data.event_names:
                seq["names"].add(entry.iid)
            for entry in p.interned_data.debug_annotation_names:
                seq["keys"].add(entry.iid)
            if p.HasField("track_event"):
                _check_track_event(report, at, p.track_event, seq, tracks, depth)
    report.notes.append("a Perfetto protobuf trace")
    if report.events > UI_MAX_PROTO_EVENTS:
        report.warnings.append(f"{report.events:,} events: more than the Perfetto web UI loads as protobuf "
                               f"(about {UI_MAX_PROTO_EVENTS // 10**6} M events)")
    report._trim()
    return report


def _check_track_event(report, at, e, seq, tracks, depth):
    track = e.track_uuid if e.HasField("track_uuid") else seq["track"]
    if track is None or track not in tracks:
        report.problem(None, f"byte {at}: track event on a track no descriptor announced (Perfetto drops it)")
        return
    if e.HasField("name_iid") and e.name_iid not in seq["names"]:
        report.problem(None, f"byte {at}: event name id {e.name_iid} not interned on its sequence")
    if any(a.HasField("name_iid") and a.name_iid not in seq["keys"] for a in e.debug_annotations):
        report.problem(None, f"byte {at}: argument name id not interned on its sequence")
    if e.type == 2:  # TYPE_SLICE_END
        if not depth[track]:
            report.problem(None, f"byte {at}: slice end without an open slice on its track")
        else:
            depth[track] -= 1
        return
    report.events += 1
    if e.type == 1:
        depth[track] += 1


def validate(path, keep=KEEP):
    """Returns a :class:`Report` for one trace file, keeping its first ``keep`` problems."""
    if is_perfetto_protobuf(path):
        return validate_protobuf(path, keep)
    report = Report(path, keep)
    threads = defaultdict(list)
    lines = EventLines(path)
    for lineno, _, ev in lines:
        report.events += 1
        _check_event(report, lineno, ev, threads)
    if not lines.text_lines and not lines.oversized.count:
        report.problem(None, "empty file: Perfetto rejects it" if not lines.last_line
                       else "blank lines only: Perfetto rejects it")
        return report
    _check_sniff(report, lines.head)
    if lines.cut_last_line():
        report.notes.append(f"line {lines.last_line}: cut last line (a crash); Perfetto drops it silently")
        lines.broken.count -= 1
        if lines.broken.first[-1] == lines.last_line:
            lines.broken.first.pop()
    report.counted(lines.broken, "not valid JSON: Perfetto aborts the whole load")
    report.counted(lines.not_events, "JSON value that is not an event object")
    report.counted(lines.early_close, "data after this ']' (two runs appended to one file?): "
                                      "Perfetto stops reading here")
    if lines.numeric_ph.count:
        report.problem(lines.numeric_ph.first[0], f"'ph' is a number ({lines.first_ph}): Perfetto opens this file "
                       "as an empty trace (DFTracer 2.1+ layout; dftrace-dynamo convert writes a copy it shows)")
    for lineno, size in zip(lines.oversized.first, lines.oversized_sizes):
        report.problem(lineno, too_long(size))
    report.count += lines.oversized.count - len(lines.oversized.first)
    if not lines.closed:
        report.notes.append("no closing ']' (fine for Perfetto; the writer did not finish)")
    for note in lines.damage.notes:
        report.problem(None, note.split(": ", 1)[1] + " (Perfetto v52 fails to load such a file; "
                             "dftrace-dynamo convert writes a repaired copy)")
    _check_nesting(report, threads)
    if compression_of(path) == "zstd":
        report.warnings.append(ZSTD_NOTE)
    if report.events > UI_MAX_EVENTS:
        report.warnings.append(
            f"{report.events:,} events: more than the Perfetto web UI loads (about {UI_MAX_EVENTS // 10**6} M "
            f"events; it runs out of memory above that); cut it into parts with: dftrace-dynamo convert "
            f"{path} --split --max-events {SPLIT_EVENTS} -o DIR")
    report._trim()
    return report
