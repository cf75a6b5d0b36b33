"""``dftrace-dynamo run``: run an unmodified script or module with tracing on."""

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from ._common import warn

DEFAULT_OUT = "traces"


def register(subparsers):
    p = subparsers.add_parser(
        "run", help="run a script (or -m module) with tracing on",
        usage="dftrace-dynamo run [-h] [--out DIR] [--level {aten,torch,inductor}] [--compile-all [--keep-backend]] "
              "[--steps SPEC] [--] (script.py | -m module | torchrun [TORCHRUN OPTIONS] script.py) [ARGS ...]",
        description="Runs the script in a child Python process with DFTRACER_ENABLE=1 and "
                    "DFTRACER_LOG_FILE=DIR/<script>-<date>-<time>/<script>: each run gets a new "
                    "directory of its own (printed at the end), so code that already uses the dftrace "
                    "backend or decorator traces there. With --compile-all every torch.compile() "
                    "of the script uses the tracer as well. Under torchrun (run ... torchrun ..., "
                    "run ... -m torch.distributed.run ..., or torchrun --no-python dftrace-dynamo run ...) "
                    "every rank traces into the one run directory. The script's stdout, stderr and exit "
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
    p.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE ARGS",
                   help="run a library module as a script (everything after it is the module's arguments)")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="script.py ARGS",
                   help="the script and its arguments, or torchrun and its arguments")
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


def _traces(directory, rank=None):
    """The trace files under ``directory`` (``rank``: only that rank's)."""
    mark = None if rank is None else f"-rank{rank}-"
    return sorted(os.path.join(root, n) for root, _, names in os.walk(directory) for n in names
                  if ".pfw" in n and (mark is None or mark in n))


def _why_no_trace(rc, compile_all, compiled):
    if rc != 0:  # it failed before tracing anything: --compile-all would not help
        how = f"exited with status {rc}" if rc > 0 else f"was killed by signal {-rc}"
        return f"no trace written (the script {how})"
    if not compile_all:
        return "no trace written (did the script call torch.compile? try --compile-all)"
    if compiled:
        return "no trace written (the script called torch.compile but never ran the compiled code)"
    return ("no trace written (the script called no torch.compile; --compile-all reaches the script's "
            "process and torchrun's workers, not processes the script starts itself)")


TORCHRUN_MODULES = ("torch.distributed.run",)
PYTHON = re.compile(r"python[0-9.]*$")
# torchrun's options that say how a worker starts: the tracer's launcher takes their place
WORKER_FLAGS = ("module", "no_python", "run_path")


class _Target:
    """What ``run`` starts: ``name`` (of the run directory and trace files), the command after the
    interpreter, and ``torchrun``'s options when the job is a torchrun job."""

    def __init__(self, name, command, torchrun=None):
        self.name, self.command, self.torchrun = name, command, torchrun


def _script_target(argv, module=None):
    """A script (``argv[0]``) or ``module`` with its arguments."""
    from dftrace_dynamo.traces.reader import TraceError

    if module is not None:
        return _Target(module.rsplit(".", 1)[-1], ["-m", module, *argv])
    if not argv:
        raise TraceError("give a script to run (or -m module)")
    if not os.path.isfile(argv[0]):
        raise TraceError(f"no such script: {argv[0]}")
    return _Target(os.path.splitext(os.path.basename(argv[0]))[0], argv)


def _is_torchrun(command):
    if os.path.basename(command) != "torchrun":
        return False
    return os.path.isfile(command) or shutil.which(command) is not None


def _torchrun_target(argv):
    """A torchrun job (``argv``: torchrun's arguments): its workers start through the tracer's
    launcher (``--no-python python -m dftrace_dynamo.cli._launch``), whatever torchrun's
    ``-m``/``--no-python``/``--run-path`` said."""
    from torch.distributed.run import get_args_parser

    from dftrace_dynamo.traces.reader import TraceError

    parser = get_args_parser()
    try:
        parsed = parser.parse_args(argv)
    except SystemExit:  # torchrun's usage error: torchrun says it
        return _Target("torchrun", [], torchrun=argv)
    at = len(argv) - len(parsed.training_script_args) - 1
    options, script, rest = argv[:at], argv[at], argv[at + 1:]
    flags = {o: a.dest for a in parser._actions for o in a.option_strings}

    def says_how_workers_start(option):  # the option, or the one it abbreviates, is one of WORKER_FLAGS
        named = {d for o, d in flags.items() if o == option or (option.startswith("--") and o.startswith(option))}
        return len(named) == 1 and named <= set(WORKER_FLAGS)
    options = [o for o in options if not says_how_workers_start(o)]
    if parsed.module:
        target = _script_target(rest, script)
    elif not parsed.no_python:
        target = _script_target([script, *rest])
    elif PYTHON.match(os.path.basename(script)) and rest and (rest[0] == "-m" or not rest[0].startswith("-")):
        target = _script_target(rest[2:], rest[1]) if rest[0] == "-m" else _script_target(rest)
    else:  # another program: it runs as torchrun would run it
        if not shutil.which(script):
            raise TraceError(f"no such command: {script}")
        return _Target(os.path.basename(script), [script, *rest], torchrun=options + ["--no-python"])
    target.torchrun = options + ["--no-python", sys.executable, "-u"]
    return target


def _target(args):
    """What to start (:class:`_Target`) from the command line: ``-m module``, a script, torchrun."""
    if args.module is not None:  # (argparse hands what follows a "--" to the positionals)
        module, *rest = (args.module or [None]) + args.argv
        if module is None:
            from dftrace_dynamo.traces.reader import TraceError

            raise TraceError("-m needs a module")
        if module in TORCHRUN_MODULES:
            return _torchrun_target(rest)
        return _script_target(rest, module)
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if argv and _is_torchrun(argv[0]):
        return _torchrun_target(argv[1:])
    return _script_target(argv)


def _agent_start():
    """The start time of this process's parent (torchrun's agent, for its workers), the same in
    every worker of the host; None where it cannot be read (not Linux)."""
    try:
        with open(f"/proc/{os.getppid()}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return None


def _worker_directory(parent, name):
    """The run directory that every worker of a torchrun job on this host shares
    (``torchrun --no-python dftrace-dynamo run ...``): named for the time torchrun started."""
    started = _agent_start()
    if started is None:
        stamp = f"torchrun-{os.getppid()}"
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    path = os.path.join(parent, f"{name}-{stamp}")
    os.makedirs(path, exist_ok=True)
    return path


def run(args):
    from dftrace_dynamo.traces.reader import TraceError

    if args.keep_backend and not args.compile_all:
        raise TraceError("--keep-backend needs --compile-all")
    target = _target(args)
    # a worker of a torchrun job: the job's ranks share one run directory
    worker_rank = os.environ.get("RANK") if "TORCHELASTIC_RUN_ID" in os.environ else None
    parent = os.path.abspath(args.out)
    new_parent = not os.path.isdir(parent)
    if worker_rank is not None:
        out = _worker_directory(parent, target.name)
    else:
        out = _run_directory(parent, target.name)
    env = dict(os.environ, DFTRACER_ENABLE="1", DFTRACER_LOG_FILE=os.path.join(out, target.name),
               DFTRACER_RUN_ID=os.path.basename(out))
    if args.steps is not None:
        env["DFTRACER_STEPS"] = args.steps
    fd, report = tempfile.mkstemp(prefix="dftrace-run-")  # a process that called torch.compile says so here
    os.close(fd)
    launch = ["-m", "dftrace_dynamo.cli._launch"]
    if args.compile_all:
        launch += ["--compile-all", args.level, "--report", report] + ["--keep-backend"] * args.keep_backend
    if target.torchrun is None:
        cmd = [sys.executable, *launch, *target.command]
    elif target.torchrun[-1] == "--no-python" or not target.command:  # not a Python program
        cmd = [sys.executable, "-m", "torch.distributed.run", *target.torchrun, *target.command]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", *target.torchrun, *launch, *target.command]
    try:
        child = subprocess.Popen(cmd, env=env)
        # Ctrl-C reaches the child from the terminal; let it decide, and wait for it.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, lambda *_: child.terminate())
        rc = child.wait()
        with open(report) as f:
            compiled = bool(f.read())
    finally:
        os.remove(report)
    new = _traces(out, worker_rank)  # the run's directory is new: everything in it is this run's
    if new and worker_rank in (None, "0"):
        new = _traces(out)
        print(f"dftrace-dynamo run: run directory {out}: {len(new)} trace file(s):", file=sys.stderr)
        for path in new:
            print(f"  {path}", file=sys.stderr)
        print(f"  summary: dftrace-dynamo summary {out}", file=sys.stderr)
    elif not new:
        if worker_rank is None:
            with contextlib.suppress(OSError):  # leave no empty directory behind (kept if the script wrote in it)
                os.rmdir(out)
                if new_parent:
                    os.rmdir(parent)
        why = _why_no_trace(rc, args.compile_all, compiled)
        warn("run", why if worker_rank is None else f"rank {worker_rank}: {why}")
    return rc if rc >= 0 else 128 - rc
