"""What compiled: graphs, graph breaks and recompiles, from the compile events.

Compile events (cat ``dynamo_compile``) carry ``args.kind`` (``compile``,
``graph_break``, ``recompile``, ``backend``, ``instrument``); traces written
before ``kind`` was recorded are recognised by the event name (``graph
break``, ``recompile``, ``backend graph N``, ``instrument ...``). Graph breaks
and recompiles are listed with their reason and source location, grouped when
the same one happened several times (once per process, or per recompile).
"""

import bisect

from ..schema import COMPILE_KINDS as KINDS


def kind_of(record):
    kind = record.get("kind")
    if kind in KINDS:
        return kind
    name = record["name"]
    if name in ("graph break", "recompile"):
        return name.replace(" ", "_")
    if name.startswith("backend graph"):
        return "backend"
    return "instrument" if name.startswith("instrument ") else "compile"


def place(records, slices):
    """Gives each compile record (dicts with file, pid, ts, step) the step whose step slice holds
    it: a step's events carry the step counted when they ran, and a compile that runs while the
    step is still open (a GAN's G compiles after D's optimizer step) may carry the next one.
    Outside every slice a record keeps its own step; in a process without step slices it has
    none. ``slices``: (file, pid, tid, step, ts, dur) rows."""
    by_proc = {}
    for file, pid, _, step, ts, dur in slices:
        by_proc.setdefault((file, pid), []).append((ts, ts + (dur or 0), step))
    for spans in by_proc.values():
        spans.sort()
    for r in records:
        spans = by_proc.get((r["file"], r["pid"]))
        if spans is None:
            r["step"] = None
            continue
        i = bisect.bisect_right(spans, (r["ts"], float("inf"), float("inf"))) - 1
        if i >= 0 and r["ts"] < spans[i][1]:
            r["step"] = spans[i][2]
    return records


def _grouped(records, label):
    """One entry per (reason, location): count, steps and processes where it happened."""
    out = {}
    for r in sorted(records, key=lambda r: r["ts"]):
        key = (r.get("reason") or "(no reason recorded)", r.get("location") or "?")
        entry = out.setdefault(key, {"reason": key[0], "location": key[1], "frame": r.get("frame"),
                                     "count": 0, "steps": [], "processes": []})
        entry["count"] += 1
        if r["step"] is not None and r["step"] not in entry["steps"]:
            entry["steps"].append(r["step"])
        if label(r) not in entry["processes"]:
            entry["processes"].append(label(r))
    return list(out.values())


def report(records, label):
    """The summary's ``compile`` document. ``label(record)`` names its process."""
    by_kind = {k: [r for r in records if kind_of(r) == k] for k in KINDS}
    backends = {(r["file"], r["pid"], r.get("graph")) for r in by_kind["backend"]}
    frames = [r for r in by_kind["compile"] if (r.get("frame") or r["name"].startswith("dynamo compile"))
              and not r.get("reason")]  # a reason: Dynamo gave up on the frame, which made no graph
    # traces that record kinds record each graph the backend compiled (none: Dynamo made no graph,
    # as for FSDP2's modules); older ones only the frames
    return {
        "graphs_compiled": len(backends) if backends or any(r.get("kind") for r in records) else len(frames),
        "compiles": [{"name": r["name"], "process": label(r), "step": r["step"], "dur_us": r["dur"],
                      "frame": r.get("frame"), "location": r.get("location")}
                     for r in sorted(by_kind["compile"], key=lambda r: r["ts"])],
        "graph_breaks": _grouped(by_kind["graph_break"], label),
        "recompiles": _grouped(by_kind["recompile"], label),
    }
