"""What the ``profile``, ``explore`` and ``graph`` subcommands do (the CLI modules only parse).

Bad input raises :class:`~dftrace_dynamo.traces.reader.TraceError`, which the
command reports in one line with exit status 2."""

from __future__ import annotations

import pathlib
import re
import sys

from ..traces.reader import TraceError

__all__ = ["run_profile", "run_explore", "run_graph"]


def _load(args, machine: bool = True):
    """(model, inputs, kwargs, machine options); bad input raises TraceError."""
    from .models import ModelError
    from .options import load_from_args, machine_from_args

    try:
        options = machine_from_args(args) if machine else {}
        loaded, inputs, kwargs = load_from_args(args)
    except (ModelError, ValueError) as exc:
        raise TraceError(str(exc)) from None
    return loaded, inputs, kwargs, options


def _trace(command: str, loaded, inputs, kwargs, method: str):
    """The traced model, or None after a one-line message when tracing fails (exit status 1)."""
    from .hybrid import trace_hybrid

    try:
        return trace_hybrid(loaded.model, inputs, kwargs, method=method)
    except Exception as exc:  # the model's own error or Dynamo's: one line, not a traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"dftrace-dynamo {command}: error: could not trace {loaded.name}: {type(exc).__name__}: {first}",
              file=sys.stderr)
        return None


def _slug(name: str) -> str:
    """A file-name-safe stem for a model name (``pkg.mod:Factory``, ``cfg/bert.json``)."""
    base = pathlib.Path(name).name
    base = base[:-5] if base.endswith(".json") else base
    return re.sub(r"\W+", "_", base).strip("_") or "model"


def run_profile(args, out, warn) -> int:
    from .profile import profile_traced
    from .report import render_profile

    loaded, inputs, kwargs, machine = _load(args)
    traced = _trace("profile", loaded, inputs, kwargs, args.method)
    if traced is None:
        return 1
    profile = profile_traced(traced, loaded.model, inputs, kwargs, name=loaded.name, runs=args.runs, **machine)
    if profile.timing_error:
        warn("profile", f"op times not measured: {profile.timing_error}")
    out.write(render_profile(profile, args.format, args.showshape))
    return 0


def run_explore(args, out) -> int:
    from .explore import render_explorer, select
    from .profile import profile_traced

    for name in ("start", "end", "around"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise TraceError(f"--{name} must be >= 1")
    loaded, inputs, kwargs, machine = _load(args)
    traced = _trace("explore", loaded, inputs, kwargs, args.method)
    if traced is None:
        return 1
    total = sum(len(p.graph_module.graph.nodes) for p in traced.partitions)
    try:
        select(total, args.start, args.end, args.around, args.context, args.max_nodes)
    except ValueError as exc:
        raise TraceError(str(exc)) from None
    profile = profile_traced(traced, loaded.model, inputs, kwargs, name=loaded.name, runs=0, **machine)
    text = render_explorer(traced, profile, args.start, args.end, args.around, args.context, args.max_nodes)
    if args.output:
        pathlib.Path(args.output).write_text(text)
        print(f"explorer view: {args.output}", file=sys.stderr)
    else:
        out.write(text)
    return 0


def run_graph(args) -> int:
    from .draw import FORMATS, write_graph
    from .export import export_partition

    if not args.output and not args.code:
        raise TraceError("give -o FILE.{dot,svg,png,pdf} and/or --code DIR")
    if args.output and pathlib.Path(args.output).suffix.lstrip(".").lower() not in FORMATS:
        raise TraceError(f"{args.output}: unknown picture format (use .dot, .svg, .png or .pdf)")
    loaded, inputs, kwargs, _ = _load(args, machine=False)
    traced = _trace("graph", loaded, inputs, kwargs, args.method)
    if traced is None:
        return 1
    print(f"{loaded.name}: {len(traced.partitions)} graph(s) via {traced.method}"
          + (f" (symbolic_trace failed: {traced.fx_error})" if traced.fx_error else ""), file=sys.stderr)
    for brk in traced.graph_breaks:
        print(f"  graph break{' at ' + brk.location if brk.location else ''}: {brk.short_reason}", file=sys.stderr)
    status = 0
    if args.code:
        stem = _slug(loaded.name)
        for part in traced.partitions:
            path = export_partition(part, pathlib.Path(args.code) / f"{stem}_graph_{part.index}.py", title=loaded.name)
            print(f"code: {path}", file=sys.stderr)
    if args.output:
        result = write_graph(traced.partitions, args.output, name=_slug(loaded.name))
        print(result.message, file=sys.stderr)
        # The requested picture was not made (no Graphviz): say so in the status too.
        status = 0 if result.rendered else 1
    return status
