"""The trainers' own loop code in the trace: each call is a ``trainer`` slice.

Between the phases of a step, the Hugging Face ``Trainer`` and Lightning run
Python of their own (preparing inputs, counting tokens and FLOPs, callbacks,
hooks, logging): 15-25 % of a small model's step, which no op or phase
names. Their calls are slices of category ``trainer``, named as the trainer
names them: Lightning's actions, as its own profilers see them
(``[Callback]ModelCheckpoint.on_train_batch_end``, ``run_training_batch``,
through ``Profiler.profile``, whatever profiler the trainer has), and the
``Trainer`` methods of :data:`TRAINER_METHODS` (``Trainer.training_step``,
``CallbackHandler.call_event``...). The phases inside them stay theirs:
``summary``'s step view counts as ``trainer`` only the time of these slices
outside every other part. A step begins no later than a trainer call in
progress that holds what begins it (the batch fetched inside
``get_batch_samples``), so the slices nest in the steps. Outside the step
windows nothing is written; ``DFTRACER_TRAINER_SLICES=0`` turns them off (a
call costs 2.5-3.5 us with its slice, ``benchmarks/results_coverage.rst``).
"""

from __future__ import annotations

import functools
import sys
import threading

from torch.compiler import is_dynamo_compiling

from .. import _core
from ..schema import CAT_TRAINER
from ..session import config, hooks, logger
from . import steps

GROUP = "trainer code"
# (module, class, methods): the trainers' calls between the phases of their loops
TRAINER_METHODS = (
    ("transformers.trainer", "Trainer",
     ("get_batch_samples", "training_step", "floating_point_ops", "_track_num_input_tokens", "_clip_grad_norm",
      "_get_grad_norm", "_get_learning_rate", "log", "_save_checkpoint")),
    ("transformers.trainer_callback", "CallbackHandler", ("call_event",)),
    # Lightning's loop between its actions: fetching and moving the batch, logging, the validation check
    ("lightning.pytorch.loops.training_epoch_loop", "_TrainingEpochLoop", ("advance", "on_advance_end")),
    ("pytorch_lightning.loops.training_epoch_loop", "_TrainingEpochLoop", ("advance", "on_advance_end")),
)
# (module, class): Lightning's profiler base class, whose profile(action_name) every hook and loop stage runs in
PROFILERS = (("lightning.pytorch.profilers.profiler", "Profiler"),
             ("pytorch_lightning.profilers.profiler", "Profiler"))
_local = threading.local()  # .starts: this thread's trainer calls in progress (ns), outermost first


def _record(name: str, start: int) -> None:
    """The slice of a trainer call that began at ``start`` and ends now, on its thread. A call
    that began before the step (or evaluation) in progress holds a boundary: it is the loop around
    steps (Lightning's ``run_training_epoch``), or a call that ran an evaluation: no slice."""
    try:
        if _core.ops_on() and _core.is_open():
            segment = steps.segment_start()
            if segment is None or segment <= start:
                end = _core.now_ns()
                # after the slices held back for the step it is in (a region's way)
                if not steps.hold(name, CAT_TRAINER, start, end, None, False, False):
                    _core.log(name, CAT_TRAINER, start, end, None)
    except Exception as exc:  # never in the trainer's way: these slices stop, training goes on
        hooks.remove(GROUP)
        config.log.error("trainer slices are off: %s: %s", type(exc).__name__, exc)


def _wrap_method(original, cls: str):
    name = f"{cls}.{original.__name__}"

    @functools.wraps(original)
    def traced(*args, **kwargs):
        if is_dynamo_compiling():
            return original(*args, **kwargs)
        starts = _local.__dict__.setdefault("starts", [])
        start = _core.now_ns()
        starts.append(start)
        try:
            return original(*args, **kwargs)
        finally:
            starts.pop()
            _record(name, start)

    return traced


class _Action:
    """Lightning's ``profile(action_name)`` context (``inner``), timed as a trainer call."""

    __slots__ = ("name", "inner", "start")

    def __init__(self, name, inner):
        self.name, self.inner = name, inner

    def __enter__(self):
        self.start = _core.now_ns()
        value = self.inner.__enter__()  # the trainer's own profiler runs inside: its time is the action's
        _local.__dict__.setdefault("starts", []).append(self.start)
        return value

    def __exit__(self, *exc):
        try:
            return self.inner.__exit__(*exc)
        finally:
            _local.starts.pop()
            _record(str(self.name), self.start)


def _wrap_profile(original):
    @functools.wraps(original)
    def profile(self, action_name, *args, **kwargs):
        inner = original(self, action_name, *args, **kwargs)
        return inner if is_dynamo_compiling() else _Action(action_name, inner)

    return profile


def _owner(module: str, cls: str):
    return getattr(sys.modules[module], cls)


_WATCHED = {m for m, _, _ in TRAINER_METHODS} | {m for m, _ in PROFILERS}
_NAMES = [(m, c, f"{c}.{method} of {m}") for m, c, methods in TRAINER_METHODS for method in methods]
for _module, _cls, _methods in TRAINER_METHODS:
    for _method in _methods:
        hooks.declare(hooks.Patch(f"{_cls}.{_method} of {_module}", GROUP, functools.partial(_owner, _module, _cls),
                                  _method, functools.partial(_wrap_method, cls=_cls)))
for _module, _cls in PROFILERS:
    _NAMES.append((_module, _cls, f"{_cls}.profile of {_module}"))
    hooks.declare(hooks.Patch(_NAMES[-1][2], GROUP, functools.partial(_owner, _module, _cls), "profile",
                              _wrap_profile))


def _install_imported() -> None:
    """The trainer code of the trainer modules imported by now."""
    for module, cls, name in _NAMES:
        if hasattr(sys.modules.get(module), cls):
            hooks.install_one(name)


def _innermost():
    starts = getattr(_local, "starts", None)
    return starts[-1] if starts else None


def _earliest_since(since: int):
    return min((t for t in getattr(_local, "starts", ()) if t >= since), default=None)


hooks.declare(hooks.ImportWatch("trainer code imports", GROUP + " imports", _WATCHED, _install_imported))
# a trace opening in a trainer call: its first step holds the call (and what it kept before)
steps.begin_no_later_than(_innermost)
# a complete step ends no later than a trainer call begun since: the call is what follows
steps.end_no_later_than(_earliest_since)


def _install() -> None:
    if config.get().trainer_slices:
        _install_imported()
        hooks.install(GROUP + " imports")


logger.add_hooks(_install, lambda: None)
if _core.is_open() or config.get().enable:  # a trace open, or opening lazily: its first batch
    _install()
