"""Per-node cost model of traced graphs plus measured op times.

Every call node of every partition is run once through an FX interpreter:
FLOPs come from ``torch.utils.flop_counter`` (matmul-like ops only, so
MACs = FLOPs / 2); bytes read are the node's tensor inputs (parameters
included), bytes written its new outputs plus the inputs it modifies in
place (``x += y``, ``relu_``, ``ReLU(inplace=True)``: found by their
version counters, the same way on FX and Dynamo graphs). Views move no data.
Embedding lookups read the gathered rows and the indices, not the whole
table. Arithmetic intensity (AI) = FLOPs / bytes; a node is compute-bound
when its AI exceeds the machine balance (peak FLOP/s over memory
bandwidth), memory-bound otherwise, and "none" when it moves nothing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import torch
import torch.fx
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from .balance import DEFAULT_BALANCE, machine_balance
from .capture import CALL_OPS, GraphBreak, GraphPartition, target_name
from .names import module_stack, node_label, number_nodes

__all__ = ["DEFAULT_BALANCE", "NodeProfile", "ModelProfile", "machine_balance", "profile_partitions",
           "profile_traced", "profile_model", "tensors_in"]

# Timing warnings: the runs of ops holding a quarter of the time differ by more
# than SPREAD_WARN times their median; or the op medians add up to more than the
# whole graph took (they run inside it), or to less than half of it beyond the
# tracer's own cost per op (OP_OVERHEAD_NS).
SPREAD_WARN = 1.0
OP_OVERHEAD_NS = 20_000.0


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_rnn_flops(input_shape, weight_ih_shape, weight_hh_shape, *args, **kwargs) -> int:
    """One layer and direction of the oneDNN RNN that runs ``nn.LSTM`` on CPU: its gate GEMMs,
    counted as ``aten.mm`` counts them (GRU and RNN run as addmm/mm, counted already)."""
    return 2 * math.prod(input_shape[:-1]) * (math.prod(weight_ih_shape) + math.prod(weight_hh_shape))


# flop_counter has formulas for the CUDA attention kernels but not the CPU one, and none for the
# CPU LSTM kernel.
_EXTRA_FLOPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops,
                torch.ops.aten.mkldnn_rnn_layer: _cpu_rnn_flops}
_EMBEDDING_FUNCTIONS = {torch.nn.functional.embedding, torch.embedding}


@dataclasses.dataclass
class NodeProfile:
    index: int  # node number, shared with the explorer (see names.number_nodes)
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
    time_spread: Optional[float] = None  # (max - min) / median of the measured executions

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

    label: str = ""  # readable name (names.node_label)

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
    graph_time_ns: Optional[float] = None  # measured time of one run of all graphs (median)
    timing_warnings: list = dataclasses.field(default_factory=list)
    model_params: Optional[int] = None  # the model's parameters, used by the graphs or not

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
            "model_params": self.model_params,
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
            "timing_warnings": list(self.timing_warnings),
            "time_ns": total_time,
            "graph_time_ns": self.graph_time_ns,
            "achieved_flops": self.total_flops / (total_time * 1e-9) if total_time else None,
            "bottlenecks": self.bottlenecks(),
        }


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


def tensors_in(value: Any, _depth: int = 0) -> list:
    """Every tensor in ``value``, also inside objects such as transformers' KV caches."""
    found = []
    for leaf in tree_leaves(value):
        if isinstance(leaf, torch.Tensor):
            found.append(leaf)
        elif _depth < 4 and hasattr(leaf, "__dict__") and not isinstance(leaf, (torch.nn.Module, type)):
            found += tensors_in(list(vars(leaf).values()), _depth + 1)
    return found


def _unique(tensors) -> list:
    return list({id(t): t for t in tensors}.values())


def _versions(tensors) -> list:
    out = []
    for t in tensors:
        try:
            out.append(t._version)
        except (RuntimeError, AttributeError):  # inference tensors have no version counter
            out.append(None)
    return out


def _embedding_indices(n: torch.fx.Node, module: Optional[torch.nn.Module], args: tuple) -> Optional[torch.Tensor]:
    """The index tensor of an embedding lookup, None for any other node."""
    if isinstance(module, torch.nn.Embedding) or (n.op == "call_function" and n.target in _EMBEDDING_FUNCTIONS):
        index = args[0] if n.target is not torch.embedding else args[1]
        return index if isinstance(index, torch.Tensor) else None
    return None


class _Meter(torch.fx.Interpreter):
    """Runs a graph once and measures every call node."""

    def __init__(self, part: GraphPartition, numbers: dict, seen: set):
        super().__init__(part.graph_module)
        self.graph_index, self.numbers, self.seen = part.index, numbers, seen
        self.rows: list[NodeProfile] = []
        self.module_types: dict[str, str] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op not in CALL_OPS:
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        inputs = [v for v in tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
        module = self.module.get_submodule(n.target) if n.op == "call_module" else None
        if module is not None:
            inputs += list(module.parameters()) + list(module.buffers())
        inputs = _unique(inputs)
        before = _versions(inputs)
        with FlopCounterMode(display=False, custom_mapping=_EXTRA_FLOPS) as counter:
            out = super().run_node(n)
        flops = counter.get_total_flops()
        params = 0
        for t in inputs:
            if isinstance(t, torch.nn.Parameter) and id(t) not in self.seen:
                self.seen.add(id(t))
                params += t.numel()
        mutated = [t for t, v0, v1 in zip(inputs, before, _versions(inputs)) if v0 is not None and v1 != v0]
        in_storages = {_storage(t) for t in inputs}
        fresh = _unique(t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and _storage(t) not in in_storages)
        written = sum(_nbytes(t) for t in fresh) + sum(_nbytes(t) for t in mutated)
        indices = _embedding_indices(n, module, args)
        if indices is not None:  # the rows gathered (= the output) and the indices
            read = written + _nbytes(indices)
        elif fresh or mutated or flops:
            read = sum(_nbytes(t) for t in inputs)
        else:  # a view: reads nothing either
            read = 0
        stack = module_stack(n)
        self.module_types.update(stack)
        mpath, mtype = stack[-1] if stack else ("", "")
        self.rows.append(NodeProfile(
            index=self.numbers[(self.graph_index, n.name)], graph=self.graph_index, name=n.name, op=n.op,
            target=target_name(n), module=mpath, module_type=mtype, params=params, shape=_shape(out),
            flops=int(flops), bytes_read=read, bytes_written=written, label=node_label(n)))
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
    numbers = number_nodes(partitions)
    with torch.no_grad():
        for part in partitions:
            meter = _Meter(part, numbers, seen)
            meter.run(*part.example_inputs)
            nodes.extend(meter.rows)
            module_types.update(meter.module_types)
    for node in nodes:
        node.bottleneck = _classify(node, balance)

    def tensor_bytes(value: Any) -> int:
        return sum(_nbytes(t) for t in _unique(tensors_in(value)))

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
    profile.model_params = sum(p.numel() for p in model.parameters())
    if runs > 0:
        try:
            times = measure_op_times(traced.partitions, runs=runs)
        except TimingError as exc:
            profile.timing_error = str(exc)
        else:
            for node in profile.nodes:
                measured = times.ops.get((node.graph, node.name))
                if measured is not None:
                    node.time_ns, node.calls, node.time_spread = measured.median_ns, measured.calls, measured.spread
            profile.timing = f"tracer, median of {runs} run(s)"
            profile.graph_time_ns = times.graph_median_ns or None
            profile.timing_warnings = _timing_warnings(profile)
    return profile


def _timing_warnings(profile: ModelProfile) -> list[str]:
    """Why the measured times may not be trusted: noisy runs, or ops that do not add up to the graph."""
    warnings = []
    timed = [n for n in profile.nodes if n.time_ns]
    total = sum(n.time_ns for n in timed)
    if total:
        noisy = sum(n.time_ns for n in timed if n.time_spread is not None and n.time_spread > SPREAD_WARN)
        if noisy > 0.25 * total:
            warnings.append(f"op times are noisy: ops holding {100 * noisy / total:.0f}% of the time vary by more "
                            f"than {SPREAD_WARN:.0%} of their median between runs (a busy machine?); "
                            "use more --runs or a quiet machine")
    graph = profile.graph_time_ns
    if total and graph and (total > 1.1 * graph or graph - total > max(0.5 * graph, OP_OVERHEAD_NS * len(timed))):
        warnings.append(f"the op times add up to {total / 1e6:.2f} ms but a whole run of the graph(s) took "
                        f"{graph / 1e6:.2f} ms (median); per-op times are unreliable on this run")
    return warnings


def profile_model(model: torch.nn.Module, args: tuple = (), kwargs: Optional[dict] = None, *,
                  method: str = "auto", **options) -> ModelProfile:
    """Hybrid-trace ``model`` on ``args``/``kwargs`` and profile it (options: see :func:`profile_traced`)."""
    from .hybrid import trace_hybrid

    traced = trace_hybrid(model, args, kwargs, method=method)
    return profile_traced(traced, model, args, kwargs, **options)
