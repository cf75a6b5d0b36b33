"""dftrace_dynamo: a torch.compile backend that traces every FX op into DFTracer .pfw files."""

import importlib

__version__ = "0.1.0"

# Imported on first use so that `import dftrace_dynamo` (e.g. by the CLI's
# trace tools) does not pay for importing torch.
_LAZY = {
    "dftracer": ("dftracer", None),
    "initialize_log": ("session.logger", "initialize_log"),
    "finalize": ("session.logger", "finalize"),
    "log_event": ("session.logger", "log_event"),
    "get_time": ("session.logger", "get_time"),
    "region": ("session.logger", "region"),
    "tracer_backend": ("backend", "tracer_backend"),
    "dftracer_dynamo_backend": ("backend", "dftracer_dynamo_backend"),
    "create_backend": ("backend", "create_backend"),
    "dynamo": ("backend.decorator", "dynamo"),
    "Dynamo": ("backend.decorator", "Dynamo"),
    "step": ("events.steps", "step"),
    "step_context": ("events.steps", "step_context"),
    "set_steps": ("events.steps", "set_steps"),
    "dump": ("events.flight", "dump"),
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'dftrace_dynamo' has no attribute {name!r}") from None
    value = importlib.import_module(f"{__name__}.{module}")
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
