"""Measured time per op, from the project's own tracer.

Each partition (a copy: the backend rewrites graphs in place) goes through
the tracing backend at ``level="torch"``, so its nodes are the nodes the
profile counted. The partitions run on their example inputs, once untraced
(warm-up) and then ``runs`` times with a trace open in a temporary directory;
the op events are read back and matched to nodes by their ``graph`` and
``node`` args, the graph events give the measured time of each whole graph.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import statistics
import tempfile

import torch

from .capture import GraphPartition, snapshot

__all__ = ["TimingError", "OpTime", "OpTimes", "measure_op_times"]

_INHERITED = ("DFTRACER_ENABLE", "DFTRACER_LOG_FILE")


class TimingError(RuntimeError):
    """Op times cannot be measured in this process (tracing off or busy)."""


@dataclasses.dataclass(frozen=True)
class OpTime:
    """Measured executions of one node (or one whole graph), in nanoseconds."""

    median_ns: float
    calls: int
    min_ns: float
    max_ns: float

    @property
    def spread(self) -> float:
        """(max - min) / median: 0 for identical runs; above 1 the runs disagree by more than the median."""
        return (self.max_ns - self.min_ns) / self.median_ns if self.median_ns else 0.0

    @classmethod
    def of(cls, ns: list) -> "OpTime":
        return cls(statistics.median(ns), len(ns), min(ns), max(ns))


@dataclasses.dataclass
class OpTimes:
    ops: dict  # {(partition index, node name): OpTime}
    graphs: dict  # {partition index: OpTime of the whole graph}

    @property
    def graph_median_ns(self) -> float:
        """Median time of one run of all partitions (sum of their medians)."""
        return sum(t.median_ns for t in self.graphs.values())


def measure_op_times(partitions: list[GraphPartition], runs: int = 5) -> OpTimes:
    """Times of every node and of every whole graph over ``runs`` traced runs.

    The median, not the mean: one descheduled execution on a busy machine
    would otherwise dominate a node's time. Min and max give the spread.
    """
    from ..session import config, logger
    from ..backend import create_backend, tracing_disabled
    from ..schema import CAT_GRAPH, CAT_OP
    from ..traces.reader import EventLines

    if runs < 1:
        raise ValueError("runs must be at least 1")
    if tracing_disabled():
        raise TimingError("tracing is off (DFTRACER_ENABLE=0 or a bad DFTRACER_* value)")
    if logger.enabled():
        hint = " (DFTRACER_ENABLE=1 opened it: unset it to measure)" if config.get().enable else ""
        raise TimingError(f"a trace is already open in this process{hint}; its events would mix with ours")

    partition_of: dict[int, int] = {}
    current: list[int] = []
    compiler = create_backend(name="profile", level="torch",
                              on_graph=lambda gm, inputs, info: partition_of.update({info["graph_id"]: current[0]}))
    compiled = []
    for part in partitions:
        current[:] = [part.index]
        compiled.append((compiler(snapshot(part.graph_module), part.example_inputs), part.example_inputs))

    def run_all() -> None:
        for fn, inputs in compiled:
            fn(*inputs)

    durations: dict = collections.defaultdict(list)
    graph_durations: dict = collections.defaultdict(list)
    with torch.no_grad(), tempfile.TemporaryDirectory(prefix="dftrace-profile-") as tmp:
        run_all()  # warm-up: nothing is recorded while no trace is open
        # initialize_log exports DFTRACER_ENABLE/LOG_FILE for child processes; this
        # temporary trace is ours alone, so the environment is put back afterwards.
        saved = {name: os.environ.get(name) for name in _INHERITED}
        logger.initialize_log(os.path.join(tmp, "profile"))
        try:
            if not logger.enabled():
                raise TimingError("the trace could not be opened")
            for _ in range(runs):
                run_all()
        finally:
            closed = logger.finalize()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        for _, _, event in EventLines(closed["path"]):
            args = event.get("args") or {}
            if args.get("graph") not in partition_of:
                continue
            ns = float(event.get("dur", 0)) * 1000.0
            if event.get("cat") == CAT_OP:
                durations[(partition_of[args["graph"]], args.get("node"))].append(ns)
            elif event.get("cat") == CAT_GRAPH:
                graph_durations[partition_of[args["graph"]]].append(ns)
    return OpTimes({key: OpTime.of(ns) for key, ns in durations.items()},
                   {key: OpTime.of(ns) for key, ns in graph_durations.items()})
