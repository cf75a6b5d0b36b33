"""Distributed runs (torchrun, gloo, CPU): collectives as events, who waits for whom, compile
divergence across ranks and memory per step.

Most jobs run as scenarios of one torchrun job per world size (tests/scripts/dist_train.py
SCENARIOS), each traced into its own run directory: the ranks start and import torch once."""

import json
import os
import pathlib
import statistics
import textwrap

import pytest

from backend_support import TorchrunBatches, inside, run_py, run_python, run_torchrun
from scripts.clitools import summary_json
from tracefile import read_events, traces

SCRIPT = pathlib.Path(__file__).parent / "scripts" / "dist_train.py"
# the straggler's sleep a step: large against what two busy cores add to a step (tens of ms)
DELAY_MS = 150


def job(tmp_path, monkeypatch, nproc=2, **env):
    """The script as an ``nproc``-rank job (settings in the environment torchrun passes on); its
    trace files, by rank."""
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    run_torchrun(SCRIPT, tmp_path, tmp_path / "run" / "job", nproc=nproc)
    files = traces(tmp_path / "run")
    assert len(files) == nproc, files
    return files


# name -> (world size, settings) of the jobs run as scenarios of one job per world size (the
# sleeps' times go to slept.json in the scenario's directory). Those that mark steps with step()
# come last (the others count steps by the optimizer).
SHARED = {
    **{f"ddp-{n}-{ms}": (n, dict(MODE="ddp", STEPS=8, DELAY_MS=ms)) for n in (2, 4) for ms in (DELAY_MS, 0)},
    **{f"pipeline-{n}-{late}-{batch}": (n, dict(MODE="pipeline", STEPS=8, DELAY_MS=30, DELAY_RANK=late,
                                                  **({"BATCH": 1} if batch else {})))
       for n, late, batch in ((2, 0, False), (3, 1, False), (2, 0, True))},
    "fsdp": (2, dict(MODE="fsdp", STEPS=8, DELAY_MS=DELAY_MS)),
    **{f"eval-{everyone}-{marked}": (2, dict(MODE="eval", STEPS=8, EVAL_MS=150, **({"EVAL_ALL": 1} if everyone else {}),
                                             **({"MARK": 1} if marked else {})))
       for everyone, marked in ((False, False), (True, False), (False, True))},
    "eager": (2, dict(MODE="eager", STEPS=3)),
    "functional": (2, dict(MODE="functional", STEPS=3)),
    "recompile": (2, dict(MODE="recompile", STEPS=5)),
}


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """``shared(name)``: (the directory the scenario ran in, its trace files by rank)."""
    batches = TorchrunBatches(SCRIPT, tmp_path_factory.mktemp("dist"), SHARED)

    def get(name):
        directory = batches.dir(name)
        files = traces(directory / "run")
        assert len(files) == SHARED[name][0], files
        return directory, files

    return get


def assert_straggler(info, rank, tmp_path):
    """``rank`` slept before its collectives each step (the times tests/scripts/dist_train.py
    measured, in ``tmp_path / "slept.json"``: on busy cores a sleep ends late): each other rank
    waits for it that long, less what it did itself meanwhile, and at most what ``rank`` did a
    step (the sleep, its compute and the Python between them): what each rank did a step is its
    time not waiting, as the run measured it (busy cores stretch it by tens of ms), within a tenth
    of the sleep."""
    assert info["straggler"] is not None and info["straggler"]["rank"] == rank, info
    slept_us = statistics.median(json.loads((tmp_path / "slept.json").read_text())) * 1e6

    others = max(busy_us(info, r["rank"]) for r in info["ranks"] if r["rank"] != rank)
    assert slept_us - others - 0.1 * slept_us <= info["straggler"]["wait_caused_median_us"] \
        <= busy_us(info, rank) + 0.1 * slept_us, (slept_us, others, busy_us(info, rank), info)


def busy_us(info, rank):
    """What ``rank`` did a step, median over the steady steps: its time not waiting."""
    return statistics.median(sum(x[p] for p in ("comm_us", "data_us", "compute_us", "gc_us", "trainer_us", "other_us"))
                             for x in info["rows"] if x["rank"] == rank)


def assert_backed(info):
    """A straggler named where no rank slept (two busy cores may really slow one rank) must be
    what the rows show: above the threshold, every other rank waited at least half of what it
    is charged, and it did at least that much more a step than the busiest of the others."""
    s = info["straggler"]
    caused = s["wait_caused_median_us"]
    assert caused > info["threshold_us"], info
    others = [r["rank"] for r in info["ranks"] if r["rank"] != s["rank"]]
    for r in others:
        assert statistics.median(x["wait_us"] for x in info["rows"] if x["rank"] == r) >= 0.5 * caused, (r, info)
    assert busy_us(info, s["rank"]) - max(busy_us(info, r) for r in others) >= 0.5 * caused, info


def comm_events(path, waits=False):
    """The comm events of a trace file; with ``waits``, only the time blocked in the wait() of
    async operations (``wait <op>``), else all but those."""
    return [e for e in read_events(path) if e.get("cat") == "comm" and e["name"].startswith("wait ") == waits]


def test_eager_collectives_counts_and_bytes(shared):
    for rank, path in enumerate(shared("eager")[1]):
        got = {}
        for e in comm_events(path):
            a = e["args"]
            assert a["op"] == e["name"] and a["group_size"] == 2 and a["rank"] == rank, e
            got.setdefault((e["name"], a["bytes"], a.get("dtype"), a.get("async_op", False)), []).append(a["step"])
        got = {key: sorted(steps) for key, steps in got.items()}  # async ones are written on completion
        assert got == {("all_reduce", 4000, "float32", False): [0, 1, 2], ("broadcast", 80, "float64", False): [0, 1, 2],
                       ("all_gather", 20, "int32", False): [0, 1, 2], ("all_reduce", 1024, "float32", True): [0, 1, 2],
                       ("barrier", 0, None, False): [3]}, got
        waits = [(e["name"], e["args"]["op"], e["args"]["rank"], e["args"]["step"])
                 for e in comm_events(path, waits=True)]
        assert waits == [("wait all_reduce", "all_reduce", rank, s) for s in range(3)], waits


@pytest.mark.parametrize("nproc,delay_ms", [(2, DELAY_MS), (2, 0), (4, DELAY_MS), (4, 0)])
def test_ddp_straggler(shared, nproc, delay_ms):
    tmp_path, files = shared(f"ddp-{nproc}-{delay_ms}")
    for path in files:  # one bucket all-reduce per step, 17 * 4 floats
        buckets = [e for e in comm_events(path) if "bucket" in e["args"]]
        assert len(buckets) == 8 and {e["args"]["bytes"] for e in buckets} == {17 * 4 * 4}, buckets
        assert {e["args"]["group_size"] for e in buckets} == {nproc}
    info = summary_json(tmp_path / "run", "--by", "rank")[0]["ranks"]
    assert [r["rank"] for r in info["ranks"]] == [f"rank{r}" for r in range(nproc)], info
    if delay_ms:
        assert_straggler(info, "rank1", tmp_path)
        waits = {r["rank"]: statistics.median(x["wait_us"] for x in info["rows"] if x["rank"] == r["rank"])
                 for r in info["ranks"]}
        assert all((w > 0.5 * delay_ms * 1e3) == (rank != "rank1") for rank, w in waits.items()), waits
    elif info["straggler"] is not None:  # nobody slept: only a busy machine's real imbalance is named
        assert_backed(info)
    assert info["threshold_us"] > 0 and info["skew"]["median_us"] is not None


@pytest.mark.parametrize("everyone, marked", [(False, False), (True, False), (False, True)])
def test_a_barrier_after_one_ranks_evaluation_is_a_wait_of_the_others(shared, everyone, marked):
    """Rank 0 evaluates after every 4th step and the ranks then meet at a barrier: rank 1 waits
    there for the evaluation, in its step, and rank 0 is charged with it (its barrier is in no
    step: it counts in the step rank 1 waits in, the one the evaluation follows; where
    ``step()`` after ``optimizer.step()`` marks the steps, the one it precedes, which rank 1's
    barrier after the mark is in). When rank 1 evaluates too and waits in its own evaluation (a
    metric's all-reduce), that wait is in no step: nobody is charged."""
    eval_us = SHARED["eval-False-False"][1]["EVAL_MS"] * 1e3
    rows = summary_json(shared(f"eval-{everyone}-{marked}")[0] / "run", "--by", "rank")[0]["ranks"]["rows"]
    by = {(r["rank"], r["step"]): r for r in rows}
    steps = sorted({r["step"] for r in rows})
    waited_in = 4 if marked else 3
    assert waited_in in steps and 7 in steps, steps
    for s in steps:
        waited, caused = by[("rank1", s)]["wait_us"], by[("rank0", s)]["wait_caused_us"]
        if s % 4 == waited_in % 4 and not everyone:
            assert waited >= 0.8 * eval_us and caused >= 0.8 * eval_us, (s, by[("rank1", s)], by[("rank0", s)])
        else:
            assert waited < eval_us / 2 and caused < eval_us / 2, (s, by[("rank1", s)], by[("rank0", s)])


def test_functional_collectives_in_a_graph(shared):
    for rank, path in enumerate(shared("functional")[1]):
        events = read_events(path)
        assert not [e for e in events if "_c10d_functional" in e.get("name", "") and e.get("cat") != "comm"]
        got = {}
        for e in comm_events(path):
            a = e["args"]
            got.setdefault(e["name"], []).append((a["step"], a["op"], a.get("bytes"), a.get("dtype"),
                                                  a.get("group_size"), a.get("rank")))
        all_reduce = [(s, "all_reduce", 40, "float32", 2, rank) for s in range(3)]
        wait = [(s, "wait_tensor", 40, "float32", None, None) for s in range(3)]
        assert got == {"function._c10d_functional.all_reduce.default": all_reduce,
                       "function._c10d_functional.wait_tensor.default": wait,
                       "barrier": [(3, "barrier", 0, None, 2, rank)]}, got


@pytest.mark.parametrize("nproc, late, batch", [(2, 0, False), (3, 1, False), (2, 0, True)])
def test_a_late_pipeline_stage_is_waited_for_by_its_neighbours(shared, nproc, late, batch):
    """One stage per rank, ``send``/``recv`` between neighbours, or ``isend``/``irecv`` through
    ``batch_isend_irecv`` (which checks its ``P2POp``s against ``torch.distributed.isend`` by
    identity; gloo's works have no future: their events end at ``wait()``); stage ``late`` sleeps
    30 ms a step before sending on. Each receive is matched with its send (not with the other
    ranks' receives): the neighbours wait for the late stage, which is the straggler. A receive
    between ``zero_grad()`` and the forward is in the step it begins, where the trace shows it."""
    tmp_path, files = shared(f"pipeline-{nproc}-{late}-{batch}")
    send, recv = ("isend", "irecv") if batch else ("send", "recv")
    for rank, path in enumerate(files):
        events = read_events(path)
        steps = {e["args"]["step"]: e for e in events if e.get("cat") == "step"}
        p2p = sorted((e for e in comm_events(path) if e["name"] in (send, recv)), key=lambda e: e["ts"])
        iteration = ([(recv, rank - 1)] if rank else []) + (
            [(send, rank + 1), (recv, rank + 1)] if rank < nproc - 1 else []) + ([(send, rank - 1)] if rank else [])
        assert [(e["name"], e["args"]["peer"]) for e in p2p] == iteration * 8 and len(steps) == 8, (p2p, sorted(steps))
        for e in p2p:
            assert inside(e, steps[e["args"]["step"]]), (e, steps[e["args"]["step"]])
    info = summary_json(tmp_path / "run", "--by", "rank")[0]["ranks"]
    assert info["straggler"]["rank"] == f"rank{late}", info
    waits = {r["rank"]: statistics.median(x["wait_us"] for x in info["rows"] if x["rank"] == r["rank"])
             for r in info["ranks"]}
    # a neighbour waits the 30 ms (and the late stage's own forward), the late stage far less
    assert all((w >= 0.8 * 30e3) == (rank != f"rank{late}") for rank, w in waits.items()), waits


@pytest.mark.parametrize("lazy", [False, True])
def test_fsdp2_collectives_are_recorded_and_explain_the_wait(tmp_path, monkeypatch, shared, lazy):
    """FSDP2 all-gathers and reduce-scatters through ``all_gather_single`` and
    ``reduce_scatter_single``: every step of every rank holds the same ones, and the rank that
    sleeps ``DELAY_MS`` a step is the straggler. Two sharded Linears, resharded after the forward: 4
    all-gathers and 2 reduce-scatters an iteration, the first all-gather (in the root module's
    pre-forward hook) before the first compiled call, which opens a lazily opened trace: it is
    in the first step all the same."""
    if lazy:  # (a lazily opened trace cannot be one scenario of many)
        files = job(tmp_path, monkeypatch, MODE="fsdp", STEPS=8, DELAY_MS=DELAY_MS, SLEPT=tmp_path / "slept.json",
                    LAZY=1)
    else:
        tmp_path, files = shared("fsdp")
    per_rank = []
    for path in files:
        counts = {}
        events = comm_events(path)
        for e in events:
            if e["name"] != "barrier":
                counts.setdefault(e["args"]["step"], []).append(e["name"])
        per_rank.append({s: sorted(names) for s, names in counts.items()})
        names = [e["name"] for e in events]
        assert (names.count("all_gather_single"), names.count("reduce_scatter_single")) == (4 * 8, 2 * 8), names
        first = min(events, key=lambda e: e["ts"])
        step0 = next(e for e in read_events(path) if e.get("cat") == "step" and e["name"] == "step 0")
        assert first["name"] == "all_gather_single" and first["args"]["step"] == 0 and step0["ts"] <= first["ts"], \
            (first, step0)
    assert per_rank[0] == per_rank[1] and sorted(per_rank[0]) == list(range(8)), per_rank
    assert {n for names in per_rank[0].values() for n in names} == {"all_gather_single", "reduce_scatter_single"}
    assert_straggler(summary_json(tmp_path / "run", "--by", "rank")[0]["ranks"], "rank1", tmp_path)


def test_recompile_divergence(shared):
    div = summary_json(shared("recompile")[0] / "run", "--by", "rank")[0]["ranks"]["divergence"]
    assert div is not None and div["rank0"]["recompile_steps"] == [] and div["rank1"]["recompile_steps"] == [3], div


def test_peak_memory_per_step(tmp_path, monkeypatch):
    for path in job(tmp_path, monkeypatch, MODE="memory", STEPS=6):
        peaks = {e["args"]["step"]: e["args"]["peak_rss"] for e in read_events(path) if e.get("cat") == "step"}
        base = min(peaks[s] for s in (2, 4))
        assert abs(peaks[3] - base - (64 << 20)) <= 0.1 * (64 << 20), peaks
        assert any(e.get("ph") == "C" and e["cat"] == "memory" for e in read_events(path))


def test_memory_samples_make_no_step(tmp_path):
    # the sampler records after the last step mark: the step in progress holds nothing of the program
    run_py("""
        import time
        import dftrace_dynamo
        dftrace_dynamo.initialize_log()
        for _ in range(3):
            dftrace_dynamo.step()
        time.sleep(0.35)
    """, tmp_path, {"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": str(tmp_path / "t")})
    (path,) = traces(tmp_path)
    events = read_events(path)
    assert any(e.get("ph") == "C" and e["cat"] == "memory" for e in events)
    assert sorted(e["args"]["step"] for e in events if e.get("cat") == "step") == [0, 1, 2]


ONE_RANK = """
    import threading
    import torch
    import torch.distributed as dist
    import dftrace_dynamo
    from dftrace_dynamo import create_backend

    dist.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
"""


def one_rank_trace(tmp_path, body):
    """Runs ``body`` in a process of a one-rank gloo group (the imports of ``ONE_RANK`` made),
    traced with ``DFTRACER_ENABLE=1``; returns its trace file."""
    code = textwrap.dedent(ONE_RANK.format(store=tmp_path / "store")) + textwrap.dedent(body)
    run_py(code + "dist.destroy_process_group()\n", tmp_path,
           {"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": str(tmp_path / "t")})
    (path,) = traces(tmp_path)
    return path


def test_collectives_after_a_graph_break_are_recorded(tmp_path):
    """Eager collectives a compiled function calls after a graph break: Dynamo must not compile
    the tracer's wrapper as a frame of its own (that compile would skip the recording)."""
    path = one_rank_trace(tmp_path, """
        dftrace_dynamo.initialize_log()

        @torch.compile(backend=create_backend())
        def f(x):
            y = x * 2
            torch._dynamo.graph_break()
            dist.barrier()
            dist.broadcast(y, 0)
            return y + 1

        for _ in range(3):
            f(torch.randn(4))
    """)
    events = read_events(path)
    assert sorted(e["name"] for e in comm_events(path)) == ["barrier"] * 3 + ["broadcast"] * 3
    breaks = [e["args"]["location"] for e in events if e.get("name") == "graph break"]
    assert breaks and not any("dftrace_dynamo" in b for b in breaks), breaks


def test_collectives_on_one_thread_while_another_compiles_are_recorded(tmp_path):
    path = one_rank_trace(tmp_path, """
        dftrace_dynamo.initialize_log()
        compiling, done = threading.Event(), threading.Event()

        def held(gm, example_inputs, info):  # the backend's compile waits for the other thread
            compiling.set()
            assert done.wait(60)

        f = torch.compile(lambda x: x.relu() + 1, backend=create_backend(on_graph=held))
        compiler = threading.Thread(target=f, args=(torch.randn(4),))
        compiler.start()
        assert compiling.wait(60)
        dist.barrier()
        dist.all_reduce(torch.ones(8))
        done.set()
        compiler.join()
    """)
    assert sorted((e["name"], e["args"]["bytes"]) for e in comm_events(path)) == [("all_reduce", 32), ("barrier", 0)]


def test_destroy_process_group_frees_the_groups_whose_collectives_were_recorded(tmp_path):
    """The tracer must not keep a process group alive: a Gloo group that outlived
    ``destroy_process_group`` kept its worker threads into interpreter shutdown, where one
    releasing a tensor aborted the process at exit now and then ("terminate called without an
    active exception"). A group set up again afterwards is recorded under its own figures."""
    again = tmp_path / "store2"
    path = one_rank_trace(tmp_path, f"""
        import gc, weakref
        dftrace_dynamo.initialize_log()
        group = dist.new_group([0])
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(4), group=group)
        refs = [weakref.ref(dist.distributed_c10d._get_default_group()), weakref.ref(group)]
        del group
        dist.destroy_process_group()
        gc.collect()
        assert [r() for r in refs] == [None, None], [r() for r in refs]
        dist.init_process_group("gloo", init_method="file://{again}", rank=0, world_size=1)
        dist.all_reduce(torch.ones(2))
    """)
    assert [(e["name"], e["args"]["bytes"]) for e in comm_events(path)] == [("all_reduce", 16)] * 2 + [
        ("all_reduce", 8)]


def test_a_rank_given_to_init_process_group_names_the_trace(tmp_path):
    """Launchers that pass the rank to ``init_process_group`` (``torch.multiprocessing.spawn``)
    set no ``RANK``: the trace, opened at the first compile, takes torch.distributed's rank."""
    path = one_rank_trace(tmp_path, """
        torch.compile(lambda x: x + 1, backend=create_backend())(torch.randn(2))
    """)
    assert os.path.basename(path).startswith("t-rank0-")
    events = read_events(path)
    (name,) = [e["args"]["name"] for e in events if e.get("name") == "process_name"]
    assert name.startswith("rank 0 (")
    assert [e["args"]["rank"] for e in events if e.get("name") == "start"] == ["0"]


SPAWNED = """
    import os, sys, time
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import dftrace_dynamo

    def run(rank, world, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dftrace_dynamo.initialize_log("run/spawned")  # before the process group: no rank in the name
        dist.init_process_group("gloo", rank=rank, world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(torch.compile(torch.nn.Linear(16, 4), backend="dftrace"))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(8):
            if rank == 1:
                time.sleep(0.15)  # large against what busy cores add to a step (30 ms named no straggler)
            opt.zero_grad()
            model(torch.randn(8, 16)).sum().backward()
            opt.step()
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(run, args=(2, int(sys.argv[1])), nprocs=2)
"""


@pytest.mark.parametrize("source", ["aggregates", "events"])
def test_ranks_whose_trace_opened_before_their_process_group_are_named_by_rank(tmp_path, source):
    """Under ``torch.multiprocessing.spawn`` a trace opened before ``init_process_group`` has no
    rank in its name: the rank view takes each process's rank from its clock record."""
    import socket

    (tmp_path / "spawned.py").write_text(textwrap.dedent(SPAWNED))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_python(["spawned.py", str(port)], tmp_path, timeout=600)
    assert len(traces(tmp_path / "run")) == 2
    info = summary_json(tmp_path / "run", "--by", "rank", "--source", source)[0]["ranks"]
    assert [r["rank"] for r in info["ranks"]] == ["rank0", "rank1"], info["ranks"]
    assert info["straggler"]["rank"] == "rank1", info


def test_collectives_before_a_lazy_open_since_the_last_optimizer_step_are_in_step_0(tmp_path):
    """No initialize_log: the trace opens at the first compile. Of the collectives before it, those
    since the last optimizer step (16 and 32 bytes, then an async one, which is not kept) are
    the first step's, and it begins no later than the first of them; the one before that step
    (4 bytes) is in no trace."""
    path = one_rank_trace(tmp_path, """
        w = torch.nn.Parameter(torch.ones(4))
        opt = torch.optim.SGD([w], lr=0.1)
        dist.all_reduce(torch.ones(1))
        (w * 2).sum().backward()
        opt.step()
        dist.all_reduce(torch.ones(4))
        dist.broadcast(torch.ones(8), 0)
        dist.all_reduce(torch.ones(2), async_op=True).wait()
        f = torch.compile(lambda x: (x * w).sum(), backend="dftrace")
        opt.zero_grad()
        f(torch.ones(4)).backward()
        opt.step()
    """)
    events = read_events(path)
    got = [(e["name"], e["args"]["bytes"], e["args"]["step"]) for e in comm_events(path)]
    assert got == [("all_reduce", 16, 0), ("broadcast", 32, 0)], got
    step0 = next(e for e in events if e.get("cat") == "step" and e["name"] == "step 0")
    first = min(e["ts"] for e in comm_events(path))
    assert step0["ts"] <= first, (step0, first)
