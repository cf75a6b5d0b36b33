"""Names and numbers of graph nodes, shared by the profile, the explorer and the pictures.

* :func:`node_label`: the readable name of a node. Dynamo's placeholder
  *targets* keep the attribute's case (``..._modules_LayerNorm_parameters_weight_``)
  where the node *names* are lower-cased, so placeholders are named from
  their target.
* :func:`module_stack`: the module paths around a node, equal to the names
  ``model.named_modules()`` gives.
* :func:`number_nodes`: every node of every partition numbered from 0 in
  graph order, inputs and outputs included, parameters and buffers left out
  (no view lists them by default), so a number seen in ``profile`` finds the
  same node in ``explore`` and numbers have no gaps.
* :func:`weight_nodes`: parameter and buffer inputs, folded into the ops that
  use them by default.
"""

from __future__ import annotations

import re
from typing import Iterable

import torch
import torch.fx

from ..naming import abbreviate, user_path

__all__ = ["node_label", "module_stack", "module_path", "number_nodes", "weight_nodes"]

_BARE_ROOT = re.compile(r"""^[LG]\[(['"])[^'"]+\1\]$""")


def node_label(node: torch.fx.Node, max_len: int | None = None) -> str:
    """Readable name of ``node`` (``embeddings.LayerNorm.weight``, ``input_ids``, ``add_1``).

    A ``call_module`` node (FX graphs) is named by its module path.
    """
    if node.op in ("placeholder", "get_attr", "call_module"):
        return abbreviate(str(node.target), max_len)
    return abbreviate(node.name, max_len)


def module_stack(node: torch.fx.Node) -> list[tuple[str, str]]:
    """``[(module path, class name)]`` enclosing ``node``, outermost first.

    The model itself is not listed: its nodes are at the top level.
    """
    stack = []
    for path, mtype in (node.meta.get("nn_module_stack") or {}).values():
        # Dynamo's outermost entry is the compiled model itself (L['self']).
        user = "" if _BARE_ROOT.match(str(path)) else user_path(abbreviate(path, max_len=None))
        if user and (not stack or stack[-1][0] != user):  # a compiled method's module repeats its holder's
            stack.append((user, getattr(mtype, "__name__", str(mtype).rsplit(".", 1)[-1])))
    if node.op == "call_module":
        path = str(node.target)
        if not stack or stack[-1][0] != path:
            stack.append((path, type(node.graph.owning_module.get_submodule(node.target)).__name__))
    return stack


def module_path(node: torch.fx.Node) -> tuple[str, str]:
    """(module path, class name) owning ``node``; ("", "") at top level."""
    stack = module_stack(node)
    return stack[-1] if stack else ("", "")


def number_nodes(partitions: Iterable) -> dict[tuple[int, str], int]:
    """``{(partition index, node name): number}``, from 0 over the nodes of all partitions
    other than parameter and buffer inputs (:func:`weight_nodes`), which have no number."""
    numbers: dict[tuple[int, str], int] = {}
    for part in partitions:
        weights = weight_nodes(part)
        for node in part.graph_module.graph.nodes:
            if node.name not in weights:
                numbers[(part.index, node.name)] = len(numbers)
    return numbers


def weight_nodes(partition) -> set[str]:
    """Names of the nodes of ``partition`` that are parameters or buffers of the model."""
    kinds = {meta.name: meta.kind for meta in partition.inputs}
    gm = partition.graph_module
    out = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder" and kinds.get(node.name) in ("parameter", "buffer"):
            out.add(node.name)
        elif node.op == "get_attr":
            try:
                value = gm.get_parameter(node.target)
            except AttributeError:
                try:
                    value = gm.get_buffer(node.target)
                except AttributeError:
                    continue
            if isinstance(value, torch.Tensor):
                out.add(node.name)
    return out
