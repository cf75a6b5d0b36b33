"""What compiled: graphs, graph breaks and recompiles, from the compile events.

Compile events (cat ``dynamo_compile``) carry ``args.kind`` (``compile``,
``graph_break``, ``recompile``, ``backend``, ``instrument``); traces written
before ``kind`` was recorded are recognised by the event name (``graph
break``, ``recompile``, ``backend graph N``, ``instrument ...``). Graph breaks
and recompiles are listed with their reason and source location, grouped when
the same one happened several times (once per process, or per recompile).
"""

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
    frames = [r for r in by_kind["compile"] if r.get("frame") or r["name"].startswith("dynamo compile")]
    return {
        "graphs_compiled": len(backends) if backends else len(frames),
        "compiles": [{"name": r["name"], "process": label(r), "step": r["step"], "dur_us": r["dur"],
                      "frame": r.get("frame"), "location": r.get("location")}
                     for r in sorted(by_kind["compile"], key=lambda r: r["ts"])],
        "graph_breaks": _grouped(by_kind["graph_break"], label),
        "recompiles": _grouped(by_kind["recompile"], label),
    }
