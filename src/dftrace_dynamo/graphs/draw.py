"""Graph pictures from FX's own drawer (``torch.fx.passes.graph_drawer.FxGraphDrawer``).

FxGraphDrawer works on any FX graph, so Dynamo graphs of multi-input models
(BERT: ``input_ids`` + ``attention_mask``) draw as well as symbolic_trace
ones, which torchview could not do (seed 002). Several partitions become
one picture with a cluster per partition. Rendering to SVG/PNG/PDF needs the
Graphviz ``dot`` program; without it the DOT file is written and
:class:`DrawResult` says how to render it.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
from typing import Optional

import torch
from torch.fx.passes.shape_prop import ShapeProp

from .capture import GraphPartition, snapshot

__all__ = ["FORMATS", "DrawResult", "dot_graph", "write_graph"]

FORMATS = ("dot", "svg", "png", "pdf")
GRAPHVIZ_HINT = "install Graphviz (apt-get install graphviz, brew install graphviz, conda install graphviz)"


@dataclasses.dataclass
class DrawResult:
    path: pathlib.Path  # the file written (the DOT file when rendering was not possible)
    rendered: bool  # False: the requested picture format was not produced
    message: str


def _drawer_graph(partition: GraphPartition, name: str):
    from torch.fx.passes.graph_drawer import FxGraphDrawer

    gm = snapshot(partition.graph_module)
    # Shapes in the node labels: FxGraphDrawer reads node.meta["tensor_meta"].
    with torch.no_grad():
        ShapeProp(gm).propagate(*partition.example_inputs)
    return FxGraphDrawer(gm, name, ignore_getattr=False, ignore_parameters_and_buffers=True).get_main_dot_graph()


def _unquote(name: str) -> str:
    return name[1:-1] if len(name) >= 2 and name[0] == name[-1] == '"' else name


def dot_graph(partitions: list[GraphPartition], name: str = "model"):
    """One ``pydot.Dot`` for all partitions (a cluster each when there are several)."""
    import pydot

    if len(partitions) == 1:
        return _drawer_graph(partitions[0], name)
    top = pydot.Dot(name, graph_type="digraph", rankdir="TB")
    for part in partitions:
        sub = _drawer_graph(part, f"{name}_graph_{part.index}")
        cluster = pydot.Cluster(f"graph_{part.index}", label=f"graph {part.index}", color="royalblue")
        prefix = f"g{part.index}_"
        for node in sub.get_nodes():
            if _unquote(node.get_name()) in ("node", "edge", "graph"):  # default-attribute statements
                continue
            cluster.add_node(pydot.Node(prefix + _unquote(node.get_name()), **node.get_attributes()))
        for edge in sub.get_edges():
            cluster.add_edge(pydot.Edge(prefix + _unquote(edge.get_source()),
                                        prefix + _unquote(edge.get_destination())))
        top.add_subgraph(cluster)
    return top


def write_graph(partitions: list[GraphPartition], path, name: str = "model",
                dot_program: Optional[str] = None) -> DrawResult:
    """Draw ``partitions`` into ``path``; the format comes from its suffix."""
    path = pathlib.Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise ValueError(f"{path}: unknown picture format {path.suffix!r} (use .dot, .svg, .png or .pdf)")
    if not partitions:
        raise ValueError("no graph to draw")
    graph = dot_graph(partitions, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "dot":
        graph.write(str(path), format="raw")
        return DrawResult(path, True, f"wrote {path}")
    program = dot_program or shutil.which("dot")
    if program is None:
        dot_path = path.with_suffix(".dot")
        graph.write(str(dot_path), format="raw")
        return DrawResult(dot_path, False,
                          f"Graphviz 'dot' is not installed, so {path.name} was not rendered; wrote {dot_path}. "
                          f"To render it, {GRAPHVIZ_HINT}, then run: dot -T{fmt} {dot_path} -o {path}")
    graph.write(str(path), format=fmt, prog=program)
    return DrawResult(path, True, f"wrote {path}")
