"""Writes traces in Perfetto's native protobuf format (``convert --format perfetto``).

The output is a ``Trace``: a sequence of ``TracePacket`` messages of
Perfetto's TrackEvent format, about a quarter of the JSON's size, which the
trace processor loads without keeping the text of every event.

* One track per thread (``TrackDescriptor`` with pid, tid and thread name),
  under one track per process (pid and name; the rank names of ``merge``,
  :class:`.merge.Inputs`, whose pid/tid moves and clock offsets apply here too;
  an offset of whole µs is subtracted from integer nanoseconds).
* One packet sequence per thread: its packets default to the thread's track
  and to a sequence-scoped incremental clock (each timestamp is the
  nanoseconds since the previous packet of the sequence), and its event names,
  categories, argument names and short string values are interned once at the
  start of the sequence (``SEQ_INCREMENTAL_STATE_CLEARED``, then the interned
  data with ``SEQ_NEEDS_INCREMENTAL_STATE``; event packets leave the flags off,
  4 bytes a slice: the file is written whole, its state is never lost).
* An ``X`` event becomes a ``TYPE_SLICE_BEGIN`` and a ``TYPE_SLICE_END``
  packet. Perfetto matches an end to the innermost open slice, so a thread's
  events are ordered as Perfetto's JSON importer orders them (by start, longer
  first) and ends are placed where the slices close; an event overlapping an
  earlier one partially is left out, as Perfetto does with the JSON.
* ``i``/``I`` events become ``TYPE_INSTANT`` (scope ``p``: on a process track,
  ``g``: on a global track); a ``C`` event becomes one ``TYPE_COUNTER`` value
  per numeric argument on the process counter track ``"<name> <argument>"``
  (the JSON importer's names).
* Every argument becomes a debug annotation (nested objects and lists as
  dictionaries and arrays), except nulls and empty objects and lists, which
  the JSON importer drops as well.

Metadata records other than process and thread names, and events of other
phases, are not carried (the latter counted in a warning). Each input file's
events are held in memory while it is converted (its threads are sorted).

The event packets are encoded here, field by field in field-number order, the
bytes the package's own messages give (tests compare them); descriptors,
clock snapshots and interned data are built with the ``perfetto`` package's
``perfetto_trace_pb2`` messages. See ``benchmarks/results_perfetto.rst`` for
why the event packets are not built with those messages.
"""

import os
import struct
from collections import defaultdict

from .convert import prepare_output
from .merge import Inputs
from .reader import PH_LETTERS, TraceError, is_number, perfetto_ns

EXTENSIONS = (".perfetto-trace", ".pftrace")
CLOCK = 64  # the first sequence-scoped clock id
BOOTTIME = 6  # Perfetto's default trace clock, the JSON importer's
INTERN_MAX = 1024  # string values up to this many bytes are interned
SLICE_BEGIN, INSTANT, COUNTER = 1, 3, 4  # TrackEvent.type (2, SLICE_END, is written as bytes)
CLEARED, NEEDS_STATE = 1, 2  # TracePacket.sequence_flags
_INT64 = 1 << 63
_SMALL = [bytes([n]) if n < 128 else bytes([n & 127 | 128, n >> 7]) for n in range(1 << 14)]
_DOUBLE = struct.Struct("<d").pack


def load_pb2():
    """The ``perfetto_trace_pb2`` module of the ``perfetto`` package, or a one-line :class:`.reader.TraceError`."""
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2
    except ImportError:
        raise TraceError("the perfetto format needs the perfetto and protobuf packages: "
                         "pip install 'dftrace-dynamo[perfetto]'") from None
    return perfetto_trace_pb2


def varint(n):
    """``n`` (negative: as its 64-bit two's complement) as a protobuf varint."""
    if 0 <= n < 16384:
        return _SMALL[n]
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 127:
        out.append(n & 127 | 128)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(tag, payload):
    """A length-delimited field: ``tag`` (bytes) + length + ``payload``."""
    return tag + varint(len(payload)) + payload


class Sequence:
    """One thread's packet sequence: its interning tables, events and clock."""

    def __init__(self, seq_id, track):
        self.id, self.track = seq_id, track
        self.tail = b"\x50" + varint(seq_id)  # trusted_packet_sequence_id
        self.names, self.cats, self.keys, self.strings = {}, {}, {}, {}
        self.cache = {}  # (key, type, value) -> encoded annotation
        self.events = []  # (start ns, -end ns, order, kind, TrackEvent fields)

    @staticmethod
    def _iid(table, text):
        iid = table.get(text)
        if iid is None:
            iid = table[text] = len(table) + 1
        return iid

    def value(self, v):
        """The value fields of a DebugAnnotation for the JSON value ``v``; None for what the JSON importer drops."""
        t = type(v)
        if t is bool:
            return b"\x10\x01" if v else b"\x10\x00"
        if t is int:
            if -_INT64 <= v < _INT64:
                return b"\x20" + varint(v)
            if v < 1 << 64:
                return b"\x18" + varint(v)
            v = str(v)
            t = str
        if t is float:
            return b"\x29" + _DOUBLE(v)
        if t is str:
            data = v.encode()
            if len(data) <= INTERN_MAX:
                return b"\x88\x01" + varint(self._iid(self.strings, v))
            return field(b"\x32", data)
        if t is dict:
            entries = b"".join(field(b"\x5a", _entry(field(b"\x52", str(k).encode()), body))
                               for k, item in v.items() if (body := self.value(item)) is not None)
            return entries or None
        if t is list:
            items = b"".join(field(b"\x62", body) for item in v if (body := self.value(item)) is not None)
            return items or None
        return None

    def annotations(self, args):
        """The ``debug_annotations`` fields of a TrackEvent for the event's ``args``."""
        out = []
        cache = self.cache
        for k, v in args.items():
            t = type(v)
            key = (k, t, v) if t is not dict and t is not list else None
            enc = cache.get(key) if key else None
            if enc is None:
                body = self.value(v)
                if body is None:
                    continue
                enc = field(b"\x22", b"\x08" + varint(self._iid(self.keys, k)) + body)
                if key:
                    if len(cache) > 1 << 16:
                        cache.clear()
                    cache[key] = enc
            out.append(enc)
        return b"".join(out)

    def named(self, ev):
        """category_iids and debug_annotations of a TrackEvent for ``ev`` (the name comes after its type)."""
        cat, args = ev.get("cat"), ev.get("args")
        out = b"\x18" + varint(self._iid(self.cats, cat)) if cat is not None else b""
        if args:
            out += self.annotations(args)
        return out

    def name_iid(self, ev):
        return b"\x50" + varint(self._iid(self.names, ev.get("name") or ""))

    def add_slice(self, start, end, order, ev):
        self.events.append((start, -end, order, SLICE_BEGIN,
                            self.named(ev) + b"\x48\x01" + self.name_iid(ev)))

    def add_instant(self, ts, order, ev, track):
        uuid = b"\x58" + varint(track) if track is not None else b""
        self.events.append((ts, -ts, order, INSTANT, self.named(ev) + b"\x48\x03" + self.name_iid(ev) + uuid))

    def add_counter(self, ts, order, track, value):
        enc = b"\xf0\x01" + varint(value) if type(value) is int and -_INT64 <= value < _INT64 \
            else b"\xe1\x02" + _DOUBLE(float(value))
        self.events.append((ts, -ts, order, COUNTER, b"\x48\x04\x58" + varint(track) + enc))

    def encode(self, t0, write):
        """Writes the event packets of the sequence (its events sorted) with ``write``, in time
        order from ``t0`` (see the module's notes), and lets the events go; returns how many were
        left out for overlapping an earlier one."""
        out, stack, dropped = bytearray(), [], 0
        seq = self.tail
        end_event = b"\x5a\x02\x48\x02"  # track_event {type: SLICE_END}
        last = t0
        for start, neg_end, _, kind, body in self.events:
            while stack and stack[-1] <= start:
                t = stack.pop()
                packet = b"\x40" + varint(t - last) + seq + end_event
                out += b"\x0a" + varint(len(packet)) + packet
                last = t
            if kind == SLICE_BEGIN:
                if stack and -neg_end > stack[-1]:
                    dropped += 1
                    continue
                stack.append(-neg_end)
            packet = b"\x40" + varint(start - last) + seq + field(b"\x5a", body)
            out += b"\x0a" + varint(len(packet)) + packet
            last = start
            if len(out) >= 1 << 20:
                write(out)
                out.clear()
        while stack:
            t = stack.pop()
            packet = b"\x40" + varint(t - last) + seq + end_event
            out += b"\x0a" + varint(len(packet)) + packet
            last = t
        write(out)
        self.events = []
        return dropped


class Writer:
    """Writes the packets of a trace to ``out``: descriptors and sequence
    headers with the package's messages, event packets from :class:`Sequence`."""

    def __init__(self, out):
        self.pb = load_pb2()
        self.file = open(out, "xb")
        self.path = out
        self.uuids = 0
        self.sequences = 0
        self.events = 0

    def uuid(self):
        self.uuids += 1
        return self.uuids

    def packet(self, packet):
        data = packet.SerializeToString()
        self.file.write(b"\x0a" + varint(len(data)) + data)

    def track(self, uuid, parent=None, name=None, **kinds):
        p = self.pb.TracePacket()
        d = p.track_descriptor
        d.uuid = uuid
        if parent is not None:
            d.parent_uuid = parent
        if name is not None:
            d.name = name
        for kind, values in kinds.items():
            getattr(d, kind).SetInParent()
            for k, v in values.items():
                if v is not None:
                    setattr(getattr(d, kind), k, v)
        self.packet(p)

    def sequence(self, seq):
        """The header packets of ``seq``, then its events; returns the events left out (:meth:`Sequence.encode`)."""
        seq.events.sort()
        t0 = seq.events[0][0] if seq.events else 0
        self.header(seq, t0)
        return seq.encode(t0, self.file.write)

    def header(self, seq, t0):
        """The packets that start ``seq``: its defaults, its clock at ``t0``, its interned strings."""
        pb = self.pb
        p = pb.TracePacket()
        p.trusted_packet_sequence_id = seq.id
        p.sequence_flags = CLEARED
        p.incremental_state_cleared = True
        p.trace_packet_defaults.timestamp_clock_id = CLOCK
        p.trace_packet_defaults.track_event_defaults.track_uuid = seq.track
        for clock_id, incremental in ((CLOCK, True), (BOOTTIME, False)):
            c = p.clock_snapshot.clocks.add()
            c.clock_id, c.timestamp = clock_id, t0
            if incremental:
                c.is_incremental = True
        self.packet(p)
        p = pb.TracePacket()
        p.trusted_packet_sequence_id = seq.id
        p.sequence_flags = NEEDS_STATE
        data = p.interned_data
        for table, target, key in ((seq.names, data.event_names, "name"), (seq.cats, data.event_categories, "name"),
                                   (seq.keys, data.debug_annotation_names, "name"),
                                   (seq.strings, data.debug_annotation_string_values, "str")):
            for text, iid in table.items():
                entry = target.add()
                entry.iid = iid
                setattr(entry, key, text.encode() if key == "str" else text)
        self.packet(p)

    def close(self):
        self.file.close()


def _entry(name, body):
    """A dictionary entry: the ``name`` field (10) and the value fields, in field-number order."""
    return body + name if body[0] < 0x52 else name + body


def _text(value):
    return value if isinstance(value, str) else str(value)


def _convert_input(inputs, index, w, dropped, other):
    """Writes the tracks and sequences of input ``index``; counts left-out events into ``dropped``/``other``."""
    shift_ns = inputs.shift_us(index) * 1000
    threads, processes, thread_names, counters, scoped = {}, {}, {}, {}, {}
    order = 0
    global_track = None

    def sequence(pid, tid):
        key = (pid, tid)
        seq = threads.get(key)
        if seq is None:
            processes.setdefault(pid, None)
            w.sequences += 1
            seq = threads[key] = Sequence(w.sequences, w.uuid())
        return seq

    def process_track(pid):
        if pid not in scoped:
            scoped[pid] = w.uuid()
        return scoped[pid]

    for _, ev in inputs.events(index, shift=False):
        ph = ev.get("ph")
        if type(ph) is int:
            ph = PH_LETTERS.get(ph)
        pid, tid = ev.get("pid") or 0, ev.get("tid") or 0
        if ph == "M":
            name = (ev.get("args") or {}).get("name")
            if ev.get("name") == "process_name":
                processes[pid] = name
            elif ev.get("name") == "thread_name":
                thread_names[(pid, tid)] = name
            continue
        ts = ev.get("ts")
        start = perfetto_ns(ts) if is_number(ts) else None
        if start is None:
            other[f"{ph} without ts"] += 1
            continue
        start -= shift_ns
        order += 1
        if ph == "X":
            dur = ev.get("dur")
            length = perfetto_ns(dur) if is_number(dur) and dur >= 0 else None
            if length is None:
                other["X without dur"] += 1
                continue
            sequence(pid, tid).add_slice(start, start + length, order, ev)
        elif ph in ("i", "I"):
            scope = ev.get("s")
            if scope == "g":
                global_track = global_track or w.uuid()
                track = global_track
            elif scope == "p":
                track = process_track(pid)
            else:
                track = None
            sequence(pid, tid).add_instant(start, order, ev, track)
        elif ph == "C":
            for key, value in (ev.get("args") or {}).items():
                if is_number(value):
                    name = f"{ev.get('name') or ''} {key}"
                    track = counters.get((pid, name))
                    if track is None:
                        track = counters[(pid, name)] = w.uuid()
                    sequence(pid, tid).add_counter(start, order, track, value)
        else:
            other[ph] += 1
            continue
        w.events += 1

    process_uuids = {}
    for pid, name in processes.items():
        process_uuids[pid] = w.uuid()
        w.track(process_uuids[pid], process={"pid": pid, "process_name": _text(name) if name else None})
    for pid, uuid in scoped.items():
        w.track(uuid, process_uuids.get(pid))
    if global_track:
        w.track(global_track)
    for (pid, name), uuid in counters.items():
        w.track(uuid, process_uuids.get(pid), _text(name), counter={})
    for (pid, tid), seq in threads.items():
        name = thread_names.get((pid, tid))
        w.track(seq.track, thread={"pid": pid, "tid": tid, "thread_name": _text(name) if name else None})
    for seq in threads.values():
        dropped[0] += w.sequence(seq)


def write_perfetto(paths, out, force=False, progress=None, all_runs=False):
    """Writes the events of ``paths`` (one or more trace files, merged as by
    ``merge``) into ``out`` as a Perfetto protobuf trace. Returns ``(events
    written, warnings)``. Raises :class:`.reader.TraceError` (and writes
    nothing) when the perfetto package is missing, or the inputs hold several
    runs unless ``all_runs``."""
    load_pb2()
    inputs = Inputs(paths, progress)
    out = prepare_output(out, paths, force)
    w = Writer(out)
    dropped, other = [0], defaultdict(int)
    try:
        for index in range(len(paths)):
            _convert_input(inputs, index, w, dropped, other)
        inputs.check_runs(all_runs, "convert")
    except BaseException:
        w.close()
        os.unlink(out)
        raise
    w.close()
    warnings = list(inputs.warnings)
    if dropped[0]:
        warnings.append(f"left out {dropped[0]:,} X event(s) overlapping an earlier one of their thread "
                        "partially (Perfetto drops them from the JSON too; see dftrace-dynamo validate)")
    if other:
        kinds = ", ".join(f"{n:,} {k if k else 'without ph'}" for k, n in sorted(other.items(), key=str))
        warnings.append(f"left out events the protobuf output does not carry: {kinds}")
    return w.events - dropped[0], warnings
