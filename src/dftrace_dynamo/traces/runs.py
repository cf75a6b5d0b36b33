"""Telling the runs in a set of trace files apart, so they are never added up silently.

A *run* is one launch of a job: one process, or all ranks and workers of
one. Two files belong to the same run when their ``start`` records carry the
same ``run_id`` (written when ``DFTRACER_RUN_ID`` is set, as ``dftrace-dynamo
run`` does). Files without a ``run_id`` (traces written outside ``run``,
older traces, pydftracer's, and the parts ``dftracer_split`` writes, which
keep the ``start`` record in one part only) join the run with a ``run_id``
whose time span they overlap, directly or through other such files, or, failing
that, the run of a file of the same process (pid) that began before them (a split
part after a pause between steps overlaps nothing); the others are grouped by time: the processes of
one job run at the same time, while running a script again starts after the
previous run ended, so files whose time spans (first to last event) overlap,
directly or through other files, are one run, and so are the parts of one
process's file wherever ``dftracer_split`` cut them (the parts after the first
have no ``start`` record and the first's pid).
"""

import datetime

# per input: first and last event time, the start record's args as JSON text (table ev, see summary)
# and a pid of the file's events
SQL = """SELECT file, min(ts), max(ts + coalesce(dur, 0)), any_value(extra) FILTER (WHERE kind = {start}),
any_value(pid) FILTER (WHERE pid >= 0) FROM ev WHERE ts IS NOT NULL GROUP BY file ORDER BY file"""


def _when(ts_us):
    try:
        return datetime.datetime.fromtimestamp(ts_us / 1e6).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, ValueError, OSError):  # not a date: a hand-made or corrupt trace
        return f"at ts {ts_us:g} us"


def find_runs(paths, rows):
    """Runs as ``[{"label", "files": [input index...], "start_us"}]`` in start order,
    from ``rows`` of :data:`SQL` (rows without the pid column are read too)."""
    runs, by_id, timed = [], {}, []
    for file, first, last, start, *pid in rows:
        pid = pid[0] if pid else None
        run_id = (start or {}).get("run_id")
        if run_id:
            if run_id not in by_id:
                by_id[run_id] = {"label": f"run {run_id}", "files": [], "start_us": first, "pids": set()}
                runs.append(by_id[run_id])
            run = by_id[run_id]
            run["files"].append(file)
            run["pids"].add(pid)
            run["start_us"], run["end_us"] = min(run["start_us"], first), max(run.get("end_us", last), last)
        else:
            timed.append((first, last, file, pid, start is not None))
    by_time = []
    for first, last, file, pid, started in sorted(timed):  # a file without run_id during a run with one belongs to it
        run = (next((r for r in runs if first <= r["end_us"] and last >= r["start_us"]), None)
               or next((r for r in runs if pid is not None and pid in r["pids"] and first >= r["start_us"]), None))
        if run:
            run["files"].append(file)
            run["pids"].add(pid)
            run["end_us"] = max(run["end_us"], last)
        else:
            by_time.append((first, last, file, pid, started))
    end, pid_run = None, {}
    for first, last, file, pid, started in sorted(by_time):
        # a later part of a process's file (dftracer_split: no start record) is the run of that
        # process's file with one, even after a gap; a file with its own start is a launch
        run = pid_run.get(pid) if pid is not None and not started else None
        if run is None:
            if end is None or first > end:
                runs.append({"label": None, "files": [], "start_us": first})
                end = last
            run = runs[-1]
        run["files"].append(file)
        if run is runs[-1]:
            end = max(end, last)
        if pid is not None and started:
            pid_run[pid] = run
    seen = {f for r in runs for f in r["files"]}
    if runs and len(seen) < len(paths):  # files without any timed event go with the first run
        runs[0]["files"] += [i for i in range(len(paths)) if i not in seen]
    runs.sort(key=lambda r: r["start_us"])
    for r in runs:
        r["label"] = r["label"] or f"run started {_when(r['start_us'])}"
        r["files"].sort()
        r.pop("end_us", None)
        r.pop("pids", None)
    return runs


def mixed_message(runs, paths, command="summary"):
    """One line naming the runs found in the inputs, for ``command`` (summary, merge)."""
    def files(r):
        names = [paths[i] for i in r["files"]]
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    listed = "; ".join(f"{r['label']}: {files(r)}" for r in runs)
    verb, together = {"summary": ("summarise", "count them together"),
                      "merge": ("merge", "merge them into one file")}[command]
    return (f"the traces hold {len(runs)} different runs, which would be mixed ({listed}); "
            f"{verb} one run at a time (dftrace-dynamo run writes each run to its own directory), "
            f"or add --all-runs to {together}")
