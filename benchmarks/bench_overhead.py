"""Per-op overhead of dftrace_dynamo against the same graph untraced, and of the tools users compare it to.

Run (pinned to one core, one torch thread, as in benchmarks/results_overhead.rst)::

    DFTRACER_ENABLE=1 DFTRACER_DISABLE_IO=1 taskset -c 1 python3 benchmarks/bench_overhead.py --rounds 30

Every tool is measured against its untraced baseline on the same Dynamo graph, each
measurement in a fresh process: ``backend="eager"`` for torch-level tools (ours at ``level="torch"``,
torch.profiler, VizTracer), ``backend="aot_eager"`` for ATen-level ones (ours at
``level="aten"``, pydftracer's dynamo backend). Blocks of calls alternate A, B, B, A, A, B...
after a warm-up (each round flips the pair's order); the reported overhead is the median of the paired differences divided
by the ops executed per call (with their interquartile range: the noise), and the
ratio the median of B/A. The mean of the differences is shown too: work a tool does
in bursts (our writer thread formats and compresses about once a second) lands in a
few blocks, which the median leaves out and the mean spreads over all calls. Times are CPU time of
the process (``time.process_time_ns``: the trace writer thread is included, other
processes on the machine are not); transformers get a third of the rounds. Every
measurement runs twice, the baseline compiled first (``first`` base) and the traced
graph first: the first model Dynamo compiles in a process can run slower than the
second (``bench_inductor.py``), so the two rows' mean is the figure and half their
difference the order's effect.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ELEM_LAYERS = 100


def elem_fn(x):
    for _ in range(ELEM_LAYERS):
        x = torch.relu(x * 1.0001 + 0.5)
    return x


def elem_of(layers):
    """elem_fn with ``layers`` layers (3 ops each) instead of ELEM_LAYERS: the graph-size scan."""
    def fn(x):
        for _ in range(layers):
            x = torch.relu(x * 1.0001 + 0.5)
        return x
    return fn


class DeepMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(*[m for _ in range(50) for m in (torch.nn.Linear(64, 64), torch.nn.GELU())])

    def forward(self, x):
        return self.layers(x)


def transformer(kind, batch=1, seq=64):
    """BERT-base or GPT-2 small (random weights) in eval mode, and token ids of ``batch`` x ``seq``."""
    import transformers as tf

    if kind == "bert":
        model = tf.BertModel(tf.BertConfig())  # bert-base, random weights
    else:
        model = tf.GPT2Model(tf.GPT2Config())  # gpt-2 small, random weights
    return model.eval(), torch.randint(0, 1000, (batch, seq))


def workload(name):
    """(callable to compile, its inputs, whether a call also runs backward, calls per block)."""
    torch.manual_seed(0)
    if name == "elem":
        return elem_fn, (torch.randn(8, 8),), False, 20
    if name in ("mlp", "mlp_train"):
        return DeepMLP(), (torch.randn(8, 64),), name == "mlp_train", 10
    model, ids = transformer(name)
    return model, (ids,), False, 1


# the timers the benchmarks offer (--timer): CPU time of the process, the trace writer thread
# included, or of the calling thread alone
CLOCKS = {"process": time.process_time_ns, "thread": time.thread_time_ns}


def time_block(call, n, clock=time.process_time_ns):
    """Time of ``n`` calls of ``call`` by ``clock``: by default CPU time of the whole process (the
    trace writer thread included), which other jobs on a shared machine delay but do not add to."""
    start = clock()
    for _ in range(n):
        call()
    return clock() - start


class Tool:
    """Compiles with ``backend`` and times blocks of calls; subclasses wrap the block in a tracer."""

    def __init__(self, name, backend, level="torch"):
        self.name, self.backend, self.level = name, backend, level

    def block(self, call, n):
        return time_block(call, n)


class ProfilerTool(Tool):
    def block(self, call, n):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]):
            return super().block(call, n)  # in-loop cost only: stop and export come on top


class VizTool(Tool):
    def __init__(self, name, backend):
        super().__init__(name, backend)
        from viztracer import VizTracer

        self.tracer = VizTracer(verbose=0, tracer_entries=2_000_000)

    def block(self, call, n):
        self.tracer.start()
        elapsed = super().block(call, n)
        self.tracer.stop()
        self.tracer.clear()
        return elapsed


def make_tools(names, trace_dir, record=True):
    from dftrace_dynamo import create_backend
    from dftrace_dynamo.session import logger

    if record:  # otherwise interceptors run but record nothing: the cost of the call path alone
        logger.initialize_log(os.path.join(trace_dir, "bench"))
    tools = {}
    for name in names:
        if name == "ours-torch":
            tools[name] = Tool(name, create_backend(level="torch"))
        elif name == "ours-aten":
            tools[name] = Tool(name, create_backend(level="aten"), "aten")
        elif name == "torch.profiler":
            tools[name] = ProfilerTool(name, "eager")
        elif name == "viztracer":
            tools[name] = VizTool(name, "eager")
        elif name == "pydftracer":
            from dftracer.python import create_backend as pyd_backend
            from dftracer.python import dftracer as pyd

            pyd.initialize_log(os.path.join(trace_dir, "pydftracer.pfw"), None, -1)
            tools[name] = Tool(name, pyd_backend(), "aten")
    return tools


def ops_per_call(fn, inputs, level, train):
    """Executed FX nodes per call at ``level`` (forward, plus backward when training at ATen level)."""
    from dftrace_dynamo import create_backend

    counts = {}

    def on_graph(gm, example_inputs, info):
        if info["level"] == level:
            counts[(info["graph_id"], info["phase"])] = sum(
                n.op in ("call_function", "call_method", "call_module") for n in gm.graph.nodes)

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=create_backend(level=level, on_graph=on_graph))
    run(compiled, inputs, train)
    torch._dynamo.reset()
    return sum(counts.values())


def run(compiled, inputs, train):
    if train:
        compiled(*inputs).sum().backward()
    else:
        with torch.no_grad():
            compiled(*inputs)


def measure(fn, inputs, train, tool, rounds, block_calls, traced_first):
    baseline = torch.compile(fn, backend="eager" if tool.level == "torch" else "aot_eager")
    traced = torch.compile(fn, backend=tool.backend)
    call_a, call_b = (lambda: run(baseline, inputs, train)), (lambda: run(traced, inputs, train))
    first, second = call_a, (lambda: tool.block(call_b, 1))
    if traced_first:
        first, second = second, first
    for _ in range(3):  # compile (in the order asked) and warm up both
        first()
        second()
    diffs, ratios = [], []
    for r in range(rounds):  # the pair's order flips every round: in a fixed order the second block gained
        if r % 2 == 0:
            a = time_block(call_a, block_calls)
            b = tool.block(call_b, block_calls)
        else:
            b = tool.block(call_b, block_calls)
            a = time_block(call_a, block_calls)
        diffs.append((b - a) / block_calls)
        ratios.append(b / a)
    q1, median, q3 = statistics.quantiles(diffs, n=4)
    return median, (q1, q3), statistics.fmean(diffs), statistics.median(ratios), a / block_calls


def median_ci(values):
    """The distribution-free 95 % interval of the median of ``values``: the order statistics
    n/2 -+ 0.98 sqrt(n) (binomial). Where the median is the figure, this is its noise."""
    ordered, half = sorted(values), 0.98 * len(values) ** 0.5
    return ordered[max(0, int(len(values) / 2 - half))], ordered[min(len(values) - 1, int(len(values) / 2 + half))]


def clock_call_ns(n=200_000):
    """Cost of one time.perf_counter_ns() call from Python: this machine's speed right now
    (shared/loaded machines vary several-fold; 45 ns when this kind of machine is idle)."""
    clock = time.perf_counter_ns
    start = clock()
    for _ in range(n):
        clock()
    return (clock() - start) / n


def measure_one(wname, tool_name, args):
    """Measures one tool on one workload in this process and prints its row."""
    trace_dir = tempfile.mkdtemp(prefix="bench_overhead_")
    (tool,) = make_tools([tool_name], trace_dir, record=not args.no_trace).values()
    fn, inputs, train, block_calls = workload(wname)
    block_calls = args.block_calls or block_calls
    n = ops_per_call(fn, inputs, tool.level, train)
    rounds = args.rounds if wname in ("elem", "mlp", "mlp_train") else max(5, args.rounds // 3)
    diff, (q1, q3), mean, ratio, base = measure(fn, inputs, train, tool, rounds, block_calls, args.traced_first)
    iqr = f"{q1 / n:.0f}..{q3 / n:.0f}"
    first = "traced" if args.traced_first else "base"
    print(f"{wname:<10} {tool.name:<15} {first:<6} {n:>8} {base / 1e3:>12.1f} {diff / n:>9.0f} {iqr:>15} "
          f"{mean / n:>10.0f} {ratio:>7.3f}", flush=True)


def measure_in_child(script, wname, what, passed, width):
    """Runs ``script --one wname what *passed`` in a fresh process; its result row, or why it failed."""
    proc = subprocess.run([sys.executable, os.path.abspath(script), "--one", wname, what, *passed],
                          capture_output=True, text=True)
    rows = [line for line in proc.stdout.splitlines() if line.startswith(wname)]
    if proc.returncode == 0 and rows:
        return rows[-1]
    return f"{wname:<10} {what:<{width}} failed: {proc.stderr.strip().splitlines()[-1:]}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="A,B block pairs per measurement")
    parser.add_argument("--workloads", default="elem,mlp,mlp_train,bert,gpt2")
    parser.add_argument("--tools", default="ours-torch,ours-aten,torch.profiler,viztracer,pydftracer")
    parser.add_argument("--no-trace", action="store_true", help="do not open our trace (interceptor cost only)")
    parser.add_argument("--block-calls", type=int, help="calls per timed block (default: per workload)")
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "TOOL"), help=argparse.SUPPRESS)
    parser.add_argument("--traced-first", action="store_true", help=argparse.SUPPRESS)  # compile order
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.one:
        measure_one(*args.one, args)
        return 0
    print(f"perf_counter_ns() call: {clock_call_ns():.0f} ns")
    print(f"torch {torch.__version__}, affinity {sorted(os.sched_getaffinity(0))}, rounds {args.rounds}"
          f"{', ours not recording' if args.no_trace else ''}", flush=True)
    header = (f"{'workload':<10} {'tool':<15} {'first':<6} {'ops/call':>8} {'base us/call':>12} {'ns/op':>9} "
              f"{'IQR ns/op':>15} {'mean ns/op':>10} {'ratio':>7}")
    print(header)
    print("-" * len(header))
    # One process per measurement: tools leave state behind (profiler callbacks, tracer
    # hooks, loaded libraries) that would slow whatever runs after them.
    passed = [f"--rounds={args.rounds}"] + (["--no-trace"] if args.no_trace else []) + (
        [f"--block-calls={args.block_calls}"] if args.block_calls else [])
    for wname in args.workloads.split(","):
        for tool_name in args.tools.split(","):
            if tool_name == "pydftracer" and wname == "mlp_train":
                continue  # its ATen backend has no bw_compiler: backward runs untraced
            for first in ([], ["--traced-first"]):  # which one Dynamo compiles first: see the docstring
                print(measure_in_child(__file__, wname, tool_name, passed + first, 15), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
