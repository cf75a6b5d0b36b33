"""Trainer integrations: the trace's steps are the trainer's steps.

* :class:`DftraceTrainerCallback`: a Hugging Face ``transformers`` ``TrainerCallback``
  (``Trainer(..., callbacks=[DftraceTrainerCallback()])``);
* :class:`DftraceProfiler`: a PyTorch Lightning ``Profiler``
  (``lightning.Trainer(..., profiler=DftraceProfiler())``).

Each numbers the trace's steps with the trainer's own ``global_step`` (also after
resuming from a checkpoint), and ``steps="100-110"`` selects the steps whose
op-level events are recorded, in those numbers (as :func:`dftrace_dynamo.set_steps`).
Where steps begin and end, and evaluation, follow the optimizer-driven rules of
:ref:`steps`: neither adds marks of its own.

Importing this module imports neither ``transformers`` nor ``lightning`` (nor torch):
each class is built on first use, from the trainer package it plugs into.
"""

from __future__ import annotations

from typing import Optional

from .session import config

__all__ = ["DftraceTrainerCallback", "DftraceProfiler"]


def _checked(steps: Optional[str]) -> Optional[str]:
    config.parse_steps(steps or "")  # a bad value raises ValueError where the trainer is set up
    return steps


def _select(steps: Optional[str]) -> None:
    if steps is not None:
        from .events import steps as step_tracking
        step_tracking.set_steps(steps)


def _name(global_step: int) -> None:
    from .events import steps as step_tracking
    step_tracking.name_step(global_step)


def _trainer_callback():
    from transformers import TrainerCallback

    class DftraceTrainerCallback(TrainerCallback):
        """Steps named by ``state.global_step``; ``steps``: the step window (``None``: as
        ``DFTRACER_STEPS`` says)."""

        def __init__(self, steps: Optional[str] = None):
            self.steps = _checked(steps)

        def on_train_begin(self, args, state, control, **kwargs):
            _select(self.steps)

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            _name(state.global_step)  # after backward: the step in progress is this one

    return DftraceTrainerCallback


def _profiler():
    from lightning.pytorch.profilers import PassThroughProfiler

    class DftraceProfiler(PassThroughProfiler):
        """Steps named by ``trainer.global_step``; ``steps``: the step window (``None``: as
        ``DFTRACER_STEPS`` says). Lightning's own actions are ``trainer`` slices with or without
        it (events.trainers)."""

        def __init__(self, steps: Optional[str] = None):
            super().__init__()
            self.steps = _checked(steps)

        def setup(self, stage, local_rank=None, log_dir=None):
            super().setup(stage, local_rank, log_dir)
            _select(self.steps)

        def stop(self, action_name: str) -> None:
            # after training_step: inside the optimizer's closure the step in progress is this
            # one; with manual optimization its steps are done and the name goes to the next
            # step, which Lightning's global_step already counts
            if action_name.startswith("[Strategy]") and action_name.endswith(".training_step"):
                module = getattr(self, "_lightning_module", None)
                if module is not None:
                    _name(module.trainer.global_step)

    return DftraceProfiler


_BUILDERS = {"DftraceTrainerCallback": _trainer_callback, "DftraceProfiler": _profiler}


def __getattr__(name):
    try:
        build = _BUILDERS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = globals()[name] = build()
    value.__module__, value.__qualname__ = __name__, name
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
