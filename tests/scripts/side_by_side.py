"""A test program's loop run traced by dftrace_dynamo or under torch.profiler, for the scripts
that compare the two (eager_ops.py, op_counts.py). ``loop(compile)`` is the program; it
compiles its models with ``compile(model, **options)``."""
import torch


def traced(path, loop):
    """``loop``'s result, traced into ``path`` (compiled models on ``backend="dftrace"``)."""
    from dftrace_dynamo import dftracer
    from dftrace_dynamo.backend import tracer  # noqa: F401  (registers backend="dftrace")

    dftracer.initialize_log(path, None, -1)
    result = loop(lambda m, **kw: torch.compile(m, backend="dftrace", **kw))
    dftracer.finalize()
    return result


def profiled(loop, backend):
    """``loop``'s result and the torch.profiler (CPU, shapes off) that watched it, its compiled
    models on ``backend``."""
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=False)
    with prof:
        result = loop(lambda m, **kw: torch.compile(m, backend=backend, **kw))
    return result, prof
