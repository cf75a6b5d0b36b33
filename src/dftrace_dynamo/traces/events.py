"""The events of trace files, as a DuckDB table: the *source* stage of ``summary`` when the files'
aggregate records cannot answer (see docs/design.rst, "Trace analysis").

The files' events are read into ``ev``, in memory (a view over :mod:`.fullscan`'s tables), the events the views need, one
row each. Files in the line layout are read by :mod:`.fullscan` (the C reader: no Python code
runs per event, one thread per file); the lines it does not take (``[``/``]``, a cut last line,
forms of other writers) and JSON array files are parsed by DuckDB's JSON reader
(``ignore_errors``), and every row is classified by the same SQL (:func:`_classify_sql`). What
a damaged compressed file still holds is used, with a warning per damage. A
line longer than :data:`.reader.MAX_LINE`, or an event field of the wrong JSON
type (any event: see :data:`_SUSPECT`), is refused with ``validate``'s message
(:class:`.reader.TraceError`).
DFTracer 2.1+ traces, whose ``ph`` is a number (:data:`.reader.PH_LETTERS`),
are read as if it were the letter.

What counts as an *op event*: a complete event (``"ph":"X"``) of category
``dynamo`` whose args carry a ``node`` (one executed FX node), or of category
``kernel`` (one Inductor kernel call); traces written by pydftracer's Dynamo
backend, which have no ``node``, count their ``cat:"dynamo"`` events without a
``graph`` arg. Graph-call events (``cat:"dynamo_graph"``), compile events
(``cat:"dynamo_compile"``), step structure (``step``, ``data``, ``backward``,
``optimizer``), module slices, ``start``/``end`` and metadata are not ops; graph calls and compile
events are reported in the totals (compile time counts only compile events not
nested in another one of the same thread).
"""

import functools
import json
import os
import tempfile
import threading

import duckdb

import numpy as np

from ..schema import (CAT_COMPILE, CAT_DFTRACER, CAT_EVAL, CAT_GC, CAT_GRAPH, CAT_KERNEL, CAT_MODULE, CAT_OP,
                      CAT_TRAINER)
from ..schema import (ARG_ASYNC, ARG_BYTES, ARG_CUDA_PEAK, ARG_GROUP, ARG_HHASH, ARG_PEAK_RSS, ARG_PEER, ARG_RANK,
                      ARG_RSS, CAT_COMM, CAT_STEP)
from ..schema import ARG_RECOMPUTE, PHASE_RECOMPUTE
from . import clock, compiles, fullscan, kernels, ranks, reader, runs, sketch, steps
from .kinds import (BACKWARD, COMM, COMPILE, DATA, EAGER_FORWARD, EAGER_IN_OPTIMIZER, EAGER_SQL, EVAL, GC, GRAPH,
                    IN_OPTIMIZER, INFERENCE_IN_OPTIMIZER, KIND_NAMES, MODULE, OP, OPTIMIZER, PROCESS_NAME,
                    RANK_COLUMNS, RANK_KINDS, START, STEP, STEP_KINDS, TRAINER, UNPARSED)
from .reader import MAX_LINE, PH_LETTERS, Damage, TraceError, check_trace, compression_of, iter_chunks, tail_damage

# a duration in integer ns: sums of them are exact, so totals do not depend on the order of addition
NS = "CAST(round(dur * 1000) AS BIGINT)"
# table ev with column b: the sketch bucket of each op event's duration (NULL on other rows)
BUCKETED = f"(SELECT *, CASE WHEN kind = {OP} THEN {sketch.key_sql('dur')} END AS b FROM ev)"

# args fields read as text (a value of another JSON type must not make DuckDB drop the line);
# each one costs parsing time on every event: only those a view uses
_INFO = ("kind", "reason", "location", "frame", "run_id")  # of compile events and the start record
# of comm events and step slices (ranks)
_RANK_INFO = (ARG_BYTES, ARG_GROUP, ARG_RANK, ARG_PEER, ARG_ASYNC, ARG_PEAK_RSS, ARG_CUDA_PEAK)
_ARGS = ("graph", "node", "module", "phase", ARG_RECOMPUTE, "name", "step", "kernel_type", *_INFO, *_RANK_INFO)
# args read only to tell an object from another JSON value (see _SUSPECT): keys that events without
# any of _ARGS have (every DFTracer event has hhash; memory counters, rss)
_PRESENT = (ARG_HHASH, ARG_RSS)
# numbers are read as their JSON text (DuckDB would turn a string, a boolean or a fraction into a
# number without a word), then made numbers (column <field>_json: the text)
_ARGS_TYPE = "STRUCT(" + ", ".join(f'"{a}" VARCHAR' for a in (*_PRESENT, *_ARGS)) + ", aten_ops VARCHAR[])"
_COLUMNS = ("{'ph':'VARCHAR','cat':'VARCHAR','name':'VARCHAR','pid':'JSON','tid':'JSON','ts':'JSON',"
            f"'dur':'JSON','args':'{_ARGS_TYPE}'}}")
_NUMBERS = {"pid": "BIGINT", "tid": "BIGINT", "ts": "DOUBLE", "dur": "DOUBLE"}
# Column suspect: true on every event with a field of the wrong JSON type (reader.FIELD_TYPES), and
# on a few right ones. Numbers, exactly: text that is no number (a string is quoted, true, [1]...),
# or for an integer, holds a fraction ('.' or 'e') or is too large for BIGINT. Strings and args are
# read as what DuckDB makes of any JSON value: the text of a number starts with '-' or a digit, of an
# array with '[', of an object with '{', of a boolean is true or false; args that are not an object
# read as an object without any of the keys read. So a name that starts with a digit is a suspect
# too, and args without those keys. cat and ph are tested only on events that their values did not
# classify (_classify_sql). The files with a suspect are checked line by line (reader.wrong_type_error).
_OTHER = "({c} >= '[' AND {c} < '\\') OR ({c} >= '{{' AND {c} < '|') OR {c} IN ('true', 'false')"
_SUSPECT = {
    "a number": "{c} IS NULL",
    "an integer": "({c} IS NULL OR contains({c}_json, '.') OR contains({c}_json, 'e'))",
    "a string": "({c} < 'A' OR " + _OTHER + ")",
    "ph": "(({c} < 'A' AND (contains({c}, '.') OR contains({c}, 'e'))) OR " + _OTHER + ")",  # or an integer
    "an object": "(coalesce(" + ", ".join(f'{{c}}."{a}"' for a in (*_PRESENT, *_ARGS)) + ") IS NULL "
                 "AND {c}.aten_ops IS NULL)",
}


def _suspect_sql(fields):
    """SQL true when one of ``fields`` may have the wrong JSON type (see _SUSPECT)."""
    return " OR ".join(f"({f}{'_json' if f in _NUMBERS else ''} IS NOT NULL AND "
                       + _SUSPECT[f if f == "ph" else reader.FIELD_TYPES[f]].format(c=f) + ")" for f in fields)


# DFTracer 2.1+ ph numbers (read as text) as the letters they replace
_PH = "CASE ph " + " ".join(f"WHEN '{n}' THEN '{c}'" for n, c in PH_LETTERS.items()) + " ELSE ph END"


def _source_sql(sources):
    """UNION ALL of one read_json per (layout, compression) group of files."""
    groups = {}
    for src, _, layout, comp, _ in sources:
        groups.setdefault((layout, comp), []).append(src)
    parts, params = [], []
    for (layout, comp), files in groups.items():
        fmt = "array" if layout == "array" else "newline_delimited"
        # hive_partitioning: the input index comes from the directory name file=N, for free
        parts.append(f"SELECT * FROM read_json(?, format='{fmt}', compression='{comp}', "
                     f"ignore_errors=true, hive_partitioning=true, maximum_object_size={MAX_LINE}, "
                     f"columns={_COLUMNS})")
        params.append(files)
    return " UNION ALL ".join(parts), params


def _classify_sql(module_depth, source_sql):
    """SELECT of the rows of table ``ev`` (the events any view needs, one row each) from a source
    with the columns of :func:`_source_sql`."""
    module = "nullif(e.args.module, '')"
    if module_depth:
        module = f"array_to_string(string_split({module}, '.')[1:{int(module_depth)}], '.')"
    step_kinds = " ".join(f"WHEN e.ph = 'X' AND e.cat = '{cat}' THEN {kind}" for cat, kind in STEP_KINDS.items())
    info = "struct_pack(" + ", ".join(f"{a} := e.args.{a}" for a in ("graph", *_INFO)) + ")"
    rank_info = "struct_pack(" + ", ".join(f'"{a}" := e.args."{a}"' for a in _RANK_INFO) + ")"
    numbers = ", ".join(f"TRY_CAST({f}::VARCHAR AS {t}) AS {f}" for f, t in _NUMBERS.items())
    texts = ", ".join(f"{f} AS {f}_json" for f in _NUMBERS)
    # cat and ph are strings (or ph a number) on the events whose kind compares them with one
    unsure, cat_ph = f"kind IN ({PROCESS_NAME}, {UNPARSED})", _suspect_sql(("cat", "ph"))
    return f"""
SELECT * EXCLUDE (cat, ph) REPLACE (CASE WHEN kind IS NULL THEN true WHEN {unsure} THEN suspect OR {cat_ph}
                                         ELSE suspect END AS suspect) FROM (
    SELECT CASE WHEN e.ph = 'X' AND e.cat = '{CAT_OP}' AND (e.args.node IS NOT NULL OR e.args.graph IS NULL) THEN {OP}
                WHEN e.ph = 'X' AND e.cat = '{CAT_KERNEL}' THEN {OP}
                WHEN e.ph = 'X' AND e.cat = '{CAT_GRAPH}' THEN {GRAPH}
                WHEN e.ph = 'X' AND e.cat = '{CAT_COMPILE}' THEN {COMPILE}
                {step_kinds}
                WHEN e.ph = 'X' AND e.cat = '{CAT_EVAL}' THEN {EVAL}
                WHEN e.ph = 'M' AND e.name = 'process_name' THEN {PROCESS_NAME}
                WHEN e.ph = 'X' AND e.name = 'start' AND e.cat = '{CAT_DFTRACER}' THEN {START}
                WHEN e.ph = 'X' AND e.cat = '{CAT_COMM}' THEN {COMM}
                WHEN e.ph = 'X' AND e.cat = '{CAT_MODULE}' AND e.args.graph IS NULL THEN {MODULE}
                WHEN e.ph = 'X' AND e.cat = '{CAT_GC}' THEN {GC}
                WHEN e.ph = 'X' AND e.cat = '{CAT_TRAINER}' THEN {TRAINER}
                WHEN e.ph IS NULL AND e.name IS NULL THEN {UNPARSED} END AS kind,
           e.file, coalesce(e.name, '(no name)') AS name, coalesce(e.pid, -1) AS pid, e.tid, e.ts, e.dur,
           TRY_CAST(e.args.step AS BIGINT) AS step, e.args.name AS aname,
           coalesce({module}, '(top level)') AS module,
           CASE WHEN e.args.{ARG_RECOMPUTE} = 'true' THEN '{PHASE_RECOMPUTE}'  -- activation checkpointing's
                ELSE coalesce(e.args.phase, '(none)') END AS phase,          -- ops run again in backward
           coalesce(e.args.graph, '?') AS graph,
           CASE WHEN e.cat = '{CAT_COMPILE}' OR (e.name = 'start' AND e.cat = '{CAT_DFTRACER}') THEN to_json({info})::VARCHAR
                WHEN e.cat = '{CAT_KERNEL}' THEN to_json({kernels.INFO})::VARCHAR
                WHEN e.cat IN ('{CAT_COMM}', '{CAT_STEP}') THEN to_json({rank_info})::VARCHAR
                WHEN e.cat = '{CAT_GRAPH}' THEN e.args.phase END AS extra,  -- the rank view's layer
           e.suspect, e.cat, e.ph
    FROM (SELECT *, {_suspect_sql(("name", *_NUMBERS, "args"))} AS suspect
          FROM (SELECT * REPLACE ({_PH} AS ph, {numbers}), {texts} FROM ({source_sql}))) e
) WHERE kind IS NOT NULL OR suspect OR {cat_ph}
"""


# An event's interval in integer ns (ts: integer µs in our traces; a double's ts * 1000 would not be exact)
_SPAN = f"CAST(floor(ts) AS BIGINT) * 1000 + CAST(round((ts - floor(ts)) * 1000) AS BIGINT) AS a, {NS} AS ns"
# each thread's step-structure events in start order, an enclosing event before what it holds
_THREAD = (f"PARTITION BY file, pid, tid ORDER BY a, ns DESC, kind = {OPTIMIZER} DESC "
           "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING")
# The parts rows of the step parts nested in an optimizer event of their thread (IN_OPTIMIZER): the
# graph calls and backward events inside an outermost optimizer event, per its step; the optimizer
# events inside another one, per their own step. The writer nests the displayed intervals as the
# measured ones (docs/design.rst), so an event is inside an optimizer event when one that began
# before it on its thread ends no earlier; the outermost one holding it is the last outermost one
# begun before it. Two window passes over the graph, backward and optimizer events: no join.
_NESTED_SQL = f"""
    WITH ph AS (SELECT file, pid, tid, step, kind, phase, {_SPAN} FROM ev
                WHERE kind IN ({GRAPH}, {BACKWARD}, {OPTIMIZER}) AND step IS NOT NULL AND dur IS NOT NULL),
         held AS (SELECT *, coalesce(max(CASE WHEN kind = {OPTIMIZER} THEN a + ns END) OVER (ROWS_) >= a + ns, false)
                           AS nested FROM ph),
         outer_step AS (SELECT *, last_value(CASE WHEN kind = {OPTIMIZER} AND NOT nested THEN step END IGNORE NULLS)
                                  OVER (ROWS_) AS ostep FROM held)
    SELECT file, pid, CASE WHEN kind = {OPTIMIZER} THEN step ELSE ostep END,
           CASE WHEN kind = {OPTIMIZER} THEN {IN_OPTIMIZER[OPTIMIZER]}
                WHEN kind = {GRAPH} AND phase = 'inference' THEN {INFERENCE_IN_OPTIMIZER}
                WHEN kind = {GRAPH} THEN {IN_OPTIMIZER[GRAPH]} ELSE {IN_OPTIMIZER[BACKWARD]} END,
           kind <> {OPTIMIZER} AND phase = 'backward', sum(ns) / 1000, count(*)
    FROM outer_step WHERE nested GROUP BY ALL""".replace("ROWS_", _THREAD)


# per step (its longest slice: row r), the spans that split its time: layer 0 graph calls, data and
# backward events, 1 optimizer events, 2 the eager forward, 3 garbage collection, 4 compile events
# (a first call's compile in a trainer's call is no part: other, as where no trainer code holds it),
# 5 trainer code
_LAYERS_SQL = f"""
    WITH s AS (SELECT file, pid, step, arg_max(a, ns) AS a, max(ns) AS ns
               FROM (SELECT file, pid, step, {_SPAN} FROM ev
                     WHERE kind = {STEP} AND step IS NOT NULL AND dur IS NOT NULL)
               GROUP BY ALL),
         r AS (SELECT *, row_number() OVER (ORDER BY file, pid, step) - 1 AS r FROM s),
         sp AS (SELECT file, pid, step, CASE WHEN kind = {OPTIMIZER} THEN 1 WHEN {EAGER_SQL} THEN 2
                                             WHEN kind = {GC} THEN 3 WHEN kind = {COMPILE} THEN 4
                                             WHEN kind = {TRAINER} THEN 5 ELSE 0 END AS layer,
                       {_SPAN} FROM ev
                WHERE step IS NOT NULL AND dur IS NOT NULL
                      AND (kind IN ({GRAPH}, {DATA}, {BACKWARD}, {OPTIMIZER}, {GC}, {COMPILE}, {TRAINER}) OR {EAGER_SQL}))
    SELECT r.r, r.file, r.pid, r.step, r.a AS lo, r.a + r.ns AS hi, sp.layer, sp.a, sp.a + sp.ns AS b
    FROM r LEFT JOIN sp USING (file, pid, step) ORDER BY r.r"""


def _split_parts(con):
    """The parts rows that split a step's time by layers (:func:`.ranks.split_layers`, as the rank
    view splits a step), each instant counted once, within the step's slice: the eager forward
    (kinds ``EAGER_FORWARD``, ``EAGER_IN_OPTIMIZER``), its time outside graph calls, data and
    backward events, outside optimizer events and inside them; garbage collection (kind ``GC``),
    its time outside all of those (a collection during an op or a phase is that phase's time);
    trainer code (kind ``TRAINER``), its time outside all of those and compile events."""
    if not con.execute(f"SELECT count(*) FROM ev WHERE step IS NOT NULL AND ({EAGER_SQL} OR kind IN ({GC}, {TRAINER}))"
                       ).fetchone()[0]:
        return []
    c = con.execute(_LAYERS_SQL).fetchnumpy()
    first = np.flatnonzero(np.diff(c["r"], prepend=-1))  # each step's first row
    keys = list(zip(*(c[k][first].tolist() for k in ("file", "pid", "step"))))
    span = ~np.ma.getmaskarray(c["layer"])
    row, layer = np.asarray(c["r"][span], np.int64), np.ma.getdata(c["layer"])[span].astype(np.int64)
    base = int(c["lo"][first].min())  # ns relative to it: exact in the float64 the split uses
    lo, hi = (np.asarray(c[k][first], np.int64) - base for k in ("lo", "hi"))
    a, b = (np.ma.getdata(c[k])[span].astype(np.int64) - base for k in ("a", "b"))

    def split(keep, layers, of):
        return ranks.split_layers(lo, hi, row[keep], of[keep], a[keep], b[keep], layers)

    below = layer < 3  # (each split: the time of its top layer outside the layers under it)
    eager = split(below & (layer != 1), 2, layer // 2)[:, 1]
    outside = split(below, 3, layer)[:, 2]
    gc = split(layer < 4, 4, layer)[:, 3]
    trainer = split(np.ones(len(layer), bool), 6, layer)[:, 5]
    eager_n, gc_n, trainer_n = (np.bincount(row[layer == k], minlength=len(lo)) for k in (2, 3, 5))
    rows = []
    for key, out, in_optimizer, gc_ns, trainer_ns, n_eager, n_gc, n_trainer in zip(
            keys, outside, eager - outside, gc, trainer, eager_n, gc_n, trainer_n):
        if n_eager:
            rows.append((*key, EAGER_FORWARD, False, float(out) / 1000, int(n_eager)))
            if in_optimizer:
                rows.append((*key, EAGER_IN_OPTIMIZER, False, float(in_optimizer) / 1000, int(n_eager)))
        if n_gc:
            rows.append((*key, GC, False, float(gc_ns) / 1000, int(n_gc)))
        if n_trainer:
            rows.append((*key, TRAINER, False, float(trainer_ns) / 1000, int(n_trainer)))
    return rows


def _run(con, sql, params, progress):
    """Runs the query in a thread so the progress bar can follow it."""
    result, error = [], []

    def work():
        try:
            result.append(con.execute(sql, params).fetchall())
        except duckdb.Error as e:
            error.append(e)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    done = 0.0
    while worker.is_alive():
        worker.join(0.2)
        pct = con.query_progress()
        if progress and pct > done:
            progress(pct - done)
            done = pct
    if error:
        raise error[0]
    return result[0]


def _decode(path, plain, damage):
    """Decodes what is readable of a compressed file into the plain file ``plain`` for DuckDB;
    returns ``plain``."""
    with open(plain, "wb") as out:
        for chunk in iter_chunks(path, damage):
            out.write(chunk)
    return plain


def _repair(con, sources):
    """After a failed scan (corrupt data inside a file): finds the inputs
    DuckDB cannot read and replaces their pieces by a plain decoded copy.
    Returns (sources, damage notes)."""
    by_file, notes = {}, []
    for s in sources:
        by_file.setdefault(s[1], []).append(s)
    fixed = []
    for index, group in by_file.items():
        sql, params = _source_sql(group)
        try:
            con.execute(f"SELECT count(ph) FROM ({sql})", params).fetchall()
            fixed += group
            continue
        except duckdb.Error:
            pass
        original, layout = group[0][4], group[0][2]
        damage = Damage(original)
        plain = os.path.join(os.path.dirname(group[0][0]), "whole.pfw")
        fixed.append((_decode(original, plain, damage), index, layout, "none", original))
        notes += damage.notes
    return fixed, notes


def _load(con, paths, indices, module_depth, progress, tmpdir, same_layout=None):
    """Scans the files ``paths[i]`` for i in ``indices`` into table ``ev`` (column ``file``: i);
    returns the warnings (what could not be read) and the clock records of the files read by the
    full scan ({i: args or None}, see :func:`.clock.offsets_us`). ``same_layout``: that of every
    file (else each file's own, see :func:`.reader.check_trace`). Files in the line layout are
    read by :mod:`.fullscan`; the lines it does not take and JSON array files, by DuckDB."""
    # sources: (file DuckDB reads, input index, layout, compression, input path)
    sources, lines, warnings = [], [], []
    for index in indices:
        path = paths[index]
        layout = same_layout or check_trace(path)
        directory = os.path.join(tmpdir, f"file={index}")
        os.mkdir(directory)
        if layout == "lines":
            lines.append(index)
            continue
        kind = compression_of(path)
        link = os.path.join(directory, "0" + {"gzip": ".gz", "zstd": ".zst"}.get(kind, ""))
        os.symlink(os.path.abspath(path), link)
        sources.append((link, index, layout, kind or "none", path))
        if kind is None:
            continue
        damage = Damage(path)
        tail_damage(path, kind, damage)
        if damage.notes and kind == "gzip":  # DuckDB fails on a cut gzip member: decode it here
            damage = Damage(path)
            sources[-1] = (_decode(path, os.path.join(directory, "whole.pfw"), damage), index, layout, "none", path)
        warnings += damage.notes  # DuckDB reads a cut zstd frame without a word
    classify = functools.partial(_classify_sql, module_depth)
    notes, fallbacks, marks = fullscan.fill(con, paths, lines, tmpdir, (*_ARGS, "aten_ops"), classify, _ARGS_TYPE,
                                            progress)
    warnings = notes + warnings
    sources += [(f, i, "lines", "none", paths[i]) for i, f in fallbacks.items() if f]
    clocks = {i: clock.args_of(line) if line else None for i, line in marks.items()}
    for attempt in range(2):
        if not sources:
            break
        source_sql, params = _source_sql(sources)
        try:
            _run(con, f"INSERT INTO {fullscan.OTHER} BY NAME {classify(source_sql)}", params, None if lines else progress)
            break
        except (duckdb.IOException, duckdb.InvalidInputException) as e:
            if "maximum_object_size" in str(e) and (err := reader.oversized_error([paths[i] for i in indices])):
                raise err from None
            if attempt:
                raise TraceError(f"cannot read the traces: {str(e).splitlines()[0]}") from None
            sources, notes = _repair(con, sources)
            warnings += notes
    _check_types(con, paths)
    return warnings, clocks


def _check_types(con, paths):
    """Raises ``validate``'s :class:`.reader.TraceError` for the first file ``paths[i]`` with an event
    field of the wrong JSON type, checking line by line the files the scan found suspects in; then
    drops the suspects' rows that no view reads."""
    files = [f for (f,) in con.execute("SELECT DISTINCT file FROM ev WHERE suspect ORDER BY file").fetchall()]
    for index in files:
        if err := reader.wrong_type_error(paths[index]):
            raise err
    if files:
        con.execute(f"DELETE FROM {fullscan.OTHER} WHERE kind IS NULL")  # (the C reader keeps none)


def load(paths, indices, module_depth=None, include_warmup=False, progress=None, rank_rows=True, analyse=True,
         layout=None, threads=None):
    """Loads the files ``paths[i]``, i in ``indices``, into table ``ev`` of a new DuckDB connection.
    Returns (the connection, the views' common partial: warnings, runs, unparsed lines,
    evaluation slices, compile records, step slices and parts, the rank rows when there are
    step slices and ``rank_rows``; the step analysis of these files, None without ``analyse``).
    ``layout``: that of every file (``"array"``: one JSON array), else found per file; ``threads``:
    DuckDB's (default: one per core)."""
    con = duckdb.connect()
    # rows in any order: the table is filled by both threads without keeping the file order
    # (queries that need an order say so), which makes loading it markedly faster
    con.execute("SET preserve_insertion_order = false")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    # query_progress() needs DuckDB's progress tracking, not its printing (which, on a Dask
    # worker or without a terminal, would only add noise to standard error)
    con.execute(f"SET enable_progress_bar = {bool(progress)}")
    con.execute("SET enable_progress_bar_print = false")
    with tempfile.TemporaryDirectory(prefix="dftrace-summary-") as tmpdir:
        warnings, clocks = _load(con, paths, indices, module_depth, progress, tmpdir, layout)
    out = {"warnings": warnings, "clocks": clocks,
           "runs": con.execute(runs.SQL.format(start=START)).fetchall(),
           "unparsed": con.execute(f"SELECT count(*) FROM ev WHERE kind = {UNPARSED}").fetchone()[0],
           "evaluation": [d for (d,) in con.execute(f"SELECT dur FROM ev WHERE kind = {EVAL}").fetchall()]}
    records = [_record(r) for r in con.execute(
        f"SELECT file, pid, tid, ts, dur, name, step, extra FROM ev WHERE kind = {COMPILE} "
        "ORDER BY file, pid, tid, ts, dur DESC, name").fetchall()]
    slices = con.execute(f"SELECT file, pid, tid, step, ts, dur FROM ev WHERE kind = {STEP} AND step IS NOT NULL "
                         "ORDER BY file, pid, ts, tid, step").fetchall()
    compiles.place(records, slices)  # each compile in the step whose slice holds it
    # per-step sums matter only where steps were marked (every op of any trace carries a step)
    parts = con.execute(f"""
        SELECT file, pid, step, kind, phase = 'backward', sum({NS}) / 1000, count(*) FROM ev
        WHERE kind IN ({GRAPH}, {DATA}, {BACKWARD}, {OPTIMIZER}, {OP}) AND step IS NOT NULL GROUP BY ALL""").fetchall() \
        + con.execute(_NESTED_SQL).fetchall() + _split_parts(con) if slices else []
    out.update(records=records, slices=slices, parts=parts)
    if slices and rank_rows:  # the events the rank analysis reads
        out["rank_rows"] = ranks.rows(con, RANK_KINDS)
    return con, out, steps.analyse(slices, parts, records, KIND_NAMES, include_warmup) if analyse else None


def rank_columns(con):
    """The events of table ``ev`` the rank analysis reads, as columns (:data:`RANK_COLUMNS`)."""
    kinds = ", ".join(str(RANK_KINDS[k]) for k in ("step", "comm", "data", "graph", "backward", "optimizer", "gc",
                                                    "compile", "trainer"))
    rows = con.execute(f"""SELECT {", ".join(RANK_COLUMNS)} FROM ev WHERE step IS NOT NULL AND (kind IN ({kinds})
        OR (kind = {OP} AND starts_with(name, '{ranks.FUNCTIONAL}')))
        UNION ALL SELECT {EAGER_FORWARD}, file, '{KIND_NAMES[EAGER_FORWARD]}', pid, step, ts, dur, NULL
        FROM ({ranks.eager_intervals_sql(EAGER_SQL)})""").fetchall()
    return [list(c) for c in zip(*rows)] if rows else [[] for _ in RANK_COLUMNS]


def rank_rows_of_columns(columns):
    """:func:`.ranks.rows` of the events in :func:`rank_columns` (a small table ``ev`` of their own)."""
    con = duckdb.connect()
    try:
        con.execute(f"CREATE TABLE ev AS SELECT {', '.join(f'unnest(${i + 1}) AS {c}' for i, c in enumerate(RANK_COLUMNS))}",
                    columns)
        return ranks.rows(con, RANK_KINDS)
    finally:
        con.close()


def warm_condition(keys):
    """SQL condition true on the events of the warm-up steps ``keys`` ((file, pid, step)
    tuples; NULL on an event without a step): per process, its warm-up steps as an IN list."""
    by_proc = {}
    for file, pid, step in keys:
        by_proc.setdefault((int(file), int(pid)), set()).add(int(step))
    return " OR ".join(f"(file = {f} AND pid = {p} AND step IN ({', '.join(map(str, sorted(s)))}))"
                       for (f, p), s in sorted(by_proc.items())) or "false"


def warm_filter(con, keys, inline_max=256):
    """SQL condition (``AND ...``) leaving out the events of the warm-up steps ``keys``
    ((file, pid, step) tuples): :func:`warm_condition` (a filter on each row, much cheaper
    than an anti-join over 10 M rows); a table and an anti-join when more than
    ``inline_max`` processes have warm-up steps."""
    if not keys:
        return ""
    if len({(f, p) for f, p, _ in keys}) <= inline_max:
        return f"AND NOT coalesce({warm_condition(keys)}, false)"  # a row without a step is kept
    con.execute("CREATE TEMP TABLE warm (file BIGINT, pid BIGINT, step BIGINT)")
    con.executemany("INSERT INTO warm VALUES (?, ?, ?)", keys)
    return "AND NOT EXISTS (SELECT 1 FROM warm w WHERE w.file = e.file AND w.pid = e.pid AND w.step = e.step)"


def _record(row):
    """A compile event as a dict: where it ran, its args (kind, reason, location...) and step."""
    file, pid, tid, ts, dur, name, step, info = row
    args = {k: v for k, v in json.loads(info or "{}").items() if v is not None}
    return dict(args, file=file, pid=pid, tid=tid, ts=ts, dur=dur or 0.0, name=name, step=step)
