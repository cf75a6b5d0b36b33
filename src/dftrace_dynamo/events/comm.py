"""Collectives in the trace: every ``torch.distributed`` operation is an event (cat ``comm``).

Covered, on the rank that issues them:

* eager ``torch.distributed`` calls (``all_reduce``, ``broadcast``, ``reduce``,
  ``all_gather``, ``all_gather_into_tensor``, ``all_gather_single``,
  ``all_gather_coalesced``, ``reduce_scatter``, ``reduce_scatter_tensor``,
  ``reduce_scatter_single``, ``all_to_all``, ``all_to_all_single``, ``gather``,
  ``scatter``, ``barrier``, ``send``, ``recv``, ``isend``, ``irecv``,
  ``all_reduce_coalesced``), which also covers what is built on them (FSDP2's
  all-gathers and reduce-scatters, the ``*_object`` collectives);
* DDP's gradient-bucket all-reduces: a DDP model gets a communication hook
  that runs DDP's default all-reduce (``allreduce_hook``, the same arithmetic
  as DDP's built-in one) and times it; a hook the program registers itself
  (``register_comm_hook``, ``_register_builtin_comm_hook``) takes its place
  and is timed the same way;
* functional collectives in compiled graphs (``torch.distributed._functional_collectives``,
  and eager calls that Dynamo maps to them) are events of the graph's ops named
  ``function._c10d_functional.*`` (``all_reduce``, ``wait_tensor``...), cat
  ``comm``, with the args :func:`graph_args` computes at compile time. The
  collective's issue and its ``wait_tensor`` are two events: the wait for the
  peers falls in ``wait_tensor``.

Each event spans the operation from its issue to its completion: a
synchronous call is timed around the call; with ``async_op=True`` (and for
``isend``/``irecv`` and DDP buckets) the event ends when the work's future
completes (``Work.get_future().then``), on the thread that completes it, and
carries ``args.async_op``. The time the rank is then blocked in the work's
``wait()`` is an event of its own, ``wait <op>`` (``args.op``: the operation,
``group``, ``rank``): the rank's wait for its peers, where an async
operation's issue-to-completion span overlaps its compute. Args: ``op``, ``bytes`` (this rank's payload),
``dtype``, ``group`` (the process group's name), ``group_size``, ``rank``, for
point-to-point operations ``peer`` (the global rank sent to or received from) and,
for DDP, ``bucket``; ``step`` is the step in which the operation was issued.

NCCL: a future completes when the work is enqueued, not when the GPU has run
it, so for process groups whose backend is NCCL the Python wrappers record
nothing and the group's completion hook (``_register_on_completion_hook``,
``TORCH_NCCL_ENABLE_TIMING=1`` for the start time) records each operation
with the times NCCL measured (no ``bytes``/``dtype``). That path is written but
untested here: no GPU was available.

Everything is installed (hook group ``comm``) when a trace file opens in a
process that has imported ``torch.distributed``; where a trace will open
lazily (at the first compile), the operations' wrappers are installed at import,
and a synchronous operation before the trace opens is kept, on its thread, for the
first step of a trace that opens there before the next optimizer step (FSDP2's first
all-gather, in the root module's pre-forward hook, comes before the first
compiled call opens the trace). Outside the step windows a
wrapper costs one check before it calls the original.
"""

from __future__ import annotations

import collections
import functools
import gc
import itertools
import sys
import threading
import weakref
from typing import Any, Optional

import torch

from .. import _core
from ..schema import (ARG_ASYNC, ARG_BUCKET, ARG_BYTES, ARG_DTYPE, ARG_GROUP, ARG_GROUP_SIZE, ARG_OP,
                      ARG_PEER, ARG_RANK, ARG_STEP, CAT_COMM, COMM_WAIT_PREFIX)
from ..session import config, hooks, logger

GROUP = "distributed"
FUNCTIONAL_PREFIX = "function._c10d_functional."  # op events of functional collectives in graphs
# op -> (payload argument name, its position, position of group, of async_op; -1: always async,
# None: never); the payload is a tensor or a list of tensors (this rank's input)
OPS = {
    "all_reduce": ("tensor", 0, 2, 3),
    "broadcast": ("tensor", 0, 2, 3),
    "reduce": ("tensor", 0, 3, 4),
    "all_gather": ("tensor", 1, 2, 3),
    "all_gather_into_tensor": ("input_tensor", 1, 2, 3),
    "all_gather_single": ("input_tensor", 1, 2, 3),  # what FSDP2 and all_gather_into_tensor call
    "all_gather_coalesced": ("input_tensor_list", 1, 2, 3),
    "reduce_scatter": ("input_list", 1, 3, 4),
    "reduce_scatter_tensor": ("input", 1, 3, 4),
    "reduce_scatter_single": ("input", 1, 3, 4),
    "all_to_all": ("input_tensor_list", 1, 2, 3),
    "all_to_all_single": ("input", 1, 4, 5),
    "gather": ("tensor", 0, 3, 4),
    "scatter": ("tensor", 0, 3, 4),
    "barrier": (None, None, 0, 1),
    "send": ("tensor", 0, 2, None),
    "recv": ("tensor", 0, 2, None),
    "isend": ("tensor", 0, 2, -1),
    "irecv": ("tensor", 0, 2, -1),
    "all_reduce_coalesced": ("tensors", 0, 2, 3),
}

# point-to-point ops -> the argument naming the peer (a global rank; ``group_`` + it: a group rank)
PEER = {"send": "dst", "isend": "dst", "recv": "src", "irecv": "src"}
UNWAITED_MAX = 4096
# id(work) -> (weak reference to the work, op, start, args, end of its issue): async works without a
# future, whose event ends at their wait() (not kept alive: a work never waited for frees its tensors)
_unwaited: "collections.OrderedDict" = collections.OrderedDict()
# id(work) -> (weak reference to the work, op, group, rank) of the async works issued and not yet
# waited for: their wait() is recorded (the oldest dropped beyond UNWAITED_MAX)
_issued: "collections.OrderedDict" = collections.OrderedDict()
_lock = hooks.fork_safe(threading.RLock())  # reentrant: a signal's finalize may interrupt its holder
_local = threading.local()  # depth: inside a recorded operation (inner calls are its parts)
# process group -> (name, size, rank, nccl). Weak: destroy_process_group must free the group, or
# Gloo's worker threads outlive it and release tensors during interpreter shutdown (an abort)
_groups: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_watched: "weakref.WeakSet" = weakref.WeakSet()  # the NCCL groups whose completion hook is registered
# token -> (op, start, args, native thread id, group): operations issued and not complete yet (a
# flight recorder's hang dump shows them)
_in_flight: dict = {}
_tokens = itertools.count()


def in_flight() -> list:
    """The operations issued and not complete, oldest first: (op, start_ns, args, tid, peers), peers
    being the global ranks it waits for (the peer of a send/recv, else the group's ranks)."""
    out = []
    for op, start, args, tid, group in sorted(list(_in_flight.values()), key=lambda e: e[1]):
        peers = [args[ARG_PEER]] if ARG_PEER in args else None
        if peers is None:
            try:
                import torch.distributed as dist

                peers = dist.get_process_group_ranks(_process_group(group))
            except Exception:  # a group torch no longer knows
                peers = []
        out.append((op, start, dict(args), tid, peers))
    return out


def _recording() -> bool:
    """Op-level events are on and neither Dynamo nor a compile on this thread runs the caller."""
    from . import steps  # imports this module: looked up at run time

    return steps._state.ops and not steps.compiling_here()


def is_functional_collective(target: Any) -> bool:
    """Whether an FX node target is a functional collective (``_c10d_functional`` ops): its op
    event is communication, not computation."""
    return getattr(target, "namespace", None) in ("_c10d_functional", "_c10d_functional_autograd")


def graph_args(node) -> dict:
    """The comm args of a functional collective's node in a graph (compile time): ``op``, and where
    they are known, this rank's payload ``bytes`` and ``dtype``, ``group``, ``group_size``, ``rank``."""
    target = node.target
    args = {ARG_OP: getattr(target, "_opname", str(target))}
    try:
        bound = {a.name: v for a, v in zip(target._schema.arguments, node.args)}
        bound.update(node.kwargs)
    except Exception:  # not an op with a schema
        return args
    payload = next((bound[k] for k in ("input", "inputs", "tensor", "tensors") if k in bound), None)
    values = [getattr(n, "meta", {}).get("val") for n in (payload if isinstance(payload, (list, tuple)) else [payload])]
    nbytes, dtype = _payload([v for v in values if v is not None])
    if isinstance(nbytes, int):  # not symbolic (dynamic shapes): reading one would add a guard
        args[ARG_BYTES] = nbytes
    if dtype is not None:
        args[ARG_DTYPE] = dtype
    try:
        import torch.distributed as dist

        name, size, rank, _ = _group(dist.distributed_c10d._resolve_process_group(bound["group_name"]))
        args.update({ARG_GROUP: name, ARG_GROUP_SIZE: size, ARG_RANK: rank})
    except Exception:  # no group (wait_tensor), or one that cannot be resolved
        pass
    return args


def _arg(args, kwargs, name, pos):
    if name in kwargs:
        return kwargs[name]
    return args[pos] if pos is not None and pos < len(args) else None


def _payload(value) -> tuple:
    """(bytes, dtype) of a tensor or a list of tensors."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size(), str(value.dtype).removeprefix("torch.")
    if isinstance(value, (list, tuple)):
        tensors = [t for t in value if isinstance(t, torch.Tensor)]
        if tensors:
            return sum(t.numel() * t.element_size() for t in tensors), str(tensors[0].dtype).removeprefix("torch.")
    return 0, None


def _process_group(group):
    """``group``, or the default group for None."""
    import torch.distributed as dist

    return group if group is not None else dist.distributed_c10d._get_default_group()


def _group(group) -> tuple:
    """(name, size, this process's global rank, backend is NCCL) of a process group (None: the default)."""
    pg = _process_group(group)
    info = _groups.get(pg)
    if info is None:
        import torch.distributed as dist

        info = (getattr(pg, "group_name", None) or "default", dist.get_world_size(pg), dist.get_rank(),
                dist.get_backend(pg) == "nccl")
        _groups[pg] = info
    return info


def _peer(op: str, group, args, kwargs) -> Optional[int]:
    """The global rank a point-to-point ``op`` sends to or receives from (None: any source)."""
    name = PEER[op]
    peer, group_peer = _arg(args, kwargs, name, 1), _arg(args, kwargs, f"group_{name}", 4)
    if peer is None and group_peer is not None:
        import torch.distributed as dist

        peer = dist.get_global_rank(_process_group(group), group_peer)
    return None if peer is None else int(peer)


def _args(op: str, group, payload, peer: Optional[int] = None) -> Optional[dict]:
    name, size, rank, nccl = _group(group)
    if nccl:
        _watch_nccl(group)
        return None  # the completion hook records it
    nbytes, dtype = _payload(payload)
    args = {ARG_OP: op, ARG_BYTES: nbytes, ARG_GROUP: name, ARG_GROUP_SIZE: size, ARG_RANK: rank,
            ARG_STEP: _core.get_step()}
    if dtype is not None:
        args[ARG_DTYPE] = dtype
    if peer is not None:
        args[ARG_PEER] = peer
    return args


def _on_completion(fut, op: str, start: int, args: dict, token=None) -> None:
    """Ends the event of an asynchronous operation (on the thread that completes it)."""
    _in_flight.pop(token, None)
    try:
        _core.log(op, CAT_COMM, start, _core.now_ns(), args, timed=True)
    except Exception:  # the trace closed meanwhile
        pass


def _completed(fut, op: str, start: int, args: dict):
    _on_completion(fut, op, start, args)
    return fut.value()


def _record(op: str, start: int, args: dict, timed: bool = False) -> None:
    """The event of an operation, ending now on the thread that issued it; made between
    ``zero_grad()`` and the forward (a pipeline stage's receive), it goes with the slices held
    for the step it begins."""
    from . import steps  # imports this module: looked up at run time

    end, step = _core.now_ns(), args.pop(ARG_STEP)
    if not steps.hold(op, CAT_COMM, start, end, args, timed):
        args[ARG_STEP] = step
        _core.log(op, CAT_COMM, start, end, args, timed=timed)


def _when_done(work, op: str, start: int, args: dict) -> None:
    """The event ends when ``work`` (a ``Work``, or a DDP hook's future) completes; for a work
    without a future (gloo's ``isend``/``irecv``), when the program's ``wait()`` on it returns."""
    args[ARG_ASYNC] = True
    token = next(_tokens)
    _in_flight[token] = (op, start, args, threading.get_native_id(), None)
    with _lock:
        if len(_issued) >= UNWAITED_MAX:
            _issued.popitem(last=False)
        _issued[id(work)] = (weakref.ref(work), op, args[ARG_GROUP], args[ARG_RANK])
    try:
        fut = work.get_future() if hasattr(work, "get_future") else work
        fut.then(functools.partial(_on_completion, op=op, start=start, args=args, token=token))
    except Exception:
        _in_flight.pop(token, None)
        with _lock:
            if len(_unwaited) >= UNWAITED_MAX:  # never waited for: the oldest covers its issue only
                _issue_only(_unwaited.popitem(last=False)[1])
            _unwaited[id(work)] = (weakref.ref(work), op, start, args, _core.now_ns())


def _wrap_wait(original):
    @functools.wraps(original)
    def wait(self, *args, **kwargs):
        issued = _take(_issued, self) if _issued else None
        start = _core.now_ns() if issued is not None else 0
        result = original(self, *args, **kwargs)
        if issued is not None:
            _, op, group, rank = issued
            try:
                _record(COMM_WAIT_PREFIX + op, start, {ARG_OP: op, ARG_GROUP: group, ARG_RANK: rank,
                                                       ARG_STEP: _core.get_step()})
            except Exception:  # the trace closed meanwhile
                pass
        entry = _take(_unwaited, self) if _unwaited else None
        if entry is not None:
            try:
                _record(*entry[1:4], timed=True)
            except Exception:  # the trace closed meanwhile
                pass
        return result

    return wait


def _take(entries, work):
    """The entry of ``work`` in ``entries`` (removed), or None (not a collected work's reused id)."""
    with _lock:
        entry = entries.get(id(work))
        if entry is None or entry[0]() is not work:
            return None
        del entries[id(work)]
        return entry


def _issue_only(entry: tuple) -> None:
    """The event of an ``_unwaited`` entry never waited for: it covers the issue."""
    _, op, start, args, issued = entry
    _core.log(op, CAT_COMM, start, issued, args, timed=True)


def _on_close() -> None:
    with _lock:
        entries = list(_unwaited.values())
        _unwaited.clear()
    try:
        for entry in entries:
            _issue_only(entry)
    except Exception as exc:
        _fail(exc)


def _wrap_op(op: str, spec: tuple):
    payload_name, payload_pos, group_pos, async_pos = spec

    def describe(args, kwargs):
        """(group, the event's args), args None where nothing is recorded (not initialised, a bad
        argument: the original says so)."""
        try:
            group = _arg(args, kwargs, "group", group_pos)
            return group, _args(op, group, _arg(args, kwargs, payload_name, payload_pos) if payload_name else None,
                                _peer(op, group, args, kwargs) if op in PEER else None)
        except Exception:
            return None, None

    def asynchronous(args, kwargs):
        return async_pos == -1 or (async_pos is not None and _arg(args, kwargs, "async_op", async_pos))

    def with_sender(ev_args, result):
        if op == "recv" and ARG_PEER not in ev_args and isinstance(result, int) and result >= 0:
            ev_args[ARG_PEER] = result  # from any source: recv returns the sender's rank
        return ev_args

    # one wrapper for both names of the function: torch tells ``isend`` from ``irecv`` by identity
    # (``P2POp``, ``batch_isend_irecv``)
    @functools.cache
    def wrap(original):
        @functools.wraps(original)
        def traced(*args, **kwargs):
            # Dynamo tracing the call must see the original (it maps it to a functional collective);
            # asked first, so that a graph break in the original breaks at the caller's line
            if torch.compiler.is_dynamo_compiling() or getattr(_local, "depth", 0):
                return original(*args, **kwargs)
            if not _recording():
                return _before_open(original, args, kwargs)
            group, ev_args = describe(args, kwargs)
            if ev_args is None:
                return original(*args, **kwargs)
            start = _core.now_ns()
            _local.depth = 1
            token = next(_tokens)
            _in_flight[token] = (op, start, ev_args, threading.get_native_id(), group)
            try:
                result = original(*args, **kwargs)
            finally:
                _local.depth = 0
                _in_flight.pop(token, None)
            if asynchronous(args, kwargs) and result is not None:
                _when_done(result, op, start, ev_args)
            else:
                _record(op, start, with_sender(ev_args, result))
            return result

        def _before_open(original, args, kwargs):
            """No trace yet: a synchronous operation is kept for the first step of a trace that
            opens lazily (FSDP2's first all-gather, before the first compiled call opens it)."""
            from . import steps  # imports this module: looked up at run time

            if asynchronous(args, kwargs) or not steps.keeps_before_open():
                return original(*args, **kwargs)
            ev_args = describe(args, kwargs)[1]
            if ev_args is None:
                return original(*args, **kwargs)
            start = _core.now_ns()
            _local.depth = 1
            try:
                result = original(*args, **kwargs)
            finally:
                _local.depth = 0
            ev_args.pop(ARG_STEP, None)  # the step it turns out to be in
            steps.before_open(op, CAT_COMM, start, _core.now_ns(), with_sender(ev_args, result))
            return result

        return traced

    return wrap


# ---- DDP ------------------------------------------------------------------------

class _DDPHook:
    """The communication hook a DDP model runs: the program's own hook, else DDP's default
    all-reduce, timed from the hook's call to its future's completion."""

    def __init__(self, process_group):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.__name__ = self.__qualname__ = "dftrace_timed_comm_hook"  # DDP checks and logs hooks by name
        self.process_group = process_group
        self.hook, self.state, self.replaced = default_hooks.allreduce_hook, process_group, False

    def __call__(self, state, bucket):
        if torch.compiler.is_dynamo_compiling() or not _recording():
            return self.hook(self.state, bucket)
        start = _core.now_ns()
        _local.depth = 1  # the all_reduce inside the hook is part of this event
        try:
            fut = self.hook(self.state, bucket)
        finally:
            _local.depth = 0
        try:
            args = _args("all_reduce", self.process_group, bucket.buffer())
        except Exception as exc:
            _fail(exc)
            return fut
        if args is None:
            return fut
        args[ARG_BUCKET], args[ARG_ASYNC] = bucket.index(), True
        # DDP waits for the future we return: the event is recorded before DDP goes on
        return fut.then(functools.partial(_completed, op="all_reduce", start=start, args=args))


def _adopt(ddp) -> None:
    """Gives ``ddp`` the timed hook, unless it runs a hook of the program's already."""
    if getattr(ddp, "_dft_hook", None) is not None or getattr(ddp, "_comm_hooks", None):
        return
    hook = _DDPHook(ddp.process_group)
    try:
        ddp.register_comm_hook(None, hook)
    except Exception:  # a built-in hook registered before the trace opened: DDP refuses a second
        return
    ddp._dft_hook = hook


def _wrap_ddp_init(init):
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        try:
            _adopt(self)
        except Exception as exc:
            _fail(exc)

    return __init__


def _ours(ddp) -> Optional[_DDPHook]:
    """The timed hook of ``ddp`` while it still runs DDP's default all-reduce."""
    hook = getattr(ddp, "_dft_hook", None)
    return hook if hook is not None and not hook.replaced else None


def _wrap_register(original):
    @functools.wraps(original)
    def register_comm_hook(self, state, hook):
        ours = _ours(self)
        if ours is None:
            return original(self, state, hook)
        # DDP takes one hook only, and holds ours: the program's runs inside it, timed
        self._check_comm_hook(hook)
        self.logger._set_comm_hook_name(hook.__qualname__)
        self._comm_hooks[:] = [(hook, state)]
        ours.hook, ours.state, ours.replaced = hook, state, True

    return register_comm_hook


def _wrap_register_builtin(original):
    @functools.wraps(original)
    def _register_builtin_comm_hook(self, comm_hook_type):
        ours = _ours(self)
        if ours is None:
            return original(self, comm_hook_type)
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = {dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
                dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook}[comm_hook_type]
        self.logger._set_comm_hook_name(str(comm_hook_type))
        ours.hook, ours.state, ours.replaced = hook, self.process_group, True

    return _register_builtin_comm_hook


def _adopt_existing() -> None:
    """DDP models built before the trace opened (a trace that opens at the first compile)."""
    ddp_module = sys.modules.get("torch.nn.parallel.distributed")
    if ddp_module is None:
        return
    for obj in gc.get_objects():
        # not isinstance: it touches every object's __class__, and torch.distributed.reduce_op
        # warns (FutureWarning) when touched
        if ddp_module.DistributedDataParallel in type(obj).__mro__:
            _adopt(obj)


# ---- NCCL -------------------------------------------------------------------------

def _nccl_done(info, group: str, size: int, rank: int) -> None:
    """One NCCL operation completed (NCCL's completion hook; untested without a GPU)."""
    try:
        if not _recording():
            return
        end = int(info.time_finished.timestamp() * 1e9)
        start = int(info.time_started.timestamp() * 1e9) if info.time_started else end
        op = str(info.op_type).rsplit(".", 1)[-1].lower()
        _core.log(op, CAT_COMM, start, end, {ARG_OP: op, ARG_GROUP: group, ARG_GROUP_SIZE: size, ARG_RANK: rank,
                                            ARG_ASYNC: True}, timed=True)
    except Exception:
        pass


def _watch_nccl(group) -> None:
    """Registers the completion hook of an NCCL process group (once per group)."""
    name, size, rank, nccl = _group(group)
    pg = _process_group(group)
    if not nccl or pg in _watched:
        return
    _watched.add(pg)
    try:
        pg._get_backend(torch.device("cuda"))._register_on_completion_hook(
            functools.partial(_nccl_done, group=name, size=size, rank=rank))
    except Exception as exc:
        config.get()
        config.log.warning("NCCL operations are not recorded: %s: %s", type(exc).__name__, exc)


# ---- install ------------------------------------------------------------------------

def _fail(exc: BaseException) -> None:
    """Communication events stop (one message); the program runs on."""
    config.get()
    config.log.error("communication events are off: %s: %s", type(exc).__name__, exc)
    hooks.remove(GROUP)


def _c10d():
    import torch.distributed.distributed_c10d as c10d

    return c10d


def _dist():
    import torch.distributed as dist

    return dist


def _ddp_class():
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel


for _op, _spec in OPS.items():
    # both names: the program's ``dist.x`` and torch's own calls inside distributed_c10d
    _wrap = _wrap_op(_op, _spec)
    hooks.declare(hooks.Patch(f"torch.distributed.{_op}", GROUP, _dist, _op, _wrap))
    hooks.declare(hooks.Patch(f"distributed_c10d.{_op}", GROUP, _c10d, _op, _wrap))
for _hook in (
    hooks.Patch("Work.wait", GROUP, lambda: _c10d().Work, "wait", _wrap_wait),
    hooks.Patch("DistributedDataParallel.__init__", GROUP, _ddp_class, "__init__", _wrap_ddp_init),
    hooks.Patch("DistributedDataParallel.register_comm_hook", GROUP, _ddp_class, "register_comm_hook",
                _wrap_register),
    hooks.Patch("DistributedDataParallel._register_builtin_comm_hook", GROUP, _ddp_class,
                "_register_builtin_comm_hook", _wrap_register_builtin),
):
    hooks.declare(_hook)


def _on_open() -> None:
    try:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available():
            return
        hooks.install(GROUP)
        if dist.is_initialized():
            _watch_nccl(None)
            _adopt_existing()
    except Exception as exc:
        _fail(exc)


logger.add_hooks(_on_open, _on_close)
if _core.is_open():  # a trace opened before this module was imported
    _on_open()
elif config.get().enable:  # a trace will open lazily: see the operations before it (not DDP's)
    try:
        if sys.modules.get("torch.distributed") is not None and sys.modules["torch.distributed"].is_available():
            for _op in OPS:
                hooks.install_one(f"torch.distributed.{_op}")
                hooks.install_one(f"distributed_c10d.{_op}")
    except Exception as _exc:
        _fail(_exc)
