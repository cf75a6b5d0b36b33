"""What the ``profile``, ``explore`` and ``graph`` subcommands do (the CLI modules only parse).

Bad input raises :class:`~dftrace_dynamo.traces.reader.TraceError`, which the
command reports in one line with exit status 2."""

from __future__ import annotations

import pathlib
import re
import sys

from ..traces.reader import TraceError

__all__ = ["run_profile", "run_explore", "run_graph"]


def _machine(args) -> dict:
    """Machine balance options, checked before any model is built."""
    from .options import machine_from_args

    try:
        return machine_from_args(args)
    except ValueError as exc:
        raise TraceError(str(exc)) from None


def _trace(args):
    """(loaded model, inputs, kwargs, traced model); bad input raises TraceError (exit status 2).

    Returns a None traced model after a one-line message when the tracer fails
    on a model that runs (exit status 1).
    """
    from .hybrid import WarmupError, trace_hybrid
    from .models import ModelError
    from .options import load_from_args

    try:
        loaded, inputs, kwargs = load_from_args(args)
    except ModelError as exc:
        raise TraceError(str(exc)) from None
    try:
        return loaded, inputs, kwargs, trace_hybrid(loaded.model, inputs, kwargs, method=args.method)
    except WarmupError as exc:
        named = [(f"input {i}", value) for i, value in enumerate(inputs)] + list(kwargs.items())
        shapes = ", ".join(f"{name} {list(value.shape)}" for name, value in named if hasattr(value, "shape"))
        raise TraceError(f"{loaded.name} does not run on the example inputs ({shapes}): {exc}") from None
    except Exception as exc:  # Dynamo's or FX's error on a model that runs: one line, not a traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"dftrace-dynamo {args.command}: error: could not trace {loaded.name}: {type(exc).__name__}: {first}",
              file=sys.stderr)
        return loaded, inputs, kwargs, None


def _slug(name: str) -> str:
    """A file-name-safe stem for a model name (``pkg.mod:Factory``, ``cfg/bert.json``)."""
    base = pathlib.Path(name).name
    base = base[:-5] if base.endswith(".json") else base
    return re.sub(r"\W+", "_", base).strip("_") or "model"


def run_profile(args, out, warn) -> int:
    machine = _machine(args)
    loaded, inputs, kwargs, traced = _trace(args)
    if traced is None:
        return 1
    from .profile import profile_traced
    from .report import render_profile

    profile = profile_traced(traced, loaded.model, inputs, kwargs, name=loaded.name, runs=args.runs, **machine)
    if profile.timing_error:
        warn("profile", f"op times not measured: {profile.timing_error}")
    for message in profile.timing_warnings:
        warn("profile", message)
    out.write(render_profile(profile, args.format, args.showshape, depth=args.depth))
    return 0


def run_explore(args, out) -> int:
    from .options import check_range

    try:
        check_range(args.start, args.end, args.around, args.context, args.max_nodes)
    except ValueError as exc:
        raise TraceError(str(exc)) from None
    machine = _machine(args)
    loaded, inputs, kwargs, traced = _trace(args)
    if traced is None:
        return 1
    from .explore import render_explorer, select
    from .profile import profile_traced

    total = sum(len(p.graph_module.graph.nodes) for p in traced.partitions)
    try:
        select(total, args.start, args.end, args.around, args.context, args.max_nodes)
    except ValueError as exc:
        raise TraceError(str(exc)) from None
    profile = profile_traced(traced, loaded.model, inputs, kwargs, name=loaded.name, runs=0, **machine)
    text = render_explorer(traced, profile, args.start, args.end, args.around, args.context, args.max_nodes,
                           show_params=args.show_params)
    if args.output:
        pathlib.Path(args.output).write_text(text)
        print(f"explorer view: {args.output}", file=sys.stderr)
    else:
        out.write(text)
    return 0


def run_graph(args, warn) -> int:
    from .options import PICTURE_FORMATS as FORMATS

    if not args.output and not args.code:
        raise TraceError("give -o FILE.{dot,svg,png,pdf} and/or --code DIR")
    if args.output and pathlib.Path(args.output).suffix.lstrip(".").lower() not in FORMATS:
        raise TraceError(f"{args.output}: unknown picture format (use .dot, .svg, .png or .pdf)")
    if args.output and not pathlib.Path(args.output).absolute().parent.is_dir():
        # a typo must not leave directories behind (at the filesystem root, say)
        raise TraceError(f"{args.output}: directory {pathlib.Path(args.output).absolute().parent} does not exist")
    loaded, inputs, kwargs, traced = _trace(args)
    if traced is None:
        return 1
    from .draw import write_graph
    from .export import export_partition

    print(f"{loaded.name}: {len(traced.partitions)} graph(s) via {traced.method}", file=sys.stderr)
    for brk in traced.graph_breaks:
        print(f"  graph break{' at ' + brk.location if brk.location else ''}: {brk.short_reason}", file=sys.stderr)
    if args.code:
        stem = _slug(loaded.name)
        for part in traced.partitions:
            path = export_partition(part, pathlib.Path(args.code) / f"{stem}_graph_{part.index}.py", title=loaded.name)
            print(f"code: {path}", file=sys.stderr)
    if args.output:
        try:
            result = write_graph(traced.partitions, args.output, name=_slug(loaded.name), depth=args.depth)
        except RuntimeError as exc:  # Graphviz itself failed
            print(f"dftrace-dynamo graph: error: {exc}", file=sys.stderr)
            return 1
        for message in result.warnings:
            warn("graph", message)
        # without Graphviz the DOT file is the result (exit 0, so scripts go on); the line says so
        print(result.message, file=sys.stderr)
    return 0
