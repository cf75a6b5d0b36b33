"""Graph capture: every FX graph Dynamo makes for one model call.

``capture_graphs`` compiles the model on example inputs, runs it once and
returns each graph partition with its example inputs and op counts, plus the
graph breaks (reason, location). All contact with the compile machinery goes
through :func:`_compile_and_run`, which uses the project's tracing backend
(``create_backend(on_graph=...)``) and ``compile_events``: one capture
mechanism for tracing and for these tools.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from typing import Any, Callable, Optional

import torch
import torch.fx

__all__ = ["InputMeta", "GraphPartition", "GraphBreak", "CaptureResult", "capture_graphs", "make_partition",
           "snapshot", "target_name"]

CALL_OPS = ("call_function", "call_method", "call_module")


@dataclasses.dataclass(frozen=True)
class InputMeta:
    """What one example input of a partition looked like."""

    name: str
    kind: str  # "tensor", "parameter", "buffer" or the Python type name (SymInt, int...)
    shape: Optional[tuple] = None
    dtype: Optional[str] = None
    device: Optional[str] = None
    value: Any = None  # for ints / floats / bools

    @property
    def type_text(self) -> str:
        if self.shape is None:
            return f"{self.kind} = {self.value!r}"
        return f"{self.kind} {self.dtype}{list(self.shape)} on {self.device}"

    def describe(self) -> str:
        return f"{self.name}: {self.type_text}"


@dataclasses.dataclass
class GraphPartition:
    """One graph Dynamo compiled: the FX GraphModule and what it ran on."""

    index: int
    graph_module: torch.fx.GraphModule
    example_inputs: list
    inputs: list[InputMeta]
    ops_by_kind: dict[str, int]
    ops_by_target: dict[str, int]
    # Why Dynamo ended this graph ("return_value" when it simply returned).
    compile_reason: Optional[str] = None

    @property
    def num_ops(self) -> int:
        """Call nodes (call_function, call_method, call_module)."""
        return sum(self.ops_by_kind.get(op, 0) for op in CALL_OPS)

    @property
    def code(self) -> str:
        """The Python code FX generated for the graph."""
        return self.graph_module.code


@dataclasses.dataclass(frozen=True)
class GraphBreak:
    """A point where Dynamo stopped the graph and fell back to Python."""

    reason: str
    location: Optional[str] = None  # "file:line" of the user code

    @property
    def short_reason(self) -> str:
        return self.reason.strip().splitlines()[0] if self.reason.strip() else ""


@dataclasses.dataclass
class CaptureResult:
    partitions: list[GraphPartition]
    graph_breaks: list[GraphBreak]
    output: Any = None

    @property
    def graph_count(self) -> int:
        """Number of graph partitions."""
        return len(self.partitions)

    @property
    def break_count(self) -> int:
        """Number of graph breaks (can exceed graph_count - 1: some breaks leave no graph)."""
        return len(self.graph_breaks)

    def ops_by_target(self) -> dict[str, int]:
        """Call counts per target over all partitions, most frequent first."""
        total: collections.Counter = collections.Counter()
        for part in self.partitions:
            total.update(part.ops_by_target)
        return dict(total.most_common())

    def summary(self) -> str:
        """A few lines: graph and break counts, ops per graph, each break's reason."""
        lines = [f"graphs: {self.graph_count}  graph breaks: {self.break_count}"]
        for part in self.partitions:
            kinds = ", ".join(f"{k}={v}" for k, v in sorted(part.ops_by_kind.items()))
            lines.append(f"  graph {part.index}: {part.num_ops} ops ({kinds})")
        for i, brk in enumerate(self.graph_breaks, 1):
            where = f" at {brk.location}" if brk.location else ""
            lines.append(f"  break {i}{where}: {brk.short_reason}")
        return "\n".join(lines)


def target_name(node: torch.fx.Node) -> str:
    """Stable readable name of what a node calls (``torch.relu``, ``Tensor.view``)."""
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_module":
        gm = node.graph.owning_module
        mod = gm.get_submodule(node.target) if gm is not None else None
        return type(mod).__name__ if mod is not None else str(node.target)
    target = node.target
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)
    if "<locals>" in name:  # made by a factory (F.max_pool2d is boolean_dispatch.<locals>.fn)
        name = _public_name(target, module) or name
    if module.startswith("torch._C._nn"):
        module = "torch.nn.functional"
    elif module.startswith("torch._C") or not module or name.startswith("_VariableFunctionsClass."):
        # torch's C functions: qualname is _VariableFunctionsClass.matmul
        module, name = "torch", getattr(target, "__name__", name)
    elif module == "_operator":
        module = "operator"
    return f"{module}.{name}" if module else name


def _public_name(target, module: str) -> str | None:
    """The name under which ``module`` exports ``target``, the one users called."""
    owner = sys.modules.get(module)
    for name, value in (vars(owner).items() if owner is not None else ()):
        if value is target and not name.startswith("_"):
            return name
    return None


def _input_meta(node: torch.fx.Node, value: Any) -> InputMeta:
    if isinstance(value, torch.Tensor):
        kind = "parameter" if isinstance(value, torch.nn.Parameter) else "tensor"
        if kind == "tensor" and "_buffers_" in node.name:
            kind = "buffer"
        return InputMeta(node.name, kind, tuple(value.shape), str(value.dtype).replace("torch.", ""), str(value.device))
    plain = value if isinstance(value, (int, float, bool)) else None
    if isinstance(value, torch.SymInt):
        plain = value.node.hint if hasattr(value.node, "hint") else None
    return InputMeta(node.name, type(value).__name__, value=plain)


def make_partition(index: int, gm: torch.fx.GraphModule, example_inputs: list) -> GraphPartition:
    """Describe one captured graph (also used for FX symbolic_trace graphs)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = [_input_meta(n, v) for n, v in zip(placeholders, example_inputs)]
    kinds = collections.Counter(n.op for n in gm.graph.nodes)
    targets = collections.Counter(target_name(n) for n in gm.graph.nodes if n.op in CALL_OPS)
    reason = getattr(gm, "compile_subgraph_reason", None)
    return GraphPartition(
        index=index,
        graph_module=gm,
        example_inputs=list(example_inputs),
        inputs=inputs,
        ops_by_kind=dict(kinds),
        ops_by_target=dict(targets.most_common()),
        compile_reason=getattr(reason, "reason", None),
    )


def snapshot(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` with its own graph (the tracing backend rewrites graphs in place)."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    graph._codegen = gm.graph._codegen
    copy = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    copy.meta = dict(gm.meta)
    if hasattr(gm, "compile_subgraph_reason"):
        copy.compile_subgraph_reason = gm.compile_subgraph_reason
    return copy


def _compile_and_run(model: Callable, args: tuple, kwargs: dict,
                     on_graph: Callable[[torch.fx.GraphModule, list], None]) -> tuple[Any, list[GraphBreak]]:
    """Compile ``model`` with the tracing backend, run it once, return output and breaks.

    The backend hands over each Dynamo graph before instrumenting it;
    ``compile_events`` reports every graph break, including those after
    which Dynamo made no graph.
    """
    import torch._dynamo

    from .. import backend as tracer
    from ..backend import compile_events

    def keep(gm: torch.fx.GraphModule, example_inputs: list, info: dict) -> None:
        if info.get("stage") == "dynamo":
            on_graph(snapshot(gm), list(example_inputs))

    compiler = tracer.create_backend(level="torch", on_graph=keep)
    torch._dynamo.reset()
    try:
        # RNN, GRU and LSTM layers into the graphs: torch.compile runs them eagerly after a break
        with compile_events.collect() as records, torch._dynamo.config.patch(allow_rnn=True):
            output = torch.compile(model, backend=compiler)(*args, **kwargs)
    finally:
        # Cached code holds the captured graphs and the model: drop it.
        torch._dynamo.reset()
    breaks = [GraphBreak(r.get("reason", ""), r.get("location")) for r in records if r["kind"] == "graph_break"]
    return output, breaks


def capture_graphs(model: Callable, args: tuple = (), kwargs: Optional[dict] = None) -> CaptureResult:
    """Compile ``model`` on ``args``/``kwargs`` and return every graph partition.

    Resets Dynamo's caches before and after (like ``torch._dynamo.explain``),
    so already compiled functions in the process compile again on next call.
    """
    partitions: list[GraphPartition] = []

    def on_graph(gm: torch.fx.GraphModule, example_inputs: list) -> None:
        partitions.append(make_partition(len(partitions), gm, example_inputs))

    output, breaks = _compile_and_run(model, tuple(args), dict(kwargs or {}), on_graph)
    return CaptureResult(partitions=partitions, graph_breaks=breaks, output=output)
