"""Statistics over one or many trace files, computed by DuckDB.

DuckDB parses the NDJSON lines itself (multi-member gzip and multi-frame zstd
included) in one parallel scan into an in-memory table of the events the
views need (no Python code runs per event). A large compressed file is cut at
member/frame boundaries into pieces that DuckDB reads in parallel. The
``[``/``]`` lines and a cut last line are skipped (``ignore_errors``). A file
DuckDB cannot decompress (cut inside a gzip member or zstd frame) is decoded by
:mod:`.reader` into a temporary plain file first, keeping what is readable. A
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

When the traces hold step slices, warm-up steps (see :mod:`.steps`) are left
out of every statistic unless ``include_warmup``.
"""

import functools
import json
import math
import mmap
import operator
import os
import tempfile
import threading

import duckdb

from ..schema import CAT_COMPILE, CAT_DFTRACER, CAT_EVAL, CAT_GRAPH, CAT_KERNEL, CAT_OP, STEP_STRUCTURE
from ..schema import (ARG_ASYNC, ARG_BYTES, ARG_CUDA_PEAK, ARG_GROUP, ARG_HHASH, ARG_PEAK_RSS, ARG_PEER, ARG_RANK,
                      ARG_RSS, CAT_COMM, CAT_STEP)
from ..schema import ARG_RECOMPUTE, PHASE_RECOMPUTE
from . import compiles, ranks, reader, runs, sketch, steps
from .reader import (MAX_LINE, MEMBER_START, PH_LETTERS, Damage, TraceError, check_trace,
                     compression_of, iter_chunks, rank_of, starts_a_line, tail_damage)
from . import kernels
from .report import OP_VIEWS, VIEWS

UNPARSED, OP, GRAPH, COMPILE, PROCESS_NAME, STEP, DATA, BACKWARD, OPTIMIZER, START, EVAL = range(11)
COMM = 11  # collectives (ranks)
# step-structure categories -> kind (the step vocabulary, see docs/design.rst)
STEP_KINDS = dict(zip(STEP_STRUCTURE, (STEP, DATA, BACKWARD, OPTIMIZER)))
SAMPLE_VIEWS = ("op", "module", "phase")  # views with per-step samples (step_samples=True)
# the step parts nested in an optimizer event of their thread (an optimizer closure's forward and
# backward, zero_grad inside it, a compiled optimizer step's graph calls), in parts rows of their own
# kinds, per step of the outermost optimizer event (its nested optimizer events: per their own step)
IN_OPTIMIZER = {GRAPH: 12, BACKWARD: 13, OPTIMIZER: 14}
INFERENCE_IN_OPTIMIZER = 15  # nested graph calls with phase inference (a compiled optimizer step)
KIND_NAMES = {GRAPH: "graph", DATA: "data", BACKWARD: "backward", OPTIMIZER: "optimizer", OP: "ops",
              IN_OPTIMIZER[GRAPH]: "graph in optimizer", IN_OPTIMIZER[BACKWARD]: "backward in optimizer",
              IN_OPTIMIZER[OPTIMIZER]: "optimizer in optimizer", INFERENCE_IN_OPTIMIZER: "inference in optimizer"}
RANK_KINDS = {"step": STEP, "comm": COMM, "op": OP, "data": DATA, "graph": GRAPH, "backward": BACKWARD,
              "optimizer": OPTIMIZER}
RANK_COLUMNS = ("kind", "file", "name", "pid", "step", "ts", "dur", "extra")  # of ev, in version 1 aggregates
# a duration in integer ns: sums of them are exact, so totals do not depend on the order of addition
NS = "CAST(round(dur * 1000) AS BIGINT)"
# table ev with column b: the sketch bucket of each op event's duration (NULL on other rows)
BUCKETED = f"(SELECT *, CASE WHEN kind = {OP} THEN {sketch.key_sql('dur')} END AS b FROM ev)"
PIECE_BYTES = 24 << 20  # compressed bytes per piece DuckDB reads in parallel

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
_COLUMNS = ("{'ph':'VARCHAR','cat':'VARCHAR','name':'VARCHAR','pid':'JSON','tid':'JSON','ts':'JSON',"
            "'dur':'JSON','args':'STRUCT(" + ", ".join(f'"{a}" VARCHAR' for a in (*_PRESENT, *_ARGS))
            + ", aten_ops VARCHAR[])'}")
_NUMBERS = {"pid": "BIGINT", "tid": "BIGINT", "ts": "DOUBLE", "dur": "DOUBLE"}
# Column suspect: true on every event with a field of the wrong JSON type (reader.FIELD_TYPES), and
# on a few right ones. Numbers, exactly: text that is no number (a string is quoted, true, [1]...),
# or for an integer, holds a fraction ('.' or 'e') or is too large for BIGINT. Strings and args are
# read as what DuckDB makes of any JSON value: the text of a number starts with '-' or a digit, of an
# array with '[', of an object with '{', of a boolean is true or false; args that are not an object
# read as an object without any of the keys read. So a name that starts with a digit is a suspect
# too, and args without those keys. cat and ph are tested only on events that their values did not
# classify (_load_sql). The files with a suspect are checked line by line (reader.wrong_type_error).
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
_KEYS = ("name", "module", "phase", "graph", "file", "pid")  # all key columns, in result order
_SETS = {
    "op": ("name",),
    "module": ("module",),
    "phase": ("phase",),
    "graph": ("graph", "phase"),
    "process": ("file", "pid"),
}


def _pieces(path, kind, directory):
    """Files for DuckDB to read ``path`` from, in ``directory``, with their
    offsets in it: a link to it, or, for a large gzip/zstd file, copies of
    parts of about PIECE_BYTES cut at member/frame starts, which DuckDB
    decompresses in parallel. A start is used only if decoding from it gives
    the beginning of a line."""
    size = os.path.getsize(path)
    suffix = {"gzip": ".gz", "zstd": ".zst"}.get(kind, "")
    if kind is None or size < 2 * PIECE_BYTES:
        os.symlink(os.path.abspath(path), os.path.join(directory, "0" + suffix))
        return [(os.path.join(directory, "0" + suffix), 0)]
    magic = MEMBER_START[kind]
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cuts, pos = [0], PIECE_BYTES
        while pos < size - PIECE_BYTES // 2:
            pos = data.find(magic, pos)
            if pos < 0:
                break
            if starts_a_line(data[pos:pos + (1 << 18)], kind):
                cuts.append(pos)
                pos += PIECE_BYTES
            else:
                pos += 1
        cuts.append(size)
        pieces = []
        for i, (start, end) in enumerate(zip(cuts, cuts[1:])):
            pieces.append((os.path.join(directory, f"{i}{suffix}"), start))
            with open(pieces[-1][0], "wb") as out:
                out.write(data[start:end])
    return pieces


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


def _load_sql(module_depth, source_sql):
    """SQL that fills table ``ev`` with the events any view needs, one row each."""
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
CREATE TEMP TABLE ev AS
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
                WHEN e.ph IS NULL AND e.name IS NULL THEN {UNPARSED} END AS kind,
           e.file, coalesce(e.name, '(no name)') AS name, coalesce(e.pid, -1) AS pid, e.tid, e.ts, e.dur,
           TRY_CAST(e.args.step AS BIGINT) AS step, e.args.name AS aname,
           coalesce({module}, '(top level)') AS module,
           CASE WHEN e.args.{ARG_RECOMPUTE} = 'true' THEN '{PHASE_RECOMPUTE}'  -- activation checkpointing's
                ELSE coalesce(e.args.phase, '(none)') END AS phase,          -- ops run again in backward
           coalesce(e.args.graph, '?') AS graph,
           CASE WHEN e.cat = '{CAT_COMPILE}' OR (e.name = 'start' AND e.cat = '{CAT_DFTRACER}') THEN to_json({info})::VARCHAR
                WHEN e.cat = '{CAT_KERNEL}' THEN to_json({kernels.INFO})::VARCHAR
                WHEN e.cat IN ('{CAT_COMM}', '{CAT_STEP}') THEN to_json({rank_info})::VARCHAR END AS extra,
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


def _mask(columns, keys):
    """DuckDB's grouping() bits: 1 for each of ``columns`` *not* in ``keys``."""
    return sum(1 << (len(columns) - 1 - i) for i, k in enumerate(columns) if k not in keys)


def _outer_time(events):
    """Total duration of compile events not enclosed by another one of their thread."""
    total, ends = 0.0, {}
    for pid, tid, ts, dur in sorted(events, key=lambda e: (e[0], e[1] or 0, e[2], -e[3])):
        if ts + dur <= ends.get((pid, tid), float("-inf")):
            continue
        ends[(pid, tid)] = ts + dur
        total += dur
    return total


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


def _decode(path, plain, damage, offset=0, size=None):
    """Decodes what is readable of a compressed file (or part) into the plain
    file ``plain`` for DuckDB; returns ``plain``."""
    with open(plain, "wb") as out:
        for chunk in iter_chunks(path, damage, offset, size):
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
    returns the warnings (what could not be read). ``same_layout``: that of every file (else each
    file's own, see :func:`.reader.check_trace`)."""
    sources, warnings = [], []  # sources: (file DuckDB reads, input index, layout, compression, input path)
    for index in indices:
        path = paths[index]
        layout, kind = same_layout or check_trace(path), compression_of(path)
        directory = os.path.join(tmpdir, f"file={index}")
        os.mkdir(directory)
        pieces = _pieces(path, kind, directory)
        sources += [(p, index, layout, kind or "none", path) for p, _ in pieces]
        if kind is None:
            continue
        damage = Damage(path)
        tail_damage(path, kind, damage)
        if damage.notes and kind == "gzip":  # DuckDB fails on a cut gzip member: decode the last piece here
            damage, (last, offset) = Damage(path), pieces[-1]
            plain = _decode(last, os.path.join(directory, "last.pfw"), damage, offset, os.path.getsize(path))
            sources[-1] = (plain, index, layout, "none", path)
        warnings += damage.notes  # DuckDB reads a cut zstd frame without a word
    for attempt in range(2):
        source_sql, params = _source_sql(sources)
        try:
            _run(con, _load_sql(module_depth, source_sql), params, progress)
            _check_types(con, paths)
            return warnings
        except (duckdb.IOException, duckdb.InvalidInputException) as e:
            if "maximum_object_size" in str(e) and (err := reader.oversized_error([paths[i] for i in indices])):
                raise err from None
            if attempt:
                raise TraceError(f"cannot read the traces: {str(e).splitlines()[0]}") from None
            con.execute("DROP TABLE IF EXISTS ev")
            sources, notes = _repair(con, sources)
            warnings += notes


def _check_types(con, paths):
    """Raises ``validate``'s :class:`.reader.TraceError` for the first file ``paths[i]`` with an event
    field of the wrong JSON type, checking line by line the files the scan found suspects in; then
    drops the suspects' rows that no view reads."""
    files = [f for (f,) in con.execute("SELECT DISTINCT file FROM ev WHERE suspect ORDER BY file").fetchall()]
    for index in files:
        if err := reader.wrong_type_error(paths[index]):
            raise err
    if files:
        con.execute("DELETE FROM ev WHERE kind IS NULL")


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
    ``step_samples`` (see :func:`_step_samples`). Raises :class:`TraceError`
    when the files hold several runs, unless ``all_runs``. ``progress(n)`` is
    called with percent steps. ``engine`` (see :mod:`.engines`) scans the files in
    parts and merges them; by default one scan here, with exact quantiles. ``source``:
    ``auto`` reads the aggregate records of the files (:mod:`.aggregates`) when every file has
    one that answers, else scans the events; ``events`` always scans them; ``aggregates``
    never does (TraceError when it would have to). ``processes``: how many local processes read
    the aggregate records (see :func:`.aggregates.partials`; None: one per core for many files)."""
    from . import aggregates

    views = list(dict.fromkeys(views))
    options = {"views": views, "module_depth": module_depth, "include_warmup": include_warmup,
               "step_samples": step_samples}
    note = None
    if source != "events":
        partials, note = aggregates.partials(paths, **options, processes=processes)
        if partials is not None:
            return merge(paths, partials, views, top, include_warmup, all_runs, step_samples,
                         {"source": "aggregates", "engine": "local", "quantiles": "sketch"})
        if source == "aggregates":
            raise TraceError("not every file holds aggregates that answer this summary (see --source)"
                             + (f": {note}" if note else ""))
    if engine is None:
        partials = [scan(paths, range(len(paths)), whole=True, progress=progress, **options)]
    else:
        partials = engine.scan(paths, options, progress)
    result = merge(paths, partials, views, top, include_warmup, all_runs, step_samples)
    if note:  # why the records were not used, first
        result["warnings"].insert(0, note)
    return result


def scan(paths, indices, views=VIEWS, module_depth=None, include_warmup=False, step_samples=False, whole=False,
         progress=None):
    """The mergeable partial result (a picklable dict) of the files ``paths[i]``, i in ``indices``:
    small row sets (runs, compile records, step slices and parts, evaluation slices, the events
    the rank analysis needs) and per group of each op view its count, duration count, exact sum
    (integer ns), min, max and quantile sketch buckets. A process's events are all in one file,
    so the warm-up steps (a per-process rule) are found here. ``whole``: ``indices`` are all
    the inputs; quantiles are then exact and the rank analysis is done here."""
    con, out, info = load(paths, indices, module_depth, include_warmup, progress, rank_rows=not whole)
    warm_filter = _warm_filter(con, info["warmup_keys"]) if not include_warmup else ""
    out.update(whole=whole, steps=info,
               groups=_groups(con, [v for v in views if v in OP_VIEWS], warm_filter, whole),
               kernels=_kernels(con, f"kind = {OP} {warm_filter}", whole) if "kernel" in views else None,
               samples=_step_samples(con, [v for v in views if v in SAMPLE_VIEWS], warm_filter)
               if step_samples else None)
    if whole and out["slices"]:
        out["ranks"] = ranks.analyse(ranks.rows(con, RANK_KINDS), paths, RANK_KINDS, out["records"], info,
                                     warnings=out["warnings"])
    con.close()
    return out


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
        warnings = _load(con, paths, indices, module_depth, progress, tmpdir, layout)
    out = {"warnings": warnings,
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
        + con.execute(_NESTED_SQL).fetchall() if slices else []
    out.update(records=records, slices=slices, parts=parts)
    if slices and rank_rows:  # the events the rank analysis reads
        out["rank_rows"] = ranks.rows(con, RANK_KINDS)
    return con, out, steps.analyse(slices, parts, records, KIND_NAMES, include_warmup) if analyse else None


def merge(paths, partials, views, top, include_warmup=False, all_runs=False, step_samples=False, scan_info=None):
    """The summary (see :func:`summarize`) from the :func:`scan` partials of disjoint sets of
    ``paths``. Counts and sums add up exactly; quantiles come from the merged sketches, or
    are the exact ones of a single ``whole`` scan. ``scan_info``: the document's ``scan``
    (what was read, where), by default that of the local or the Dask engine."""
    whole = len(partials) == 1 and partials[0]["whole"]

    def rows(field, file=operator.itemgetter(0)):  # the partials' rows, in input order (each partial's own order kept)
        return steps.in_order((p[field] for p in partials), file)

    warnings = [w for p in partials for w in p["warnings"]]
    found = runs.find_runs(paths, [(f, first, last, json.loads(start) if start else None, *pid)
                                   for f, first, last, start, *pid in rows("runs")])
    if len(found) > 1 and not all_runs:
        raise TraceError(runs.mixed_message(found, paths))
    records, slices = rows("records", operator.itemgetter("file")), rows("slices")
    step_info = steps.join(p["steps"] for p in partials)
    groups = {}
    for p in partials:
        for kind, view, key, *stats in p["groups"]:
            groups.setdefault((kind, view), {}).setdefault(key, _Stats()).add(*stats)
    unparsed = sum(p["unparsed"] for p in partials)
    result = _result(paths, views, top, groups, warnings, unparsed, records, step_info, found)
    # what was read, where, and how exact the quantiles are
    result["scan"] = scan_info or {"source": "events", "engine": "local" if whole else "dask",
                                   "quantiles": "exact" if whole else "sketch"}
    durations = [d for p in partials for d in p["evaluation"]]
    timed = [d for d in durations if d is not None]
    # evaluation passes (eval slices): apart from the training steps
    result["evaluation"] = {"count": len(durations), "total_us": math.fsum(timed) if timed else None,
                            "mean_us": math.fsum(timed) / len(timed) if timed else None,
                            "median_us": steps.quantile(timed, 0.5)} if durations else None
    if step_samples:
        result["step_samples"] = _merge_samples(views, (p["samples"] for p in partials))
    if "kernel" in views:
        kernel_rows = _kernel_rows([p["kernels"] for p in partials], top)
        if kernel_rows:
            result["views"]["kernel"] = kernel_rows
    if whole or not slices:
        result["ranks"] = partials[0].get("ranks") if whole else None
    else:
        result["ranks"] = _rank_analysis(paths, partials, records, step_info, result["warnings"])
    return result


class _Stats:
    """One group's statistics, merged over partials: count, count and exact sum (ns) of the
    durations, min, max, the exact quantiles (a whole scan) or the sketch, a process name."""

    __slots__ = ("count", "timed", "ns", "quant", "sketch", "aname")

    def __init__(self):
        self.count = self.timed = self.ns = 0
        self.quant, self.sketch, self.aname = None, sketch.Sketch(), None

    def add(self, bucket, count, timed, ns, lo, hi, quant, aname):
        self.count += count
        self.timed += timed
        self.ns += ns or 0
        self.quant = quant or self.quant
        self.aname = self.aname or aname
        if timed and bucket is not None:
            self.sketch.add_bucket(bucket, timed, lo, hi)

    def row(self):
        """count, total, mean, p50, p99 (µs)."""
        total = self.ns / 1000
        p50, p99 = self.quant or (self.sketch.quantile(0.5), self.sketch.quantile(0.99))
        return self.count, total, total / self.timed if self.timed else None, p50, p99


def _groups(con, views, warm_filter, whole):
    """Per grouping set of ``views`` (and phase, process: the totals and labels) and group:
    (kind, set name, key values, sketch bucket, count, durations, sum in ns, min, max,
    exact quantiles or None, process name). A ``whole`` scan gives one row per group with its
    exact quantiles; else one per group and sketch bucket of op events."""
    names = list(dict.fromkeys(["phase", "process", *views]))
    sets = [_SETS[v] for v in names]
    keys = [k for k in _KEYS if any(k in s for s in sets)]
    bucket = "NULL" if whole else "b"
    grouping = ", ".join("(kind, " + ", ".join(s) + ("" if whole else ", b") + ")" for s in sets)
    quant = f"quantile_cont(dur, [0.5, 0.99]) FILTER (WHERE kind = {OP})" if whole else "NULL"
    source = "ev" if whole else BUCKETED
    rows = con.execute(f"""
SELECT kind, grouping({", ".join(keys)}), {", ".join(keys)}, {bucket}, count(*), count(dur), sum({NS}),
       min(dur), max(dur), {quant}, any_value(aname) FILTER (WHERE kind = {PROCESS_NAME})
FROM {source} e WHERE kind IN ({OP}, {GRAPH}, {PROCESS_NAME}) {warm_filter}
GROUP BY GROUPING SETS ({grouping})""").fetchall()
    by_mask = {_mask(keys, s): (name, [keys.index(k) for k in s]) for name, s in zip(names, sets)}
    out = []
    for kind, mask, *rest in rows:
        name, where = by_mask[mask]
        out.append((kind, name, tuple(rest[i] for i in where), *rest[len(keys):]))
    return out


def _kernels(con, where, whole):
    """The kernel view's partial: per kernel name and sketch bucket (one row per name in a
    ``whole`` scan) the same statistics as :func:`_groups`, and per name its kernel type,
    fused ops and, in a whole scan, exact quantiles (:func:`.kernels.view`)."""
    info = {r["key"]: r for r in kernels.view(con, where, None)}
    bucket = "NULL" if whole else sketch.key_sql("dur")
    rows = con.execute(f"""SELECT name, {bucket} AS b, count(*), count(dur), sum({NS}), min(dur), max(dur)
        FROM ev e WHERE extra IS NOT NULL AND {where} GROUP BY ALL""").fetchall()
    return {"info": {k: (r["kernel_type"], r["fused_ops"], (r["p50_us"], r["p99_us"]) if whole else None)
                     for k, r in info.items()},
            "rows": rows}


def _kernel_rows(partials, top):
    """Rows of the kernel view from the :func:`_kernels` partials, largest total first."""
    stats, info = {}, {}
    for p in partials:
        for name, (kind, fused, quant) in p["info"].items():
            old = info.get(name, (kind, "", None))
            ops = {o for o in (old[1] + ", " + fused).split(", ") if o}
            info[name] = (old[0] or kind, ", ".join(sorted(ops)), quant)
        for name, bucket, count, timed, ns, lo, hi in p["rows"]:
            stats.setdefault(name, _Stats()).add(bucket, count, timed, ns, lo, hi, info[name][2], None)
    grand = sum(s.ns for s in stats.values()) / 1000
    out = []
    for name, s in stats.items():
        count, total, mean, p50, p99 = s.row()
        out.append({"key": name, "kernel_type": info[name][0], "count": count, "total_us": total, "mean_us": mean,
                    "p50_us": p50, "p99_us": p99, "share": total / grand if grand else 0.0,
                    "fused_ops": info[name][1]})
    out.sort(key=lambda r: (-r["total_us"], r["key"]))
    return out[:top]


def _rank_analysis(paths, partials, records, step_info, warnings):
    """The rank analysis over the partials' rank rows."""
    clocks = {i: args for p in partials for i, args in (p.get("clocks") or {}).items()}
    return ranks.analyse(ranks.join(p.get("rank_rows") for p in partials), paths, RANK_KINDS, records, step_info,
                         clocks, warnings)


def rank_columns(con):
    """The events of table ``ev`` the rank analysis reads, as columns (:data:`RANK_COLUMNS`)."""
    rows = con.execute(f"""SELECT {", ".join(RANK_COLUMNS)} FROM ev WHERE step IS NOT NULL AND (kind IN
        ({", ".join(str(RANK_KINDS[k]) for k in ("step", "comm", "data", "graph", "backward", "optimizer"))})
        OR (kind = {OP} AND starts_with(name, '{ranks.FUNCTIONAL}')))""").fetchall()
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


def _step_samples(con, views, warm_filter):
    """Rows (view, key, step, op time in that step in ns, all processes together) for the
    views of one key column (op, module, phase): the per-step samples ``diff`` tests."""
    if not views:
        return []
    cols = [_SETS[v][0] for v in views]
    rows = con.execute(f"""
        SELECT grouping({", ".join(cols)}), step, {", ".join(cols)}, sum(coalesce({NS}, 0)) FROM ev e
        WHERE kind = {OP} AND step IS NOT NULL {warm_filter}
        GROUP BY GROUPING SETS ({", ".join(f"(step, {c})" for c in cols)})""").fetchall()
    masks = {_mask(cols, (c,)): (v, i) for i, (v, c) in enumerate(zip(views, cols))}
    return [(masks[mask][0], rest[masks[mask][1]], step, rest[-1]) for mask, step, *rest in rows]


def _merge_samples(views, partials):
    """view -> key -> {step: op time in that step (µs)} from the :func:`_step_samples` rows, keys
    and steps in order. Steps in which a key has no event are absent."""
    ns = {v: {} for v in views if v in SAMPLE_VIEWS}
    for rows in partials:
        for view, key, step, total in rows:
            cell = ns[view].setdefault(key, {})
            cell[step] = cell.get(step, 0) + total
    # sorted: the same order whatever the engine or the order the groups came in
    return {view: {key: {step: v / 1000 for step, v in sorted(keys[key].items())} for key in sorted(keys)}
            for view, keys in ns.items()}


def warm_condition(keys):
    """SQL condition true on the events of the warm-up steps ``keys`` ((file, pid, step)
    tuples; NULL on an event without a step): per process, its warm-up steps as an IN list."""
    by_proc = {}
    for file, pid, step in keys:
        by_proc.setdefault((int(file), int(pid)), set()).add(int(step))
    return " OR ".join(f"(file = {f} AND pid = {p} AND step IN ({', '.join(map(str, sorted(s)))}))"
                       for (f, p), s in sorted(by_proc.items())) or "false"


def _warm_filter(con, keys, inline_max=256):
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


def _result(paths, views, top, groups, warnings, unparsed, records, step_info, found):
    """The summary document from the merged groups ((kind, set name) -> key values -> _Stats)."""
    def total(kind):
        phase_rows = groups.get((kind, "phase"), {}).values()
        return sum(r.count for r in phase_rows), sum(r.ns for r in phase_rows) / 1000

    n_ops, op_time = total(OP)
    n_graph, graph_time = total(GRAPH)
    # DuckDB skips lines it cannot parse; '[', ']' and a cut last line are expected
    unparsed -= 2 * len(paths)
    if unparsed > 0:
        warnings.append(f"{unparsed:,} lines that are not JSON events were skipped "
                        "(corrupt data? dftrace-dynamo validate lists them)")
    names = {key: s.aname for key, s in groups.get((PROCESS_NAME, "process"), {}).items()}
    op_procs = groups.get((OP, "process"), {})
    # one label per process, for every view (the same name in two views means the same process)
    labels = _process_labels(paths, set(op_procs) | {(r["file"], r["pid"]) for r in records}
                             | set(step_info["processes"]), names)
    result = {
        "files": list(paths),
        "runs": [{"run": r["label"], "files": [paths[i] for i in r["files"]]} for r in found],
        "processes": len(labels),  # those with ops, compiles or steps
        "op_events": n_ops,
        "op_time_us": op_time,
        "graph_calls": n_graph,
        "graph_time_us": graph_time,
        "compile_events": len(records),
        "compile_time_us": _outer_time([(r["pid"], r["tid"], r["ts"], r["dur"]) for r in records]),
        "compile": compiles.report(records, lambda r: labels[(r["file"], r["pid"])]),
        "steps": steps.public(step_info, lambda key: labels[key]),
        "views": {},
        "warnings": warnings,
    }
    for view in views:
        if view not in OP_VIEWS:
            continue
        out = []
        for values, stats in groups.get((OP, view), {}).items():
            if view == "process":
                key = labels[values]
            else:
                key = " ".join(map(str, values))
                key = f"graph {key}" if view == "graph" else key
            count, dur, mean, p50, p99 = stats.row()
            out.append({"key": key, "count": count, "total_us": dur, "mean_us": mean, "p50_us": p50,
                        "p99_us": p99, "share": dur / op_time if op_time else 0.0})
        out.sort(key=lambda row: (-row["total_us"], row["key"]))
        result["views"][view] = out[:top]
    return result


def _process_labels(paths, processes, names):
    """One display label per (input, pid) of ``processes``: process name, rank, pid.
    ``names``: (input, pid) -> process_name."""
    labels = {}
    for f, p in processes:
        label = names.get((f, p)) or os.path.basename(paths[f]).split(".")[0]
        rank = rank_of(paths[f])
        if rank is not None and f"rank{rank}" not in label.replace(" ", ""):
            label = f"rank{rank} {label}"
        labels[(f, p)] = f"{label} [pid {p}]"
    seen = list(labels.values())
    for (f, p), label in labels.items():
        if seen.count(label) > 1:  # same name and pid in several files (several hosts)
            labels[(f, p)] = f"{label} {os.path.basename(paths[f])}"
    return labels
