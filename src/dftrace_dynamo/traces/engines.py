"""Where ``summary`` and ``diff`` scan the trace files: here (the default) or on Dask workers.

The Dask engine partitions the files across the workers of a Dask cluster, one
task per file: each task runs :func:`.summary.scan` (the same DuckDB reader as
the local scan) on its file and returns the mergeable partial; the client
merges them (:func:`.summary.merge`). No shuffle is needed: the events of one
process are all in one file, so everything per process (warm-up steps, step
slices) is decided in the task, and what spans processes (the op views' groups,
the rank analysis) is merged from small partials. Counts and totals equal the
local scan's exactly (durations are summed as integer ns); p50/p99 come from
the merged quantile sketches (:mod:`.sketch`, within 1 % of the exact value,
which the local scan reports). The workers must see the files at the same
paths (a shared file system).
"""

import concurrent.futures
import contextlib
import multiprocessing
import os

from .reader import TraceError

INSTALL = "pip install 'dftrace-dynamo[dask]'"
SKETCH_NOTE = "p50/p99 from quantile sketches (within 1% of the exact value)"
SOURCES = ("auto", "events", "aggregates")  # what summary and diff read (summary.summarize)


class Dask:
    """Scans on a Dask cluster: an existing one (``scheduler``: its address), a ``client``
    already made, or a local cluster of ``workers`` worker processes started here
    (``processes=False``: threads of this process)."""

    def __init__(self, scheduler=None, workers=None, client=None, processes=True):
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError:
            raise TraceError(f"--engine dask needs Dask's distributed scheduler: {INSTALL}") from None
        self._own = []
        if client is None:
            if scheduler:
                try:
                    client = Client(scheduler, timeout="30s")
                except (OSError, TimeoutError) as e:
                    raise TraceError(f"cannot reach the Dask scheduler at {scheduler}: {e}") from None
            else:
                cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=processes,
                                       dashboard_address=None)
                client = Client(cluster)
                self._own.append(cluster)
            self._own.insert(0, client)
        self.client = client

    def scan(self, paths, options, progress=None):
        """The partials of ``paths``, one task per file, in input order."""
        from dask.distributed import as_completed

        from .summary import scan

        futures = [self.client.submit(scan, paths, [i], pure=False, **options) for i in range(len(paths))]
        for future in as_completed(futures):
            if future.status == "error":
                future.result()  # raises the task's error here
            if progress:
                progress(100 / len(futures))
        return self.client.gather(futures)

    def close(self):
        """Closes the client and the cluster this engine started (an existing cluster is left running)."""
        for thing in self._own:
            thing.close()
        self._own = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def cores():
    """The cores this process may run on (``taskset``, cgroup cpusets), else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class Processes:
    """Tasks spread over a pool of ``workers`` local processes (default: one per core), for the
    work per file that is the same for every file, such as reading many files' aggregate records.
    The workers are spawned (never forked: the caller may hold DuckDB's or Dask's threads)."""

    def __init__(self, workers=None):
        self.workers = workers or cores()
        self._pool = concurrent.futures.ProcessPoolExecutor(self.workers,
                                                            mp_context=multiprocessing.get_context("spawn"))

    def map(self, function, *iterables):
        """``function`` over the items of ``iterables``, in the workers: every task starts now, the
        iterator returned gives the results in order (raising a task's error at its turn)."""
        return self._pool.map(function, *iterables)

    def close(self):
        self._pool.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def add_arguments(parser):
    """The ``--engine``, ``--scheduler`` and ``--workers`` options of ``summary`` and ``diff``."""
    parser.add_argument("--engine", choices=("local", "dask"), default="local",
                        help="where the files are scanned: here (default; exact p50/p99) or on Dask workers, "
                             "one task per file (p50/p99 within 1%%; needs dftrace-dynamo[dask])")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="with --engine dask: the scheduler of an existing cluster (tcp://host:8786)")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="with --engine dask: start a local cluster of N worker processes (default: one per core)")
    parser.add_argument("--source", choices=SOURCES, default="auto",
                        help="auto (default): the aggregate records stored in the files when every file has "
                             "them, else every event; events: always read every event; aggregates: never")


def source_note(scan, files):
    """One line on what was read (``scan``: a summary's) from ``files`` files, when it was not
    every event here; for standard error."""
    if scan["source"] == "aggregates":
        return (f"read the aggregate records of the {files} file(s), not their events "
                f"(--source events reads every event); {SKETCH_NOTE}")
    if scan["engine"] == "dask":
        return f"{files} file(s) scanned on Dask; {SKETCH_NOTE}"
    return None


def make(name, scheduler=None, workers=None):
    """The engine of the CLI's ``--engine``, as a context manager that gives it (None for the
    local scan) and closes what it started."""
    if name == "local":
        if scheduler or workers:
            raise TraceError("--scheduler and --workers go with --engine dask")
        return contextlib.nullcontext()
    if scheduler and workers:
        raise TraceError("--scheduler and --workers exclude each other (the cluster at ADDRESS has its own workers)")
    if workers is not None and workers < 1:
        raise TraceError("--workers must be at least 1")
    return Dask(scheduler, workers)
