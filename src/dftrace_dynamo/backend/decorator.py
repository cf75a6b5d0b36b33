"""pydftracer's ``Dynamo`` / ``dynamo``: ``@dynamo.compile`` and tagged tracers.

::

    from dftrace_dynamo import dynamo, Dynamo

    class Net(torch.nn.Module):
        @dynamo.compile
        def forward(self, x): ...

    tracer = Dynamo(name="resnet50", epoch=0, step=0)
    step_fn = tracer.compile(train_step)
    tracer.update(epoch=1, step=5)   # later events carry the new tags, no recompile
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .tracer import DEFAULT_LEVEL, Tags, TracerBackend, resolve_level, tracing_disabled


class Dynamo:
    """A tracer whose tags (``name``, ``epoch``, ``step``, ``image_idx``, ``image_size``) go into every event."""

    def __init__(self, name: Optional[str] = None, epoch: Optional[int] = None, step: Optional[int] = None,
                 image_idx: Optional[int] = None, image_size: Any = None, enable: bool = True,
                 level: str = DEFAULT_LEVEL, inner: Any = None):
        self.enable = enable
        self.tags = Tags(name=name, epoch=epoch, step=step, image_idx=image_idx, image_size=image_size)
        self.backend = TracerBackend(level=level, enable=enable, inner=inner, tags=self.tags)

    def update(self, epoch=None, step=None, image_idx=None, image_size=None, args=None) -> "Dynamo":
        """Changes the tags of the events recorded from now on; ``None`` keeps a tag as it is."""
        self.backend.update(epoch, step, image_idx, image_size, args)
        return self

    def compile(self, f_py: Optional[Callable] = None, autograd: Optional[bool] = None, *,
                level: Optional[str] = None, **compile_kwargs):
        """``torch.compile`` with this tracer as backend; usable as ``@compile`` or ``@compile(...)``.

        Takes pydftracer's call forms (``compile(f_py=f)``, ``compile(f, False)``): ``autograd=True/False``
        is ``level="aten"/"torch"`` and wins over ``level``; either overrides the tracer's level; other
        keywords go to ``torch.compile``. Disabled (``enable=False`` or ``DFTRACER_ENABLE=0``): ``f_py``
        is returned as it is, not compiled.
        """
        level = resolve_level(level, autograd)
        backend = self.backend
        if level is not None and level != backend.level:
            backend = TracerBackend(level=level, enable=self.enable, inner=backend.inner, tags=self.tags)

        def decorate(func: Callable) -> Callable:
            if not self.enable or tracing_disabled():
                return func
            return torch.compile(func, backend=backend, **compile_kwargs)

        return decorate(f_py) if f_py is not None else decorate


dynamo = Dynamo()
