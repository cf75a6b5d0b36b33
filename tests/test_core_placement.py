"""Placement of events on the µs grid: display intervals must keep the measured
tree (children inside parents, siblings disjoint, leaves with their exact
duration) even with many sub-µs siblings, and the real Perfetto trace
processor must load every event at its measured depth with no error stat.
Also: dftracer-utils accepts the gzip file with the exact count."""

import random
import subprocess
import threading

from hypothesis import given, settings, strategies as st

import perfetto_tp
from dftrace_dynamo import _core
from test_core_format import closed_core, events, open_trace, read_objects  # noqa: F401 (closed_core: autouse fixture)
from tracefile import dftracer_tool, dftracer_validate

BASE = 1_763_000_000_000_000_123  # epoch-sized ns, not on a µs boundary


def make_tree(rnd, n_top, max_depth, sub_us, min_gap=0):
    """Measured nodes [start, end, depth, parent] in completion order
    (children before parents, siblings in time order); sibling gaps are at
    least min_gap ns."""
    nodes = []

    def walk(start, depth):
        """Builds one subtree; returns (end, index of its root)."""
        t = start + rnd.randrange(0, 50)
        kids = rnd.randrange(0, 10) if depth < max_depth else 0
        child_ids = []
        for _ in range(kids):
            end, idx = walk(t, depth + 1)
            child_ids.append(idx)
            t = end + rnd.randrange(min_gap, min_gap + (150 if sub_us else 4000))
        end = t + rnd.randrange(1, 300 if sub_us else 6000)
        nodes.append([start, end, depth, None])
        idx = len(nodes) - 1
        for c in child_ids:
            nodes[c][3] = idx
        return end, idx

    t = BASE
    for _ in range(n_top):
        end, _ = walk(t, 0)
        t = end + rnd.randrange(min_gap, min_gap + (300 if sub_us else 10000))
    return nodes


def record_tree(tmp_path, nodes, comp=0, name="tree"):
    sites = [_core.intern_site(f"n{i}", "tree") for i in range(len(nodes))]
    path = open_trace(tmp_path, comp, name=name)
    for i, (s, e, _, _) in enumerate(nodes):
        _core.record(sites[i], s, e)
    assert _core.close()["num_events"] == len(nodes)
    return path


def check_placement(nodes, evs):
    """Display intervals in ns keep the measured tree."""
    by_name = {e["name"]: e for e in evs}
    assert len(by_name) == len(nodes)
    disp = {}
    for i, (s, e, _, _) in enumerate(nodes):
        ev = by_name[f"n{i}"]
        assert isinstance(ev["ts"], int)
        d = round(ev["dur"] * 1000)
        assert abs(ev["dur"] * 1000 - d) < 1e-6 and d >= 0
        disp[i] = (ev["ts"] * 1000, ev["ts"] * 1000 + d)
        assert disp[i][0] >= s // 1000 * 1000  # never earlier than measured
    children = {}
    for i, (_, _, _, p) in enumerate(nodes):
        children.setdefault(p, []).append(i)
    for p, kids in children.items():
        kids.sort(key=lambda k: nodes[k][0])
        for a, b in zip(kids, kids[1:]):
            assert disp[a][1] <= disp[b][0], ("siblings overlap", nodes[a], nodes[b], disp[a], disp[b])
        if p is None:
            continue
        for k in kids:
            assert disp[p][0] <= disp[k][0] and disp[k][1] <= disp[p][1], ("child outside", p, k)
            assert disp[p] != disp[k]
    for i, (s, e, _, _) in enumerate(nodes):
        if i not in children:  # leaf: its measured duration, trimmed to the µs after its end, never empty
            assert disp[i][1] - disp[i][0] == max(e > s, min(e - s, -(-e // 1000) * 1000 - disp[i][0])), i
            assert disp[i][1] <= max(-(-e // 1000) * 1000, disp[i][0] + 1)  # never ends later than that
    return disp


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), sub_us=st.booleans(), depth=st.integers(0, 4))
def test_placement_keeps_measured_tree(tmp_path_factory, seed, sub_us, depth):
    nodes = make_tree(random.Random(seed), 6, depth, sub_us)
    path = record_tree(tmp_path_factory.mktemp("pl"), nodes)
    check_placement(nodes, events(read_objects(path)))


def test_starts_move_less_than_a_microsecond_when_spread_out(tmp_path):
    nodes = make_tree(random.Random(5), 20, 3, sub_us=False, min_gap=1000)
    path = record_tree(tmp_path, nodes)
    disp = check_placement(nodes, events(read_objects(path)))
    for i, (s, _, _, _) in enumerate(nodes):
        assert -1000 < disp[i][0] - s < 1000


def add_burst(nodes, n):
    """A parent holding n back-to-back 3 ns ops: all start within a few µs."""
    start = nodes[-1][1] + 500
    first = len(nodes)
    for k in range(n):
        nodes.append([start + 5 + 4 * k, start + 8 + 4 * k, 1, first + n])
    nodes.append([start, start + 4 * n + 10, 0, None])


def test_burst_of_tiny_ops(tmp_path):
    nodes = make_tree(random.Random(7), 2, 2, sub_us=True)
    add_burst(nodes, 300)
    path = record_tree(tmp_path, nodes)
    disp = check_placement(nodes, events(read_objects(path)))
    parent = len(nodes) - 1
    assert disp[parent][1] - disp[parent][0] > 299 * 1000  # one µs slot per op


def test_perfetto_loads_every_event_at_its_depth(tmp_path):
    nodes = make_tree(random.Random(1234), 40, 4, sub_us=True)
    add_burst(nodes, 200)
    assert len(nodes) > 1000
    path = record_tree(tmp_path, nodes, comp=1)
    check_placement(nodes, events(read_objects(path)))
    res = perfetto_tp.query(
        path,
        perfetto_tp.ERROR_STATS_SQL,
        "select s.name as name, s.depth as depth, s.ts as ts, s.dur as dur, t.tid as tid "
        "from slice s join thread_track tt on s.track_id = tt.id join thread t using(utid)",
        "select t.tid as tid, t.name as name from thread t where t.name is not null",
    )
    assert res[0]["rows"] == []
    slices = perfetto_tp.as_dicts(res[1])
    got = {r["name"]: r for r in slices if r["name"].startswith("n")}
    assert len(got) == len(nodes) and len(slices) == len(nodes) + 2  # + start, end
    for i, (s, e, depth, _) in enumerate(nodes):
        assert got[f"n{i}"]["depth"] == depth, (i, nodes[i])
    # integer-µs ts are exact in Perfetto; leaf durations keep every ns
    evs = {e["name"]: e for e in events(read_objects(path))}
    for name, r in got.items():
        assert r["ts"] == evs[name]["ts"] * 1000
        assert r["dur"] == round(evs[name]["dur"] * 1000)
    names = {r["tid"]: r["name"] for r in perfetto_tp.as_dicts(res[2])}
    assert got["n0"]["tid"] == threading.get_native_id()
    assert names[got["n0"]["tid"]] == "MainThread"


def test_dftracer_utils_accept_gzip(tmp_path):
    event_count = dftracer_tool("dftracer_event_count")
    site = _core.intern_site("op", "dynamo", {"graph": 0})
    d = tmp_path / "traces"
    d.mkdir()
    path = open_trace(d, 1, name="app")
    t = _core.now_ns()
    n = 3000
    for i in range(n):
        _core.record(site, t + i * 1000, t + i * 1000 + 300)
        if i % 1000 == 0:
            _core.flush()  # several members
    _core.close()
    objs = read_objects(path)
    non_meta = sum(o["ph"] != "M" for o in objs)
    assert non_meta == n + 2  # start + events + end
    dftracer_validate(path)
    c = subprocess.run([event_count, "-d", str(d), "--index-dir", str(tmp_path / "idx"),
                        "--log-level", "off"], capture_output=True, text=True, timeout=120)
    assert c.returncode == 0, c.stderr
    assert int(c.stdout.split()[-1]) == non_meta


def assert_properly_nested(evs):
    """No two display intervals overlap partially (Perfetto would drop one)."""
    iv = sorted(((e["ts"] * 1000, e["ts"] * 1000 + round(e["dur"] * 1000)) for e in evs),
                key=lambda x: (x[0], -x[1]))
    open_ends = []
    for s, e in iv:
        while open_ends and open_ends[-1] <= s:
            open_ends.pop()
        assert not open_ends or e <= open_ends[-1], (s, e, open_ends[-1])
        open_ends.append(e)


def test_stack_overflow_degrades_without_overlaps(tmp_path):
    """More than the placement stack holds (65536 open siblings) under a late
    parent: events stay properly nested, none is lost, the newest children are
    inside the parent."""
    n = 70_000
    nodes = [[BASE + 300 * k, BASE + 300 * k + 100, 1, n] for k in range(n)]  # one µs slot each
    nodes.append([BASE + 300 * 10 - 1, nodes[-1][1] + 50, 0, None])
    path = record_tree(tmp_path, nodes)
    evs = events(read_objects(path))
    assert len(evs) == n + 1
    assert_properly_nested(evs)
    parent = evs[-1]
    p0, p1 = parent["ts"] * 1000, parent["ts"] * 1000 + round(parent["dur"] * 1000)
    inside = [e for e in evs[:-1] if p0 <= e["ts"] * 1000 and e["ts"] * 1000 + round(e["dur"] * 1000) <= p1]
    # the stack gives up boundaries between neighbours in pairs, so the parent's start loses at most one
    assert len(inside) >= n - 11, n - len(inside)


def test_a_full_stack_keeps_the_boundary_of_a_long_earlier_sibling(tmp_path):
    """A long event (a step), then a parent beginning where it ends whose 70,000 short children
    arrive before it (a step of eager ops whose end is decided last): every child is inside the
    parent, and the long sibling before it, as measured."""
    n = 70_000
    step = [BASE, BASE + 1_000_000_000, 0, None]
    start = step[1] + 5_000
    kids = [[start + 300 * k + 10, start + 300 * k + 110, 1, n + 1] for k in range(n)]
    nodes = [step, *kids, [start, kids[-1][1] + 50, 0, None]]
    evs = events(read_objects(record_tree(tmp_path, nodes)))
    assert len(evs) == n + 2
    assert_properly_nested(evs)
    first, parent = evs[0], evs[-1]
    assert first["ts"] * 1000 + round(first["dur"] * 1000) <= parent["ts"] * 1000 <= start
    p1 = parent["ts"] * 1000 + round(parent["dur"] * 1000)
    assert all(parent["ts"] <= e["ts"] and e["ts"] * 1000 + round(e["dur"] * 1000) <= p1 for e in evs[1:-1])
