"""Events the user times (log_event) keep their times: start rounded down to
the µs, exact duration, on a "(logged)" track of their thread, so that they
never move the measured events and Perfetto drops none of them."""

import random
import threading

import perfetto_tp
from dftrace_dynamo import _core
from dftrace_dynamo.session import logger
from test_core_format import closed_core, events, open_trace, read_objects  # noqa: F401 (closed_core: autouse fixture)
from test_core_placement import BASE, check_placement, make_tree


def record(tmp_path, nodes, logged, rnd, comp=1):
    """The measured nodes (completion order) with log_event calls for the
    logged ones interleaved at random points."""
    sites = [_core.intern_site(f"n{i}", "tree") for i in range(len(nodes))]
    at = sorted(rnd.randrange(len(nodes) + 1) for _ in logged)
    path = open_trace(tmp_path, comp)
    k = 0
    for i in range(len(nodes) + 1):
        while k < len(logged) and at[k] == i:
            name, s, d = logged[k]
            logger.log_event(name, "user", s / 1000, d / 1000)  # s: a multiple of 250 ns, exact in a float
            k += 1
        if i < len(nodes):
            _core.record(sites[i], nodes[i][0], nodes[i][1])
    assert _core.close()["num_events"] == len(nodes) + len(logged)
    return path


def logged_events(rnd, nodes):
    """(name, start_ns, dur_ns): past events that straddle measured ones,
    nest in each other, overlap each other partially, arrive in any order."""
    lo, hi = nodes[0][0], max(e for _, e, _, _ in nodes)
    out = [
        ("straddle", nodes[len(nodes) // 3][0] + 700, (hi - lo) // 2),  # 3 ms-scale, starts inside an event
        ("tiny", nodes[5][0] + 300, 1000),  # 1 µs inside an op
        ("inner", lo + 10_000, 5_000),
        ("outer", lo + 9_000, 20_000),  # logged after its child
        ("overlap", lo + 12_000, 30_000),  # partially overlaps outer
        ("zero", lo + 12_000, 0),
    ]
    for k in range(300):
        s = rnd.randrange(lo - 50_000, hi)
        out.append((f"fuzz{k}", s, rnd.choice([0, 1, 999, 1000, 2500, rnd.randrange(1, 10**7)])))
    rnd.shuffle(out)
    return [(name, s - s % 250, d) for name, s, d in out]


def test_logged_events_keep_their_times_and_move_nothing(tmp_path):
    rnd = random.Random(8)
    nodes = make_tree(rnd, 30, 3, sub_us=True)
    logged = logged_events(rnd, nodes)
    path = record(tmp_path, nodes, logged, rnd)
    evs = events(read_objects(path))
    measured = [e for e in evs if e["cat"] == "tree"]
    check_placement(nodes, measured)  # exactly as without the logged events
    got = {e["name"]: e for e in evs if e["cat"] == "user"}
    assert len(got) == len(logged)
    main = threading.get_native_id()
    for name, s, d in logged:
        e = got[name]
        assert e["ts"] == s // 1000 and round(e["dur"] * 1000) == d, (name, s, d, e)
        assert e["tid"] != main and e["args"] == {"hhash": e["args"]["hhash"]}

    res = perfetto_tp.query(
        path,
        perfetto_tp.ERROR_STATS_SQL,
        "select s.name as name, s.ts as ts, s.dur as dur, t.tid as tid, t.name as thread "
        "from slice s join thread_track tt on s.track_id = tt.id join thread t using(utid)",
    )
    assert res[0]["rows"] == []  # no slice_drop_overlapping_complete_event
    slices = [r for r in perfetto_tp.as_dicts(res[1]) if r["name"] not in ("start", "end")]
    assert len(slices) == len(nodes) + len(logged)
    for r in slices:
        if r["name"] in got:
            e = got[r["name"]]
            assert (r["ts"], r["dur"]) == (e["ts"] * 1000, round(e["dur"] * 1000))
            assert r["thread"].startswith("MainThread (logged") and r["tid"] == e["tid"]
        else:
            assert r["thread"] == "MainThread" and r["tid"] == main
    tracks = {r["thread"] for r in slices if r["name"] in got}
    assert "MainThread (logged)" in tracks and len(tracks) >= 2  # overlapping ones on a second track


def test_logged_event_in_the_past_is_not_stretched(tmp_path):
    """A 3,000 µs interval logged after the run of ops it covers, and 1 µs inside one of them."""
    nodes = [[BASE + 1000 * k, BASE + 1000 * k + 600, 0, None] for k in range(20)]
    logged = [("past", BASE - BASE % 1000 - 500_000, 3_000_000), ("one", nodes[3][0] + 250 - nodes[3][0] % 250, 1000)]
    path = record(tmp_path, nodes, logged, random.Random(1), comp=0)
    evs = {e["name"]: e for e in events(read_objects(path))}
    assert (evs["past"]["ts"], evs["past"]["dur"]) == (BASE // 1000 - 500, 3000)
    assert (evs["one"]["ts"], evs["one"]["dur"]) == ((nodes[3][0] + 250 - nodes[3][0] % 250) // 1000, 1)
    check_placement(nodes, [e for e in evs.values() if e["cat"] == "tree"])
