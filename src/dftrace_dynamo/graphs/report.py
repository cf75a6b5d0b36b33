"""Rendering a :class:`~dftrace_dynamo.graphs.profile.ModelProfile` as table, CSV or JSON."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from typing import Optional

from ..naming import abbreviate
from .profile import ModelProfile, NodeProfile

__all__ = ["FORMATS", "render_profile", "human", "human_bytes"]

FORMATS = ("table", "csv", "json")
NAME_WIDTH = 44

CSV_FIELDS = ["index", "graph", "name", "label", "module", "module_type", "op", "target", "params", "shape", "macs", "flops",
              "bytes_read", "bytes_written", "intensity", "bottleneck", "time_ns", "time_spread", "calls", "achieved_flops"]


def human(value: Optional[float], unit: str = "") -> str:
    """1234567 → ``1.23M`` (K/M/G/T, powers of 1000); ``unit`` follows a space."""
    if value is None:
        return "-"
    sep = " " if unit else ""
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= div:
            return f"{value / div:.2f}{sep}{suffix}{unit}"
    return f"{value:.0f}{sep}{unit}" if float(value).is_integer() else f"{value:.2f}{sep}{unit}"


def human_bytes(value: Optional[float]) -> str:
    """Bytes with binary units (KiB, MiB, GiB)."""
    if value is None:
        return "-"
    for div, suffix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if value >= div:
            return f"{value / div:.2f} {suffix}"
    return f"{value:.0f} B"


def _time(ns: Optional[float]) -> str:
    if ns is None:
        return "-"
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} us"
    return f"{ns:.0f} ns"


@dataclasses.dataclass
class _Module:
    """A module row of the table: its totals and what is listed under it, in call order."""

    path: str
    depth: int
    items: list = dataclasses.field(default_factory=list)  # _Module children (first call) and NodeProfile ops
    children: dict = dataclasses.field(default_factory=dict)
    params: int = 0
    flops: int = 0
    read: int = 0
    written: int = 0
    time: Optional[float] = None

    def add(self, node: NodeProfile) -> None:
        self.params += node.params
        self.flops += node.flops
        self.read += node.bytes_read
        self.written += node.bytes_written
        if node.time_ns is not None:
            self.time = (self.time or 0.0) + node.time_ns


def _module_tree(nodes: list[NodeProfile]) -> _Module:
    """Modules by path prefix (``encoder``, ``encoder.layer``, ``encoder.layer.0``...).

    Every op goes under its own module, so the ops of a module called several
    times all appear under that module's row.
    """
    root = _Module("", 0)
    for node in nodes:
        current = root
        current.add(node)
        parts = node.module.split(".") if node.module else []
        for depth in range(1, len(parts) + 1):
            key = ".".join(parts[:depth])
            child = current.children.get(key)
            if child is None:
                child = current.children[key] = _Module(key, depth)
                current.items.append(child)
            child.add(node)
            current = child
        current.items.append(node)
    return root


def _cells(number: str, label: str, params: int, shape: str, flops: int, read: int, written: int, bound: str,
           time_ns: Optional[float], show_shapes: bool, timed: bool) -> list[str]:
    traffic = read + written
    row = [number, label, human(params) if params else ""] + ([shape] if show_shapes else []) + [
        human(flops // 2) if flops else "", human(flops) if flops else "", human_bytes(read), human_bytes(written),
        f"{flops / traffic:.2f}" if traffic else "-", bound]
    if timed:
        row += [_time(time_ns), human(flops / (time_ns * 1e-9)) if time_ns and flops else "-"]
    return row


def _tree_rows(profile: ModelProfile, module: _Module, depth: Optional[int], show_shapes: bool,
               timed: bool) -> list[list[str]]:
    rows: list[list[str]] = []
    indent = "  " * module.depth
    for item in module.items:
        if isinstance(item, _Module):
            if depth is not None and item.depth > depth:
                continue
            name = item.path if item.depth == 1 else item.path.rsplit(".", 1)[-1]
            label = indent + abbreviate(name, max(NAME_WIDTH - len(indent), 12))
            if profile.module_types.get(item.path):
                label += f" ({profile.module_types[item.path]})"
            rows.append(_cells("", label, item.params, "", item.flops, item.read, item.written, "", item.time,
                               show_shapes, timed))
            rows += _tree_rows(profile, item, depth, show_shapes, timed)
        elif depth is None:
            op = item.target.rsplit(".", 1)[-1]
            label = indent + abbreviate(f"{item.label} [{op}]", max(NAME_WIDTH - len(indent), 12))
            rows.append(_cells(str(item.index), label, item.params, item.shape, item.flops, item.bytes_read,
                               item.bytes_written, item.bottleneck, item.time_ns, show_shapes, timed))
    ops = [item for item in module.items if isinstance(item, NodeProfile)]
    if depth is not None and ops and module.depth < depth and (module.children or not module.path):
        # --depth: the ops of this module outside its submodules, in one row after them
        other = _Module("", 0)
        for node in ops:
            other.add(node)
        label = f"{indent}({len(ops)} op{'s' if len(ops) > 1 else ''}{' at top level' if not module.path else ''})"
        rows.append(_cells("", label, other.params, "", other.flops, other.read, other.written, "", other.time,
                           show_shapes, timed))
    return rows


def _table(profile: ModelProfile, show_shapes: bool, depth: Optional[int] = None) -> str:
    timed = profile.timing is not None
    header = ["Node", "Module / op", "#Params"] + (["Shape"] if show_shapes else []) + \
             ["MACs", "FLOPs", "Read", "Written", "AI", "Bound"] + (["Time", "FLOP/s"] if timed else [])
    rows = _tree_rows(profile, _module_tree(profile.nodes), depth, show_shapes, timed)
    if depth is not None:  # module rows only: no node numbers
        header, rows = header[1:], [r[1:] for r in rows]
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    left = {0 if depth is not None else 1}  # the name column is left-aligned, numbers right-aligned
    out = io.StringIO()
    scope = f", modules to depth {depth}" if depth is not None else ""
    out.write(f"Graph profile of {profile.model} ({profile.method}, {profile.graph_count} graph(s){scope})\n\n")
    line = "  ".join(h.ljust(w) if i in left else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths)))
    out.write(line + "\n" + "-" * len(line) + "\n")
    for r in rows:
        out.write("  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) + "\n")
    out.write("\n" + _summary_text(profile))
    return out.getvalue()


def _unseen_params(s: dict) -> str:
    """What the parameter count leaves out: those of the model that no graph uses."""
    if not s["model_params"] or s["params"] >= s["model_params"]:
        return ""
    return (f" of the model's {human(s['model_params'])}: the rest are in no graph (unused by this forward, "
            "or run eagerly after a graph break)")


def _summary_text(profile: ModelProfile) -> str:
    s = profile.summary()
    mem = s["memory"]
    lines = ["Model summary",
             f"  tracing:           {s['method']}",
             f"  graphs:            {s['graphs']} ({len(s['graph_breaks'])} graph break(s))"]
    for brk in profile.graph_breaks:
        where = f" at {brk.location}" if brk.location else ""
        lines.append(f"    break{where}: {brk.short_reason}")
    lines += [
        f"  nodes:             {s['nodes']}",
        f"  parameters:        {human(s['params'])}{_unseen_params(s)}",
        f"  MACs / FLOPs:      {human(s['macs'])} / {human(s['flops'])}",
        f"  memory:            inputs {human_bytes(mem['inputs'])}, outputs {human_bytes(mem['outputs'])}, "
        f"weights {human_bytes(mem['weights'])}, activations {human_bytes(mem['activations'])}",
        f"  memory traffic:    {human_bytes(mem['traffic'])} (sum of op reads and writes)",
        f"  intensity:         {s['intensity']:.2f} FLOPs/byte (machine balance {s['balance']:.2f})",
    ]
    if s["timing"]:
        achieved = human(s["achieved_flops"], "FLOP/s") if s["achieved_flops"] else "-"
        lines.append(f"  measured op time:  {_time(s['time_ns'])} per run ({s['timing']}), achieved {achieved}")
        spreads = sorted(n.time_spread for n in profile.nodes if n.time_spread is not None)
        if spreads:
            lines.append(f"  run-to-run spread: median {spreads[len(spreads) // 2]:.0%}, worst {spreads[-1]:.0%} "
                         "of an op's median ((max - min) / median)")
        if s["graph_time_ns"]:
            lines.append(f"  whole graph(s):    {_time(s['graph_time_ns'])} per run (median; ops run inside it)")
        for message in s["timing_warnings"]:
            lines.append(f"  warning: {message}")
    lines += ["", "Bottleneck distribution"]
    total_nodes = max(s["nodes"], 1)
    total_time = s["time_ns"]
    for cls, b in s["bottlenecks"].items():
        share = f"{100.0 * b['nodes'] / total_nodes:5.1f}% of nodes"
        if total_time and b["time_ns"] is not None:
            share += f", {100.0 * b['time_ns'] / total_time:5.1f}% of time"
        lines.append(f"  {cls + '-bound' if cls != 'none' else 'no traffic':<14} {b['nodes']:5d}  ({share})"
                     f"  FLOPs {human(b['flops'])}")
    return "\n".join(lines) + "\n"


def render_profile(profile: ModelProfile, fmt: str = "table", show_shapes: bool = False,
                   depth: Optional[int] = None) -> str:
    """The profile as ``table``, ``csv`` or ``json``; ``depth`` (table only) keeps modules to that depth."""
    if fmt == "json":
        return json.dumps({"summary": profile.summary(), "nodes": [n.as_dict() for n in profile.nodes]},
                          indent=2) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for node in profile.nodes:
            writer.writerow(node.as_dict())
        return out.getvalue()
    if fmt == "table":
        return _table(profile, show_shapes, depth)
    raise ValueError(f"format must be one of {FORMATS}")
