"""``dftrace-dynamo convert``: change compression, write a strict JSON array or Perfetto's protobuf format."""

import os

from dftrace_dynamo.traces.reader import MAX_LINE, TraceError
from dftrace_dynamo.traces.validate import SPLIT_EVENTS

from ._common import progress_bar, warn

FORMATS = ("pfw", "json-array", "perfetto")


def register(subparsers):
    p = subparsers.add_parser(
        "convert", help="gzip <-> zstd <-> plain, a strict JSON array, or Perfetto's protobuf format",
        description="Copies the events of a trace into OUT. Compression follows OUT's extension "
                    "(.gz gzip members, .zst zstd frames, anything else plain). --format json-array "
                    "writes a strict JSON array (commas, closing ]) for chrome://tracing-style "
                    "viewers. --format perfetto writes Perfetto's native protobuf trace (a quarter of "
                    "the JSON's size; it loads where the JSON is too big), from one file or, merged "
                    "as by merge, from several. Lines that are not valid JSON (a cut last line, a cut "
                    f"gzip member) and lines over {MAX_LINE >> 20} MiB are left out, so the output always loads.")
    p.add_argument("input", nargs="+", metavar="IN",
                   help="trace file (--format perfetto: files, directories or glob patterns, merged)")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="file to write (with --split: a directory)")
    p.add_argument("--format", choices=FORMATS,
                   help="pfw: [ + one object per line + ] (default); json-array: strict JSON "
                        "(default when OUT ends in .json, .json.gz or .json.zst); perfetto: Perfetto's "
                        "protobuf trace (default when OUT ends in .perfetto-trace or .pftrace; needs the "
                        "perfetto extra)")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--all-runs", action="store_true",
                   help="--format perfetto: convert files of different runs into one trace instead of refusing")
    split = p.add_argument_group(
        "splitting a big trace", "--split writes parts (.pfw.gz) into the directory OUT; each keeps the metadata "
                                 "records, no slice is cut in half, and together they hold every event")
    split.add_argument("--split", action="store_true", help="write parts instead of one copy; pick one of:")
    split.add_argument("--steps", metavar="A-B", help="the steps A to B (step slices, args.step)")
    split.add_argument("--time", metavar="START:END", help="the events starting between START and END seconds "
                                                           "after the first event")
    split.add_argument("--max-events", type=int, metavar="N",
                       help=f"every event, in parts of at most N events ({SPLIT_EVENTS} loads well in the Perfetto UI)")
    p.set_defaults(func=run)


def _pair(text, sep, option, kind):
    """``A<sep>B``, ``A<sep>`` (to the end) or, for steps (``sep`` "-"), ``A`` alone (one step)."""
    lo, mid, hi = text.partition(sep)
    pair = None
    try:
        if hi:
            pair = (kind(lo), kind(hi))
        elif mid:
            pair = (kind(lo), float("inf"))
        elif sep == "-":
            pair = (kind(lo), kind(lo))
    except ValueError:
        pass
    if pair is None or pair[0] > pair[1]:
        raise TraceError(f"{option} {text!r}: expected A{sep}B with A <= B")
    return pair


def run_split(args, src):
    from dftrace_dynamo.traces.split import split

    chosen = [o for o in ("steps", "time", "max_events") if getattr(args, o) is not None]
    if len(chosen) != 1:
        raise TraceError("--split needs exactly one of --steps A-B, --time START:END, --max-events N")
    if args.max_events is not None and args.max_events < 1:
        raise TraceError("--max-events must be at least 1")
    steps = _pair(args.steps, "-", "--steps", int) if args.steps else None
    window = _pair(args.time, ":", "--time", float) if args.time else None
    parts, warnings = split(src, args.output, steps, window, args.max_events, args.force)
    for note in warnings:
        warn("convert", note)
    for path, events in parts:
        print(f"wrote {path}: {events:,} events")
    return 0


def output_format(args):
    from dftrace_dynamo.traces.perfetto_proto import EXTENSIONS

    name = args.output.lower().rsplit("/", 1)[-1]
    if args.format:
        return args.format
    if name.endswith(EXTENSIONS):
        return "perfetto"
    return "json-array" if ".json" in name else "pfw"


def run_perfetto(args):
    from dftrace_dynamo.traces.perfetto_proto import write_perfetto
    from dftrace_dynamo.traces.reader import find_traces

    paths = find_traces(args.input)
    with progress_bar(sum(os.path.getsize(p) for p in paths), "convert") as bar:
        events, warnings = write_perfetto(paths, args.output, args.force, None if bar.disable else bar.update,
                                          args.all_runs)
    for note in warnings:
        warn("convert", note)
    files = f" from {len(paths)} files" if len(paths) > 1 else ""
    print(f"wrote {args.output}: {events:,} events{files} (perfetto)")
    return 0


def run(args):
    from dftrace_dynamo.traces.convert import convert
    from dftrace_dynamo.traces.reader import find_traces

    fmt = output_format(args)
    if args.split and args.format == "perfetto":
        raise TraceError("--split writes .pfw.gz parts; without --split, --format perfetto writes one file "
                         "that loads whole")
    if fmt == "perfetto" and not args.split:
        if args.steps or args.time or args.max_events is not None:
            raise TraceError("--steps, --time and --max-events go with --split")
        return run_perfetto(args)
    if args.all_runs:
        raise TraceError("--all-runs goes with --format perfetto")
    found = find_traces(args.input)
    if len(found) != 1:
        raise TraceError(f"convert takes one trace file; {' '.join(args.input)} holds {len(found)} "
                         "(--format perfetto merges several)")
    src = found[0]
    if args.split:
        return run_split(args, src)
    if args.steps or args.time or args.max_events is not None:
        raise TraceError("--steps, --time and --max-events go with --split")
    events, warnings = convert(src, args.output, fmt == "json-array", args.force)
    for note in warnings:
        warn("convert", note)
    print(f"wrote {args.output}: {events:,} events ({fmt})")
    return 0
