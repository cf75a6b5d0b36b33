"""Kernel-level tracing of Inductor-compiled graphs (``level="inductor"``).

The graph is compiled by Inductor (``compile_fx``) with our ``inner_compile``,
which sees every forward, backward and inference graph Inductor compiles,
whether its code was generated now or loaded from the FX graph cache. The
generated module is never modified: each compiled graph gets its own copy of
the module's ``call`` function (and of the functions ``call`` runs for
``torch.cond`` branches), compiled from the same source with every kernel
call site's callee replaced by a name bound, in that copy's own globals, to a
``_core.Interceptor`` (one per call site). So the kernels run unchanged, the hot
path is the C interceptor, and two graphs sharing one generated module (same
code, same cache key) keep separate interceptors.

Provenance comes from torch's provenance tracking, switched on for our compiles
(``trace.provenance_tracking_level=1``, part of Inductor's cache key): the
generated code marks each kernel call with ``# [Provenance debug handles]
<kernel>:<handle>`` and the compiled graph carries ``cppCodeToPost`` (handle ->
post-grad FX nodes) in ``inductor_provenance_mapping_str``; both are stored in
the FX graph cache, so a graph loaded from it is traced like a fresh one. The
nodes' ``original_aten``, ``from_node`` and module stack give the event args.
"""

from __future__ import annotations

import ast
import contextlib
import json
import operator
import re
import types
from typing import Any, Callable, Optional

import torch

from .. import _core
from ..schema import (ARG_ATEN_OPS, ARG_BYTES, ARG_FLOPS, ARG_GRAPH, ARG_KERNEL_TYPE, ARG_LEVEL, ARG_MODULE, CAT_KERNEL,
                      PHASE_BACKWARD, PHASE_FORWARD, PHASE_INFERENCE)
from ..events import cuda as cuda_events
from ..session import config
from . import modules, sites

_HANDLE = re.compile(r"#\s*\[Provenance debug handles\]\s*(\S+):(\d+)\s*$")


def _nodes_by_name(gm: torch.fx.GraphModule) -> dict:
    return {n.name: n for n in gm.graph.nodes if n.op == "call_function"}


def module_stacks(gm: torch.fx.GraphModule) -> dict:
    """{subgraph attribute name ("" for ``gm``): {node name: module stack}}, taken before
    Inductor's post-grad passes rewrite the graphs in place."""
    graphs = {"": gm, **{n: m for n, m in gm.named_children() if isinstance(m, torch.fx.GraphModule)}}
    return {key: {n.name: sites.module_stack(n) for n in g.graph.nodes
                  if n.op == "call_function" and n.target is not operator.getitem}
            for key, g in graphs.items()}


def _aten_op(node: torch.fx.Node) -> Optional[str]:
    op = node.meta.get("original_aten")
    if isinstance(op, torch._ops.OpOverload):
        return str(op._overloadpacket)
    if isinstance(op, torch._ops.HigherOrderOperator):
        return op.name()
    return None


def _source_node(node: torch.fx.Node) -> str:
    # as Inductor's "Source Nodes" comment: the Dynamo graph node the op came from
    # (backward nodes have none and name themselves)
    origin = node.meta.get("from_node")
    return origin[0].name if origin else node.name


def kernel_args(by_name: dict, graph_id: int, kind: str, post_grad: list, with_metadata: bool,
                comment: Callable[[], tuple], before: dict) -> tuple[dict, tuple]:
    """Static args of one kernel call site from the post-grad nodes it fused (``by_name``:
    the graph's nodes by name), or, without them, from Inductor's comment (``comment()``:
    source nodes and ATen ops); and the module calls all those ops ran in (outermost
    first): the kernel's ``module`` is the innermost. Where the post-grad nodes share no
    module call (a node a post-grad pass made has no module stack), the source nodes of the
    comment name them as in ``before`` (the module stacks by node name before the passes), as
    for a graph loaded from the FX graph cache, where no pass runs."""
    nodes = [by_name[n] for n in post_grad if n in by_name]
    args: dict[str, Any] = {
        ARG_GRAPH: graph_id, ARG_KERNEL_TYPE: kind,
        ARG_ATEN_OPS: list(dict.fromkeys(op for op in map(_aten_op, nodes) if op)),
        "source_nodes": list(dict.fromkeys(map(_source_node, nodes))),
    }
    if not nodes:
        args["source_nodes"], args[ARG_ATEN_OPS] = comment()
        nodes = [by_name[n] for n in args["source_nodes"] if n in by_name]
    # getitem only picks an output of a multi-output op (and has no module stack of its own)
    stack = _common_stack([sites.module_stack(n) for n in nodes if n.target is not operator.getitem])
    if not stack and post_grad:
        stack = _common_stack([before[n] for n in comment()[0] if n in before])
    if stack and stack[-1][1]:
        args[ARG_MODULE] = stack[-1][1]
    if with_metadata and nodes:
        # upper estimates: the sum over the fused ops, as if each ran alone
        meta = [sites.metadata(n, None) for n in nodes]
        for key in (ARG_FLOPS, ARG_BYTES):
            if all(key in m for m in meta):
                args[key] = sum(m[key] for m in meta)
    return args, stack


def _common_stack(stacks: list) -> tuple:
    """The module calls that all ``stacks`` share (outermost first); ``()`` for none."""
    common = min(stacks, key=len, default=())
    for stack in stacks:
        common = common[:next((i for i, (a, b) in enumerate(zip(common, stack)) if a[0] != b[0]), len(common))]
    return common


_SITE_NAME = re.compile(r"_dft_k(\d+)$")


def _sequences(stmts: list, seq: Optional[list] = None):
    """The straight-line statement sequences of a function body, as ``[(block, stmt)]``:
    a ``with`` body runs once, in place, so it continues its enclosing sequence; the
    blocks of other compound statements (run zero or many times) are sequences of their
    own. Nested definitions are skipped."""
    top = seq is None
    seq = [] if top else seq
    for stmt in stmts:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            yield from _sequences(stmt.body, seq)
        elif isinstance(getattr(stmt, "body", None), list):
            for inner in (stmt.body, getattr(stmt, "orelse", None), getattr(stmt, "finalbody", None),
                          *(h.body for h in getattr(stmt, "handlers", ())),
                          *(c.body for c in getattr(stmt, "cases", ()))):
                if inner:
                    yield from _sequences(inner)
        else:
            seq.append((stmts, stmt))
    if top:
        yield seq


def _site_ids(stmt: ast.stmt) -> list:
    return [int(m.group(1)) for n in ast.walk(stmt) if isinstance(n, ast.Name) and (m := _SITE_NAME.match(n.id))]


def _sole_kernel_call(stmt: ast.stmt) -> Optional[int]:
    """``i`` when ``stmt`` is a call of call site ``i`` alone (``_dft_k<i>(...)``, its result
    maybe assigned) with no other call site in it: each run of the statement calls it once."""
    value = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and len(_site_ids(stmt)) == 1:
        found = _SITE_NAME.match(value.func.id)
        return int(found.group(1)) if found else None
    return None


def add_spans(call_def: ast.FunctionDef, stacks: list, graph_id: int, hooked: bool = True,
              folds: Optional[dict] = None) -> int:
    """Inserts module-slice boundary calls (``_dft_span``, see :mod:`.modules`) between the
    kernel call statements of ``call_def``: a kernel call nests in the module calls all its
    fused ops ran in (``stacks[i]``: those of call site ``i``). Each straight-line sequence
    of statements closes the slices it opened. Returns the number of module slices a call
    records when each statement runs once. ``hooked``: as in :func:`.modules.span_plan`
    (False for a backward graph). ``folds``: where given, a boundary just before a statement
    that is one kernel call alone (call site ``i``) is not inserted but put in ``folds[i]``,
    as ``(opened, closed sites)``, for that call site's interceptor (``boundary=``)."""
    inserts: dict = {}  # (block, statement, after it?) by identity -> the boundary calls there
    slices = 0
    for seq in _sequences(call_def.body):
        at = [(block, stmt, _common_stack([stacks[i] for i in ids]))
              for block, stmt in seq if (ids := _site_ids(stmt))]
        for i, opened, closed in modules.span_plan([stack for *_, stack in at], graph_id, hooked):
            block, stmt, _ = at[min(i, len(at) - 1)]
            slices += len(closed)
            kernel = _sole_kernel_call(stmt) if folds is not None and i < len(at) else None
            if kernel is not None:
                folds[kernel] = (opened, tuple(closed))
                continue
            call = ast.parse(f"_dft_span({', '.join(map(str, (opened, *closed)))})").body[0]
            inserts.setdefault((id(block), id(stmt), i == len(at)), (block, stmt, []))[2].append(call)
    for (_, _, after), (block, stmt, calls) in inserts.items():
        pos = next(p for p, s in enumerate(block) if s is stmt) + after
        block[pos:pos] = calls
    return slices


_COMMENT = re.compile(r"Source Nodes: \[(.*?)\], Original ATen: \[(.*?)\]")


def _comment_provenance(lines: list, lineno: int) -> tuple[list, list]:
    """(source nodes, ATen ops) from Inductor's comment just above a call line; used for a
    call site whose provenance handle the mapping does not list."""
    i = lineno - 2
    while i >= 0 and lines[i].lstrip().startswith("#"):
        found = _COMMENT.search(lines[i])
        if found:
            return [x for x in found.group(1).split(", ") if x], [x for x in found.group(2).split(", ") if x]
        i -= 1
    return [], []


def _kernel_kind(callee: str, target) -> tuple[str, str]:
    """(event name, kernel_type) of a call site: its callee expression and what it calls."""
    if callee.startswith("extern_kernels."):
        return callee, "extern"
    if isinstance(target, torch._ops.OpOverload):  # an ATen (or other namespace) fallback
        name = f"{target.namespace}.{target._opname}"
        return (name if target._overloadname == "default" else f"{name}.{target._overloadname}"), "fallback"
    if callee.endswith(".run"):  # Triton launcher (CachingAutotuner.run)
        return callee.removesuffix(".run"), "triton"
    return callee, "cpp" if callee.startswith("cpp_") else "extern"


def _resolve(expr: ast.expr, namespace: dict):
    if isinstance(expr, ast.Name):
        return namespace[expr.id]
    if isinstance(expr, ast.Attribute):
        return getattr(_resolve(expr.value, namespace), expr.attr)
    raise TypeError(f"unexpected callee {ast.unparse(expr)}")


def _find_call_def(tree: ast.Module) -> ast.FunctionDef:
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "call":
            return stmt
        if isinstance(stmt, ast.ClassDef) and stmt.name == "Runner":
            for item in stmt.body:
                if isinstance(item, ast.FunctionDef) and item.name == "call":
                    return item
    raise LookupError("no call function in the generated module")


class _Sites(ast.NodeTransformer):
    """Replaces the callee of each kernel call with ``_dft_k<i>`` (numbered across all the
    functions it visits); records ``(name, callee text, callee expression, function)`` per
    call site, in source order."""

    def __init__(self, kernels: set):
        self.kernels = kernels
        self.found: list = []
        self.function: Optional[ast.FunctionDef] = None

    def visit_function(self, fdef: ast.FunctionDef) -> int:
        """Visits ``fdef``; returns how many call sites it has."""
        self.function, before = fdef, len(self.found)
        self.visit(fdef)
        return len(self.found) - before

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        callee = ast.unparse(node.func)
        if callee in self.kernels or callee.removesuffix(".run") in self.kernels:
            name = f"_dft_k{len(self.found)}"
            self.found.append((name, callee, node.func, self.function))
            node.func = ast.copy_location(ast.Name(id=name, ctx=ast.Load()), node.func)
        return node


def _handles(lines: list) -> list:
    """``(line number, kernel, "<kernel>:<handle>")`` of each provenance comment."""
    return [(i, m.group(1), f"{m.group(1)}:{m.group(2)}") for i, m in enumerate(map(_HANDLE.search, lines), 1) if m]


def _handle_of(handles: list, used: set, callee: str, expr: ast.expr, fdef: ast.FunctionDef) -> Optional[str]:
    """The provenance key of a call site: the nearest unused comment above it, in its own
    function, naming its kernel (torch writes one just above each kernel call)."""
    names = (callee, callee.removesuffix(".run"))
    above = [h for h in handles if h[1] in names and h[2] not in used and fdef.lineno <= h[0] < expr.lineno]
    if not above:
        return None
    key = max(above)[2]
    used.add(key)
    return key


def instrument(compiled, gm: torch.fx.GraphModule, graph_id: int, cell, with_metadata: bool,
               module_slices: bool, before: dict, device_timer=None, backward: bool = False) -> int:
    """Gives ``compiled`` (a ``CompiledFxGraph``) its own ``call`` whose kernel calls
    are intercepted (and, with ``module_slices``, framed by module slices; with
    ``device_timer``, a ``cuda_events.DeviceTimer``, bracketed by CUDA events; in a ``backward``
    graph, the module whose forward hooks frame its forward calls gets slices too; ``before``:
    :func:`module_stacks` of ``gm`` before it was compiled); returns
    the number of call sites. The generated module's other functions with kernel calls
    (the branches of ``torch.cond``, loop bodies) get copies too, which ``call`` then
    calls. Raises if the compiled graph is not a Python wrapper module (CUDA graphs,
    C++ wrapper, AOTInductor)."""
    current = compiled.current_callable
    func = getattr(current, "__func__", current)
    if not isinstance(func, types.FunctionType) or func.__name__ != "call":
        raise TypeError(f"the compiled graph runs {type(current).__name__}, not a generated call function")
    source = compiled.source_code
    lines = source.splitlines()
    handles = _handles(lines)
    mapping = json.loads(compiled.inductor_provenance_mapping_str or "{}").get("cppCodeToPost", {})
    tree = ast.parse(source)
    call_def = _find_call_def(tree)
    finder = _Sites({kernel for _, kernel, _ in handles})
    finder.visit_function(call_def)
    subgraphs = [d for d in tree.body if isinstance(d, ast.FunctionDef) and d is not call_def
                 and finder.visit_function(d)]
    module_globals = func.__globals__
    namespace = dict(module_globals)
    def graph_of(fdef):  # a subgraph function's provenance names nodes of the subgraph module of that name
        sub = getattr(gm, fdef.name, None) if fdef is not call_def else None
        return sub if isinstance(sub, torch.fx.GraphModule) else gm

    by_name = {id(d): _nodes_by_name(graph_of(d)) for d in (call_def, *subgraphs)}
    stacks_before = {id(d): before.get("" if graph_of(d) is gm else d.name, {}) for d in (call_def, *subgraphs)}
    used: set = set()
    stacks, kernels = [], []
    for name, callee, expr, fdef in finder.found:
        key = _handle_of(handles, used, callee, expr, fdef)
        target = _resolve(expr, module_globals)
        event, kind = _kernel_kind(callee, target)
        args, stack = kernel_args(by_name[id(fdef)], graph_id, kind, mapping.get(key, []), with_metadata,
                                  lambda: _comment_provenance(lines, expr.lineno), stacks_before[id(fdef)])
        stacks.append(stack)
        site = _core.intern_site(event, CAT_KERNEL, args)
        if device_timer is not None:
            target = device_timer.op(target, _core.CALL, event, args)
        kernels.append((name, target, site))
    folds: dict = {}  # call site -> the module-slice boundary its interceptor makes
    if module_slices and sum(add_spans(fdef, stacks, graph_id, not backward, folds)
                             for fdef in [call_def, *subgraphs]):
        namespace["_dft_span"] = modules.span_function(cell)
    # the Interceptor itself, not its builtin (instrument.direct_calls): Inductor's kernels evict the
    # L2 cache between calls, and a builtin is one more object line to miss per call
    for i, (name, target, site) in enumerate(kernels):
        namespace[name] = _core.Interceptor(target, site, cell, _core.CALL, _core.GRAD_INHERIT, name=name,
                                            boundary=folds.get(i))
    _core.chain([namespace[name] for name, _, _ in kernels])  # in source order: each prefetches the next
    code = compile(ast.fix_missing_locations(ast.Module(body=[*subgraphs, call_def], type_ignores=[])),
                   func.__code__.co_filename, "exec")
    local: dict = {}
    exec(code, namespace, local)
    namespace.update((d.name, local[d.name]) for d in subgraphs)  # what call (a copy) calls by name
    call = local["call"]
    compiled.current_callable = types.MethodType(call, current.__self__) if hasattr(current, "__self__") else call
    return len(finder.found)


@contextlib.contextmanager
def _provenance(is_backward: bool, gm: torch.fx.GraphModule):
    """Inductor's provenance tracking on for one compile. A backward graph is compiled
    after the forward's compile context ended: it gets fresh provenance globals of its
    own and a graph id, so that torch records its kernel -> node mapping too."""
    from torch._inductor import config as inductor_config, debug

    level = max(inductor_config.trace.provenance_tracking_level, 1)
    with inductor_config.patch({"trace.provenance_tracking_level": level}):
        if not is_backward:
            yield
            return
        with debug.reset_provenance_globals():
            debug._pre_grad_graph_id = id(gm.graph)
            yield


_warned: set = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        config.log.warning("%s", message)


def compile_graph(gm: torch.fx.GraphModule, example_inputs, graph_id: int, cell,
                  wrap: Callable[[Any, str, dict], Any],
                  notify: Callable[[Any, Any, str], None], config_patches: Optional[dict] = None):
    """Compiles the Dynamo graph ``gm`` with Inductor, tracing each kernel call.

    ``wrap(fn, phase, args, plain)`` returns ``fn`` wrapped in the graph event, running
    ``plain`` (Inductor's own ``call``, or None) when no op is recorded;
    ``notify(gm, inputs, phase)`` reports each AOT graph to ``on_graph``.
    """
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    with_metadata, module_slices = config.get().inc_metadata, config.get().module_slices

    def inner_compile(aot_gm, inputs, **kwargs):
        backward = bool(kwargs.get("is_backward"))
        phase = PHASE_BACKWARD if backward else PHASE_INFERENCE if kwargs.get("is_inference") else PHASE_FORWARD
        notify(aot_gm, inputs, phase)
        try:  # (what fails here fails again in instrument, which reports it)
            before = module_stacks(aot_gm)
        except Exception:
            before = {}
        with _provenance(backward, aot_gm):
            compiled = compile_fx_inner(aot_gm, inputs, **kwargs)
        args = {ARG_GRAPH: graph_id, ARG_LEVEL: "inductor"}
        timer = cuda_events.DeviceTimer(f"graph {graph_id} {phase}", graph_id) if cuda_events.wanted(inputs) else None
        own, plain = compiled.current_callable, None
        try:
            args["kernels"] = instrument(compiled, aot_gm, graph_id, cell, with_metadata, module_slices, before,
                                         timer, backward)
            # outside the step windows the generated code runs as Inductor made it, at plain cost
            plain = own if timer is None else None
        except Exception as e:  # never break the user's program: the graph event still records
            _warn_once(type(e).__name__, f"graph {graph_id} {phase}: kernels are not traced, only "
                       f"the graph call ({type(e).__name__}: {e})")
        if compiled.current_callable is not None:
            # a graph whose kernels are not traced (a CUDA graph replay) still gets its device time
            call = compiled.current_callable if timer is None else timer.graph(compiled.current_callable)
            compiled.current_callable = wrap(call, phase, args, plain)
        return compiled

    # An AOTAutograd cache hit would skip inner_compile; the FX graph cache below it
    # still serves the generated code.
    with torch._functorch.config.patch(enable_autograd_cache=False):
        return compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=config_patches)
