"""Text view of traced graphs (the graph explorer).

Every node of every partition has a number (1-based, continuing across
partitions, :func:`~.names.number_nodes`: the numbers of the profile); a
range of them is printed with its FX opcode, readable name, arguments,
module, output shape and the profile's cost figures. Parameter and buffer
inputs are folded away by default (the ops that use them name them).
Partition boundaries show why Dynamo ended the graph.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional

import torch.fx

from ..naming import truncate
from .hybrid import TracedModel
from .names import module_path, node_label, number_nodes, weight_nodes
from .options import check_range
from .profile import ModelProfile
from .report import human, human_bytes

__all__ = ["Selection", "select", "render_explorer"]

ARG_WIDTH = 28
TOP_TARGETS = 10


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which node numbers to show (1-based, inclusive)."""

    start: int
    end: int


def select(total: int, start: Optional[int] = None, end: Optional[int] = None, around: Optional[int] = None,
           context: int = 5, max_nodes: Optional[int] = None) -> Selection:
    """The node range asked for; ``ValueError`` with a one-line reason when it is not valid.

    ``max_nodes`` is applied by the caller, which knows which nodes are shown.
    """
    check_range(start, end, around, context, max_nodes)
    if around is not None:
        if not 1 <= around <= total:
            raise ValueError(f"--around {around} is outside the graph (nodes 1..{total})")
        first, last = max(1, around - context), min(total, around + context)
    else:
        first = 1 if start is None else start
        last = total if end is None else min(end, total)
        if first > total:
            raise ValueError(f"--start {first} is outside the graph (nodes 1..{total})")
    return Selection(first, last)


def _arg_text(arg) -> str:
    if isinstance(arg, torch.fx.Node):
        return node_label(arg, ARG_WIDTH)
    if isinstance(arg, (list, tuple)):
        inner = ", ".join(_arg_text(a) for a in arg)
        return f"[{inner}]" if isinstance(arg, list) else f"({inner}{',' if len(arg) == 1 else ''})"
    if isinstance(arg, dict):
        return "{" + ", ".join(f"{k}: {_arg_text(v)}" for k, v in arg.items()) + "}"
    return truncate(repr(arg), ARG_WIDTH)


def _call_text(node: torch.fx.Node, target: str) -> str:
    parts = [_arg_text(a) for a in node.args] + [f"{k}={_arg_text(v)}" for k, v in node.kwargs.items()]
    return f"{target}({', '.join(parts)})"


def _header(traced: TracedModel, profile: ModelProfile, total: int) -> list[str]:
    kinds: collections.Counter = collections.Counter()
    targets: collections.Counter = collections.Counter()
    for part in traced.partitions:
        kinds.update(part.ops_by_kind)
        targets.update(part.ops_by_target)
    lines = [f"Graph explorer: {profile.model}",
             f"  traced with:  {traced.method}" + (f" (symbolic_trace failed: {traced.fx_error})" if traced.fx_error else ""),
             f"  graphs:       {len(traced.partitions)}, graph breaks: {len(traced.graph_breaks)}"]
    for brk in traced.graph_breaks:
        lines.append(f"    break{' at ' + brk.location if brk.location else ''}: {brk.short_reason}")
    lines.append(f"  nodes:        {total} (" + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ")")
    lines.append("  top targets:  " + ", ".join(f"{t} x{n}" for t, n in targets.most_common(TOP_TARGETS)))
    dist = profile.bottlenecks()
    lines.append("  bottlenecks:  " + ", ".join(f"{cls} {d['nodes']}" for cls, d in dist.items())
                 + f" (machine balance {profile.balance:.2f} FLOPs/byte)")
    lines.append(f"  totals:       FLOPs {human(profile.total_flops)}, params {human(profile.total_params)}, "
                 f"traffic {human_bytes(profile.total_bytes)}")
    return lines


def render_explorer(traced: TracedModel, profile: ModelProfile, start: Optional[int] = None,
                    end: Optional[int] = None, around: Optional[int] = None, context: int = 5,
                    max_nodes: Optional[int] = None, show_params: bool = False) -> str:
    """The explorer text for the chosen node range (all nodes by default).

    Parameter and buffer inputs are left out unless ``show_params``;
    ``max_nodes`` counts the nodes shown.
    """
    metrics = {(n.graph, n.name): n for n in profile.nodes}
    inputs = {(part.index, meta.name): meta for part in traced.partitions for meta in part.inputs}
    numbers = number_nodes(traced.partitions)
    numbered = [(numbers[(part.index, node.name)], part, node)
                for part in traced.partitions for node in part.graph_module.graph.nodes]
    if not numbered:
        return "\n".join(_header(traced, profile, 0) + ["", "(no graph nodes)"]) + "\n"
    sel = select(len(numbered), start, end, around, context, max_nodes)
    weights = set() if show_params else {(p.index, name) for p in traced.partitions for name in weight_nodes(p)}
    shown = [(number, part, node) for number, part, node in numbered
             if sel.start <= number <= sel.end and (number == around or (part.index, node.name) not in weights)]
    if max_nodes is not None:
        shown = shown[:max_nodes]
    lines = _header(traced, profile, len(numbered))
    folded = f"; {len(weights)} parameter/buffer inputs folded into their ops (--show-params shows them)" \
        if weights else ""
    last = shown[-1][0] if shown else sel.end
    lines += ["", f"Nodes {sel.start}..{last} of {len(numbered)}{folded}"]
    current = None
    for number, part, node in shown:
        if part.index != current:
            current = part.index
            reason = (part.compile_reason or "").strip().splitlines()
            ended = f"  (ended by: {reason[0]})" if reason else ""
            lines += ["", f"=== graph {part.index}: {part.num_ops} ops{ended} ==="]
        marker = ">>" if around == number else "  "
        stats = metrics.get((part.index, node.name))
        head = f"{marker}{number:5d}. [{node.op}] {node_label(node, 48)}"
        if node.op == "placeholder":
            meta = inputs.get((part.index, node.name))
            lines.append(f"{head}  {meta.type_text if meta else ''}")
            continue
        if node.op == "output":
            lines.append(f"{head}  returns {_arg_text(node.args[0])}")
            continue
        if node.op == "get_attr":
            lines.append(f"{head}")
            continue
        target = stats.target if stats else str(node.target)
        lines.append(f"{head} = {_call_text(node, target)}")
        module, mtype = module_path(node)
        if module:
            lines.append(f"           module: {module} ({mtype})")
        if stats:
            lines.append(f"           shape {stats.shape or '-'} | params {human(stats.params)} | "
                         f"FLOPs {human(stats.flops)} | read {human_bytes(stats.bytes_read)} | "
                         f"written {human_bytes(stats.bytes_written)} | AI {stats.intensity:.2f} | {stats.bottleneck}")
    return "\n".join(lines) + "\n"
