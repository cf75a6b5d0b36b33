"""Aggregates stored in a trace file, so that ``summary`` and ``diff`` need not read every event.

One metadata record (``"ph":"M"``, ``"name":"dftrace_aggregates"``, ``cat``
``dftracer``) holds in ``args`` what the summary needs of the file (see
docs/format.rst, "Aggregate records"): per op/graph group (name, module path,
phase, graph, process, kernel or not; kept per step for the warm-up steps, all
other steps together) its count, timed count, exact sum (integer ns), min, max,
sum of squares and the quantile sketch buckets (:mod:`.sketch`); the step
slices and their per-step sums, the compile records, the evaluation slices, the
events the rank view reads, the per-step samples of ``diff`` and the run's
time span. A file may hold several such records (checkpoints): the last one
counts.

:func:`partial` turns a record into the same mergeable partial as a full scan
of the file (:func:`.summary.scan`), or None when the record cannot answer
exactly: the warm-up steps the reader finds differ from those the record kept
apart, per-step samples are asked for and missing, or the record's version is
unknown, or it is not as documented. It is looked for in the last
few members of the file (:data:`SEARCH_MEMBERS`), each decoded once. :func:`compute` and :func:`write`
make the record from a full scan of the file and store it in it (the trace writer does not
write it yet).
"""

import os

import orjson

from ..schema import CAT_DFTRACER
from . import kernels, steps
from .reader import MAX_LINE, MEMBER_START, TraceError, compression_of, decode_members, starts_a_line
from .report import OP_VIEWS
from .summary import BUCKETED, GRAPH, KIND_NAMES, NS, OP, PROCESS_NAME, load, warm_condition
from .writer import compress

NAME = "dftrace_aggregates"
VERSION = 1
MARKER = b'"name":"' + NAME.encode() + b'"'
MAX_SAMPLES = 100_000  # per-step samples kept at most (else diff reads the events)
# the record is looked for in the last SEARCH_MEMBERS members (plain text: SEARCH_BYTES) of a
# file: a file without one (the common case) costs a summary only that much more decoding
SEARCH_BYTES, SEARCH_MEMBERS = 8 << 20, 4
_GROUP_KEYS = ("name", "module", "phase", "graph")  # then pid; the view keys of a group


def compute(path):
    """The aggregate record (its ``args``) of the trace file ``path``, from a full scan."""
    con, base, info = load([path], [0], rank_rows=True)
    groups = con.execute(f"""
        SELECT kind, name, module, phase, graph, pid, extra IS NOT NULL AND kind = {OP},
               CASE WHEN {warm_condition(info["warmup_keys"])} THEN step END, b, count(*), count(dur), sum({NS}),
               min(dur), max(dur), sum(dur * dur)
        FROM {BUCKETED} WHERE kind IN ({OP}, {GRAPH}) GROUP BY ALL ORDER BY ALL""").fetchall()
    samples = con.execute(f"""
        SELECT grouping(name, module, phase), pid, step, name, module, phase, sum(coalesce({NS}, 0)) FROM ev
        WHERE kind = {OP} AND step IS NOT NULL
        GROUP BY GROUPING SETS ((pid, step, name), (pid, step, module), (pid, step, phase)) ORDER BY ALL""").fetchall()
    names = dict(con.execute(f"SELECT pid, any_value(aname) FROM ev WHERE kind = {PROCESS_NAME} GROUP BY pid")
                 .fetchall())
    info_rows = kernels.view(con, f"kind = {OP}", None)
    con.close()
    views = {0b011: "op", 0b101: "module", 0b110: "phase"}  # grouping() bits of the columns left out
    return {
        "version": VERSION,
        "warmup": sorted([int(p), int(s)] for _, p, s in info["warmup_keys"]),
        "groups": groups,
        "process_names": [[p, n] for p, n in names.items()],
        "kernels": [[r["key"], r["kernel_type"], r["fused_ops"]] for r in info_rows],
        "samples": [[views[m], pid, step, name if m == 0b011 else module if m == 0b101 else phase, ns]
                    for m, pid, step, name, module, phase, ns in samples] if len(samples) <= MAX_SAMPLES else None,
        **{k: base[k] for k in ("runs", "unparsed", "evaluation", "records", "slices", "parts")},
        "rank_rows": base.get("rank_rows"),
    }


def _depth(module, depth):
    if not depth or module == "(top level)":
        return module
    return ".".join(module.split(".")[:depth])


def partial(paths, index, record, views, module_depth=None, include_warmup=False, step_samples=False):
    """The :func:`.summary.scan` partial of ``paths[index]`` from its aggregate ``record``, or None
    when the record cannot give exactly what a full scan gives."""
    if record.get("version") != VERSION or (step_samples and record["samples"] is None):
        return None
    i = index
    records = [dict(r, file=i) for r in record["records"]]
    slices = [(i, *r[1:]) for r in record["slices"]]
    parts = [(i, *r[1:]) for r in record["parts"]]
    info = steps.analyse(slices, parts, records, KIND_NAMES, include_warmup)
    if {(p, s) for _, p, s in info["warmup_keys"]} != {tuple(w) for w in record["warmup"]}:
        return None
    names = list(dict.fromkeys(["phase", "process", *(v for v in views if v in OP_VIEWS)]))
    groups, kernel_rows = [], []
    for kind, name, module, phase, graph, pid, is_kernel, wstep, bucket, *stats in record["groups"]:
        if wstep is not None and not include_warmup:
            continue
        keys = {"op": (name,), "module": (_depth(module, module_depth),), "phase": (phase,),
                "graph": (graph, phase), "process": (i, pid)}
        groups += [(kind, view, keys[view], bucket, *stats[:5], None, None) for view in names]
        if is_kernel:
            kernel_rows.append((name, bucket, *stats[:5]))
    groups += [(PROCESS_NAME, "process", (i, pid), None, 1, 0, 0, None, None, None, name)
               for pid, name in record["process_names"]]
    warm = {tuple(w) for w in record["warmup"]}
    out = {"whole": False, "warnings": [], "runs": [(i, *record["runs"][0][1:])] if record["runs"] else [],
           "unparsed": record["unparsed"], "evaluation": record["evaluation"], "records": records,
           "slices": slices, "parts": parts, "steps": None, "groups": groups,
           "kernels": {"info": {k: (t, f, None) for k, t, f in record["kernels"]}, "rows": kernel_rows}
           if "kernel" in views else None,
           "samples": [(view, _depth(key, module_depth) if view == "module" else key, step, ns)
                       for view, pid, step, key, ns in record["samples"]
                       if view in views and (include_warmup or (pid, step) not in warm)]
           if step_samples else None}
    if record["rank_rows"] is not None:
        columns = [list(c) for c in record["rank_rows"]]
        columns[1] = [i] * len(columns[1])  # the file column
        out["rank_rows"] = columns
    return out


def partials(paths, views, module_depth=None, include_warmup=False, step_samples=False):
    """The partials of every file from its aggregate record, or None when some file has none
    or one cannot answer (the caller then scans the events)."""
    out = []
    for i, path in enumerate(paths):
        record = read(path)
        try:
            got = record and partial(paths, i, record, views, module_depth, include_warmup, step_samples)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):  # a record not as documented
            got = None
        if not got:
            return None
        out.append(got)
    return out


def _members_from_end(path, kind, budget=SEARCH_BYTES, members=SEARCH_MEMBERS):
    """(offset, end, text) of the file's last ``members`` members/frames that start a line, last
    first, within its last ``budget`` bytes, each decoded once; a plain file is one piece from
    its first whole line in that window to its end."""
    size = os.path.getsize(path)
    start = max(0, size - budget)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    if kind is None:
        first = 0 if start == 0 else data.find(b"\n") + 1
        yield start + first, size, data[first:]
        return
    end = pos = len(data)
    while (pos := data.rfind(MEMBER_START[kind], 0, pos)) >= 0:
        if starts_a_line(data[pos:pos + (1 << 18)], kind):
            # a member that large holds no record a reader would take, and must not fill the memory
            text = decode_members(data[pos:end], kind, 2 * MAX_LINE)
            if text is not None:  # else a false start inside compressed data
                yield start + pos, start + end, text
                end = pos
                members -= 1
                if not members:
                    return


def read(path):
    """The last aggregate record (its ``args``) of the trace file ``path``, or None; None too when
    an event follows it (one the record does not hold: the events are read, and checked, instead)."""
    after = b""  # the members after the record's
    try:
        for _, _, text in _members_from_end(path, compression_of(path)):
            if MARKER in text:
                break
            after = text + after
        else:
            return None
    except OSError:
        return None
    at = text.rfind(MARKER)
    end = text.find(b"\n", at) if text.find(b"\n", at) >= 0 else len(text)
    if (text[end:] + after).strip() not in (b"", b"]"):
        return None
    line = text[text.rfind(b"\n", 0, at) + 1:end]
    try:
        return orjson.loads(line.rstrip(b",\r"))["args"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


def write(path, record=None):
    """Stores the aggregate ``record`` (default: :func:`compute`) in the trace file ``path``, as a
    line just before its closing ``]`` (a compressed file's last member/frame is rewritten)."""
    record = record if record is not None else compute(path)
    kind = compression_of(path)
    pids = [p for p, _ in record.get("process_names") or []] + [g[5] for g in record.get("groups") or [] if len(g) > 5]
    pid = pids[0] if pids else 0
    def encode(args):
        return orjson.dumps({"name": NAME, "cat": CAT_DFTRACER, "ph": "M", "pid": pid, "tid": 0, "args": args}) + b"\n"

    line = encode(record)
    if len(line) > MAX_LINE:  # every reader skips longer lines: without the samples (diff reads the events)
        line = encode(dict(record, samples=None))
    if len(line) > MAX_LINE:
        raise TraceError(f"{path}: its aggregates take {len(line) >> 20} MiB, more than a line may hold")
    size = os.path.getsize(path)
    # the last member (plain text: the tail) when it holds the closing ']', else the file's end
    offset, end, text = next(_members_from_end(path, kind), (size, size, b""))
    at = text.rfind(b"]")
    if end != size or at < 0 or text[at + 1:].strip():  # not closed (a running or killed process)
        offset, text, at = size, b"", 0
    text = compress(text[:at] + line + text[at:], kind)
    with open(path, "r+b") as f:
        f.truncate(offset)
        f.seek(offset)
        f.write(text)

