"""Export a graph partition as standalone, importable Python code.

The file holds one ``torch.nn.Module`` subclass whose ``forward`` is the code
FX generated for the graph, the imports that code needs, and
``example_inputs()``. Attributes the graph reads (``get_attr`` /
``call_module``: constants, submodules) go to a ``.pt`` file next to it;
Dynamo passes parameters as inputs, so most partitions need none.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys
import textwrap
import types
from typing import Any, Optional

import torch
import torch.fx

from .capture import CaptureResult, GraphPartition, InputMeta

__all__ = ["ExportError", "partition_source", "export_partition", "export_capture", "load_exported"]


class ExportError(RuntimeError):
    """The graph uses something that cannot be named from a standalone file."""


def _import_line(name: str, obj: Any) -> str:
    if isinstance(obj, types.ModuleType):
        return f"import {obj.__name__} as {name}" if obj.__name__ != name else f"import {name}"
    if isinstance(obj, float) and (math.isinf(obj) or math.isnan(obj)):
        return f"{name} = float({str(obj)!r})"
    if obj is type(None):
        return f"{name} = type(None)"
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not module or not qualname or "<" in qualname:
        raise ExportError(f"graph global {name}={obj!r} has no importable name")
    if "." not in qualname:
        return f"from {module} import {qualname}" + (f" as {name}" if name != qualname else "")
    head, _, rest = qualname.partition(".")
    return f"from {module} import {head} as _{name}_owner\n{name} = _{name}_owner.{rest}"


def _one_line(text: str) -> str:
    """``text`` escaped as in a string literal: one line, no NUL, safe in a comment."""
    return repr(str(text))[1:-1]


def _docstring_text(text: str) -> str:
    """``text`` escaped for use between triple double quotes."""
    return _one_line(text).replace('"', '\\"')


def _attr_roots(gm: torch.fx.GraphModule) -> list[str]:
    """Top-level attribute names the graph reads through get_attr / call_module."""
    roots = []
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            root = str(node.target).split(".")[0]
            if root not in roots:
                roots.append(root)
    return roots


def _input_expr(meta: InputMeta) -> str:
    if meta.shape is None:
        return repr(meta.value)
    dtype = getattr(torch, meta.dtype)
    maker = "torch.randn" if dtype.is_floating_point or dtype.is_complex else "torch.zeros"
    return f"{maker}({list(meta.shape)}, dtype=torch.{meta.dtype})"


def partition_source(partition: GraphPartition, class_name: Optional[str] = None,
                     attrs_file: Optional[str] = None, title: str = "model") -> str:
    """Python source for ``partition``; ``attrs_file`` names the sidecar, if any."""
    gm = partition.graph_module
    class_name = class_name or f"Partition{partition.index}"
    code = gm.graph.python_code(root_module="self")
    imports = ["import pathlib", "import torch"]
    imports += [_import_line(name, obj) for name, obj in sorted(code.globals.items()) if name != "torch"]
    roots = _attr_roots(gm)
    if roots and not attrs_file:
        raise ExportError("the graph reads attributes: an attrs_file is needed")

    inputs = "\n".join(f"#   {_one_line(m.describe())}" for m in partition.inputs) or "#   (none)"
    lines = [
        f'"""Graph partition {partition.index} of {_docstring_text(title)}, exported by dftrace_dynamo '
        f'(torch {torch.__version__})."""',
        "# Inputs when captured:",
        inputs,
    ]
    if partition.compile_reason:
        reason = partition.compile_reason.strip().splitlines()[0]
        lines.append(f"# Graph ended because: {_one_line(reason)}")
    lines += ["", *imports, "", "", f"class {class_name}(torch.nn.Module):", "    def __init__(self):",
              "        super().__init__()"]
    if roots:
        lines += [
            f"        attrs = torch.load(pathlib.Path(__file__).with_name({attrs_file!r}), weights_only=False)",
            "        for name, value in attrs.items():",
            "            setattr(self, name, value)",
        ]
    lines.append(textwrap.indent(code.src.strip("\n"), "    "))
    example = ",\n        ".join(_input_expr(m) for m in partition.inputs)
    lines += [
        "",
        "",
        "def example_inputs():",
        "    # Random values with the captured shapes and dtypes.",
        f"    return [\n        {example},\n    ]" if example else "    return []",
        "",
        "",
        'if __name__ == "__main__":',
        f"    out = {class_name}()(*example_inputs())",
        "    print(torch.utils._pytree.tree_map(lambda t: tuple(t.shape) if isinstance(t, torch.Tensor) else t, out))",
        "",
    ]
    return "\n".join(lines)


def export_partition(partition: GraphPartition, path, title: str = "model") -> pathlib.Path:
    """Write ``partition`` to ``path`` (.py) and, if needed, ``<stem>.attrs.pt``."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    gm = partition.graph_module
    roots = _attr_roots(gm)
    attrs_file = f"{path.stem}.attrs.pt" if roots else None
    source = partition_source(partition, attrs_file=attrs_file, title=title)
    if attrs_file:
        torch.save({root: getattr(gm, root) for root in roots}, path.with_name(attrs_file))
    path.write_text(source)
    return path


def export_capture(result: CaptureResult, directory, stem: str = "graph", title: str = "model") -> list[pathlib.Path]:
    """Export every partition of a capture as ``<stem>_<index>.py``."""
    directory = pathlib.Path(directory)
    return [export_partition(p, directory / f"{stem}_{p.index}.py", title=title) for p in result.partitions]


def load_exported(path) -> types.ModuleType:
    """Import an exported file as a module (its directory need not be on sys.path)."""
    path = pathlib.Path(path)
    name = f"dftrace_dynamo_exported_{path.stem}_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
