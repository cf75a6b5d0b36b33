"""Rewrites a trace in another compression or as a strict JSON array.

Event lines are copied byte for byte (numbers keep their exact text); lines
that are not valid JSON are dropped so that the output always loads in
Perfetto (one broken line would abort the whole load). An event whose ``ph``
is a DFTracer 2.1+ number gets the letter it stands for (:data:`.reader.PH_LETTERS`),
which Perfetto reads."""

import os

import orjson

from .reader import PH_LETTERS, EventLines, TraceError, check_trace, too_long
from .writer import TraceWriter


def prepare_output(out, inputs, force):
    """Absolute path for ``out``; refuses to overwrite an input, or
    any existing file unless ``force``."""
    out = os.path.abspath(out)
    if not os.path.isdir(os.path.dirname(out)):
        raise TraceError(f"output directory {os.path.dirname(out)} does not exist")
    if os.path.exists(out):
        if any(os.path.samefile(p, out) for p in inputs):
            raise TraceError(f"output {out} is one of the inputs")
        if not force:
            raise TraceError(f"output {out} exists (use --force to overwrite)")
        os.unlink(out)
    return out


def lost_notes(lines):
    """Warnings for what an iterated :class:`EventLines` could not copy: its
    damage notes, then one line on the lines it dropped and one on the lines
    too long to read."""
    notes = list(lines.damage.notes)
    count = lines.broken.count + lines.not_events.count
    if lines.cut_last_line() and count == 1:
        notes.append(f"{lines.path}: dropped the cut last line {lines.last_line}")
    elif count:
        first = sorted(lines.broken.first + lines.not_events.first)[:5]
        shown = ", ".join(map(str, first)) + (" ..." if count > 5 else "")
        notes.append(f"{lines.path}: dropped {count:,} line(s) that are not JSON events (line {shown})")
    if lines.oversized.count:
        more = f" and {lines.oversized.count - 1:,} more such line(s)" if lines.oversized.count > 1 else ""
        notes.append(f"{lines.path}: dropped line {lines.oversized.first[0]}, "
                     f"{too_long(lines.oversized_sizes[0])}{more}")
    return notes


def convert(src, out, json_array=False, force=False):
    """Copies the events of ``src`` into ``out`` (compression from its
    extension). Returns ``(events written, warnings)``."""
    check_trace(src)
    out = prepare_output(out, [src], force)
    lines = EventLines(src)
    with TraceWriter(out, json_array=json_array) as w:
        for _, raw, ev in lines:
            if type(ev.get("ph")) is int:
                raw = orjson.dumps(dict(ev, ph=PH_LETTERS.get(ev["ph"], str(ev["ph"]))))
            w.write(raw)
    return w.events, lost_notes(lines)
