"""Graph pictures: DOT text drawn from the traced graphs, rendered by Graphviz.

Op level (the default): one box per op, labelled by :func:`~.names.node_label`
with its target, module and output shape; parameter and buffer inputs are
folded into the box of the op that uses them (their shapes are listed
there). Module level (``depth=N``): one box per module N levels deep, the ops
inside it collapsed, which keeps BERT or ResNet readable. Several partitions
become one picture with a cluster per partition.

SVG, PNG and PDF need the Graphviz ``dot`` program; without it the DOT file
is written and :class:`DrawResult` says how to render it. Graphviz's own
warnings are passed on, and a raster picture that Graphviz had to shrink
until its text is unreadable is reported with what to do instead.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
import struct
import subprocess
import tempfile
from typing import Optional

import torch
from torch.fx.passes.shape_prop import ShapeProp
from torch.utils._pytree import tree_leaves

from ..naming import truncate
from .capture import GraphPartition, snapshot, target_name
from .names import module_stack, node_label, weight_nodes
from .options import PICTURE_FORMATS

__all__ = ["FORMATS", "DrawResult", "dot_source", "write_graph"]

FORMATS = PICTURE_FORMATS
GRAPHVIZ_HINT = "install Graphviz (apt-get install graphviz, brew install graphviz, conda install graphviz)"
LABEL_WIDTH = 32  # characters per label line
MAX_WEIGHTS = 3  # folded parameter shapes listed per op
# Graphviz's default 14 pt text is ~19 px in a PNG; below MIN_TEXT_PX after
# Graphviz shrinks a picture to its raster limit, the text cannot be read.
TEXT_PX = 14 * 96 / 72
MIN_TEXT_PX = 9.0
_SCALING = re.compile(r"Scaling by ([0-9.]+)")


@dataclasses.dataclass
class DrawResult:
    path: pathlib.Path  # the file written (the DOT file when rendering was not possible)
    rendered: bool  # False: the requested picture format was not produced
    message: str
    warnings: list = dataclasses.field(default_factory=list)  # Graphviz's, and whether the picture is readable
    size: Optional[tuple] = None  # (width, height) in pixels of a PNG


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _shape_text(node: torch.fx.Node) -> str:
    meta = node.meta.get("tensor_meta")  # a TensorMetadata, or a container of them for several outputs
    metas = [meta] if hasattr(meta, "shape") else tree_leaves(meta, is_leaf=lambda m: hasattr(m, "shape"))
    shapes = [m.shape for m in metas if hasattr(m, "shape")]
    return ", ".join("x".join(map(str, s)) or "scalar" for s in shapes)


def _shaped(partition: GraphPartition) -> torch.fx.GraphModule:
    """A copy of the partition's graph with output shapes in ``node.meta["tensor_meta"]``."""
    gm = snapshot(partition.graph_module)
    with torch.no_grad():
        ShapeProp(gm).propagate(*partition.example_inputs)
    return gm


def _op_label(node: torch.fx.Node, weights: set) -> str:
    lines = [truncate(node_label(node), LABEL_WIDTH)]
    if node.op in ("call_function", "call_method", "call_module"):
        lines.append(truncate(target_name(node), LABEL_WIDTH))
        stack = module_stack(node)
        if stack:
            lines.append(truncate(stack[-1][0], LABEL_WIDTH))
        folded = [a for a in node.all_input_nodes if a.name in weights]
        if folded:
            shapes = [_shape_text(a) for a in folded[:MAX_WEIGHTS]]
            lines.append("weights " + ", ".join(shapes) + (" ..." if len(folded) > MAX_WEIGHTS else ""))
    shape = _shape_text(node)
    if shape and node.op != "output":
        lines.append(truncate(shape, LABEL_WIDTH))
    return "\n".join(lines)


def _group(node: torch.fx.Node, depth: Optional[int]) -> Optional[str]:
    """The module box ``node`` is drawn in at ``depth``, None when it gets its own box."""
    if depth is None or node.op in ("placeholder", "output"):
        return None
    stack = module_stack(node)
    if not stack:
        return None
    parts = stack[-1][0].split(".")
    return ".".join(parts[:depth])


def _partition_body(partition: GraphPartition, prefix: str, depth: Optional[int], indent: str) -> list[str]:
    gm = _shaped(partition)
    weights = weight_nodes(partition)
    types = {}
    for node in gm.graph.nodes:
        types.update(module_stack(node))
    box_of: dict[str, str] = {}
    boxes: dict[str, dict] = {}  # box id -> {"label": ..., "ops": n, "last": node}
    for node in gm.graph.nodes:
        if node.name in weights:
            continue
        group = _group(node, depth)
        if group is None:
            box = f"{prefix}{node.name}"
            boxes[box] = {"label": _op_label(node, weights), "shape": "ellipse" if node.op == "placeholder" else "box"}
        else:
            box = f"{prefix}m_{re.sub(r'[^A-Za-z0-9_]', '_', group)}"
            entry = boxes.setdefault(box, {"module": group, "ops": 0, "shape": "box3d"})
            entry["ops"] += 1
            entry["last"] = node
        box_of[node.name] = box
    lines = []
    for box, entry in boxes.items():
        if "module" in entry:
            kind = types.get(entry["module"], "")
            label = [truncate(entry["module"], LABEL_WIDTH)] + ([kind] if kind else [])
            label.append(f"{entry['ops']} op{'s' if entry['ops'] > 1 else ''}")
            shape = _shape_text(entry["last"])
            if shape:
                label.append(truncate(shape, LABEL_WIDTH))
            entry["label"] = "\n".join(label)
        lines.append(f"{indent}{_quote(box)} [label={_quote(entry['label'])}, shape={entry['shape']}];")
    edges = []
    for node in gm.graph.nodes:
        if node.name not in box_of:
            continue
        for arg in node.all_input_nodes:
            edge = (box_of.get(arg.name), box_of[node.name])
            if edge[0] is not None and edge[0] != edge[1] and edge not in edges:
                edges.append(edge)
    lines += [f"{indent}{_quote(a)} -> {_quote(b)};" for a, b in edges]
    return lines


def dot_source(partitions: list[GraphPartition], name: str = "model", depth: Optional[int] = None) -> str:
    """DOT text for ``partitions``; ``depth`` draws one box per module at that depth."""
    lines = [f"digraph {_quote(name)} {{", "  rankdir=TB;", '  graph [fontname="Helvetica"];',
             '  node [fontname="Helvetica", fontsize=14, style=rounded];']
    if len(partitions) == 1:
        lines += _partition_body(partitions[0], "", depth, "  ")
    else:
        for part in partitions:
            lines += [f"  subgraph cluster_graph_{part.index} {{", f"    label={_quote(f'graph {part.index}')};",
                      "    color=royalblue;"]
            lines += _partition_body(part, f"g{part.index}_", depth, "    ")
            lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _png_size(path: pathlib.Path) -> Optional[tuple]:
    head = path.read_bytes()[:24]
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return struct.unpack(">II", head[16:24])


def _readability(fmt: str, path: pathlib.Path, warnings: list) -> tuple[Optional[tuple], Optional[str]]:
    """(PNG size, a warning when the raster picture cannot be read)."""
    if fmt != "png":
        return None, None
    size = _png_size(path)
    scale = min([float(m.group(1)) for w in warnings for m in [_SCALING.search(w)] if m] or [1.0])
    if TEXT_PX * scale >= MIN_TEXT_PX:
        return size, None
    where = f" ({size[0]}x{size[1]} px)" if size else ""
    return size, (f"{path.name}{where} is unreadable: Graphviz shrank it to {scale:.0%} to fit its raster limit, "
                  f"text is about {TEXT_PX * scale:.0f} px high; write an .svg (scales without limit) or draw "
                  "modules with --depth N")


def write_graph(partitions: list[GraphPartition], path, name: str = "model", depth: Optional[int] = None,
                dot_program: Optional[str] = None) -> DrawResult:
    """Draw ``partitions`` into ``path``; the format comes from its suffix."""
    path = pathlib.Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise ValueError(f"{path}: unknown picture format {path.suffix!r} (use .dot, .svg, .png or .pdf)")
    if not partitions:
        raise ValueError("no graph to draw")
    if depth is not None and depth < 1:
        raise ValueError("depth must be at least 1")
    source = dot_source(partitions, name, depth)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "dot":
        path.write_text(source)
        return DrawResult(path, True, f"wrote {path}")
    program = dot_program or shutil.which("dot")
    if program is None:
        dot_path = path.with_suffix(".dot")
        dot_path.write_text(source)
        return DrawResult(dot_path, False,
                          f"Graphviz 'dot' is not installed, so {path.name} was not rendered; wrote {dot_path}. "
                          f"To render it, {GRAPHVIZ_HINT}, then run: dot -T{fmt} {dot_path} -o {path}")
    with tempfile.NamedTemporaryFile("w", suffix=".dot", delete=False) as tmp:
        tmp.write(source)
    try:
        proc = subprocess.run([program, f"-T{fmt}", tmp.name, "-o", str(path)], capture_output=True, text=True)
    finally:
        pathlib.Path(tmp.name).unlink()
    warnings = [f"Graphviz: {line.strip()}" for line in proc.stderr.splitlines() if line.strip()]
    if proc.returncode != 0:
        raise RuntimeError(f"Graphviz failed on {path.name} (exit status {proc.returncode})"
                           + (f": {warnings[-1]}" if warnings else ""))
    size, unreadable = _readability(fmt, path, warnings)
    if unreadable:
        warnings.append(unreadable)
    where = f" ({size[0]}x{size[1]} px)" if size else ""
    return DrawResult(path, True, f"wrote {path}{where}", warnings, size)
