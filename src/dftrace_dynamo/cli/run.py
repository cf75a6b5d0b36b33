"""``dftrace-dynamo run``: run an unmodified script or module with tracing on."""

import argparse
import os
import signal
import subprocess
import sys

from ._common import warn

DEFAULT_OUT = "traces"


def register(subparsers):
    p = subparsers.add_parser(
        "run", help="run a script (or -m module) with tracing on",
        usage="dftrace-dynamo run [-h] [--out DIR] [--level {aten,torch,inductor}] [--compile-all [--keep-backend]] "
              "(script.py | -m module) [ARGS ...]",
        description="Runs the script in a child Python process with DFTRACER_ENABLE=1 and "
                    "DFTRACER_LOG_FILE=DIR/<script name>, so code that already uses the dftrace "
                    "backend or decorator traces into DIR. With --compile-all every torch.compile() "
                    "of the script uses the tracer as well. The script's stdout, stderr and exit "
                    "status pass through unchanged; where the traces went is printed on stderr.")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"directory for the traces (default ./{DEFAULT_OUT})")
    p.add_argument("--level", choices=("aten", "torch", "inductor"), default="aten",
                   help="with --compile-all: trace ATen ops of forward and backward (default), "
                        "torch-level ops of the Dynamo graph, or the kernels of Inductor's "
                        "compiled code (inductor)")
    p.add_argument("--compile-all", action="store_true",
                   help="make every torch.compile() use the tracer, whatever backend the script "
                        "chose (that backend is replaced: ops run eagerly and are all traced)")
    p.add_argument("--keep-backend", action="store_true",
                   help="with --compile-all: keep the script's backend (e.g. inductor) and trace "
                        "one event per compiled-graph call instead of every op")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="script.py ARGS",
                   help="the script and its arguments (with -m: the module's arguments)")
    p.set_defaults(func=run)


def _traces(directory):
    if not os.path.isdir(directory):
        return set()
    return {os.path.join(root, n) for root, _, names in os.walk(directory) for n in names if ".pfw" in n}


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
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, DFTRACER_ENABLE="1", DFTRACER_LOG_FILE=os.path.join(out, name))
    cmd = [sys.executable, "-m", "dftrace_dynamo.cli._launch"]
    if args.compile_all:
        cmd += ["--compile-all", args.level] + ["--keep-backend"] * args.keep_backend
    before = _traces(out)
    child = subprocess.Popen([*cmd, *target, *args.argv], env=env)
    # Ctrl-C reaches the child from the terminal; let it decide, and wait for it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    rc = child.wait()
    new = sorted(_traces(out) - before)
    if new:
        print(f"dftrace-dynamo run: {len(new)} trace file(s) in {out}:", file=sys.stderr)
        for path in new:
            print(f"  {path}", file=sys.stderr)
        print(f"  summary: dftrace-dynamo summary {out}", file=sys.stderr)
    else:
        warn("run", "no trace written (did the script call torch.compile? try --compile-all)")
    return rc if rc >= 0 else 128 - rc
