"""Where ``summary`` and ``diff`` read the trace files: here (the default) or on Dask workers.

An engine maps one function, :func:`.partials.of_files`, over the files and nothing else: here
(:class:`Local`) over all of them in one call, or over contiguous shares of them in local
processes; on Dask (:class:`Dask`) over contiguous shares of them, two per worker thread,
each task returning its share's mergeable partial; the caller merges them (:mod:`.merged`).
No shuffle is needed: the events of one process are all in one file, so everything per
process (warm-up steps, step slices) is decided in the task, and what spans processes (the
op views' groups, the rank analysis) is merged from small partials. Counts and totals equal the
local scan's exactly (durations are summed as integer ns); p50/p99 come from
the merged quantile sketches (:mod:`.sketch`, within 1 % of the exact value,
which the local scan reports). The workers must see the files at the same
paths (a shared file system).
"""

import concurrent.futures
import contextlib
import multiprocessing
import os
import sys
import threading
import time

from .reader import TraceError

INSTALL = "pip install 'dftrace-dynamo[dask]'"
SKETCH_NOTE = "p50/p99 from quantile sketches (within 1% of the exact value)"
SOURCES = ("auto", "events", "aggregates")  # what summary and diff read (summary.summarize)
TIMEOUT_S = 60.0  # default of --timeout: connecting, each answer of the scheduler, a cluster without workers
POLL_S = 2.0  # how often a scan asks the scheduler whether it still has workers
PARALLEL_FILES = 16  # from this many files up, Local(processes=None) uses one process per core
# Dask: a scan's fixed cost (its DuckDB table, its sites' classification, its queries) is about a
# third of a 500,000-line file's, so files are scanned in shares, two per worker thread (a slow
# worker's share is taken over), of at most TASK_BYTES of files each (a worker's memory)
TASKS_PER_THREAD = 2
TASK_BYTES = 128 << 20


class Local:
    """Reads the files here: :func:`.partials.of_files` of all of them in one call (one scan of
    their events, with exact quantiles), or over ``processes`` contiguous shares of them, this
    process reading the first share while spawned ones read theirs (None: one per core from
    :data:`PARALLEL_FILES` files up, else 1). Spawned: the caller's main module must be
    importable (a script calls this under ``if __name__ == "__main__":``)."""

    def __init__(self, processes=1):
        self.processes = processes

    def map(self, paths, source, options, progress=None):
        """:func:`.partials.of_files` of each share of ``paths``, in file order."""
        from .partials import of_files  # here: the CLI's --help must not load DuckDB

        processes = self.processes
        if processes is None:
            processes = cores() if len(paths) >= PARALLEL_FILES else 1
        shares = split(paths, processes) or [[]]
        if len(shares) == 1:
            return [of_files(paths, shares[0], source, options, whole=True, progress=progress)]
        rest = len(shares) - 1
        with Processes(rest) as pool:
            others = pool.map(of_files, [paths] * rest, shares[1:], [source] * rest, [options] * rest)
            return [of_files(paths, shares[0], source, options), *others]


class Dask:
    """Scans on a Dask cluster: an existing one (``scheduler``: its address), a ``client``
    already made, or a local cluster of ``workers`` worker processes started here (forked on
    Linux; ``processes=False``: threads of this process), started when first used: not at all when
    the files' aggregate records answer (they are read here). No wait is unbounded: connecting, each
    answer of the scheduler and a cluster without workers give up after ``timeout`` seconds
    with a :class:`TraceError` (a task that is running may take as long as it needs)."""

    def __init__(self, scheduler=None, workers=None, client=None, processes=True, timeout=TIMEOUT_S):
        try:
            from dask.distributed import Client
        except ImportError:
            raise TraceError(f"--engine dask needs Dask's distributed scheduler: {INSTALL}") from None
        self._own, self.timeout, self.where = [], timeout, scheduler or "the local cluster"
        self._local, self._starting = (workers, processes), threading.Lock()  # (diff maps both sides at once)
        if client is None and scheduler:
            client = _connect(Client, scheduler, timeout)
            self._own.append(client)
        self._client = client

    @property
    def client(self):
        """The Dask client; the local cluster is started here, on first use."""
        with self._starting:
            if self._client is None:
                import dask
                from dask.distributed import Client, LocalCluster

                workers, processes = self._local
                # forked on Linux: a spawned worker imports Dask, DuckDB and this package again (about
                # a CPU second each, two files' scan); a forked one touches nothing of this process's
                # other threads (its scans make their own DuckDB databases)
                method = "fork" if sys.platform == "linux" else "spawn"
                with dask.config.set({"distributed.worker.multiprocessing-method": method}):
                    # no dashboard; the scheduler's HTTP routes on a free local port, not on 8787
                    # (taken by the cluster of a command running beside this one: a warning)
                    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=processes,
                                           dashboard_address=None,
                                           scheduler_kwargs={"dashboard_address": "127.0.0.1:0"})
                self._own.append(cluster)
                self._client = Client(cluster)
                self._own.insert(0, self._client)
        return self._client

    def map(self, paths, source, options, progress=None):
        """:func:`.partials.of_files` of contiguous shares of ``paths`` (:func:`split`: about
        :data:`TASKS_PER_THREAD` per worker thread, at most :data:`TASK_BYTES` of files each but
        never less than a file), one task each, in input order."""
        from dask.distributed import wait

        from .partials import of_files

        shares = split(paths, TASKS_PER_THREAD * self._threads() or len(paths), TASK_BYTES)
        futures = [self.client.submit(of_files, paths, share, source, options, pure=False) for share in shares]
        pending, idle_since, results = set(futures), None, {}
        while pending:
            try:
                done, pending = wait(pending, timeout=min(POLL_S, self.timeout), return_when="FIRST_COMPLETED")
            except TimeoutError:  # nothing finished meanwhile: is anyone still working on it?
                done = set()
            for future in done:  # fetched once (each result() fetches it from its worker again)
                results[future.key] = self._result(future, paths, shares, futures)
                if progress:
                    progress(100 / len(futures))
            idle_since = None if self._threads() else idle_since or time.monotonic()
            if idle_since and time.monotonic() - idle_since > self.timeout:
                left = sum(len(shares[futures.index(f)]) for f in pending)
                raise TraceError(f"the Dask cluster at {self.where} has had no worker for {self.timeout:g} s "
                                 f"({left} of {len(paths)} file(s) left to scan)")
        return [results[f.key] for f in futures]

    def _result(self, future, paths, shares, futures):
        """A finished task's partials; its error here (a worker lost while running it: one line)."""
        from dask.distributed import KilledWorker

        try:
            return future.result(timeout=self.timeout)
        except KilledWorker:
            share = shares[futures.index(future)]
            more = f" and {len(share) - 1} file(s) after it" if len(share) > 1 else ""
            raise TraceError(f"Dask workers died scanning {paths[share[0]]}{more} (killed, or out of "
                             "memory?)") from None
        except TimeoutError:
            raise TraceError(f"the Dask cluster at {self.where} did not hand back a result within "
                             f"{self.timeout:g} s") from None

    def _threads(self):
        """How many threads the scheduler's workers have in all, asked with a timeout."""
        try:
            info = self.client.sync(self.client.scheduler.identity, callback_timeout=self.timeout)
        except (TimeoutError, OSError):
            raise TraceError(f"the Dask scheduler at {self.where} stopped answering (nothing within "
                             f"{self.timeout:g} s)") from None
        return sum(worker.get("nthreads") or 1 for worker in (info.get("workers") or {}).values())

    def close(self):
        """Closes the client and the cluster this engine started (an existing cluster is left running)."""
        for thing in self._own:
            thing.close()
        self._own = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _connect(client_class, address, timeout):
    """A client of the scheduler at ``address``, or a :class:`TraceError` after ``timeout`` s:
    Dask bounds the connection but not the scheduler's first answer, so the client is made in
    a thread of its own and left behind (a daemon) when no answer comes."""
    box = {}

    def connect():
        try:
            box["client"] = client_class(address, timeout=timeout)
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=connect, name="dftrace-dask-connect", daemon=True)
    thread.start()
    thread.join(timeout + 1)
    if "client" in box:
        return box["client"]
    error = box.get("error")
    raise TraceError(f"cannot reach the Dask scheduler at {address}: "
                     + (str(error).splitlines()[0] if error else f"no answer within {timeout:g} s"))


def split(paths, parts, most=None):
    """The indices of ``paths`` in at most ``parts`` contiguous shares (in file order) of about
    equal size on disk, more when that size would be above ``most`` bytes: the files are laid end
    to end and cut in equal parts, a file going to the part that holds its middle byte. A file
    that cannot be read counts as one byte."""
    sizes = []
    for path in paths:
        try:
            sizes.append(max(os.path.getsize(path), 1))
        except OSError:  # the scan says why
            sizes.append(1)
    total = sum(sizes)
    parts = max(min(parts, len(paths)), -(-total // most) if most else 1, 1)
    shares, before = {}, 0
    for i, size in enumerate(sizes):
        shares.setdefault(min((before + size / 2) * parts // total, parts - 1), []).append(i)
        before += size
    return list(shares.values())


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
                             "in shares of the files, two per worker thread (p50/p99 within 1%%; needs "
                             "dftrace-dynamo[dask])")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="with --engine dask: the scheduler of an existing cluster (tcp://host:8786)")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="with --engine dask: start a local cluster of N worker processes (default: one per core)")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help=f"with --engine dask: give up (exit status 2) when the scheduler does not answer, or "
                             f"the cluster has no worker, for SECONDS (default {TIMEOUT_S:g})")
    parser.add_argument("--source", choices=SOURCES, default="auto",
                        help="auto (default): the aggregate records stored in the files when every file has "
                             "them, else every event; events: always read every event; aggregates: never")


def source_note(scan, files, engine="local"):
    """One line on what was read (``scan``: a summary's) from ``files`` files, when it was not
    every event here; for standard error. ``engine``: the one asked for (``--engine``)."""
    if scan["source"] == "aggregates":
        where = ", here and not on Dask (each record is a small part of its file)" if engine == "dask" else ""
        return (f"read the aggregate records of the {files} file(s){where}, not their events "
                f"(--source events reads every event); {SKETCH_NOTE}")
    if scan["engine"] == "dask":
        return f"{files} file(s) scanned on Dask; {SKETCH_NOTE}"
    return None


def make(name, scheduler=None, workers=None, timeout=None):
    """The engine of the CLI's ``--engine``, as a context manager that gives it (None for the
    local scan) and closes what it started."""
    if name == "local":
        if scheduler is not None or workers is not None or timeout is not None:
            raise TraceError("--scheduler, --workers and --timeout go with --engine dask")
        return contextlib.nullcontext()
    if scheduler is not None and workers is not None:
        raise TraceError("--scheduler and --workers exclude each other (the cluster at ADDRESS has its own workers)")
    if workers is not None and workers < 1:
        raise TraceError("--workers must be at least 1")
    if timeout is not None and not 0 < timeout < float("inf"):
        raise TraceError(f"--timeout must be a number of seconds above 0, not {timeout!r}")
    if scheduler is not None:
        check_address(scheduler)
    return Dask(scheduler, workers, timeout=timeout or TIMEOUT_S)


def check_address(address):
    """Raises :class:`TraceError` unless ``address`` reads as a Dask scheduler's address."""
    example = "an address such as tcp://host:8786"
    if not address.strip():
        raise TraceError(f"--scheduler needs {example}, not an empty string")
    try:
        from distributed.comm import registry
        from distributed.comm.addressing import parse_address, parse_host_port
        scheme, location = parse_address(address.strip(), strict=False)
        registry.get_backend(scheme)
        if scheme in ("tcp", "tls", "ws", "wss"):
            parse_host_port(location)
    except ImportError:
        raise TraceError(f"--engine dask needs Dask's distributed scheduler: {INSTALL}") from None
    except ValueError as e:
        raise TraceError(f"--scheduler needs {example}, not {address!r} ({e})") from None
