"""Training steps in the trace: step slices, the phases inside them, step windows.

A step ends at every ``step()`` of any ``torch.optim.Optimizer`` (torch's global
optimizer hooks: no change to the user's loop), or where the user marks it with
:func:`step` / :func:`step_context` (from then on, in that trace file, optimizer
steps no longer end steps).
Each trace file numbers its steps from 0; step 0 begins when tracing starts
(the trace file opens). Each step is written as the slice ``step N`` (cat ``step``) on the thread
that ends it, from the end of the previous step to the end of this one, and
every event recorded meanwhile carries ``args.step = N`` (the C core writes the
current step into each record).

Inside a step, each ``next()`` on a DataLoader iterator (``data``), each
``Tensor.backward`` / ``torch.autograd.backward`` / ``torch.autograd.grad``
(``backward``), each optimizer ``step()`` and ``zero_grad()`` (cat ``optimizer``)
are slices of their own. Outside the step windows (``DFTRACER_STEPS`` or
:func:`set_steps`) these and all op-level events are skipped; step slices are
always written.

Everything here is installed when a trace file opens, never at import, and a
failure inside it turns step tracking off with one message: the user's program
runs on.
"""

from __future__ import annotations

import functools
import operator
import threading
from typing import Optional

import torch

from .. import _core
from ..schema import ARG_OPTIMIZER, CAT_BACKWARD, CAT_DATA, CAT_OPTIMIZER
from ..session import config, dataloaders, hooks, logger


class _State:
    number = 0  # the current step's number
    named = False  # number was given (name_step) before the trace opened: keep it
    start_ns: Optional[int] = None  # when the current step began; None while no trace is open
    recorded_at = 0  # events recorded when the current step began (is the last step empty?)
    ended = False  # a step ended in this trace file
    explicit = False  # the user marks steps in this trace: optimizer steps no longer end them
    windows: Optional[tuple] = None
    windows_set = False  # set_steps() was called: DFTRACER_STEPS no longer applies
    ops = False  # a trace is open and the current step is in a window
    broken = False


_state = _State()
_lock = threading.RLock()
_local = threading.local()  # per thread: backward depth, optimizer step starts


def _fail(exc: BaseException) -> None:
    """Step tracking stops for good (one message); the traced program is not affected."""
    if not _state.broken:
        _state.broken = True
        _state.ops = False
        _core.set_ops_on(True)
        config.get()
        config.log.error("step tracking is off: %s: %s (the trace goes on without step slices)",
                         type(exc).__name__, exc)


def _recorded() -> int:
    return _core.stats()["recorded"]


def _begin(now: int) -> None:
    """The current step starts at ``now``: its number goes into every record; window on or off."""
    _state.start_ns = now
    _enter(_state.number)
    _state.recorded_at = _recorded()


def _enter(number: int) -> None:
    """Step ``number`` is the current one: every record carries it, its window decides ops."""
    _core.set_step(number)
    _state.ops = config.step_selected(_state.windows, number)
    _core.set_ops_on(_state.ops)


def _end(now: int) -> None:
    """Ends the current step at ``now`` (writing its slice) and begins the next."""
    with _lock:
        if _state.start_ns is None or _state.broken:
            _state.number += 1
            return
        _core.step_slice(_state.number, _state.start_ns, now)
        _state.ended = True
        _state.number += 1
        _begin(now)


def _on_open() -> None:
    try:
        with _lock:
            if _state.broken:
                return
            if not _state.windows_set:
                _state.windows = config.get().steps
            _install()
            if not _state.named:  # every trace file numbers its steps from 0
                _state.number = 0
            _state.named = _state.ended = _state.explicit = False
            _begin(_core.now_ns())
    except Exception as exc:  # never let tracing break the program
        _fail(exc)


def _on_close() -> None:
    """The step in progress is written if steps ended before it and anything was recorded in it."""
    try:
        with _lock:
            if _state.start_ns is not None and not _state.broken and _state.ended \
                    and _recorded() > _state.recorded_at:
                _core.step_slice(_state.number, _state.start_ns, _core.now_ns())
            _state.start_ns = None
            _state.ops = False
            _core.set_step(None)
            _core.set_ops_on(True)
    except Exception as exc:
        _fail(exc)


# ---- public API -------------------------------------------------------------

def step() -> None:
    """Ends the current step now; the next one begins. For loops without an optimizer."""
    _state.explicit = True
    try:
        _end(_core.now_ns())
    except Exception as exc:
        _fail(exc)


class step_context:
    """``with step_context(): ...``: the block is one step (from its start to its end).

    Time between blocks belongs to no step slice; events recorded there carry
    the number of the step that follows. Blocks are not nested.
    """

    def __enter__(self):
        _state.explicit = True
        try:
            with _lock:
                if _state.start_ns is not None and not _state.broken:
                    _state.start_ns = _core.now_ns()
        except Exception as exc:
            _fail(exc)
        return self

    def __exit__(self, *exc):
        step()
        return False


def set_steps(spec: Optional[str]) -> None:
    """Selects the steps whose op-level events are recorded, as ``DFTRACER_STEPS`` does.

    ``spec``: comma-separated ``A-B``, ``A``, ``A-`` or ``A-B:K`` (e.g. ``"10-12,100-"``,
    ``"0-:100"``); ``None`` or ``""``: every step. Overrides ``DFTRACER_STEPS``; a bad
    value raises ``ValueError``.
    """
    windows = config.parse_steps(spec or "")
    with _lock:
        _state.windows, _state.windows_set = windows, True
        if _state.start_ns is not None and not _state.broken:
            _enter(_state.number)


def name_step(number) -> None:
    """Renames the current step (``Dynamo.update(step=...)``); later events carry ``number``.

    Any integer type (``int``, NumPy integers, 0-d integer tensors) is accepted; another value
    is ignored with a warning, since it comes from the user's loop and must not stop it.
    """
    try:
        number = operator.index(number)
        if number < 0:
            raise ValueError
    except (TypeError, ValueError):
        config.get()  # sets up the dftrace_dynamo logger
        config.log.warning("step=%r ignored: a step is named by a non-negative integer", number)
        return
    with _lock:
        _state.number = number
        _state.named = _state.start_ns is None
        if _state.start_ns is not None and not _state.broken:
            _enter(number)


# ---- patch points -------------------------------------------------------------

def _slice(name: str, cat: str, start: int, args: Optional[dict] = None) -> None:
    try:
        _core.log(name, cat, start, _core.now_ns(), args)
    except Exception as exc:
        _fail(exc)


def _optimizer_pre_hook(optimizer, args, kwargs):
    if _state.ops:
        _local.__dict__.setdefault("opt", {})[id(optimizer)] = _core.now_ns()


def _optimizer_post_hook(optimizer, args, kwargs):
    try:
        now = _core.now_ns()
        start = _local.__dict__.get("opt", {}).pop(id(optimizer), None)
        if start is not None and _state.ops:
            cls = type(optimizer).__name__
            _core.log(f"{cls}.step", CAT_OPTIMIZER, start, now, {ARG_OPTIMIZER: cls})
        if not _state.explicit:
            _end(now)
    except Exception as exc:
        _fail(exc)


def _untraced() -> bool:
    # Dynamo tracing into a patched function must see the original only
    return not _state.ops or torch.compiler.is_compiling()


def _wrap_backward(original):
    @functools.wraps(original)
    def traced(*args, **kwargs):
        if _untraced() or getattr(_local, "backward", 0):  # nested calls: the outermost is the slice
            return original(*args, **kwargs)
        start = _core.now_ns()
        _local.backward = 1
        try:
            return original(*args, **kwargs)
        finally:
            _local.backward = 0
            _slice("backward", CAT_BACKWARD, start)

    return traced


def _wrap_next(original):
    @functools.wraps(original)
    def __next__(self):
        if _untraced():
            return original(self)
        start = _core.now_ns()
        batch = original(self)  # StopIteration loaded nothing: no event
        _slice("data", CAT_DATA, start)
        return batch

    return __next__


def _wrap_zero_grad(original):
    @functools.wraps(original)
    def zero_grad(self, *args, **kwargs):
        if _untraced():
            return original(self, *args, **kwargs)
        start = _core.now_ns()
        try:
            return original(self, *args, **kwargs)
        finally:
            cls = type(self).__name__
            _slice(f"{cls}.zero_grad", CAT_OPTIMIZER, start, {ARG_OPTIMIZER: cls})

    return zero_grad


def _torch_autograd():
    return torch.autograd


def _dataloader_iter():
    from torch.utils.data import dataloader

    return dataloader._BaseDataLoaderIter


def _optimizer_hook(register_name: str, hook):
    def register():
        from torch.optim import optimizer

        return getattr(optimizer, register_name)(hook)

    return register


GROUP = "steps"
for _hook in (
    hooks.Registration("optimizer step pre-hook", GROUP,
                       _optimizer_hook("register_optimizer_step_pre_hook", _optimizer_pre_hook)),
    hooks.Registration("optimizer step post-hook", GROUP,
                       _optimizer_hook("register_optimizer_step_post_hook", _optimizer_post_hook)),
    hooks.Patch("torch.autograd.backward", GROUP, _torch_autograd, "backward", _wrap_backward),
    hooks.Patch("torch.autograd.grad", GROUP, _torch_autograd, "grad", _wrap_backward),
    hooks.Patch("DataLoader iterator __next__", GROUP, _dataloader_iter, "__next__", _wrap_next),
    hooks.Patch("Optimizer.zero_grad", GROUP, lambda: torch.optim.Optimizer, "zero_grad", _wrap_zero_grad),
):
    hooks.declare(_hook)


def _install() -> None:
    """At every trace file: torch's global optimizer hooks and the patches (each once)."""
    hooks.install(GROUP)
    dataloaders.install()


logger.add_hooks(_on_open, _on_close)
if _core.is_open():  # a trace opened before this module was imported
    _on_open()
