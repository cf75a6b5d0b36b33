"""Rendering a :class:`~dftrace_dynamo.graphs.profile.ModelProfile` as table, CSV or JSON."""

from __future__ import annotations

import csv
import io
import json
from typing import Optional

from ..naming import abbreviate
from .profile import ModelProfile, NodeProfile

__all__ = ["FORMATS", "render_profile", "human", "human_bytes"]

FORMATS = ("table", "csv", "json")
NAME_WIDTH = 44

CSV_FIELDS = ["index", "graph", "name", "module", "module_type", "op", "target", "params", "shape", "macs", "flops",
              "bytes_read", "bytes_written", "intensity", "bottleneck", "time_ns", "calls", "achieved_flops"]


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


def _module_rows(nodes: list[NodeProfile]) -> dict[str, dict]:
    """Totals per module path prefix (``encoder``, ``encoder.layer.0``...)."""
    totals: dict[str, dict] = {}
    for node in nodes:
        parts = node.module.split(".") if node.module else []
        for depth in range(1, len(parts) + 1):
            key = ".".join(parts[:depth])
            row = totals.setdefault(key, {"params": 0, "flops": 0, "read": 0, "written": 0, "time": None})
            row["params"] += node.params
            row["flops"] += node.flops
            row["read"] += node.bytes_read
            row["written"] += node.bytes_written
            if node.time_ns is not None:
                row["time"] = (row["time"] or 0.0) + node.time_ns
    return totals


def _cells(label: str, params: int, shape: str, flops: int, read: int, written: int, bound: str,
           time_ns: Optional[float], show_shapes: bool, timed: bool) -> list[str]:
    traffic = read + written
    row = [label, human(params) if params else ""] + ([shape] if show_shapes else []) + [
        human(flops // 2) if flops else "", human(flops) if flops else "", human_bytes(read), human_bytes(written),
        f"{flops / traffic:.2f}" if traffic else "-", bound]
    if timed:
        row += [_time(time_ns), human(flops / (time_ns * 1e-9)) if time_ns and flops else "-"]
    return row


def _table(profile: ModelProfile, show_shapes: bool) -> str:
    timed = profile.timing is not None
    header = ["Module / op", "#Params"] + (["Shape"] if show_shapes else []) + \
             ["MACs", "FLOPs", "Read", "Written", "AI", "Bound"] + (["Time", "FLOP/s"] if timed else [])
    rows: list[list[str]] = []
    modules = _module_rows(profile.nodes)
    shown: set = set()
    for node in profile.nodes:
        parts = node.module.split(".") if node.module else []
        # A module's row (its totals) comes before its first op.
        for depth in range(1, len(parts) + 1):
            key = ".".join(parts[:depth])
            if key in shown:
                continue
            shown.add(key)
            m = modules[key]
            label = "  " * (depth - 1) + abbreviate(parts[depth - 1] if depth > 1 else key, NAME_WIDTH - 2 * depth)
            if profile.module_types.get(key):
                label += f" ({profile.module_types[key]})"
            rows.append(_cells(label, m["params"], "", m["flops"], m["read"], m["written"], "", m["time"],
                               show_shapes, timed))
        indent = "  " * len(parts)
        op = node.target.rsplit(".", 1)[-1]
        label = indent + abbreviate(f"{node.label} [{op}]", max(NAME_WIDTH - len(indent), 12))
        rows.append(_cells(label, node.params, node.shape, node.flops, node.bytes_read, node.bytes_written,
                           node.bottleneck, node.time_ns, show_shapes, timed))
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    out = io.StringIO()
    out.write(f"Graph profile of {profile.model} ({profile.method}, {profile.graph_count} graph(s))\n\n")
    line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths)))
    out.write(line + "\n" + "-" * len(line) + "\n")
    for r in rows:
        out.write("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) + "\n")
    out.write("\n" + _summary_text(profile))
    return out.getvalue()


def _summary_text(profile: ModelProfile) -> str:
    s = profile.summary()
    mem = s["memory"]
    lines = ["Model summary",
             f"  tracing:           {s['method']}" + (f" (symbolic_trace failed: {s['fx_error']})" if s["fx_error"] else ""),
             f"  graphs:            {s['graphs']} ({len(s['graph_breaks'])} graph break(s))"]
    for brk in profile.graph_breaks:
        where = f" at {brk.location}" if brk.location else ""
        lines.append(f"    break{where}: {brk.short_reason}")
    lines += [
        f"  nodes:             {s['nodes']}",
        f"  parameters:        {human(s['params'])}",
        f"  MACs / FLOPs:      {human(s['macs'])} / {human(s['flops'])}",
        f"  memory:            inputs {human_bytes(mem['inputs'])}, outputs {human_bytes(mem['outputs'])}, "
        f"weights {human_bytes(mem['weights'])}, activations {human_bytes(mem['activations'])}",
        f"  memory traffic:    {human_bytes(mem['traffic'])} (sum of op reads and writes)",
        f"  intensity:         {s['intensity']:.2f} FLOPs/byte (machine balance {s['balance']:.2f})",
    ]
    if s["timing"]:
        achieved = human(s["achieved_flops"], "FLOP/s") if s["achieved_flops"] else "-"
        lines.append(f"  measured op time:  {_time(s['time_ns'])} per run ({s['timing']}), achieved {achieved}")
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


def render_profile(profile: ModelProfile, fmt: str = "table", show_shapes: bool = False) -> str:
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
        return _table(profile, show_shapes)
    raise ValueError(f"format must be one of {FORMATS}")
