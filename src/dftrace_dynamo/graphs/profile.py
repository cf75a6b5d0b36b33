"""Per-node cost model of traced graphs (seed 004) plus measured op times.

Every call node of every partition is run once through an FX interpreter:
FLOPs come from ``torch.utils.flop_counter`` (matmul-like ops only, so
MACs = FLOPs / 2), bytes read are the node's tensor inputs (parameters
included), bytes written its outputs. Outputs that alias an input (views)
move no data. Arithmetic intensity (AI) = FLOPs / bytes; a node is
compute-bound when its AI exceeds the machine balance (peak FLOP/s over
memory bandwidth), memory-bound otherwise, and "none" when it moves nothing.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Optional

import torch
import torch.fx
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from ..naming import abbreviate
from .capture import CALL_OPS, GraphBreak, GraphPartition, target_name

__all__ = ["DEFAULT_BALANCE", "NodeProfile", "ModelProfile", "machine_balance", "profile_partitions",
           "profile_traced", "profile_model", "module_path", "module_stack"]

# Seed 004's threshold between memory- and compute-bound, in FLOPs/byte.
DEFAULT_BALANCE = 10.0



def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# flop_counter has formulas for the CUDA attention kernels but not the CPU one.
_EXTRA_FLOPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops}

_BARE_ROOT = re.compile(r"""^[LG]\[(['"])[^'"]+\1\]$""")


def machine_balance(peak_flops: Optional[float] = None, mem_bw: Optional[float] = None,
                    balance: Optional[float] = None) -> float:
    """FLOPs/byte at which a kernel stops being memory-bound."""
    if balance is not None and (peak_flops or mem_bw):
        raise ValueError("give either the balance or --peak-flops with --mem-bw, not both")
    if (peak_flops is None) != (mem_bw is None):
        raise ValueError("--peak-flops and --mem-bw go together")
    for name, value in (("balance", balance), ("peak FLOP/s", peak_flops), ("memory bandwidth", mem_bw)):
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be positive")
    if peak_flops is not None:
        return peak_flops / mem_bw
    return DEFAULT_BALANCE if balance is None else balance


@dataclasses.dataclass
class NodeProfile:
    index: int  # 1-based position over all partitions (explorer numbering)
    graph: int
    name: str  # FX node name
    op: str  # FX opcode
    target: str
    module: str  # readable module path, "" for the top-level module
    module_type: str
    params: int  # parameters first used by this node
    shape: str
    flops: int
    bytes_read: int
    bytes_written: int
    bottleneck: str = "none"
    time_ns: Optional[float] = None  # median measured time of one execution
    calls: int = 0  # measured executions

    @property
    def macs(self) -> int:
        """Multiply-accumulates: FLOPs / 2 (flop_counter counts products only)."""
        return self.flops // 2

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte moved (0 when nothing moves)."""
        return self.flops / self.bytes if self.bytes else 0.0

    @property
    def label(self) -> str:
        return abbreviate(self.name, max_len=None)

    @property
    def achieved_flops(self) -> Optional[float]:
        """FLOP/s of the measured run (None without a measurement)."""
        if not self.time_ns:
            return None
        return self.flops / (self.time_ns * 1e-9)

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(macs=self.macs, intensity=self.intensity, achieved_flops=self.achieved_flops)
        return out


@dataclasses.dataclass
class ModelProfile:
    model: str
    method: str
    fx_error: Optional[str]
    nodes: list[NodeProfile]
    graph_breaks: list[GraphBreak]
    graph_count: int
    balance: float
    input_bytes: int
    output_bytes: int
    weight_bytes: int
    peak_flops: Optional[float] = None
    mem_bw: Optional[float] = None
    timing: Optional[str] = None  # how op times were measured, None when they were not
    timing_error: Optional[str] = None  # why they were not
    module_types: dict = dataclasses.field(default_factory=dict)  # module path -> class name

    @property
    def total_params(self) -> int:
        return sum(n.params for n in self.nodes)

    @property
    def total_flops(self) -> int:
        return sum(n.flops for n in self.nodes)

    @property
    def total_bytes(self) -> int:
        return sum(n.bytes for n in self.nodes)

    @property
    def activation_bytes(self) -> int:
        return sum(n.bytes_written for n in self.nodes)

    @property
    def intensity(self) -> float:
        return self.total_flops / self.total_bytes if self.total_bytes else 0.0

    @property
    def total_time_ns(self) -> Optional[float]:
        times = [n.time_ns for n in self.nodes if n.time_ns is not None]
        return sum(times) if times else None

    def bottlenecks(self) -> dict[str, dict]:
        """Count, FLOPs and measured time per bottleneck class."""
        out: dict[str, dict] = {}
        for cls in ("compute", "memory", "none"):
            members = [n for n in self.nodes if n.bottleneck == cls]
            times = [n.time_ns for n in members if n.time_ns is not None]
            out[cls] = {"nodes": len(members), "flops": sum(n.flops for n in members),
                        "time_ns": sum(times) if times else None}
        return out

    def summary(self) -> dict:
        """Totals, memory breakdown, graphs and breaks, timing and bottlenecks (the JSON ``summary``)."""
        total_time = self.total_time_ns
        return {
            "model": self.model,
            "method": self.method,
            "fx_error": self.fx_error,
            "graphs": self.graph_count,
            "graph_breaks": [dataclasses.asdict(b) for b in self.graph_breaks],
            "nodes": len(self.nodes),
            "params": self.total_params,
            "macs": self.total_flops // 2,
            "flops": self.total_flops,
            "memory": {"inputs": self.input_bytes, "outputs": self.output_bytes, "weights": self.weight_bytes,
                       "activations": self.activation_bytes, "traffic": self.total_bytes},
            "intensity": self.intensity,
            "balance": self.balance,
            "peak_flops": self.peak_flops,
            "mem_bw": self.mem_bw,
            "timing": self.timing,
            "timing_error": self.timing_error,
            "time_ns": total_time,
            "achieved_flops": self.total_flops / (total_time * 1e-9) if total_time else None,
            "bottlenecks": self.bottlenecks(),
        }


def module_stack(node: torch.fx.Node) -> list[tuple[str, str]]:
    """``[(readable module path, class name)]`` enclosing ``node``, outermost first.

    The model itself is not listed: its nodes are at the top level.
    """
    stack = []
    for path, mtype in (node.meta.get("nn_module_stack") or {}).values():
        # Dynamo's outermost entry is the compiled model itself (L['self']).
        if not _BARE_ROOT.match(str(path)):
            stack.append((abbreviate(path, max_len=None), getattr(mtype, "__name__", str(mtype).rsplit(".", 1)[-1])))
    if node.op == "call_module":
        path = abbreviate(node.target, max_len=None)
        if not stack or stack[-1][0] != path:
            stack.append((path, type(node.graph.owning_module.get_submodule(node.target)).__name__))
    return stack


def module_path(node: torch.fx.Node) -> tuple[str, str]:
    """(readable module path, class name) owning ``node``; ("", "") at top level."""
    stack = module_stack(node)
    return stack[-1] if stack else ("", "")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _storage(t: torch.Tensor) -> Optional[int]:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensor subclasses without storage
        return None


def _shape(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "x".join(str(d) for d in value.shape) or "scalar"
    leaves = [v for v in tree_leaves(value) if isinstance(v, torch.Tensor)]
    if isinstance(value, (tuple, list)) and leaves:
        return "(" + ", ".join(_shape(v) for v in leaves) + ")"
    return type(value).__name__ if value is not None else ""


def _in_place(node: torch.fx.Node) -> bool:
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


class _Meter(torch.fx.Interpreter):
    """Runs a graph once and measures every call node."""

    def __init__(self, gm: torch.fx.GraphModule, graph: int, start: int, seen: set):
        super().__init__(gm)
        self.graph_index, self.index, self.seen = graph, start, seen
        self.rows: list[NodeProfile] = []
        self.module_types: dict[str, str] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op not in CALL_OPS:
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        inputs = [v for v in tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
        if n.op == "call_module":
            mod = self.module.get_submodule(n.target)
            inputs += list(mod.parameters()) + list(mod.buffers())
        with FlopCounterMode(display=False, custom_mapping=_EXTRA_FLOPS) as counter:
            out = super().run_node(n)
        flops = counter.get_total_flops()
        params = 0
        for t in inputs:
            if isinstance(t, torch.nn.Parameter) and id(t) not in self.seen:
                self.seen.add(id(t))
                params += t.numel()
        unique = {id(t): t for t in inputs}.values()
        in_storages = {_storage(t) for t in unique}
        fresh = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and _storage(t) not in in_storages]
        written = sum(_nbytes(t) for t in {id(t): t for t in fresh}.values())
        # A pure view reads nothing either; in-place ops alias but do move data.
        read = sum(_nbytes(t) for t in unique) if (fresh or flops or _in_place(n)) else 0
        if _in_place(n) and not fresh:
            written = sum(_nbytes(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        stack = module_stack(n)
        self.module_types.update(stack)
        module, mtype = stack[-1] if stack else ("", "")
        self.index += 1
        self.rows.append(NodeProfile(
            index=self.index, graph=self.graph_index, name=n.name, op=n.op, target=target_name(n),
            module=module, module_type=mtype, params=params, shape=_shape(out), flops=int(flops),
            bytes_read=read, bytes_written=written))
        return out


def _classify(node: NodeProfile, balance: float) -> str:
    if not node.bytes:
        return "none"
    return "compute" if node.intensity > balance else "memory"


def profile_partitions(partitions: list[GraphPartition], *, model: str = "model", method: str = "dynamo",
                       fx_error: Optional[str] = None, graph_breaks: Optional[list] = None,
                       model_inputs: Any = None, model_output: Any = None, weights: Any = None,
                       balance: float = DEFAULT_BALANCE, peak_flops: Optional[float] = None,
                       mem_bw: Optional[float] = None) -> ModelProfile:
    """Profile every node of ``partitions`` (each run on its example inputs).

    ``weights`` (parameters and buffers of the model) gives the weight memory;
    ``model_inputs`` / ``model_output`` the input / output memory.
    """
    seen: set = set()
    nodes: list[NodeProfile] = []
    module_types: dict[str, str] = {}
    with torch.no_grad():
        for part in partitions:
            meter = _Meter(part.graph_module, part.index, len(nodes), seen)
            meter.run(*part.example_inputs)
            nodes.extend(meter.rows)
            module_types.update(meter.module_types)
    for node in nodes:
        node.bottleneck = _classify(node, balance)

    def tensor_bytes(value: Any) -> int:
        unique = {id(t): t for t in tree_leaves(value) if isinstance(t, torch.Tensor)}
        return sum(_nbytes(t) for t in unique.values())

    return ModelProfile(
        model=model, method=method, fx_error=fx_error, nodes=nodes, graph_breaks=list(graph_breaks or []),
        graph_count=len(partitions), balance=balance, input_bytes=tensor_bytes(model_inputs),
        output_bytes=tensor_bytes(model_output), weight_bytes=tensor_bytes(weights),
        peak_flops=peak_flops, mem_bw=mem_bw, module_types=module_types)


def profile_traced(traced, model: torch.nn.Module, args: tuple = (), kwargs: Optional[dict] = None, *,
                   name: str = "model", peak_flops: Optional[float] = None, mem_bw: Optional[float] = None,
                   balance: Optional[float] = None, runs: int = 5) -> ModelProfile:
    """Profile a :class:`~.hybrid.TracedModel` of ``model``; ``runs`` > 0 also times the ops with the tracer.

    When op times cannot be measured (tracing off, or a trace already open)
    the profile has no times and ``timing_error`` says why.
    """
    from .timing import TimingError, measure_op_times

    balance = machine_balance(peak_flops, mem_bw, balance)
    weights = list(model.parameters()) + list(model.buffers())
    profile = profile_partitions(
        traced.partitions, model=name, method=traced.method, fx_error=traced.fx_error,
        graph_breaks=traced.graph_breaks, model_inputs=(args, kwargs), model_output=traced.output,
        weights=weights, balance=balance, peak_flops=peak_flops, mem_bw=mem_bw)
    if runs > 0:
        try:
            times = measure_op_times(traced.partitions, runs=runs)
        except TimingError as exc:
            profile.timing_error = str(exc)
        else:
            for node in profile.nodes:
                node.time_ns, node.calls = times.get((node.graph, node.name), (None, 0))
            profile.timing = f"tracer, median of {runs} run(s)"
    return profile


def profile_model(model: torch.nn.Module, args: tuple = (), kwargs: Optional[dict] = None, *,
                  method: str = "auto", **options) -> ModelProfile:
    """Hybrid-trace ``model`` on ``args``/``kwargs`` and profile it (options: see :func:`profile_traced`)."""
    from .hybrid import trace_hybrid

    traced = trace_hybrid(model, args, kwargs, method=method)
    return profile_traced(traced, model, args, kwargs, **options)
