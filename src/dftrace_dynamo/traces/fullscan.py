"""The full scan: the events of trace files in the line layout, read by the C reader
(``_core.Scanner``, csrc/reader.c) into a DuckDB table, without a Python object per event.

Each file is read in its own thread (the reader releases the GIL), :data:`ROWS` events at a
time: numeric columns (pid, tid, ts, dur, args.step) and per event a *site*, the
combination of its text fields (ph, cat, name and the args fields the views read), which
the reader keeps once. Each new site is classified once by the caller's SQL (the same SQL
that classifies the events of every other source) into table ``site_info``; the events of
sites with a kind are stored as their numbers and site id (table :data:`LINES`, about 53 bytes
an event), and table ``ev`` is a view joining them with their sites (a site's texts are not
copied into each row), in a union with table :data:`OTHER`, where the caller puts the events
DuckDB's reader reads. The lines the reader does not take (``[``/``]``, a cut last
line, other writers' forms it does not decode, wrong types) go, as they are, to a fallback
file per input that the caller reads with DuckDB's JSON reader: no line is read two ways.

Memory of the scan itself, besides the table: batches of :data:`ROWS` events (44 bytes each:
11 MiB), at most three per reading thread (one being read, two waiting); per reading thread one
gzip window (:data:`.reader.WINDOW`), one inflated member (at most 64 MiB) and one line
(:data:`.reader.MAX_LINE`); plus the distinct sites, and at most :data:`DEFER_ROWS` events of
new sites held back until their sites are classified.
"""

import concurrent.futures
import os
import queue
import threading

import numpy as np

from .. import _core
from ..schema import ARG_ATEN_OPS, ARG_CLOCK_OFFSET, ARG_NODE, ARG_STEP
from .clock import SCAN_BYTES
from .reader import MAX_LINE, Damage, scan_text

ROWS = 1 << 18  # events per batch (11 MiB; a statement per batch costs about a millisecond)
# The events of new sites wait (copied) until their sites are classified with others in one query
# (each query costs tens of milliseconds), at the end or once this many events or sites wait.
DEFER_ROWS, DEFER_SITES = 1 << 14, 1 << 12
MARK = f'"{ARG_CLOCK_OFFSET}"'.encode()  # the clock record (clock.record: the first line holding it)
LINES, OTHER = "ev_lines", "ev_other"  # the tables under view ev: events read here; by DuckDB's reader
_NULL = np.iinfo(np.int64).min  # the reader's NULL integer (NaN: NULL double)
_NUMERIC = ("pid", "tid", "ts", "dur", "step")
_TYPES = (np.int32, np.int64, np.int64, np.float64, np.float64, np.int64)


def _site_source(fields, args_type):
    """SQL with the columns of DuckDB's ``read_json`` for the sites of table ``new_sites`` (args
    field i in its column a<i>; numbers NULL: they are per event; ``file``: the site id)."""
    packed = ", ".join(f'"{f}" := a{i}' for i, f in enumerate(fields))
    return (f"SELECT ph, cat, name, NULL::JSON AS pid, NULL::JSON AS tid, NULL::JSON AS ts, NULL::JSON AS dur, "
            f"struct_pack({packed})::{args_type} AS args, site::BIGINT AS file FROM new_sites")


class _Sites:
    """The sites of all files of one scan, classified once each into table ``site_info``; the
    ids below ``known`` are classified."""

    def __init__(self, con, fields, classify, args_type):
        self.con, self.fields, self.ids, self.pending, self.known = con, fields, {}, [], 0
        self.listed = fields.index(ARG_ATEN_OPS) if ARG_ATEN_OPS in fields else -1
        source = _site_source(fields, args_type)
        self.sql = f"SELECT file AS site, * EXCLUDE (file, suspect) FROM ({classify(source)}) WHERE kind IS NOT NULL"
        columns = ", ".join(f'a{i} {"VARCHAR[]" if i == self.listed else "VARCHAR"}' for i in range(len(fields)))
        con.execute(f"CREATE TEMP TABLE new_sites (site INTEGER, ph VARCHAR, cat VARCHAR, name VARCHAR, {columns})")
        con.execute(f"CREATE TEMP TABLE site_info AS {self.sql} LIMIT 0")
        self.kept = np.zeros(0, bool)  # per site id: classified with a kind (its events are kept)
        # (copying the site's texts into every row cost a quarter of the scan's CPU)
        con.execute(f"CREATE TEMP TABLE {OTHER} AS {classify(source)} LIMIT 0")
        types = dict(con.execute(f"SELECT column_name, column_type FROM (DESCRIBE {OTHER})").fetchall())
        con.execute(f"CREATE TEMP TABLE {LINES} (site INTEGER, "
                    + ", ".join(f"{c} {types[c]}" for c in ("file", *_NUMERIC)) + ")")
        own = ("file", *_NUMERIC)
        select = ", ".join(f"n.{c}" if c in own else "false AS suspect" if c == "suspect" else f"s.{c}"
                           for c in types)
        con.execute(f"CREATE TEMP VIEW ev AS SELECT {select} FROM {LINES} n JOIN site_info s ON s.site = n.site "
                    f"UNION ALL SELECT * FROM {OTHER}")

    def remap(self, sites):
        """Global ids for a scanner's new sites (tuples); the unseen ones wait in ``pending``."""
        out = np.empty(len(sites), np.int32)
        for i, site in enumerate(sites):
            gid = self.ids.get(site)
            if gid is None:
                gid = self.ids[site] = len(self.ids)
                self.pending.append((gid, *site))
            out[i] = gid
        return out

    def classify(self):
        """Classifies the pending sites (one query for them all: each costs as much planning
        as running), adding them to ``site_info``."""
        if not self.pending:
            return
        # one list per column (a statement per site is slow); the listed field's tuples as lists
        columns = [[list(v) if type(v) is tuple else v for v in c] for c in zip(*self.pending)]
        types = ["INTEGER", "VARCHAR", "VARCHAR", "VARCHAR",
                 *("VARCHAR[]" if i == self.listed else "VARCHAR" for i in range(len(self.fields)))]
        self.con.execute("DELETE FROM new_sites")
        self.con.execute("INSERT INTO new_sites SELECT " + ", ".join(f"unnest(${i + 1}::{t}[])" for i, t in
                                                                     enumerate(types)), columns)
        self.con.execute(f"INSERT INTO site_info {self.sql}")
        self.kept = np.zeros(len(self.ids), bool)
        self.kept[[s for (s,) in self.con.execute("SELECT site FROM site_info").fetchall()]] = True
        self.known = len(self.ids)
        self.pending = []


class _Stop(Exception):
    """The scan stopped (an error elsewhere): a worker leaves its file."""


def _put(out, item, stop):
    while True:
        if stop.is_set():
            raise _Stop
        try:
            return out.put(item, timeout=0.2)
        except queue.Full:
            pass


def _read(path, index, fallback, fields, rows, out, stop):
    """Reads one file in a worker thread: puts (index, new sites, columns) per batch on ``out``,
    then (index, None, (damage notes, clock line, lines read, lines sent to the fallback))."""
    fd = os.open(fallback, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        scanner = _core.Scanner(fd, fields, present=ARG_NODE, integer=ARG_STEP, listed=ARG_ATEN_OPS, mark=MARK,
                                mark_limit=SCAN_BYTES, max_line=MAX_LINE)
        damage = Damage(path)
        for _ in scan_text(path, scanner, damage, rows):
            n, sites, *columns = scanner.take()
            if n or sites:
                _put(out, (index, sites, [np.frombuffer(c, t) for c, t in zip(columns, _TYPES)]), stop)
        lines, _, to_fallback = scanner.lines
        _put(out, (index, None, (damage.notes, scanner.mark_line, lines, to_fallback)), stop)
    finally:
        os.close(fd)


def fill(con, paths, indices, tmpdir, fields, classify, args_type, progress=None, threads=None):
    """Adds the events of the files ``paths[i]``, i in ``indices`` (line layout), to table ``ev``
    (made when missing: its columns are those ``classify`` gives). ``fields``: the args fields the
    sites keep; ``classify(source_sql)``: the SELECT giving ``ev``'s rows from a source with the
    columns of DuckDB's ``read_json`` (ph, cat, name, pid, tid, ts, dur, args of type
    ``args_type``, file). Returns (warnings, {index: fallback file (plain lines) or None},
    {index: the first line holding the clock record's mark, or None})."""
    sites = _Sites(con, fields, classify, args_type)
    fallbacks = {i: os.path.join(tmpdir, f"file={i}", "fallback.pfw") for i in indices}
    workers = threads or min(len(indices), os.cpu_count() or 1) or 1
    out, stop, warnings, marks, remaps, deferred = queue.Queue(2 * workers), threading.Event(), {}, {}, {}, []
    held = 0  # events in deferred
    sizes = {i: os.path.getsize(paths[i]) for i in indices}
    total = sum(sizes.values()) or 1
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(_read, paths[i], i, fallbacks[i], fields, ROWS, out, stop) for i in indices]
        try:
            while len(marks) < len(indices):
                try:
                    index, new, columns = out.get(timeout=0.2)
                except queue.Empty:
                    for f in futures:
                        if f.done() and f.exception():
                            raise f.exception()
                    continue
                if new is None:  # the file's end
                    warnings[index], marks[index], lines, to_fallback = columns
                    fallbacks[index] = fallbacks[index] if to_fallback else None
                    if progress:
                        progress(100 * sizes[index] / total)
                    continue
                remaps[index] = np.concatenate([remaps.get(index, np.empty(0, np.int32)), sites.remap(new)])
                columns[0] = remaps[index][columns[0]]
                fresh = columns[0] >= sites.known
                count = np.count_nonzero(fresh)
                if count and (len(sites.pending) >= DEFER_SITES or held + count > DEFER_ROWS):
                    sites.classify()
                elif count:  # a file's first lines (metadata, mostly): classified later with others
                    deferred.append((index, [c[fresh] for c in columns]))
                    held += count
                    columns = [c[~fresh] for c in columns]
                _insert(con, sites, index, *columns)
                if held > DEFER_ROWS // 2 and sites.known == len(sites.ids):  # their sites were classified
                    held = _release(con, sites, deferred)
            sites.classify()
            _release(con, sites, deferred)
        finally:
            stop.set()
    return [w for i in indices for w in warnings[i]], fallbacks, marks  # in input order


def _release(con, sites, deferred):
    """Inserts the deferred events (their sites classified); returns 0, the events still held."""
    for index, columns in deferred:
        _insert(con, sites, index, *columns)
    deferred.clear()
    return 0


def _insert(con, sites, index, site, pid, tid, ts, dur, step):
    """Adds a batch of events of input ``index`` to table :data:`LINES`: those whose site has a kind."""
    keep = sites.kept[site]
    if not keep.all():
        site, pid, tid, ts, dur, step = (c[keep] for c in (site, pid, tid, ts, dur, step))
    con.register("batch", {"site": site, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "step": step})
    try:
        con.execute(f"""INSERT INTO {LINES} SELECT b.site, {int(index)}, coalesce(nullif(b.pid, {_NULL}), -1),
            nullif(b.tid, {_NULL}), b.ts, b.dur, nullif(b.step, {_NULL}) FROM batch b""")
    finally:
        con.unregister("batch")
