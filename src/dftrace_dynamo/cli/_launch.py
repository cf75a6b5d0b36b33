"""Child-process side of ``dftrace-dynamo run``: optionally routes every
``torch.compile`` through the tracer, then runs the user's script or module as
``__main__`` with its own ``sys.argv``.

    python -m dftrace_dynamo.cli._launch [--compile-all LEVEL [--keep-backend] [--report FILE]] (SCRIPT | -m MODULE) ARGS...

``--report FILE``: the first ``torch.compile`` call appends a line to FILE, which tells ``run``
why a run that wrote no trace wrote none.
"""

import argparse
import contextlib
import functools
import os
import runpy
import sys


def compile_all(level, keep_backend, report=None):
    """Patches ``torch.compile`` (``nn.Module.compile`` goes through it too).

    Default: whatever backend the script asked for, the graph is compiled by
    the tracer at ``level`` (every op traced, run eagerly as with ``aot_eager``
    / ``eager``; ``mode=``/``options=``, which only inductor understands, are
    dropped). ``keep_backend``: the script's backend still compiles the graph
    (``inner=``); only whole-graph events are traced."""
    import torch

    from dftrace_dynamo.backend import BACKEND_NAME, TracerBackend, create_backend

    original = torch.compile
    shared = create_backend(level=level)
    reported = []

    @functools.wraps(original)
    def traced_compile(model=None, *, backend=None, mode=None, options=None, **kwargs):
        if report and not reported:
            reported.append(True)
            with contextlib.suppress(OSError), open(report, "a") as f:
                f.write(f"{os.getpid()}\n")
        if isinstance(backend, TracerBackend) or backend == BACKEND_NAME:
            return original(model, backend=backend, mode=mode, options=options, **kwargs)
        if level == "inductor" and not keep_backend:  # Inductor compiles: its mode/options apply
            return original(model, backend=shared, mode=mode, options=options, **kwargs)
        if mode is not None or options is not None:
            print(f"dftrace-dynamo run: torch.compile(mode={mode!r}, options={options!r}) "
                  "ignored: the tracer compiles this graph", file=sys.stderr)
        if keep_backend:
            backend = create_backend(level=level, inner=backend or "inductor")
        else:
            backend = shared
        return original(model, backend=backend, **kwargs)

    torch.compile = traced_compile


def _is_launcher(frame):
    name = frame.f_code.co_filename
    return name in (__file__, runpy.__file__) or name.startswith("<frozen runpy>")


def _user_frames_only(hook, kind, exc, tb):
    """An uncaught exception's traceback as ``python script.py`` shows it: the launcher's
    frames (this module, runpy) before the script's first frame are left out."""
    while tb is not None and _is_launcher(tb.tb_frame):
        tb = tb.tb_next
    hook(kind, exc.with_traceback(tb) if exc is not None else exc, tb)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="dftrace_dynamo.cli._launch")
    ap.add_argument("--compile-all", metavar="LEVEL")
    ap.add_argument("--keep-backend", action="store_true")
    ap.add_argument("--report")
    ap.add_argument("-m", dest="module", nargs=argparse.REMAINDER)  # the module's options are its own
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    if a.module:  # (argparse hands what follows a "--" to the positionals)
        a.module, a.args = a.module[0], a.module[1:] + a.args
    sys.excepthook = functools.partial(_user_frames_only, sys.excepthook)
    if a.compile_all:
        compile_all(a.compile_all, a.keep_backend, a.report)
    if a.module:
        sys.argv = [a.module, *a.args]
        runpy.run_module(a.module, run_name="__main__", alter_sys=True)
    else:
        script, *rest = a.args
        sys.argv = [script, *rest]
        sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script.py` does
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
