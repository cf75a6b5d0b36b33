"""Text view of traced graphs (the graph explorer).

Every node of every partition but the parameter and buffer inputs has a
number (from 0, continuing across partitions, :func:`~.names.number_nodes`:
the numbers of the profile); a range of them is printed with its FX opcode, readable name, arguments,
module, output shape and the profile's cost figures. Parameter and buffer
inputs are folded away by default (the ops that use them name them);
``show_params`` lists them, unnumbered.
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
    """Which node numbers to show (from 0, inclusive)."""

    start: int
    end: int


def select(total: int, start: Optional[int] = None, end: Optional[int] = None, around: Optional[int] = None,
           context: int = 5, max_nodes: Optional[int] = None) -> Selection:
    """The node range asked for; ``ValueError`` with a one-line reason when it is not valid.

    ``max_nodes`` is applied by the caller, which knows which nodes are shown.
    """
    check_range(start, end, around, context, max_nodes)
    if around is not None:
        if not 0 <= around < total:
            raise ValueError(f"--around {around} is outside the graph (nodes 0..{total - 1})")
        first, last = max(0, around - context), min(total - 1, around + context)
    else:
        first = 0 if start is None else start
        last = total - 1 if end is None else min(end, total - 1)
        if first >= total:
            raise ValueError(f"--start {first} is outside the graph (nodes 0..{total - 1})")
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


def _header(traced: TracedModel, profile: ModelProfile, numbers: dict, show_params: bool) -> list[str]:
    kinds: collections.Counter = collections.Counter()
    targets: collections.Counter = collections.Counter()
    for part in traced.partitions:
        kinds.update(node.op for node in part.graph_module.graph.nodes if (part.index, node.name) in numbers)
        targets.update(part.ops_by_target)
    weights = sum(len(part.graph_module.graph.nodes) for part in traced.partitions) - len(numbers)
    lines = [f"Graph explorer: {profile.model}",
             f"  traced with:  {traced.method}",
             f"  graphs:       {len(traced.partitions)}, graph breaks: {len(traced.graph_breaks)}"]
    for brk in traced.graph_breaks:
        lines.append(f"    break{' at ' + brk.location if brk.location else ''}: {brk.short_reason}")
    lines.append(f"  nodes:        {len(numbers)} (" + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ")"
                 + (f" and {weights} parameter/buffer inputs, unnumbered"
                    + ("" if show_params else " (folded into their ops; --show-params lists them)") if weights else ""))
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
    nodes = [(numbers.get((part.index, node.name)), part, node)
             for part in traced.partitions for node in part.graph_module.graph.nodes]
    if not numbers:
        return "\n".join(_header(traced, profile, numbers, show_params) + ["", "(no graph nodes)"]) + "\n"
    sel = select(len(numbers), start, end, around, context, max_nodes)
    shown, following = [], len(numbers)
    for number, part, node in reversed(nodes):  # an unnumbered input goes with the node after it
        following = following if number is None else number
        if sel.start <= following <= sel.end and (number is not None or show_params):
            shown.append((number, part, node))
    shown.reverse()
    if max_nodes is not None:
        shown = shown[:max_nodes]
    lines = _header(traced, profile, numbers, show_params)
    last = max((n for n, _, _ in shown if n is not None), default=sel.end)
    lines += ["", f"Nodes {sel.start}..{last} of {len(numbers)}"]
    current = None
    for number, part, node in shown:
        if part.index != current:
            current = part.index
            reason = (part.compile_reason or "").strip().splitlines()
            ended = f"  (ended by: {reason[0]})" if reason else ""
            lines += ["", f"=== graph {part.index}: {part.num_ops} ops{ended} ==="]
        marker = ">>" if around is not None and around == number else "  "
        stats = metrics.get((part.index, node.name))
        head = f"{marker}{'-' if number is None else number:>5}. [{node.op}] {node_label(node, 48)}"
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
