"""Op statistics over one or many trace files, computed by DuckDB.

DuckDB parses the NDJSON lines itself (multi-member gzip and multi-frame zstd
included), in parallel, so no Python code runs per event. The ``[``/``]``
lines and a cut last line are skipped (``ignore_errors``). A file DuckDB
cannot decompress (cut inside a gzip member or zstd frame) is decoded by
:mod:`.reader` into a temporary plain file first, keeping what is readable.

What counts as an *op event*: a complete event (``"ph":"X"``) whose args
carry a ``node`` (one executed FX node); traces written by pydftracer's
Dynamo backend, which have no ``node``, count their ``cat:"dynamo"`` events
without a ``graph`` arg. Graph-call events (``cat:"dynamo_graph"``), compile
events (``cat:"dynamo_compile"``), ``start``/``end`` and metadata are not ops;
graph calls and compile events are reported in the totals only (compile time
counts only compile events not nested in another one).
"""

import os
import tempfile

import duckdb

from .reader import Damage, check_trace, compression_of, iter_chunks, rank_of
from .report import VIEWS

# Categories written by dftrace_dynamo.sites (not imported here: it needs torch).
CAT_OP, CAT_GRAPH, CAT_COMPILE = "dynamo", "dynamo_graph", "dynamo_compile"

_COLUMNS = ("{'ph':'VARCHAR','cat':'VARCHAR','name':'VARCHAR','pid':'BIGINT','tid':'BIGINT',"
            "'ts':'DOUBLE','dur':'DOUBLE','args':'STRUCT(graph VARCHAR, node VARCHAR, module VARCHAR, "
            "phase VARCHAR, name VARCHAR)'}")
_INSERT = f"""
INSERT INTO ev
SELECT ?, ph, cat, name, pid, tid, ts, dur, args.graph, args.node, args.module, args.phase, args.name
FROM read_json(?, format=?, compression=?, ignore_errors=true, columns={_COLUMNS})
WHERE ph = 'X' OR (ph = 'M' AND name = 'process_name')
"""
_IS_OP = f"(node IS NOT NULL OR (cat = '{CAT_OP}' AND graph IS NULL))"
_OUTER_COMPILE = f"""
WITH comp AS (SELECT row_number() OVER () AS i, file, pid, tid, ts, dur
              FROM ev WHERE ph = 'X' AND cat = '{CAT_COMPILE}')
SELECT count(*), coalesce(sum(dur) FILTER (WHERE is_outer), 0) FROM (
    SELECT c.dur, NOT EXISTS (
        SELECT 1 FROM comp p WHERE p.file = c.file AND p.pid = c.pid AND p.tid IS NOT DISTINCT FROM c.tid
        AND p.i <> c.i AND p.ts <= c.ts AND p.ts + p.dur >= c.ts + c.dur
        AND (p.ts < c.ts OR p.dur > c.dur OR p.i < c.i)) AS is_outer
    FROM comp c)
"""


def _load_file(con, index, path, layout, damage, tmpdir):
    fmt = "array" if layout == "array" else "newline_delimited"
    try:
        con.execute(_INSERT, [index, path, fmt, compression_of(path) or "none"])
        return
    except duckdb.Error:
        pass  # cut or corrupt compressed data: decode what is readable below
    plain = os.path.join(tmpdir, f"{index}.pfw")
    with open(plain, "wb") as out:
        for chunk in iter_chunks(path, damage):
            out.write(chunk)
    con.execute(_INSERT, [index, plain, fmt, "none"])
    os.unlink(plain)


def _process_labels(con, paths):
    """One display label per (file, pid): process name, rank, pid."""
    names = dict(((f, p), n) for f, p, n in con.execute(
        "SELECT file, pid, any_value(aname) FROM ev WHERE ph = 'M' GROUP BY ALL").fetchall())
    rows = []
    for f, p in con.execute(f"SELECT DISTINCT file, pid FROM ev WHERE {_IS_OP}").fetchall():
        path = paths[f]
        label = names.get((f, p)) or os.path.basename(path).split(".")[0]
        rank = rank_of(path)
        if rank is not None and f"rank{rank}" not in label.replace(" ", ""):
            label = f"rank{rank} {label}"
        rows.append([f, p, f"{label} [pid {p}]"])
    seen = [r[2] for r in rows]
    for r in rows:
        if seen.count(r[2]) > 1:  # same name and pid in several files (several hosts)
            r[2] += f" {os.path.basename(paths[r[0]])}"
    con.execute("CREATE TABLE procs (file INTEGER, pid BIGINT, label VARCHAR)")
    if rows:
        con.executemany("INSERT INTO procs VALUES (?, ?, ?)", rows)


def _key(view, module_depth):
    if view == "op":
        return "name"
    if view == "module":
        mod = "nullif(module, '')"
        if module_depth:
            mod = f"array_to_string(string_split({mod}, '.')[1:{int(module_depth)}], '.')"
        return f"coalesce({mod}, '(top level)')"
    if view == "phase":
        return "coalesce(phase, '(none)')"
    if view == "graph":
        return "'graph ' || coalesce(graph, '?') || coalesce(' ' || phase, '')"
    return "procs.label"


def summarize(paths, views=VIEWS, top=20, module_depth=None, progress=None):
    """Statistics for the trace files ``paths`` (already found, see
    :func:`.reader.find_traces`). Returns a dict (the ``--format json``
    document): totals, ``views`` (view -> rows sorted by total time, at most
    ``top`` each) and ``warnings`` (what could not be read)."""
    layouts = [check_trace(p) for p in paths]
    con = duckdb.connect()
    con.execute("CREATE TABLE ev (file INTEGER, ph VARCHAR, cat VARCHAR, name VARCHAR, pid BIGINT, "
                "tid BIGINT, ts DOUBLE, dur DOUBLE, graph VARCHAR, node VARCHAR, module VARCHAR, phase VARCHAR, aname VARCHAR)")
    warnings = []
    with tempfile.TemporaryDirectory(prefix="dftrace-summary-") as tmpdir:
        for i, (path, layout) in enumerate(zip(paths, layouts)):
            damage = Damage(path)
            _load_file(con, i, path, layout, damage, tmpdir)
            warnings += damage.notes
            if progress:
                progress(os.path.getsize(path))
    _process_labels(con, paths)

    n_ops, op_time = con.execute(f"SELECT count(*), coalesce(sum(dur), 0) FROM ev WHERE ph = 'X' AND {_IS_OP}").fetchone()
    n_graph, graph_time = con.execute(
        f"SELECT count(*), coalesce(sum(dur), 0) FROM ev WHERE ph = 'X' AND cat = '{CAT_GRAPH}'").fetchone()
    n_comp, comp_time = con.execute(_OUTER_COMPILE).fetchone()
    result = {
        "files": list(paths),
        "processes": con.execute("SELECT count(*) FROM procs").fetchone()[0],
        "op_events": n_ops,
        "op_time_us": op_time,
        "graph_calls": n_graph,
        "graph_time_us": graph_time,
        "compile_events": n_comp,
        "compile_time_us": comp_time,
        "views": {},
        "warnings": warnings,
    }
    for view in views:
        source = "ev JOIN procs USING (file, pid)" if view == "process" else "ev"
        rows = con.execute(f"""
            SELECT {_key(view, module_depth)} AS key, count(*), sum(dur), avg(dur),
                   quantile_cont(dur, [0.5, 0.99])
            FROM {source}
            WHERE ph = 'X' AND {_IS_OP}
            GROUP BY key ORDER BY sum(dur) DESC, key LIMIT ?""", [top]).fetchall()
        result["views"][view] = [
            {"key": key, "count": n, "total_us": total, "mean_us": mean, "p50_us": q[0],
             "p99_us": q[1], "share": total / op_time if op_time else 0.0}
            for key, n, total, mean, q in rows
        ]
    con.close()
    return result
