"""``dftrace-dynamo run``: run an unmodified script or module with tracing on."""

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time

from ._common import warn

DEFAULT_OUT = "traces"


def register(subparsers):
    p = subparsers.add_parser(
        "run", help="run a script (or -m module) with tracing on",
        usage="dftrace-dynamo run [-h] [--out DIR] [--level {aten,torch,inductor}] [--compile-all [--keep-backend]] "
              "[--steps SPEC] (script.py | -m module) [ARGS ...]",
        description="Runs the script in a child Python process with DFTRACER_ENABLE=1 and "
                    "DFTRACER_LOG_FILE=DIR/<script>-<date>-<time>/<script>: each run gets a new "
                    "directory of its own (printed at the end), so code that already uses the dftrace "
                    "backend or decorator traces there. With --compile-all every torch.compile() "
                    "of the script uses the tracer as well. The script's stdout, stderr and exit "
                    "status pass through unchanged; where the traces went is printed on stderr.")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"directory under which each run gets its own directory (default ./{DEFAULT_OUT})")
    p.add_argument("--level", choices=("aten", "torch", "inductor"), default="aten",
                   help="with --compile-all: trace ATen ops of forward and backward (default), "
                        "torch-level ops of the Dynamo graph, or the kernels of Inductor's "
                        "compiled code (inductor)")
    p.add_argument("--compile-all", action="store_true",
                   help="make every torch.compile() use the tracer, whatever backend the script "
                        "chose (that backend is replaced: ops run eagerly and are all traced; with "
                        "--level inductor, Inductor compiles them with the script's mode and options "
                        "and every kernel call is traced)")
    p.add_argument("--keep-backend", action="store_true",
                   help="with --compile-all: keep the script's backend (e.g. inductor) and trace "
                        "one event per compiled-graph call instead of every op")
    p.add_argument("--steps", type=_steps_spec, metavar="SPEC",
                   help="record op-level events only in these training steps (DFTRACER_STEPS): "
                        "comma-separated A-B, A, A- or A-B:K, e.g. 10-12,100- or 0-:100; "
                        "every step still gets its step slice")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="script.py ARGS",
                   help="the script and its arguments (with -m: the module's arguments)")
    p.set_defaults(func=run)


def _steps_spec(text):
    from dftrace_dynamo.session.config import parse_steps

    try:
        parse_steps(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _run_directory(parent, name):
    """A new directory ``parent/<name>-<date>-<time>[-k]`` for this run's traces, so runs never mix."""
    from dftrace_dynamo.session import logger

    logger.make_dirs(parent)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for k in range(1, 1000):
        path = os.path.join(parent, f"{name}-{stamp}" + (f"-{k}" if k > 1 else ""))
        try:
            os.mkdir(path, logger.DIR_MODE)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"too many runs named {name}-{stamp} in {parent}")


def _traces(directory):
    return sorted(os.path.join(root, n) for root, _, names in os.walk(directory) for n in names if ".pfw" in n)


def _why_no_trace(rc, compile_all):
    if rc != 0:  # it failed before tracing anything: --compile-all would not help
        how = f"exited with status {rc}" if rc > 0 else f"was killed by signal {-rc}"
        return f"no trace written (the script {how})"
    if compile_all:
        return "no trace written (the script ran no torch.compile'd code)"
    return "no trace written (did the script call torch.compile? try --compile-all)"


def run(args):
    from dftrace_dynamo.traces.reader import TraceError

    if args.keep_backend and not args.compile_all:
        raise TraceError("--keep-backend needs --compile-all")
    if args.module:
        name, target = args.module.rsplit(".", 1)[-1], ["-m", args.module]
    elif args.argv:
        script = args.argv[0]
        if not os.path.isfile(script):
            raise TraceError(f"no such script: {script}")
        name, target = os.path.splitext(os.path.basename(script))[0], [script]
        args.argv = args.argv[1:]
    else:
        raise TraceError("give a script to run (or -m module)")
    parent = os.path.abspath(args.out)
    new_parent = not os.path.isdir(parent)
    out = _run_directory(parent, name)
    env = dict(os.environ, DFTRACER_ENABLE="1", DFTRACER_LOG_FILE=os.path.join(out, name),
               DFTRACER_RUN_ID=os.path.basename(out))
    if args.steps is not None:
        env["DFTRACER_STEPS"] = args.steps
    cmd = [sys.executable, "-m", "dftrace_dynamo.cli._launch"]
    if args.compile_all:
        cmd += ["--compile-all", args.level] + ["--keep-backend"] * args.keep_backend
    child = subprocess.Popen([*cmd, *target, *args.argv], env=env)
    # Ctrl-C reaches the child from the terminal; let it decide, and wait for it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    rc = child.wait()
    new = _traces(out)  # the run's directory is new: everything in it is this run's
    if new:
        print(f"dftrace-dynamo run: run directory {out}: {len(new)} trace file(s):", file=sys.stderr)
        for path in new:
            print(f"  {path}", file=sys.stderr)
        print(f"  summary: dftrace-dynamo summary {out}", file=sys.stderr)
    else:
        with contextlib.suppress(OSError):  # leave no empty directory behind (kept if the script wrote in it)
            os.rmdir(out)
            if new_parent:
                os.rmdir(parent)
        warn("run", _why_no_trace(rc, args.compile_all))
    return rc if rc >= 0 else 128 - rc
