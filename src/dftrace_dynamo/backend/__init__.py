"""The compile side: the torch.compile backend and what it inserts into compiled code.

``tracer`` (the backend itself), ``decorator`` (pydftracer's ``Dynamo``),
``instrument`` (FX graphs), ``inductor`` (Inductor's generated code), ``sites`` and
``modules`` (what is static about an op and its module slices), ``compile_events``
(compile, graph break and recompile records). Imports torch.
"""

from .tracer import (BACKEND_NAME, DEFAULT_LEVEL, LEVELS, Tags, TracerBackend, create_backend,
                     dftracer_dynamo_backend, resolve_level, tracer_backend, tracing_disabled)

__all__ = ["BACKEND_NAME", "DEFAULT_LEVEL", "LEVELS", "Tags", "TracerBackend", "create_backend",
           "dftracer_dynamo_backend", "resolve_level", "tracer_backend", "tracing_disabled"]
