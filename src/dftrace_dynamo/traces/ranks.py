"""Who waits for whom in a multi-rank run, from the per-rank trace files.

Input: what :func:`rows` reads of the summary's DuckDB table ``ev`` (step slices,
``comm`` events, data, graph calls, ``backward``, ``optimizer``, the eager forward, garbage
collection, compile events and trainer code; functional collectives inside
compiled graphs are ``comm`` events, and in traces of earlier versions op
events named ``function._c10d_functional.*``, which count as communication too)
and the compile records.

Clocks: where every rank's trace holds its clock offset to rank 0, measured
when the process group was set up (:mod:`.clock`), those offsets align the
ranks. Otherwise the ranks' clocks are aligned on the collectives themselves. Every
member of a collective finishes it at (nearly) the same instant, when the last
one has arrived and the data has moved, so each process's offset is the median
difference between its collective ends and those of the lowest rank
(``clock_offset_us``). Ranks on one host share a clock to within that.

A collective is matched across ranks by (process group, op, step, its ordinal
among the same op and group in that step), a send and its receive by (process
group, sender, receiver, step, ordinal among theirs: ``send`` or ``isend`` with
``recv`` or ``irecv``; a receive from any source that names no sender stays
unmatched); one in an evaluation counts in the
step of the collective it met on the other ranks (rank 0 evaluates, then every rank
meets at a barrier; with measured clock offsets, else the step before it), and one
that every member made during an evaluation counts in no wait. The **wait** of rank r in a
collective is ``min(latest arrival - arrival of r, its duration)``: the time it
sat in the collective before the last peer arrived; in an async one whose ``wait()`` the
trace holds (``wait <op>`` events), the part of that ``wait()`` before the last peer
arrived, the operation's time in flight outside it being **overlap**. Each wait is charged
to the rank where the delay began (:mod:`.origin`), as the time the waiting rank lost to
it; ``wait_caused`` is, per step, the median over the ranks that lost time to a rank of
what each lost. Per rank and steady step, the wall time is split (each instant counted
once, in this order) into wait, communication (the rest of the collectives' time and of the
``wait()`` calls), data, compute (optimizer, ``backward``, graph calls and the eager forward:
forward), garbage collection, trainer code (outside compile events) and other, the parts of the
step view. Within compute an instant is in its innermost phase, as in the step view: an optimizer
closure's forward and ``backward`` are forward and backward inside the optimizer slice, a backward
graph call is backward, and a graph call of phase inference (a compiled optimizer step's) inside an
optimizer slice is optimizer, else forward.

The first step of the run and warm-up steps are left out. The **straggler** is the rank charged
the most wait per step (median over the steady steps: a step where the wait fell in an
operation that is no event, such as DDP's bucket rebuild at its second iteration, does not
count), named only when that is above the threshold: three times the
run's own step-to-step noise (1.4826 × the median absolute deviation of the
step times, median over the ranks), and at least 5 % of the median step. It comes with how many
ranks it delays and what in it was slower than on its peers (:func:`.origin.cause`).
"""

import itertools
import json
import statistics

import numpy as np

from ..schema import ARG_ASYNC, ARG_CUDA_PEAK, ARG_GROUP, ARG_PEAK_RSS, ARG_PEER, ARG_RANK, COMM_WAIT_PREFIX
from . import clock, compiles, origin
from .kinds import EAGER_SQL
from .steps import quantile

P2P = {"send": True, "isend": True, "recv": False, "irecv": False}  # point-to-point op -> it sends
FUNCTIONAL = "function._c10d_functional."  # op events of functional collectives (events.comm)
PARTS = ("wait", "comm", "data", "compute", "gc", "trainer", "other")  # the rows' parts of a step
PART_KEYS = tuple(f"{c}_us" for c in PARTS)  # the rows' fields
# the layers an instant is counted in, in order (compute: the innermost phase first; "inference":
# graph calls of that phase, forward time where no optimizer slice holds them)
LAYERS = ("wait", "comm", "data", "forward", "backward", "optimizer", "inference", "gc", "compile", "trainer", "other")
COMPUTE = ("forward", "backward", "optimizer", "inference")
# the kinds of the spans that split a step, besides the eager forward; a span of kind k is in layer k
# (a graph call: by its phase; the eager forward: forward; compile events: other, under trainer code)
SPAN_KINDS = ("data", "graph", "backward", "optimizer", "gc", "compile", "trainer")
NOISE_FACTOR, MIN_SHARE = 3.0, 0.05


def _label(paths, file, pid, rank):
    return f"rank{rank}" if rank is not None else f"{paths[file].rsplit('/', 1)[-1].split('.')[0]} [pid {pid}]"


def split_layers(lo, hi, row, layer, start, end, layers):
    """Per row r, the time of [lo[r], hi[r]] in each of ``layers`` layers (the intervals
    [start, end) of that row and layer), an instant counted in the first layer that holds
    it; the rest is the last column. The pieces between a row's consecutive distinct
    boundaries (lo, hi and the interval ends between them) go, in time order, to the first
    layer holding their midpoint: the same sums as adding them one by one, for all rows in a
    few array passes instead of a set of points per row and step."""
    n = len(lo)
    ends_row, ends = np.concatenate([row, row]).astype(np.int32), np.concatenate([start, end])
    # per interval end: 2 × its layer + 1 at an end, -1 where it holds nothing (an empty interval)
    real = end > start
    code = np.concatenate([np.where(real, 2 * layer, -1), np.where(real, 2 * layer + 1, -1)])
    before = ends < lo[ends_row]
    within = ~before & (ends <= hi[ends_row])
    # each row's points by time: its bounds and the interval ends within them
    prow = np.concatenate([np.arange(n, dtype=np.int32), np.arange(n, dtype=np.int32), ends_row[within]])
    pval = np.concatenate([lo, hi, ends[within]])
    key = np.empty(len(prow), complex)  # complex numbers sort by (real, imaginary): one stable
    key.real, key.imag = prow, pval  # sort by (row, time), faster than np.lexsort's two
    order = np.argsort(key, kind="stable")
    prow, pval = prow[order], pval[order]
    code_at = np.concatenate([np.full(2 * n, -1), code[within]])[order]
    distinct = np.ones(len(prow), bool)
    distinct[1:] = (prow[1:] != prow[:-1]) | (pval[1:] != pval[:-1])
    last = np.append(np.flatnonzero(distinct)[1:], len(prow)) - 1  # of each distinct point, its last copy
    prow, pval = prow[distinct], pval[distinct]
    piece = np.flatnonzero(prow[1:] == prow[:-1])  # piece k: pval[k] to pval[k + 1]
    a, b = pval[piece], pval[piece + 1]
    mid = (a + b) / 2
    # the layers holding each midpoint: the starts minus the ends up to it, those at its time
    # included: before the row's start, then from it up to a, and at b where the midpoint
    # rounds onto b (what adding the points in time order would count)
    onto_b = mid == b
    row_start = np.searchsorted(prow, np.arange(n))  # each row's first point
    which = np.full(len(mid), layers)
    for i in reversed(range(layers)):
        if not (layer[real] == i).any():
            continue
        upto = np.cumsum((code_at == 2 * i).astype(np.int64) - (code_at == 2 * i + 1))[last]
        upto -= np.concatenate([[0], upto])[row_start][prow]  # from the row's start
        early = before & (code // 2 == i)
        held = (np.bincount(ends_row[early], np.where(code[early] % 2, -1, 1), n)[prow[piece]] + upto[piece]
                + onto_b * (upto[piece + 1] - upto[piece]))
        which[held > 0] = i
    prow = prow[piece].astype(np.int64)
    return np.bincount(prow * (layers + 1) + which, weights=b - a,
                       minlength=n * (layers + 1)).reshape(n, layers + 1)


def _columns(con, sql):
    """The result of ``sql`` as NumPy columns (file, pid and step as int64; texts: one object per
    distinct text, which keeps a partial sent from a worker small, as pickle sends each object once)."""
    out = {}
    for c, v in con.execute(sql).fetchnumpy().items():  # (tolist: None where a text is NULL)
        if v.dtype == object:
            texts = {}
            out[c] = np.array([texts.setdefault(t, t) for t in v.tolist()], object)
        else:
            out[c] = np.asarray(v)
        out[c] = out[c].astype(np.int64) if c in ("file", "pid", "step") else out[c]
    return out


def _parsed(texts, parse):
    """``parse`` of each of ``texts``, each distinct text parsed once."""
    seen = {}
    return [seen[t] if t in seen else seen.setdefault(t, parse(t)) for t in texts]


def rows(con, kinds):
    """What :func:`analyse` reads of the summary's table ``ev`` (``kinds``: as there), as NumPy
    columns: the step slices (file, pid, step, ts, dur and the memory args: NaN where absent) and
    the collectives (file, pid, step, name, ts, dur, group), by process and time; the spans
    (:data:`SPAN_KINDS` and the eager forward: file, pid, step, kind, ts, dur). Small enough to
    send from a worker: one slice per step, the spans as arrays; the args texts are read here,
    and each collective's and span's step is that of its process's step slice holding it (a
    collective in an evaluation, which has no step: that of the step it follows)."""
    k = kinds
    slices = _columns(con, f"SELECT file, pid, step, ts, coalesce(dur, 0) AS dur, extra FROM ev "
                           f"WHERE kind = {k['step']} AND step IS NOT NULL AND ts IS NOT NULL ORDER BY file, pid, ts")
    memory = _parsed(slices.pop("extra").tolist(), _memory_args)
    for key in (ARG_PEAK_RSS, ARG_CUDA_PEAK):
        slices[key] = np.array([m.get(key, np.nan) for m in memory], float)
    comm = _columns(con, f"""SELECT file, pid, coalesce(step, -1) AS step, name, ts, coalesce(dur, 0) AS dur, extra
        FROM ev WHERE ts IS NOT NULL
        AND (kind = {k['comm']} OR (kind = {k['op']} AND starts_with(name, '{FUNCTIONAL}')))
        ORDER BY file, pid, ts""")
    channels = _parsed(list(zip(comm["name"].tolist(), comm.pop("extra").tolist())), _channel)
    fields = ("group", "name", "op", "pg", "async", "blocked")
    for c, values in zip(fields, zip(*channels) if channels else [comm["name"]] * len(fields)):
        comm[c] = np.array(values, bool if c in ("async", "blocked") else object)
    # a graph call's phase is its extra (traces/events.py); the eager forward as the union of its
    # intervals (in the rank columns of a computed record: kind eager already)
    eager = EAGER_SQL if _has_modules(con) else f"kind = {k['eager']}"
    spans = _columns(con, f"""SELECT file, pid, step, kind, coalesce(extra, '') AS phase, ts, coalesce(dur, 0) AS dur FROM ev
        WHERE step IS NOT NULL AND ts IS NOT NULL AND kind IN ({", ".join(str(k[n]) for n in SPAN_KINDS)})
        UNION ALL SELECT file, pid, step, {k['eager']}, '', ts, dur FROM ({eager_intervals_sql(eager)})""")
    # op time per process, step and module: what in a rank was slower than on its peers (in
    # integer ns, as the aggregate records sum it)
    # (as columns: a Python tuple per row cost seconds for millions of rows)
    ops = _columns(con, f"""SELECT file, pid, step, module, CAST(sum(CAST(round(dur * 1000) AS BIGINT)) AS BIGINT)
        AS ns FROM ev WHERE kind = {k['op']} AND step IS NOT NULL AND dur IS NOT NULL GROUP BY ALL""") \
        if _has_modules(con) else None
    if ops is not None:
        ops["dur"] = ops.pop("ns") / 1000
    # each event in the step whose slice holds it (per process: here, where its file is read)
    steps = _Steps(slices)
    comm["in_step"] = comm["step"] >= 0  # else made during an evaluation
    comm["step"], spans["step"] = steps.step_at(comm), steps.step_at(spans)
    out = {"slices": slices, "comm": comm, "spans": spans}
    if ops is not None:
        out["ops"] = ops
    return out


def eager_intervals_sql(condition):
    """SELECT of (file, pid, step, ts, dur): the union of the intervals of the events of table ``ev``
    where ``condition`` (the eager forward), per process and step: a few rows per step however many
    eager module slices and ops ran."""
    return f"""SELECT file, pid, step, min(ts) AS ts, max(b) - min(ts) AS dur FROM (
        SELECT *, sum(CASE WHEN ts <= prev THEN 0 ELSE 1 END) OVER (
                      PARTITION BY file, pid, step ORDER BY ts, b DESC ROWS UNBOUNDED PRECEDING) AS island
        FROM (SELECT file, pid, step, ts, ts + coalesce(dur, 0) AS b,
                     max(ts + coalesce(dur, 0)) OVER (PARTITION BY file, pid, step ORDER BY ts, ts + coalesce(dur, 0) DESC
                                                      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
              FROM ev WHERE ({condition}) AND step IS NOT NULL AND ts IS NOT NULL))
        GROUP BY file, pid, step, island"""


def module_rows(rows):
    """The op time per process, step and module as :func:`rows`' ``ops`` columns. ``rows``:
    (file, pid, step, module, ns)."""
    rows = list(rows)
    names = ("file", "pid", "step", "module", "ns")
    columns = dict(zip(names, zip(*rows))) if rows else {c: () for c in names}
    out = {c: np.array(columns[c], np.int64) for c in ("file", "pid", "step")}
    out.update(module=np.array(columns["module"], object), dur=np.array(columns["ns"], np.int64) / 1000)
    return out


def _has_modules(con):
    """Whether table ``ev`` holds op events with their module and phase (the rank columns of an
    aggregate record do not)."""
    return {"module", "phase"} <= {c for (c, *_) in con.execute("DESCRIBE ev").fetchall()}


def join(parts):
    """The :func:`rows` of disjoint sets of files as the rows of all of them."""
    parts = [p for p in parts if p is not None]
    if len(parts) < 2:
        return parts[0] if parts else None

    def by_time(field):  # as ORDER BY file, pid, ts would give them
        columns = {c: np.concatenate([p[field][c] for p in parts]) for c in parts[0][field]}
        order = np.lexsort((columns["ts"], columns["pid"], columns["file"]))
        return {c: v[order] for c, v in columns.items()}
    out = {"slices": by_time("slices"), "comm": by_time("comm"),
           "spans": {c: np.concatenate([p["spans"][c] for p in parts]) for c in parts[0]["spans"]}}
    ops = [p["ops"] for p in parts if "ops" in p]
    if ops:
        out["ops"] = {c: np.concatenate([o[c] for o in ops]) for c in ops[0]}
    return out


def analyse(rank_rows, paths, kinds, records, step_info, clocks=None, warnings=None):
    """The rank document (JSON-ready), or None with fewer than two processes with steps.
    ``rank_rows``: what :func:`rows` reads; ``kinds``: the summary's kind numbers by name (step,
    comm, op, data, graph, backward, optimizer); ``clocks``: the clock records known without
    reading the files (see :func:`.clock.offsets_us`); ``warnings`` gets a line for each clock
    record that cannot be right."""
    if rank_rows is None:
        return None
    steps = _Steps(rank_rows["slices"])
    procs = steps.procs
    if len(procs) < 2:
        return None
    file_ranks = clock.ranks(paths, clocks, read=True, only={f for f, _ in procs})
    label = [_label(paths, f, p, file_ranks.get(f)) for f, p in procs]
    comm, spans = rank_rows["comm"], rank_rows["spans"]
    comm_proc, comm_step = steps.index(comm), comm["step"]
    span_proc, span_step = steps.index(spans), spans["step"]
    measured = clock.offsets_us(paths, clocks, warnings)
    if all(f in measured for f, _ in procs):
        _steps_of_evaluations(steps, comm, comm_proc, comm_step, [measured[f][0] for f, _ in procs])
    blocked = _blocked(comm, comm_proc)
    # collectives matched across ranks: (group, op, step, ordinal) -> process -> (start, end, the
    # time blocked in its wait() where it was async and waited for, else None)
    matched, seen = {}, {}
    known = np.flatnonzero((comm_proc >= 0) & ~comm["blocked"])
    in_step = set()  # the collectives some member made in a step (not all during an evaluation)
    for i, q, s, name, ts, dur, group, stepped in zip(
            known.tolist(), comm_proc[known].tolist(), comm_step[known].tolist(),
            *(comm[c][known].tolist() for c in ("name", "ts", "dur", "group", "in_step"))):
        n = seen[(q, s, group, name)] = seen.get((q, s, group, name), -1) + 1
        matched.setdefault((group, name, s, n), {})[q] = (ts, ts + dur, blocked.get(i))
        if stepped:
            in_step.add((group, name, s, n))
    if all(f in measured for f, _ in procs):
        offsets, how = [measured[f][0] for f, _ in procs], "measured offsets to rank 0 (process-group setup)"
    else:
        offsets, how = _offsets(len(procs), matched), "aligned on collective completions"
    shift = np.array(offsets, float)
    # the first step holds the job's start-up (process group, first collectives): never steady
    index = {q: i for i, q in enumerate(procs)}
    warm = {s for f, p, s in step_info["warmup_keys"] if (f, p) in index}
    common = steps.common()
    steady = [s for s in common[1:].tolist() if s not in warm]

    wait_iv, of_step = [], {}  # (proc, step, start, end) of the waits; step -> its operations
    for key, members in matched.items():
        if len(members) < 2 or key not in in_step:
            continue
        s = key[2]
        arrive = {q: members[q][0] - offsets[q] for q in members}
        last_q = max(arrive, key=arrive.get)
        waits = {}
        for q, (ts, end, held) in members.items():
            if held is None:  # blocked from its arrival, until the last peer arrived (at most its duration)
                waits[q] = min(arrive[last_q] - arrive[q], end - ts)
                wait_iv.append((q, s, arrive[q], arrive[q] + waits[q]))
            else:  # async: blocked only in its wait(), up to the last peer's arrival
                held = (held[0] - offsets[q], held[1] - offsets[q])
                waits[q] = max(min(held[1], arrive[last_q]) - held[0], 0.0)
                wait_iv.append((q, s, held[0], held[0] + waits[q]))
        of_step.setdefault(s, []).append({q: (arrive[q], waits[q]) for q in members})

    # the rows: every process's steady steps, process after process; their intervals by layer (PARTS)
    lo, hi = (x - shift[:, None] for x in steps.table(steady))
    n_steady, steady = len(steady), np.array(steady, np.int64)

    def row_of(proc, step):  # the row of each (proc, step), -1 outside the steady steps
        at = np.searchsorted(steady, step)
        inside = at < n_steady
        inside[inside] = steady[at[inside]] == step[inside]
        return np.where(inside & (proc >= 0), proc * n_steady + at, -1)
    wq, ws, wa, wb = (np.array(c, dtype) for c, dtype in
                      zip(zip(*wait_iv) if wait_iv else ([],) * 4, (np.int64, np.int64, float, float)))
    graph = spans["kind"] == kinds["graph"]
    own_layer = ("data", "optimizer", "backward", "gc", "compile", "trainer")
    span_layer = np.select([spans["kind"] == kinds[k] for k in own_layer]
                           + [graph & (spans["phase"] == p) for p in ("backward", "inference")],
                           [LAYERS.index(k) for k in (*own_layer, "backward", "inference")],
                           LAYERS.index("forward"))
    layer = np.concatenate([np.zeros(len(wq), np.int64), np.ones(len(comm_proc), np.int64), span_layer])
    comm_row = row_of(comm_proc, comm_step)
    # an async operation waited for is in flight while the rank computes: its time outside the
    # wait() is overlap, the wait() (an event of its own) is wait or communication
    waited = np.array(sorted(blocked), np.int64)
    held_from = np.array([blocked[i][0] for i in waited.tolist()], float)
    in_flight = np.clip(np.minimum(comm["ts"][waited] + comm["dur"][waited], held_from) - comm["ts"][waited], 0, None)
    overlap = np.bincount(comm_row[waited][comm_row[waited] >= 0], in_flight[comm_row[waited] >= 0], lo.size)
    comm_row[waited] = -1
    row = np.concatenate([row_of(wq, ws), comm_row, row_of(span_proc, span_step)])
    by = np.concatenate([wq, comm_proc, span_proc])
    start = np.concatenate([wa, comm["ts"], spans["ts"]]).astype(float)
    end = np.concatenate([wb, comm["ts"] + comm["dur"], spans["ts"] + spans["dur"]]).astype(float)
    own = row >= 0
    moved = np.ones(len(row), bool)
    moved[:len(wq)] = False  # the waits are on the aligned clock already
    start[own & moved] -= shift[by[own & moved]]
    end[own & moved] -= shift[by[own & moved]]
    split = split_layers(lo.ravel(), hi.ravel(), row[own], layer[own], start[own], end[own], len(LAYERS) - 1)
    part = {name: split[:, LAYERS.index(name)] for name in LAYERS}
    part["compute"] = sum(part[name] for name in COMPUTE)
    part["forward"] = part["forward"] + part.pop("inference")
    part["other"] = part["other"] + part.pop("compile")
    # the wait each rank made the others lose, per neighbour, charged where the delay began
    caused, waiting = np.zeros(lo.shape), np.zeros(lo.shape, np.int64)
    for j, s in enumerate(steady.tolist()):
        lost = origin.charges(of_step.get(s, []))
        for q, (w, n) in origin.per_neighbour(lost, range(len(procs))).items():
            caused[q, j], waiting[q, j] = w, n
    columns = {"wall_us": (hi - lo).ravel().tolist(), "end_us": hi.ravel().tolist(),
               **{f"{c}_us": part[c].tolist() for c in PARTS},
               "wait_caused_us": caused.ravel().tolist(), "overlap_us": overlap.tolist()}
    step_list, rows, per_rank = steady.tolist(), [], []
    for i in range(len(procs)):
        own = {key: values[i * n_steady:(i + 1) * n_steady] for key, values in columns.items()}
        rows += [{"rank": label[i], "step": s, **dict(zip(own, values))} for s, *values in zip(step_list, *own.values())]
        entry = {"rank": label[i], "steps": n_steady, "clock_offset_us": offsets[i]}
        if n_steady:
            entry.update({key: statistics.fmean(own[key]) for key in ("wall_us", *PART_KEYS)})
            entry["wait_caused_us"] = statistics.fmean(own["wait_caused_us"])
            entry["overlap_us"] = statistics.fmean(own["overlap_us"])
            entry["wait_caused_median_us"] = quantile(own["wait_caused_us"], 0.5)
        peaks = steps.memory(i, ARG_PEAK_RSS)
        if peaks:
            entry["peak_rss_max"] = max(peaks)
            entry["peak_rss_median"] = quantile(peaks, 0.5)
        per_rank.append(entry)
    walls = hi - lo
    phases = {name: part[layer].reshape(lo.shape) for name, layer in zip(
        origin.PHASES, ("data", "forward", "backward", "optimizer", "gc", "trainer", "other"))}
    found = _straggler(per_rank, label, walls)
    if found["straggler"] is not None:
        i = label.index(found["straggler"]["rank"])
        found["straggler"]["waiting_ranks"] = int(np.median(waiting[i])) if n_steady else 0
        found["straggler"]["slower"] = origin.cause(
            i, {p: origin.excess(v) for p, v in phases.items()},
            {key: origin.excess(v) for key, v in _module_times(rank_rows.get("ops"), steps, steady).items()})
    return {"ranks": per_rank, "rows": rows, "clock": how,
            **found, "skew": _skew(hi, step_list),
            "memory": _memory(steps, label), "divergence": _divergence(procs, label, records),
            "collectives": sum(1 for m in matched.values() if len(m) > 1)}


def _blocked(comm, comm_proc):
    """{index of an async operation in ``comm``: (start, end) of the time its process was blocked
    in its wait()}: each wait event goes to the earliest async operation of its process, name and
    group issued before it and not yet waited for."""
    pending, out = {}, {}
    for i in np.flatnonzero((comm_proc >= 0) & (comm["async"] | comm["blocked"])).tolist():  # by process, time
        key = (int(comm_proc[i]), comm["op"][i], comm["pg"][i])
        if not comm["blocked"][i]:
            pending.setdefault(key, []).append(i)
        elif pending.get(key):
            out[pending[key].pop(0)] = (float(comm["ts"][i]), float(comm["ts"][i] + comm["dur"][i]))
    return out


def _module_times(ops, steps, steady):
    """{module: op time, a row per process and a column per steady step}."""
    if ops is None or not len(steady):
        return {}
    proc = steps.index(ops)
    at = np.searchsorted(steady, ops["step"])
    keep = (proc >= 0) & (at < len(steady))
    keep[keep] = steady[at[keep]] == ops["step"][keep]
    out = {}
    for q, j, module, dur in zip(proc[keep].tolist(), at[keep].tolist(), ops["module"][keep].tolist(),
                                 ops["dur"][keep].tolist()):
        table = out.setdefault(module, np.zeros((len(steps.procs), len(steady))))
        table[q, j] += dur
    return out


def _steps_of_evaluations(steps, comm, comm_proc, comm_step, offsets) -> None:
    """A collective made during an evaluation counts in the step of the one it met on the other
    ranks (same group and name, overlapping it in time: all members leave it together): the step
    before the evaluation where steps end at their optimizer steps, the one after it where marks
    end them. The peers' own collectives decide, not the step they were in at its end, which
    the members' exits, a few ms apart, can put on either side of a step boundary. Kept as
    :func:`rows` gave it (the step before) where no other rank's collective in a step met it."""
    evaluated = np.flatnonzero(~comm["in_step"] & (comm_proc >= 0))
    if not len(evaluated):
        return
    offsets = np.asarray(offsets, float)
    stepped = np.flatnonzero(comm["in_step"] & (comm_proc >= 0))
    start = comm["ts"][stepped] - offsets[comm_proc[stepped]]  # on rank 0's clock
    end = start + comm["dur"][stepped]
    for i in evaluated.tolist():
        a = comm["ts"][i] - offsets[comm_proc[i]]
        met = ((comm_proc[stepped] != comm_proc[i]) & (comm["group"][stepped] == comm["group"][i])
               & (comm["name"][stepped] == comm["name"][i]) & (start <= a + comm["dur"][i]) & (end >= a))
        found = comm_step[stepped[met]].tolist()
        if found:
            comm_step[i] = max(set(found), key=found.count)


class _Steps:
    """The step slices of every process (:func:`rows`' ``slices``): per process and step the
    last slice (in time order) of that step."""

    def __init__(self, slices):
        n = len(slices.get("ts", ()))
        order = np.lexsort((np.arange(n), slices["step"], slices["pid"], slices["file"])) if n else np.arange(0)
        last = np.ones(n, bool)
        if n:
            same = [slices[c][order] for c in ("file", "pid", "step")]
            last[:-1] = ~((same[0][1:] == same[0][:-1]) & (same[1][1:] == same[1][:-1]) & (same[2][1:] == same[2][:-1]))
        # by process, then step
        self.cols = {c: v[order[last]] for c, v in slices.items()}
        f, p = self.cols["file"], self.cols["pid"]
        first = np.ones(len(f), bool)
        first[1:] = (f[1:] != f[:-1]) | (p[1:] != p[:-1])
        self.procs = list(zip(f[first].tolist(), p[first].tolist()))
        self.proc = np.cumsum(first) - 1
        self.cuts = np.append(np.flatnonzero(first), len(f))
        self.end = self.cols["ts"] + self.cols["dur"]
        # every process's slices by start (then step), one process after the other
        self.by_start = np.lexsort((self.cols["step"], self.cols["ts"], self.proc))
        self.start_sorted, self.end_sorted, self.step_sorted = (
            x[self.by_start] for x in (self.cols["ts"], self.end, self.cols["step"]))

    def index(self, events):
        """The index in :attr:`procs` of each of the ``events``' process, -1 for a process without
        step slices. ``events``: columns file, pid."""
        if not len(events["pid"]) or not self.procs:
            return np.full(len(events["pid"]), -1)
        pids = np.unique(np.concatenate([[p for _, p in self.procs], events["pid"]]))
        known = np.array([f for f, _ in self.procs], np.int64) * len(pids) + np.searchsorted(pids, [p for _, p in self.procs])
        wanted = np.asarray(events["file"], np.int64) * len(pids) + np.searchsorted(pids, events["pid"])
        at = np.minimum(np.searchsorted(known, wanted), len(known) - 1)
        return np.where(known[at] == wanted, at, -1)

    def step_at(self, events):
        """The step of each of the ``events``: that of its process's step slice holding its ``ts``,
        else its own, else (-1: none, as in an evaluation) that of the last slice before it: a
        collective that one rank makes after evaluating and the others in their step is the same
        one. ``events``: columns file, pid, step, ts."""
        proc, step = self.index(events), np.asarray(events["step"], np.int64).copy()
        j, inside = self.last_started(proc, np.asarray(events["ts"], float))
        take = inside | ((j >= 0) & (step < 0))
        step[take] = self.step_sorted[j[take]]
        return step

    def last_started(self, proc, ts):
        """For events of the processes ``proc`` (indices in :attr:`procs`, -1: none) at ``ts``
        (their clocks): the index in the sorted slices of the last slice of their process that
        started by then (-1: none), and whether it still ran then."""
        j = np.full(len(ts), -1, np.int64)
        for i in np.unique(proc[proc >= 0]).tolist():
            own = proc == i
            lo, hi = self.cuts[i], self.cuts[i + 1]
            k = np.searchsorted(self.start_sorted[lo:hi], ts[own], side="right") - 1
            j[own] = np.where(k >= 0, lo + k, -1)
        inside = j >= 0
        inside[inside] = ts[inside] < self.end_sorted[j[inside]]
        return j, inside

    def common(self):
        """The steps every process has, in order."""
        steps, count = np.unique(self.cols["step"], return_counts=True)
        return steps[count == len(self.procs)]

    def table(self, steps):
        """(start, end) of the slices of ``steps`` (which every process has), process by step."""
        keep = np.isin(self.cols["step"], steps)
        shape = (len(self.procs), len(steps))
        return self.cols["ts"][keep].reshape(shape), self.end[keep].reshape(shape)

    def memory(self, i, key):
        """The memory arg ``key`` of the slices of process ``i`` that have it (ints), in step order."""
        values = self.cols[key][self.cuts[i]:self.cuts[i + 1]]
        return [int(v) for v in values[~np.isnan(values)].tolist()]


def _memory_args(extra):
    """The memory args of a step slice as numbers (the table holds them as text)."""
    out = {}
    for key, value in (json.loads(extra) if extra else {}).items():
        if key in (ARG_PEAK_RSS, ARG_CUDA_PEAK) and value is not None:
            try:
                out[key] = int(float(value))
            except ValueError:
                pass
    return out


def _channel(event):
    """What a collective (``(name, extra text)``) is matched by across ranks besides its step and
    ordinal: (its process group, its name); a send and the receive of it: (the group, sender and
    receiver, ``"p2p"``); then the operation's own name and group, whether it was async, and
    whether the event is the time blocked in the ``wait()`` on one (named for it)."""
    name, extra = event
    args = json.loads(extra) if extra else {}
    group, peer, rank = args.get(ARG_GROUP) or "graph", args.get(ARG_PEER), args.get(ARG_RANK)
    is_async = args.get(ARG_ASYNC) in (True, "true")
    blocked = name.startswith(COMM_WAIT_PREFIX)
    if blocked:
        name = name[len(COMM_WAIT_PREFIX):]
    own = (name, group, is_async, blocked)
    if name in P2P and peer is not None and rank is not None:  # (numbers as text, as the table holds them)
        return (f"{group} {rank}->{peer}" if P2P[name] else f"{group} {peer}->{rank}", "p2p", *own)
    return (group, name, *own)


def _offsets(count, matched):
    """Clock offset (µs) of each of ``count`` processes from the lowest one, from the collectives' ends."""
    diffs = [[] for _ in range(count)]
    for members in matched.values():
        if 0 in members:
            for q, (_, end, _) in members.items():
                diffs[q].append(end - members[0][1])
    return [statistics.median(d) if d else 0.0 for d in diffs]


def _mad_sigma(values):
    if len(values) < 2:
        return 0.0
    return 1.4826 * float(np.median(np.abs(values - np.median(values))))


def _straggler(per_rank, label, walls):
    """The straggler (or None), the threshold and the noise it comes from. ``walls``: the step
    times, a row per process (``label``: its rank) and a column per steady step."""
    timed = [r for r in per_rank if r["steps"]]
    if not timed:
        return {"straggler": None, "threshold_us": None, "noise_us": None}
    of_rank = {}
    for i, name in enumerate(label):
        of_rank.setdefault(name, []).append(i)
    noise = statistics.median(_mad_sigma(walls[of_rank[r["rank"]]].ravel()) for r in timed)
    median_step = float(np.median(walls))
    threshold = max(NOISE_FACTOR * noise, MIN_SHARE * median_step)
    top = max(timed, key=lambda r: r["wait_caused_median_us"])
    straggler = None
    if top["wait_caused_median_us"] > threshold:
        straggler = {"rank": top["rank"], "wait_caused_us": top["wait_caused_us"],
                     "wait_caused_median_us": top["wait_caused_median_us"], "steps": top["steps"]}
    return {"straggler": straggler, "threshold_us": threshold, "noise_us": noise}


def _skew(ends, steady):
    """Step-end skew across ranks (max - min of the aligned step ends), per steady step. ``ends``:
    a row per process, a column per steady step."""
    per_step = [{"step": s, "skew_us": v} for s, v in zip(steady, (ends.max(0) - ends.min(0)).tolist())]
    values = [x["skew_us"] for x in per_step]
    return {"median_us": quantile(values, 0.5), "max_us": max(values) if values else None, "steps": per_step}


def _memory(steps, label):
    """Peak resident memory (and CUDA max allocated) per step, each rank's and the largest."""
    rss, cuda = steps.cols[ARG_PEAK_RSS], steps.cols[ARG_CUDA_PEAK]
    if np.isnan(rss).all():
        return []
    order = np.lexsort((steps.proc, steps.cols["step"]))  # by step, then process
    step, proc, rss, cuda = (x[order].tolist() for x in (steps.cols["step"], steps.proc, rss, cuda))
    out = []
    for s, at in itertools.groupby(range(len(step)), step.__getitem__):
        at = list(at)
        by_rank = {label[proc[k]]: rss[k] for k in at}  # (NaN: none)
        by_rank = {r: int(v) for r, v in by_rank.items() if v == v}
        if not by_rank:
            continue
        row = {"step": s, "peak_rss_max": max(by_rank.values()), "peak_rss": by_rank}
        peaks = [int(cuda[k]) for k in at if cuda[k] == cuda[k]]
        if peaks:
            row["cuda_max_allocated_max"] = max(peaks)
        out.append(row)
    return out


def _divergence(procs, label, records):
    """Ranks that compiled a different number of graphs, or recompiled in different steps."""
    per, of_proc = {}, {}
    for r in records:
        of_proc.setdefault((r["file"], r["pid"]), []).append(r)
    for i, q in enumerate(procs):
        own = of_proc.get(q, [])
        rep = compiles.report(own, lambda r: label[i])
        steps = sorted({r["step"] for r in own if compiles.kind_of(r) == "recompile" and r["step"] is not None})
        per[label[i]] = {"graphs_compiled": rep["graphs_compiled"], "recompile_steps": steps}
    kinds = {(v["graphs_compiled"], tuple(v["recompile_steps"])) for v in per.values()}
    if len(kinds) < 2:
        return None
    return per
