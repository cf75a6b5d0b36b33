"""What is static about an FX node's event: its name and args, computed once at compile time.

Names follow pydftracer's Dynamo backend so existing trace queries keep working:
``function.<op>[.<overload>]`` for ``call_function`` (``function.convolution.default``,
``function.linear``, ``function.getitem``), ``method.<name>`` for ``call_method`` and the
readable module path (``layer1.0.conv1``) for ``call_module``.
"""

from __future__ import annotations

import builtins
import operator
import re
import weakref
from typing import Any, Iterable, Optional

import torch
from torch.utils._pytree import tree_flatten

from .. import naming
from ..session import hooks, logger
from ..naming import abbreviate
from ..schema import (ARG_BYTES, ARG_FLOPS, ARG_GRAPH, ARG_INPUT_DTYPES, ARG_INPUT_SHAPES, ARG_MODULE, ARG_MODULE_TYPE,
                      ARG_NODE, ARG_OP_TYPE, ARG_OUTPUT_DTYPES, ARG_OUTPUT_SHAPES, ARG_SOURCE, ARG_TARGET)


_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_ROOT_PATH = re.compile(r"""^L\[(['"])(?:self|fn)\1\]$""")  # Dynamo's names for the compiled module
_SOURCE_ROOT = re.compile(r"""^([LG])\[(['"])([^'"]+)\2\]""")  # L['self'].fc -> L, self

# The frame's own module (``self`` of a frame compiled on its own: a module called from eager code,
# or a forward resumed after a graph break) in a node's stack. Its slice is written around the whole
# call by forward hooks (:func:`.modules.frame_slices`), not inside the graph.
SELF_KEY = "dftrace:self"

# module -> its path in the user's model ("" for a root: a module first seen as a compiled frame's
# self or argument, or the module torch.compile was given; a named root where paths would meet);
# filled at compile time only
_paths: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()
# root -> (its name, the trace file it was registered in: a count of files opened; None: none open)
_roots: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()
_trace = [0]


class UserPath(str):
    """A module path already in the user's terms (``named_modules()``): not abbreviated again."""

    __slots__ = ()


_ACCESSOR = re.compile(r"""\.(\w+)|\[(-?\d+)\]|\[(['"])([^'"]*)\3\]""")  # .name, [0], ['name']


def _walk(obj: Any, accessors: str) -> Any:
    """The object that ``accessors`` (what follows a source root: ``.head``, ``[0]``, ``['a']``)
    reach from ``obj``, as Dynamo did when it traced them; None where that fails."""
    pos, seen = 0, [obj]
    try:
        while pos < len(accessors):
            match = _ACCESSOR.match(accessors, pos)
            if match is None:
                return None
            name, index, key = match[1], match[2], match[4]
            if name == "__self__" and len(seen) > 2 and accessors[:match.start()].endswith("._torchdynamo_inline"):
                # a compiled method's function: its self is the object that holds the method
                obj = getattr(obj, "__self__", seen[-3])
            elif name is not None:
                subs = obj.__dict__.get("_modules") if isinstance(obj, torch.nn.Module) else None
                obj = subs[name] if subs and name in subs else getattr(obj, name)
            else:
                obj = obj[int(index) if index is not None else key]
            seen.append(obj)
            pos = match.end()
    except Exception:  # the object changed since Dynamo traced it: the path text decides
        return None
    return obj


def register(module: torch.nn.Module, frame=None) -> str:
    """``module``'s path in the user's model. A module not seen before is a root (a model): it and
    its ``named_modules()`` are registered, and a root seen earlier inside it takes its path in it.
    A root whose paths would name modules of other types in another model of the trace file (a
    GAN's generator and discriminator each hold a ``main``) is named (:func:`root_name`) and its paths begin with that
    name: two models of a trace never share a path. The root's path is returned: ``""`` for an
    unnamed one. ``frame``: the compiling frame, from which the user's name for the model is looked up."""
    path = _paths.get(module)
    if path is not None:
        return path
    inner = _wrapped_model(module)  # (its paths all begin with the wrapper's own component)
    subs = [(naming.user_path(sub_path.partition(".")[2] if inner else sub_path), sub)
            for sub_path, sub in module.named_modules()]
    earlier = [sub for _, sub in subs if sub is not module and sub in _roots]
    moved = {id(m) for root in earlier for m in root.modules()}  # they take their paths in this one
    for root in earlier:
        del _roots[root]
    inside = {id(sub) for _, sub in subs}
    used = {_paths.get(m): (type(root), type(m)) for root, (_, trace) in _roots.items()
            if trace in (_trace[0], None) for m in root.modules() if id(m) not in inside}
    used.pop(None, None)
    name = root_name(module, frame, used)
    # a copy of a model (the same classes at the same paths, a graph Dynamo shares) keeps its paths
    prefix = name if any(used.get(sub_path, (type(module), type(sub))) != (type(module), type(sub))
                         for sub_path, sub in subs if sub_path) else ""
    _roots[module] = (name, _trace[0] if logger.enabled() else None)
    for sub_path, sub in subs:
        new, old = ".".join(part for part in (prefix, sub_path) if part), _paths.get(sub)
        if old is None or old == "" or id(sub) in moved or new.endswith("." + old):
            _paths[sub] = new
    return prefix


# data-parallel wrappers hold the model as ``module``: its paths are the model's own, as in its graphs
_WRAPPERS = {"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"}


def _wrapped_model(module: torch.nn.Module) -> bool:
    """``module`` is a data-parallel wrapper of a model held as its ``module`` attribute."""
    return (any(c.__name__ in _WRAPPERS for c in type(module).__mro__)
            and isinstance(getattr(module, "module", None), torch.nn.Module))


def path_of(module: torch.nn.Module) -> Optional[str]:
    """``module``'s registered path (``""``: an unnamed root), None if not registered."""
    return _paths.get(module)


def root_name(module: torch.nn.Module, frame=None, used: Iterable[str] = ()) -> str:
    """The name a model is known by: the variable or attribute of the user's code that holds it
    (or its ``torch.compile`` wrapper), looked up from ``frame`` outward (the caller's locals, the
    attributes of its ``self``, its globals), else its class name lower-cased; made unique among
    the trace file's models registered before and the first parts of ``used`` paths (``netD``,
    ``netD_1``)."""
    if module in _roots:
        return _roots[module][0]
    name = _bound_name(module, frame) or type(module).__name__.lower()
    taken = {p.split(".", 1)[0] for p in used} | {name for name, trace in _roots.values() if trace in (_trace[0], None)}
    unique, n = name, 0
    while unique in taken:
        n += 1
        unique = f"{name}_{n}"
    return unique


def _opened() -> None:
    """A trace file opens: the models of the ones before it no longer take paths; those registered
    while none was open (its lazy open comes after the first compile began) are its own."""
    _trace[0] += 1
    for root, (name, trace) in list(_roots.items()):
        if trace is None:
            _roots[root] = (name, _trace[0])


logger.add_hooks(_opened, lambda: None)


def _bound_name(module: torch.nn.Module, frame, depth: int = 8) -> Optional[str]:
    """The name the user gave ``module`` (or the ``OptimizedModule`` around it) in the first of the
    user's frames from ``frame`` outward that holds it: a variable, an attribute of the frame's
    ``self``, a global. A function's parameters are no names (``model`` of a helper the loop calls
    with each model), nor is the receiver of the module's own methods."""
    def holds(value) -> bool:
        return value is module or getattr(value, "_orig_mod", None) is module

    try:
        frame = hooks.user_frame(frame)
        while frame is not None and depth:
            code, f_locals = frame.f_code, frame.f_locals
            parameters = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
            owner = f_locals.get("self")
            for place in (f_locals, getattr(owner, "__dict__", {}), getattr(owner, "_modules", None) or {},
                          frame.f_globals):
                for key, value in list(place.items()):
                    if isinstance(key, str) and holds(value) and (place is not f_locals or key not in parameters):
                        return key
            frame, depth = hooks.user_frame(frame.f_back), depth - 1
    except Exception:  # an object of the user's that will not be looked into: the class names it
        pass
    return None


def user_stacks(gm: torch.fx.GraphModule, f_locals: Optional[dict],
                f_globals: Optional[dict]) -> Optional[tuple[torch.nn.Module, str]]:
    """Rewrites the module stacks of ``gm``'s nodes (Dynamo's graph of one compiled frame) into the
    user's module paths, before AOTAutograd copies them onto the forward and backward graphs.

    Dynamo names modules from the frame being compiled: after a graph break that is a resume
    function whose locals hold modules as ``___stack0``..., and a module called from eager code
    is its own frame, with paths relative to it. The objects those names hold, looked up in the
    frame's locals and globals, give the user's paths. The ops of a frame whose ``self`` is a
    module (not the user's root) get that module as outermost stack entry (``SELF_KEY``);
    that module and its path are returned.
    """
    f_locals, f_globals = f_locals or {}, f_globals or {}
    owner = f_locals.get("self")
    self_path = register(owner) if isinstance(owner, torch.nn.Module) else ""
    self_frame = (SELF_KEY, (UserPath(self_path), type(owner))) if self_path else None
    resolved: dict[str, Optional[str]] = {}

    def user_path(text: str) -> Optional[str]:
        """The user's path of the module at ``text`` (a source under a module of the frame's
        locals or globals), or None."""
        if text not in resolved:
            match = _SOURCE_ROOT.match(text)
            obj = (f_locals if match[1] == "L" else f_globals).get(match[3]) if match else None
            found = None
            if isinstance(obj, torch.nn.Module):
                root = register(obj)
                # the object reached gives its registered path, whatever Dynamo went through
                reached = _walk(obj, text[match.end():])
                found = _paths.get(reached) if isinstance(reached, torch.nn.Module) else None
                if found is None:
                    rest = abbreviate(text, max_len=None) if match.end() < len(text) else ""
                    found = naming.user_path(".".join(part for part in (root, rest) if part))
            resolved[text] = found
        return resolved[text]

    # the graph's nodes and those of the subgraphs it calls (bodies of checkpointed regions...)
    graphs = [sub.graph for sub in gm.modules() if isinstance(sub, torch.fx.GraphModule)]
    for node in (node for graph in graphs for node in graph.nodes):
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        stack = {}
        for key, (path, mtype) in (node.meta.get("nn_module_stack") or {}).items():
            full = user_path(str(path))
            if full is not None:  # a module of the user's model, or below one: its path there
                if full:  # (the user's root itself keeps its name)
                    path = UserPath(full)
                    if full == self_path and not stack:
                        key = SELF_KEY  # Dynamo recorded the frame's own call
            stack[key] = (path, mtype)
        if self_frame is not None and SELF_KEY not in stack:
            stack = {self_frame[0]: self_frame[1], **stack}
        if stack:
            node.meta["nn_module_stack"] = stack
    return (owner, self_path) if self_path else None


def op_name(node: torch.fx.Node) -> str:
    """The event name of an executed node (``call_module`` targets must be the module path)."""
    if node.op == "call_method":
        return f"method.{node.target}"
    if node.op == "call_module":
        return abbreviate(node.target, max_len=None)
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        ns = target.namespace
        base = target._opname if ns == "aten" else f"{ns}.{target._opname}"
        return f"function.{base}.{target._overloadname}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return f"function.{target._qualified_op_name.replace('::', '.').removeprefix('aten.')}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"function.{target.name()}"
    return f"function.{getattr(target, '__name__', type(target).__name__)}"


# nodes that pick from or build a Python container: no tensor is computed (see computes)
_PICK = (operator.getitem, builtins.getattr)
_BUILD = (builtins.tuple, builtins.list, builtins.dict)


def computes(node: torch.fx.Node) -> bool:
    """Whether an executed node computes something: not a ``getitem`` or ``getattr`` on a
    tuple, list or result record (picking an output of a multi-output op), nor a tuple, list or
    dict built from values. Indexing a tensor computes (a view or a copy), so does a node
    whose receiver is unknown. Nodes that compute nothing are not op events."""
    if node.op != "call_function":
        return True
    if node.target in _BUILD:
        return False
    if node.target in _PICK and node.args:
        receiver = node.args[0]
        value = _value(receiver) if isinstance(receiver, torch.fx.Node) else receiver
        return value is None or isinstance(value, torch.Tensor)
    return True


def _type_name(mtype: Any) -> str:
    return mtype.__name__ if isinstance(mtype, type) else str(mtype).rsplit(".", 1)[-1]


def module_stack(node: torch.fx.Node) -> tuple[tuple[str, str, str], ...]:
    """The module calls that issued the op, outermost first: (call key, module name, module type).

    Names are module paths (``encoder.layer.3``) relative to the compiled root; the root
    itself, where Dynamo records its call, is its class name lower-cased (``sequential``)
    or the variable that holds it (``model``).

    Dynamo's ``nn_module_stack`` keys one entry per module call (a second call of the
    same module gets ``@1``); AOTAutograd copies the forward node's stack onto the
    backward nodes that differentiate it as ``fwd_nn_module_stack``.
    """
    meta = node.meta
    stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack")
    if not stack:
        return ()
    frames = []
    for key, (path, mtype) in stack.items():
        mtype = _type_name(mtype)
        # The module torch.compile was given, where Dynamo records its call (L['fn'] for an
        # nn.Sequential), is named by its class; a module reached through a variable of the
        # compiled function (L['model']) by that variable. Paths below are relative to it.
        # A path not resolved at compile time loses Dynamo's internal components (a module left
        # with none, such as an unresolved ___stack0, is named by its class).
        if isinstance(path, UserPath):
            name = str(path)
        elif _ROOT_PATH.match(str(path)):
            name = mtype.lower()
        else:
            name = naming.user_path(abbreviate(path, max_len=None)) or mtype.lower()
        frames.append((str(key), name, mtype))
    return tuple(frames)


def module_of(node: torch.fx.Node, root: Optional[torch.nn.Module] = None) -> tuple[Optional[str], Optional[str]]:
    """(module path, module type) that issued the op; backward ops get their forward module."""
    if node.op == "call_module":
        mod = root.get_submodule(node.target) if root is not None else None
        path = naming.user_path(abbreviate(node.target, max_len=None)) or None
        return path, (type(mod).__name__ if mod is not None else None)
    stack = module_stack(node)
    if not stack:
        return None, None
    _, path, mtype = stack[-1]  # the innermost module owns the op
    return (path or None), mtype


def source_of(node: torch.fx.Node) -> Optional[str]:
    """``file:line`` of the user code that produced the node (innermost frame of its stack trace)."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    found = _FILE_LINE.findall(trace)
    return f"{found[-1][0]}:{found[-1][1]}" if found else None


def _value(arg: Any) -> Any:
    if isinstance(arg, torch.fx.Node):
        return arg.meta.get("val", arg.meta.get("example_value"))
    return arg


def _dim(d: Any) -> Any:
    # Symbolic sizes are written as their expression: int() on a SymInt would add a guard.
    return d if isinstance(d, int) else str(d)


def _concrete_numel(t: torch.Tensor) -> Optional[int]:
    numel = 1
    for d in t.shape:
        if not isinstance(d, int):
            return None
        numel *= d
    return numel


def _tensors(values: Any) -> list:
    return [v for v in tree_flatten(values)[0] if isinstance(v, torch.Tensor)]


def _flops(node: torch.fx.Node, args: tuple, kwargs: dict, out: Any) -> Optional[int]:
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    if any(_concrete_numel(t) is None for t in _tensors((args, kwargs, out))):
        return None
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        formula = flop_registry.get(target.overloadpacket)
        try:
            return 0 if formula is None else int(formula(*args, **kwargs, out_val=out))
        except Exception:  # a formula that does not accept these arguments: no estimate
            return None
    # Torch-level op: run it once on its fake example values under the flop counter.
    # Mutating ops are left out: they would change Dynamo's example values.
    name = target if node.op == "call_method" else getattr(target, "__name__", "")
    if node.op == "call_module" or not isinstance(out, torch.Tensor) or name.endswith("_") \
            or getattr(target, "__module__", None) == "_operator" and name.startswith("i"):
        return None
    # the mode the example values belong to (the backend may be handed a different one)
    fake_mode = next((t.fake_mode for t in _tensors((args, kwargs)) if hasattr(t, "fake_mode")), None)
    if fake_mode is None:
        return None
    call = (lambda *a, **k: getattr(a[0], name)(*a[1:], **k)) if node.op == "call_method" else target
    try:
        with fake_mode, FlopCounterMode(display=False) as counter:
            call(*args, **kwargs)
    except Exception:
        return None
    return int(counter.get_total_flops())


def metadata(node: torch.fx.Node, module_type: Optional[str]) -> dict:
    """DFTRACER_INC_METADATA args: shapes, dtypes, module type, source, FLOPs and bytes (all static)."""
    args = tuple(_value(a) for a in node.args)
    kwargs = {k: _value(v) for k, v in node.kwargs.items()}
    out = _value(node)
    inputs, outputs = _tensors((args, kwargs)), _tensors(out)
    meta: dict[str, Any] = {
        ARG_OP_TYPE: node.op,
        ARG_TARGET: node.target if isinstance(node.target, str) else op_name(node).partition(".")[2],
        ARG_INPUT_SHAPES: [[_dim(d) for d in t.shape] for t in inputs],
        ARG_INPUT_DTYPES: [str(t.dtype).removeprefix("torch.") for t in inputs],
        ARG_OUTPUT_SHAPES: [[_dim(d) for d in t.shape] for t in outputs],
        ARG_OUTPUT_DTYPES: [str(t.dtype).removeprefix("torch.") for t in outputs],
    }
    if module_type:
        meta[ARG_MODULE_TYPE] = module_type
    source = source_of(node)
    if source:
        meta[ARG_SOURCE] = source
    flops = _flops(node, args, kwargs, out)
    if flops is not None:
        meta[ARG_FLOPS] = flops
    sizes = [_concrete_numel(t) for t in inputs + outputs]
    if sizes and None not in sizes:
        # upper estimate: every input read once and every output written once
        meta[ARG_BYTES] = sum(n * t.element_size() for n, t in zip(sizes, inputs + outputs))
    return meta


def recomputed(backward: torch.fx.GraphModule, forward_ops: "set[str]") -> frozenset:
    """Names of the nodes of an AOTAutograd backward graph that run again an op of an
    activation-checkpointed region (``torch.utils.checkpoint``) that the forward graph ran
    (``forward_ops``: its node names, which the partitioner keeps on the nodes it copies). Such a
    node is a forward node (``partitioner_tag``) whose checkpoint policy says recompute; forward
    nodes the partitioner copies on its own (cheap views outside checkpointed regions) have none."""
    from torch.utils.checkpoint import CheckpointPolicy

    again = (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE)
    return frozenset(node.name for node in backward.graph.nodes if node.name in forward_ops
                     and node.meta.get("partitioner_tag") == "is_forward" and node.meta.get("recompute") in again)


def op_args(node: torch.fx.Node, root: Optional[torch.nn.Module], graph_id: int, with_metadata: bool) -> dict:
    """Static args of a node's event: graph id, FX node name, module path (+ metadata)."""
    args: dict[str, Any] = {ARG_GRAPH: graph_id, ARG_NODE: node.name}
    module, module_type = module_of(node, root)
    if module:
        args[ARG_MODULE] = module
    if with_metadata:
        args.update(metadata(node, module_type))
    return args
