"""``dftrace-dynamo convert``: change compression, or write a strict JSON array."""

from ._common import warn

FORMATS = ("pfw", "json-array")


def register(subparsers):
    p = subparsers.add_parser(
        "convert", help="gzip <-> zstd <-> plain, or a strict JSON array",
        description="Copies the events of a trace into OUT. Compression follows OUT's extension "
                    "(.gz gzip members, .zst zstd frames, anything else plain). --format json-array "
                    "writes a strict JSON array (commas, closing ]) for chrome://tracing-style "
                    "viewers. Lines that are not valid JSON (a cut last line, a cut gzip member) "
                    "are left out, so the output always loads.")
    p.add_argument("input", metavar="IN", help="trace file")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="file to write")
    p.add_argument("--format", choices=FORMATS,
                   help="pfw: [ + one object per line + ] (default); json-array: strict JSON "
                        "(default when OUT ends in .json, .json.gz or .json.zst)")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.set_defaults(func=run)


def run(args):
    from dftrace_dynamo.traces.convert import convert
    from dftrace_dynamo.traces.reader import TraceError, find_traces

    found = find_traces([args.input])
    if len(found) != 1:
        raise TraceError(f"convert takes one trace file; {args.input} holds {len(found)}")
    src = found[0]
    fmt = args.format or ("json-array" if ".json" in args.output.lower().rsplit("/", 1)[-1] else "pfw")
    events, warnings = convert(src, args.output, fmt == "json-array", args.force)
    for note in warnings:
        warn("convert", note)
    print(f"wrote {args.output}: {events:,} events ({fmt})")
    return 0
