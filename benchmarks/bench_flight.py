"""The flight recorder's cost: training steps in flight mode against the same steps with a normal
trace, the memory N steps take, and the time a dump takes.

Run (pinned to one core, one torch thread, on an otherwise idle machine)::

    OMP_NUM_THREADS=1 taskset -c 1 python3 benchmarks/bench_flight.py --models bert,gpt2 --rounds 20

Each model (BERT-base, GPT-2 small, random weights, batch 1 x 64 tokens) trains with SGD, compiled
by our backend at ATen level, steps marked with ``dftrace_dynamo.step()``. Timing is paired, as in
``bench_overhead.py``: blocks of steps alternate a normal trace file (A) and a flight-mode trace
file (B) in the same process and on the same compiled graphs (the file is closed and the next
opened between blocks, outside the timed part), the pair's order flipping every round; the
figure is the median of B/A with the median's 95 % interval, times being CPU time of the process
(the writer thread included). Then, in flight mode with N = ``--keep`` steps: the bytes kept after
N + 5 steps (``flight_stats``), and the wall time of ``dftrace_dynamo.dump()`` (the dump of the
kept steps, from the call to its return). ``--no-timing`` skips the paired blocks (a loaded
machine makes them meaningless; memory and dump size are not affected by load).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_overhead import clock_call_ns, median_ci, time_block, transformer  # noqa: E402


def trainer(kind):
    """One SGD step of ``kind`` compiled at ATen level, ending with a step mark."""
    import dftrace_dynamo
    from dftrace_dynamo import create_backend

    model, ids = transformer(kind)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    compiled = torch.compile(model, backend=create_backend(level="aten"))

    def step():
        opt.zero_grad()
        compiled(ids).last_hidden_state.float().mean().backward()
        opt.step()
        dftrace_dynamo.step()

    return step


def open_trace(directory, flight):
    """A new trace file, in flight mode (``flight``: config.Flight) or not."""
    from dftrace_dynamo.session import config, logger

    logger.finalize()
    config._config = dataclasses.replace(config.get(), flight=flight)  # the mode of the next file
    logger.initialize_log(os.path.join(directory, "flight" if flight else "normal"))


def paired(step, directory, flight, rounds, block):
    """The median of flight/normal over the rounds, its 95 % interval, and the median CPU time of
    a normal step (ms)."""
    ratios, normal = [], []
    for r in range(rounds):
        times = {}
        for mode in ((None, flight) if r % 2 == 0 else (flight, None)):
            open_trace(directory, mode)
            times[mode is not None] = time_block(step, block)
        ratios.append(times[True] / times[False])
        normal.append(times[False] / block / 1e6)
    lo, hi = median_ci(ratios)
    return statistics.median(ratios), (lo, hi), statistics.median(normal)


def memory_and_dump(step, directory, flight):
    import dftrace_dynamo
    from dftrace_dynamo import _core

    open_trace(directory, flight)
    for _ in range(flight.steps + 5):
        step()
    _core.flush()
    kept = _core.flight_stats()
    start = time.perf_counter()
    path = dftrace_dynamo.dump("benchmark")
    took = time.perf_counter() - start
    return kept, took, os.path.getsize(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert,gpt2")
    parser.add_argument("--rounds", type=int, default=20, help="A,B block pairs")
    parser.add_argument("--block", type=int, default=3, help="steps per timed block")
    parser.add_argument("--keep", type=int, default=20, help="N: steps kept in flight mode")
    parser.add_argument("--no-timing", action="store_true", help="memory and dump only")
    args = parser.parse_args(argv)
    os.environ.setdefault("DFTRACER_FLIGHT_HANG", "0")
    from dftrace_dynamo.session import config

    flight = config.Flight(steps=args.keep, slow=1e9, hang=0)
    torch.set_num_threads(1)
    print(f"perf_counter_ns() call: {clock_call_ns():.0f} ns; torch {torch.__version__}, "
          f"affinity {sorted(os.sched_getaffinity(0))}, rounds {args.rounds} x {args.block} steps", flush=True)
    print(f"{'model':8} {'flight/normal (median, 95% CI) of a step':>44} {'kept MiB':>9} {'per step KiB':>13} "
          f"{'dump s':>7} {'dump MiB':>9}")
    for kind in args.models.split(","):
        with tempfile.TemporaryDirectory() as directory:
            torch._dynamo.reset()
            torch.manual_seed(0)
            step = trainer(kind)
            open_trace(directory, None)
            for _ in range(3):  # compile and warm up
                step()
            timing = "(not measured)"
            if not args.no_timing:
                ratio, (lo, hi), ms = paired(step, directory, flight, args.rounds, args.block)
                timing = f"{ratio:.3f} [{lo:.3f}, {hi:.3f}] of {ms:.0f} ms"
            kept, took, size = memory_and_dump(step, directory, flight)
            from dftrace_dynamo.session import logger

            logger.finalize()
            per_step = kept["bytes"] / max(kept["kept_steps"], 1)
            print(f"{kind:8} {timing:>44} {kept['bytes'] / 2**20:9.2f} {per_step / 1024:13.1f} {took:7.3f} "
                  f"{size / 2**20:9.2f}   ({kept['kept_steps']} steps kept)", flush=True)


if __name__ == "__main__":
    main()
