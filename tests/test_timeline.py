"""A timeline that never lies: every way a trace opens puts each event where it happened
(checked against wall-clock marks taken by the training script, see groundtruth.py), and
no event is dropped on other threads, in DataLoader workers or in a forked child."""

import json
import os

import pytest

import groundtruth as gt
from backend_support import run_torchrun
from subproc import run_python, wall_step_shim
from tracefile import read_events, traces

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def _train(tmp_path, mode, *extra, env=None):
    """Runs the ground-truth script with the trace opened the ``mode`` way (``env`` added to its
    environment); its events and marks."""
    marks = tmp_path / "marks.json"
    env = {"GT_LOG": str(tmp_path / "t"), "OMP_NUM_THREADS": "1", **(env or {})}
    if mode in ("lazy", "decorator", "run"):
        env.update(DFTRACER_ENABLE="1", DFTRACER_LOG_FILE=str(tmp_path / "t"))
    if mode == "run":
        run_python(["-m", "dftrace_dynamo", "run", "--compile-all", "--out", str(tmp_path / "runs"),
                    *gt.argv(marks, mode, *extra)], env=env)
        (path,) = traces(tmp_path / "runs", "*/*.pfw*")
    else:
        run_python(gt.argv(marks, mode, *extra), env=env)
        (path,) = traces(tmp_path)
    return read_events(path), gt.load_marks(marks)[0]


@pytest.mark.parametrize("mode", ["before", "after", "lazy", "decorator", "run"])
def test_every_event_is_where_it_happened(tmp_path, mode):
    events, marks = _train(tmp_path, mode)
    assert gt.check(events, marks) == []
    assert gt.coverage(events, marks) >= 0.99


@pytest.mark.parametrize("mode, clock", [("before", "tsc"), ("lazy", "tsc"), ("before", "monotonic")])
def test_a_wall_clock_stepped_forward_mid_run_is_followed(tmp_path, mode, clock):
    """The wall clock steps 50 ms forward after step 1: the events after it are on the new wall
    clock (the writer follows at its next wake, inside the loop's 0.6 s pause), as are the marks;
    with the TSC model ("tsc", where the kernel trusts the TSC) and with clock_gettime."""
    env = {"LD_PRELOAD": str(wall_step_shim(tmp_path)),
           **({"NO_TSC": "1"} if clock == "monotonic" else {})}
    kind = run_python(["-c", "from dftrace_dynamo import _core, dftracer; dftracer.initialize_log('probe/k'); "
                                  "print(_core.stats()['clock'])"], tmp_path, env).stdout
    assert kind.split() == [clock] or clock == "tsc"  # (the TSC where the kernel trusts it)
    events, marks = _train(tmp_path, mode, "--steps", 4, "--wall-step-after", 1, env=env)
    assert gt.check(events, marks) == []
    step2 = [m for m in marks if m[:2] == ["data", 2]]
    last1 = max(m[3] for m in marks if m[1] == 1)
    assert step2 and step2[0][2] - last1 >= 0.65e9  # the step happened: 0.6 s + 50 ms apart


def test_the_last_step_ends_with_what_its_thread_records_after_the_loop(tmp_path):
    """A collection 50 ms after the loop, before the trace closes: it is the last step's (the last
    step holds what runs after the loop, as step 0 holds what ran before it), and that step ends
    where the collection did, not at its optimizer step."""
    events, marks = _train(tmp_path, "before", "--collect-after-ms", 50)
    assert gt.check(events, marks) == []
    (collect,) = [m for m in marks if m[0] == "collect"]
    (last,) = [e for e in gt.x_events(events, gt.main_pid(events)) if e["cat"] == "step"
               and e["args"]["step"] == max(m[1] for m in marks if m[0] == "optimizer")]
    (slice_,) = [e for e in gt.x_events(events) if e["cat"] == "gc" and
                 collect[2] / 1e3 - gt.GRID_US <= e["ts"] and e["ts"] + e["dur"] <= collect[3] / 1e3 + gt.GRID_US]
    assert slice_["args"]["step"] == last["args"]["step"]
    assert abs(last["ts"] + last["dur"] - (slice_["ts"] + slice_["dur"])) <= 1, (last, slice_)


def test_threads_keep_their_slices_while_another_compiles(tmp_path):
    events, marks = _train(tmp_path, "before", "--steps", 24, "--thread-compiles", 6)
    assert gt.check(events, marks) == []
    compiler = [e for e in events if e.get("name") == "thread_name" and e["args"]["name"] == "compiler"]
    assert compiler, "the other thread compiled while this one trained"


def _torchrun(tmp_path, *extra):
    """A 2-rank gloo job of the ground-truth script, traces opened lazily; the ranks' marks (rank ->
    list), the merged trace's events and merge's notes."""
    path = tmp_path / "marks.json"
    run_torchrun(gt.SCRIPT, tmp_path, tmp_path / "ddp", args=[path, "--open", "lazy", "--ddp", *extra])
    marks = {rank: gt.load_marks(f"{path}.{rank}")[0] for rank in (0, 1)}
    merged = tmp_path / "merged.pfw"
    notes = run_python(["-m", "dftrace_dynamo", "merge", *traces(tmp_path, "ddp-*"), "-o", str(merged)]).stderr
    return marks, read_events(str(merged)), notes


def _rank_events(events, rank):
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    (pid,) = [p for p, n in names.items() if n.replace(" ", "").startswith(f"rank{rank}")]
    return [e for e in events if e.get("pid") == pid]


def test_torchrun_ranks_line_up_in_the_merged_view(tmp_path):
    """Ranks on one host read one clock: each measured its offset to rank 0, found it within its
    error bound, and the merged view keeps every event where it happened (to the µs)."""
    marks, events, notes = _torchrun(tmp_path)
    assert "clock" not in notes, notes
    for rank in (0, 1):
        rank_events = _rank_events(events, rank)
        (rec,) = [e["args"] for e in rank_events if e.get("name") == "clock"]
        assert rec["rank"] == rank and abs(rec["clock_offset_ns"]) <= rec["clock_error_ns"], rec
        assert gt.check(rank_events, marks[rank]) == [], rank


def test_a_rank_whose_clock_is_off_lines_up_in_merge_and_summary(tmp_path):
    """Rank 1's clock runs 3 s ahead (as on another host; DFTRACER_TEST_CLOCK_SHIFT_NS): the offset
    measured at process-group setup moves it back, in merge and in summary, to within 1 ms."""
    shift_ns = 3_000_000_000
    marks, events, notes = _torchrun(tmp_path, "--shift-rank1-ns", shift_ns)
    assert "rank1" in notes.replace(" ", "") and "moved onto rank 0's clock" in notes, notes
    (rec,) = [e["args"] for e in _rank_events(events, 1) if e.get("name") == "clock"]
    assert abs(rec["clock_offset_ns"] - shift_ns) <= rec["clock_error_ns"] <= 1_000_000, rec
    for rank in (0, 1):
        assert gt.check(_rank_events(events, rank), marks[rank], grid_us=1000.0) == [], rank
    summary = json.loads(run_python(["-m", "dftrace_dynamo", "summary", "--format", "json", "--by", "rank",
                                     *traces(tmp_path, "ddp-*")]).stdout)
    ranks = summary["ranks"]
    assert ranks["clock"].startswith("measured"), ranks["clock"]
    offsets = {r["rank"]: r["clock_offset_us"] for r in ranks["ranks"]}
    assert offsets["rank0"] == 0 and abs(offsets["rank1"] - shift_ns / 1000) <= 1000, offsets
    assert ranks["skew"]["max_us"] < 1e6  # step ends of the ranks line up, not 3 s apart
    table = run_python(["-m", "dftrace_dynamo", "summary", "--by", "rank", *traces(tmp_path, "ddp-*")]).stdout
    assert "clocks: measured offsets to rank 0" in table, table


@pytest.mark.parametrize("order", ["before", "after"])
def test_dataloader_that_raises_keeps_every_worker_event(tmp_path, order):
    """Two epochs each stopped by the dataset's exception: every worker file is closed and holds
    the items its worker fetched (the prefetched batches of each epoch), whatever the import order."""
    run_python([os.path.join(SCRIPTS, "dataloader_raises.py"), str(tmp_path / "t"), order])
    files = [read_events(p) for p in traces(tmp_path)]
    ends = [any(e.get("name") == "end" for e in evs) for evs in files]
    assert len(files) == 5 and all(ends), ends  # the main process and 2 workers per epoch
    fetched = {int(p.name.rsplit(".", 1)[1]): sorted(map(int, p.read_text().split()))
               for p in tmp_path.glob("t.items.*")}
    assert len(fetched) == 4 and all(fetched.values())
    for evs in files:  # every item a worker fetched is in its file
        pid = next(e["pid"] for e in evs if e.get("name") == "end")
        assert sorted(e["args"]["i"] for e in evs if e.get("name") == "getitem") == fetched.get(pid, []), pid


def test_forked_child_ending_with_os_exit_keeps_all_but_its_last_second(tmp_path):
    """The writer runs again in a child made by os.fork(): ending with os._exit (no atexit) it loses
    at most its last second, as under SIGKILL (a child that lives less than that keeps nothing)."""
    proc = run_python([os.path.join(SCRIPTS, "fork_exit.py"), str(tmp_path / "t")])
    made, last_ns = map(int, proc.stdout.split())
    (child,) = [evs for evs in map(read_events, traces(tmp_path)) if any(e.get("name") == "child" for e in evs)]
    kept = sorted(e["args"]["n"] for e in child if e.get("name") == "child")
    assert kept == list(range(len(kept)))  # nothing missing before the cut
    lost_from = max(e["ts"] for e in child if e.get("name") == "child")
    assert last_ns / 1000 - lost_from <= 1.5e6, (made, len(kept))  # a member at least every second


def test_clock_offset_is_bounded_by_the_barrier_intervals():
    """NTP-style bound from (before, after) reads around shared barriers: a rank whose clock runs
    5 s ahead is measured to within the bound, which the rounds together make tighter than any
    one of them (970, 725 and 1000 ns alone)."""
    from dftrace_dynamo.events.clock import offset

    shift, release = 5_000_000_000, [1_000, 50_000, 90_000]  # true instants the last rank arrived
    # per round: rank 0 read its clock a ns before and b ns after, rank 1 c before and d after
    waits = [(700, 300, 40, 900), (20, 800, 600, 30), (500, 500, 500, 500)]
    ref = [(r - a, r + b) for r, (a, b, _, _) in zip(release, waits)]
    mine = [(r + shift - c, r + shift + d) for r, (_, _, c, d) in zip(release, waits)]
    off, err = offset(mine, ref)
    assert abs(off - shift) <= err == (340 + 50) // 2
