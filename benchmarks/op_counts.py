"""Per-step op counts of dftrace_dynamo (eager ops on) against torch.profiler's top-level ops.

    python benchmarks/op_counts.py [PROGRAM ...]

Runs each program of ``tests/scripts/op_counts.py`` twice in fresh interpreters, with the same
seed and iterations: under dftrace_dynamo with ``DFTRACER_EAGER_OPS=1`` (compiled models at ATen
level) and untraced under torch.profiler (CPU, ``record_shapes`` off; compiled models on
``aot_eager``, the graphs our ATen level runs). Prints, per step, our op events (``cat``
``dynamo``: the compiled graphs' op events and the eager op events, ``args.step``) and the
profiler's top-level ops in the same step, and the evaluations' (our events of no step). Results:
``benchmarks/results_op_counts.rst``.
"""

import collections
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
SCRIPT = os.path.join(TESTS, "scripts", "op_counts.py")
sys.path.insert(0, TESTS)

from tracefile import read_events, traces  # noqa: E402


def _python(argv, cwd, env, timeout):
    """``python *argv`` in a new interpreter, with ``env`` added to this environment less DFTRACER_*."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DFTRACER_") and k != "RANK"}, **env}
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout)


def run(program, directory, python=_python):
    """``(traced, profiled, events)``: both runs' JSON outputs and the trace's events; ``python``
    runs each (the tests pass theirs)."""
    out = {}
    for mode, args in (("trace", ["--trace", os.path.join(directory, "tr")]), ("profile", ["--profile"])):
        path = os.path.join(directory, f"{mode}.json")
        proc = python([SCRIPT, program, path, *args], directory, {"DFTRACER_EAGER_OPS": "1"}, 600)
        if proc.returncode:
            raise RuntimeError(f"{program} --{mode} failed:\n{proc.stderr[-4000:]}")
        with open(path) as f:
            out[mode] = json.load(f)
    (trace,) = traces(directory, "tr-*")
    return out["trace"], out["profile"], read_events(trace)


def op_events(events):
    """Our op events: the compiled graphs' (``level`` aten) and the eager ones (``level`` eager)."""
    return [e for e in events if e.get("cat") == "dynamo" and e.get("ph") == "X"]


def per_step(events, steps):
    """Our op events per step (``steps`` of them) and those of no step (evaluation)."""
    counts, none = [0] * steps, 0
    for e in op_events(events):
        step = e["args"].get("step")
        if step is None:
            none += 1
        else:
            counts[step] += 1
    return counts, none


def by_name(events, step):
    """Our op events of ``step`` by operator name: a graph's ``function.addmm.default`` is
    ``aten::addmm``, as the profiler names it."""
    names = collections.Counter()
    for e in op_events(events):
        if e["args"].get("step") == step:
            name = e["name"]
            if e["args"].get("level") != "eager" and name.startswith("function."):
                name = "aten::" + name.split(".")[1]
            names[name] += 1
    return names


def main(programs):
    sys.path.insert(0, os.path.dirname(SCRIPT))
    from op_counts import PROGRAMS

    for program in programs or PROGRAMS:
        with tempfile.TemporaryDirectory() as d:
            traced, truth, events = run(program, d)
        ours, none = per_step(events, len(truth["ops"]))
        same = traced["losses"] == truth["losses"] and traced["params"] == truth["params"]
        print(f"{program}: ours {ours} (evaluation {none}), torch.profiler {truth['ops']} "
              f"(ATen {truth['aten']}, evaluation {truth['eval']}), numerics identical: {same}")


if __name__ == "__main__":
    main(sys.argv[1:])
