"""Worker processes keep every event: DataLoader, Pool and Process under the
fork, forkserver and spawn start methods (their children end with os._exit, or
are terminated with SIGTERM by Pool.terminate())."""

import collections
import textwrap

import pytest

from subproc import run_python
from tracefile import read_events, read_lines, traces

# Workers record `region`s named after the process model; the main module
# imports torch only for the DataLoader, so Pool and Process children start fast.
SCRIPT = """
    import multiprocessing as mp
    import sys
    from dftrace_dynamo import dftracer, region


    class Items:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            with region(f"loader_{self.kind}", i=i):
                return i


    def pool_task(i):
        with region("pool", i=i):
            return i


    def with_pool_task(i):
        with region("with_pool", i=i):
            return i


    def process(n):
        for i in range(n):
            with region("process", i=i):
                pass


    def loaders(ctx):
        from torch.utils.data import DataLoader

        for persistent in (False, True):
            items = Items()
            items.kind = "persistent" if persistent else "per_epoch"
            loader = DataLoader(items, num_workers=2, persistent_workers=persistent, multiprocessing_context=ctx)
            for epoch in range(2):
                assert [int(b) for b in loader] == [0, 1, 2, 3]


    if __name__ == "__main__":
        method = sys.argv[1]
        dftracer.initialize_log("trace")
        ctx = mp.get_context(method)
        if method != "forkserver":
            loaders(ctx)
        pool = ctx.Pool(2)
        assert pool.map(pool_task, range(6)) == list(range(6))
        pool.close()
        pool.join()
        with ctx.Pool(2) as pool:  # leaving the block terminates the workers (SIGTERM)
            assert pool.map(with_pool_task, range(6)) == list(range(6))
        procs = [ctx.Process(target=process, args=(5,)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        print("exit codes", [p.exitcode for p in procs])
"""


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_every_worker_event_is_written_and_every_file_closed(tmp_path, method):
    (tmp_path / "main.py").write_text(textwrap.dedent(SCRIPT))
    p = run_python(["main.py", method], tmp_path, timeout=600)
    assert "exit codes [0, 0]" in p.stdout
    totals, per_file = collections.Counter(), []
    for path in traces(tmp_path):  # a with-Pool worker terminated as it starts finalizes too
        events = read_events(path)
        names = collections.Counter(e["name"] for e in events if e.get("cat") == "region")
        totals.update(names)
        closed = read_lines(path)[-1] == "]" and events[-1]["name"] == "end"
        per_file.append((names, closed))
        assert closed, path
        assert events[-1]["args"]["num_events"] == sum(names.values())
    expected = {"pool": 6, "with_pool": 6, "process": 10}
    if method != "forkserver":
        expected |= {"loader_per_epoch": 8, "loader_persistent": 8}
    assert dict(totals) == expected
    # one file per Process child, each closed with exactly its 5 events
    assert sorted(n["process"] for n, closed in per_file if "process" in n and closed) == [5, 5]
    # non-persistent DataLoader workers are new processes each epoch: 2 epochs x 2 workers
    if method != "forkserver":
        assert len([n for n, _ in per_file if "loader_per_epoch" in n]) <= 4


GLOBAL_LOADER = """
    import sys
    from torch.utils.data import DataLoader
    from dftrace_dynamo import dftracer, region


    class Items:
        def __init__(self, name):
            self.name = name

        def __len__(self):
            return 4

        def __getitem__(self, i):
            with region(self.name, i=i):
                return i


    if __name__ == "__main__":
        dftracer.initialize_log("trace")
        # alive until exit: multiprocessing would terminate its workers there
        loader = DataLoader(Items("persistent"), num_workers=2, persistent_workers=True,
                            multiprocessing_context=sys.argv[1])
        for epoch in range(2):
            assert [int(b) for b in loader] == [0, 1, 2, 3]
        left = iter(DataLoader(Items("left"), num_workers=2, multiprocessing_context=sys.argv[1]))
        assert int(next(left)) == 0  # a loop left early: its workers are alive at exit too
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataloader_workers_alive_at_exit_keep_their_events(tmp_path, method):
    (tmp_path / "main.py").write_text(textwrap.dedent(GLOBAL_LOADER))
    p = run_python(["main.py", method], tmp_path, timeout=600)
    items = collections.defaultdict(list)
    for path in traces(tmp_path):
        events = read_events(path)
        assert read_lines(path)[-1] == "]" and events[-1]["name"] == "end", path
        for e in events:
            if e.get("cat") == "region":
                items[e["name"]].append(e["args"]["i"])
    assert sorted(items["persistent"]) == [0, 0, 1, 1, 2, 2, 3, 3]  # 2 epochs
    assert 0 in items["left"]  # and what the other loader's workers had fetched
