"""Statistics over one or many trace files: the ``summary`` pipeline, end to end.

Each file goes through the stages of docs/design.rst ("Trace analysis"), each a module that calls
only those below it: the file (:mod:`.reader`) → its verified source, the aggregate records the
file holds (:mod:`.aggregates`, checked by :mod:`.trust`) or its events (:mod:`.events`) →
per-file partials (:mod:`.partials`, mapped over the files by an engine, :mod:`.engines`) →
merged (:mod:`.merged`) → views (:mod:`.views`) → report (:mod:`.report`, done by the caller).
The records are used when every file holds one that answers; else every event is read.

When the traces hold step slices, warm-up steps (see :mod:`.steps`) are left
out of every statistic unless ``include_warmup``.
"""

import functools

import duckdb

from . import engines, merged
from .kinds import VIEWS
from .reader import TraceError
from .views import document


def _out_of_memory_in_one_line(function):
    """DuckDB running out of memory (traces too large for this machine) is answered with one line."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except duckdb.OutOfMemoryException as e:
            raise TraceError(f"out of memory reading the traces ({str(e).splitlines()[0]}); read fewer files at "
                             "a time, on a machine with more memory, or with --engine dask") from None
    return wrapper


@_out_of_memory_in_one_line
def summarize(paths, views=VIEWS, top=20, module_depth=None, progress=None, include_warmup=False,
              all_runs=False, step_samples=False, engine=None, source="auto", processes=1):
    """Statistics for the trace files ``paths`` (already found, see
    :func:`.reader.find_traces`). Returns a dict (the ``--format json``
    document): totals, ``steps`` (the step analysis, see :mod:`.steps`),
    ``compile`` (graphs compiled, graph breaks, recompiles), ``evaluation`` (count,
    total, mean and median time of the ``eval`` slices; None without), ``views`` (view ->
    rows sorted by total time, at most ``top`` each; all with ``top=None``)
    and ``warnings`` (what could not be read); with ``step_samples``, also
    ``step_samples`` (see :func:`.partials.scan`). Raises :class:`TraceError`
    when the files hold several runs, unless ``all_runs``. ``progress(n)`` is
    called with percent steps. ``engine`` (see :mod:`.engines`) scans the files in
    parts and merges them; by default one scan here, with exact quantiles. ``source``:
    ``auto`` reads the aggregate records of the files (:mod:`.aggregates`) when every file has
    one that answers, else scans the events; ``events`` always scans them; ``aggregates``
    never does (TraceError when it would have to). ``processes``: how many local processes read
    the aggregate records (see :class:`.engines.Local`; None: one per core for many files)."""
    views = list(dict.fromkeys(views))
    options = {"views": views, "module_depth": module_depth, "include_warmup": include_warmup,
               "step_samples": step_samples}
    note = None
    if source != "events":
        partials, note = _from_records(paths, options, processes)
        if partials is not None:
            return merge(paths, partials, views, top, all_runs, step_samples,
                         {"source": "aggregates", "engine": "local", "quantiles": "sketch"})
        if source == "aggregates":
            raise TraceError("not every file holds aggregates that answer this summary (see --source)"
                             + (f": {note}" if note else ""))
    shares = (engine or engines.Local()).map(paths, "events", options, progress)
    result = merge(paths, [p for share, _ in shares for p in share], views, top, all_runs, step_samples)
    if note:  # why the records were not used, first
        result["warnings"].insert(0, note)
    return result


def _from_records(paths, options, processes):
    """(the partials of every file from its aggregate record, None), or (None, a note or None) when
    some file has none (no note) or one that does not describe its file or cannot answer (the
    note says which and why, in one line): the caller then scans the events."""
    shares = engines.Local(processes).map(paths, "aggregates", options)
    notes = [note for _, note in shares if note]
    if any(share is None for share, _ in shares):
        if not notes:
            return None, None
        more = f" (and {len(notes) - 1} other file(s)'s)" if len(notes) > 1 else ""
        return None, f"{notes[0]}{more}: read the events of the {len(paths)} file(s) instead"
    return [p for share, _ in shares for p in share], None


def merge(paths, partials, views, top, all_runs=False, step_samples=False, scan_info=None):
    """The summary (see :func:`summarize`) from the :mod:`.partials` of disjoint sets of ``paths``:
    merged, then its views (at most ``top`` rows each; ``scan_info``: see :func:`.views.document`)."""
    return document(paths, merged.merge(paths, partials, views, all_runs, step_samples), views, top, scan_info)
