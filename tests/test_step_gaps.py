"""The time Dynamo spends in a compiled model's call outside its graphs (guard evaluation, each
frame's set-up, a function it skips, resume functions after a graph break, the return) is the
model's forward: a module slice of the compiled model, from its call to its return, which the
step view counts as forward in both sources. Ground truth: the program's own marks around each
call of the compiled models and around sleeps in functions Dynamo skips, at a model's entry
(before its first graph) and between two graphs."""

import json

import pytest

from subproc import preload_shim, run_py
from tracefile import read_events, traces

SLEEP_S = 0.015
GRID_US = 2.0  # ts is whole µs, and the writer's nesting may trim an event by 1 µs
PROGRAM = f"""
import json, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F
from dftrace_dynamo import _core, initialize_log
from dftrace_dynamo.backend import create_backend

torch.manual_seed(0)
torch.set_num_threads(1)
marks = {{"netG": [], "netD": [], "sleeps": []}}


@torch.compiler.disable
def nap(x, who):  # a function Dynamo skips (no module, no ATen op): a known time in a model's call
    start = _core.now_ns()
    time.sleep({SLEEP_S})
    marks["sleeps"].append((who, start, _core.now_ns()))
    return x.detach()  # an eager op in the model's own forward


class G(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, z):
        z = z + 0 * nap(z, "netG")  # at the entry, before the first graph
        return self.fc2(torch.relu(self.fc1(z)))


class D(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 1)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = h + 0 * nap(h, "netD")  # between two graphs
        return self.fc2(h).sigmoid()


def call(name, model, x):
    start = _core.now_ns()
    out = model(x)
    marks[name].append((start, _core.now_ns()))
    return out


log = initialize_log("tr")
netG, netD = torch.compile(G(), backend=create_backend()), torch.compile(D(), backend=create_backend())
if sys.argv[1] == "hooked":  # a hook of the user's on the wrapper: torch's own module call path
    netD.register_forward_hook(lambda *_: None)
opt = torch.optim.SGD([*netG.parameters(), *netD.parameters()], lr=0.01)
z = torch.randn(4, 8)
for _ in range(8):
    if sys.argv[1] != "tail":
        opt.zero_grad()
    loss = F.binary_cross_entropy(call("netD", netD, call("netG", netG, z)), torch.ones(4, 1))
    loss.backward()
    opt.step()
    if sys.argv[1] == "tail":  # at the end of the body: the next step begins with the model's call
        opt.zero_grad()
log.finalize()
json.dump(marks, open("marks.json", "w"))
"""
ENV = {"DFTRACER_EAGER_OPS": "1"}


def _run(directory, kind):
    run_py(PROGRAM.replace("sys.argv[1]", repr(kind)), directory, ENV)
    (path,) = traces(directory, "tr-*")
    return path, json.loads((directory / "marks.json").read_text())


@pytest.fixture(scope="module", params=["plain", "hooked", "tail"])
def traced(request, tmp_path_factory):
    return _run(tmp_path_factory.mktemp(request.param), request.param)


def _steady(path, source):
    from dftrace_dynamo.traces.summary import summarize
    result = summarize([path], views=("step",), top=None, source=source)
    rows = [r for r in result["steps"]["rows"] if r["recorded"] and not r["warmup"]]
    assert len(rows) >= 5
    return rows


def _inside(inner, outer):
    return outer[0] - GRID_US <= inner[0] and inner[1] <= outer[1] + GRID_US


def test_each_compiled_models_call_is_its_slice_holding_what_dynamo_ran_outside_graphs(traced):
    path, marks = traced
    events = read_events(path)
    steady = {r["step"] for r in _steady(path, "events")}
    for name in ("netG", "netD"):
        slices = [e for e in events if e.get("cat") == "module" and e["name"] == name and "graph" not in e["args"]]
        spans = [(e["ts"], e["ts"] + e["dur"]) for e in slices]
        calls = [(a / 1e3, b / 1e3) for a, b in marks[name]]
        naps = [(a / 1e3, b / 1e3) for who, a, b in marks["sleeps"] if who == name]
        in_steady = [s for s, e in zip(spans, slices) if e["args"].get("step") in steady]
        assert len(in_steady) == len(steady), (name, spans)
        for span in spans:  # inside one call of the model, holding that call's sleep
            (call,) = [c for c in calls if _inside(span, c)]
            (nap,) = [n for n in naps if _inside(n, call)]
            assert _inside(nap, span), (name, span, nap)
            assert all(e["args"]["phase"] == "forward" for e in slices)
        graphs = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "dynamo_graph"
                  and e["args"].get("phase") == "forward" and any(_inside((e["ts"], e["ts"]), c) for c in calls)]
        assert graphs and all(any(_inside(gr, s) for s in spans) for gr in graphs[-5:]), name



def test_a_step_holds_the_whole_call_of_each_compiled_model_it_runs(traced):
    path, _ = traced
    events = read_events(path)
    steps = {e["args"]["step"]: (e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "step"}
    slices = [e for e in events if e.get("cat") == "module" and e["name"] in ("netG", "netD")
              and "graph" not in e["args"]]
    assert len(slices) >= 2 * (len(steps) - 1)
    for e in slices:  # never across a step's start: the step begins where the model's call did
        assert _inside((e["ts"], e["ts"] + e["dur"]), steps[e["args"]["step"]]), e


@pytest.mark.parametrize("source", ["events", "auto"])
def test_the_sleeps_dynamo_skips_in_a_compiled_models_call_are_forward_not_other(traced, source):
    path, marks = traced
    slices = {e["args"]["step"]: e for e in read_events(path) if e.get("cat") == "step"}
    naps = [(a / 1e3, b / 1e3) for _, a, b in marks["sleeps"]]
    rows = _steady(path, source)
    for r in rows:
        s = slices[r["step"]]
        slept = sum(max(0.0, min(b, s["ts"] + s["dur"]) - max(a, s["ts"])) for a, b in naps)
        assert slept >= 2 * 0.9 * SLEEP_S * 1e6, r
        assert r["forward_us"] >= slept, r
        assert sum(r[k] for k in ("data_us", "forward_us", "backward_us", "optimizer_us")) <= r["wall_us"] + 4, r
    shares = sorted(r["other_us"] / r["wall_us"] for r in rows)  # the median step: a loaded machine's pauses
    assert shares[len(shares) // 2] <= 0.05, shares
    if source == "auto":  # the writer's aggregate record gives the steps the events give
        for by_record, by_events in zip(rows, _steady(path, "events"), strict=True):
            for key in ("step", "wall_us", "forward_us", "other_us", "optimizer_us", "backward_us", "gc_us",
                        "trainer_us"):
                assert by_record[key] == pytest.approx(by_events[key], abs=1.0), key



# The writer thread's monotonic clock jumps by 300 µs every 20 ms: each model it publishes steers
# the TSC's rate by the most it may (0.05 %), so a tick read before a publish converts on the
# model of its time 150 µs away from the current one's reading of it after 300 ms.
WANDERING_WRITER_CLOCK = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
static int (*real)(clockid_t, struct timespec *);
int clock_gettime(clockid_t c, struct timespec *t) {
    if (!real)
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(c, t);
    char name[16] = {0};
    prctl(PR_GET_NAME, name);
    if (c == CLOCK_MONOTONIC && strcmp(name, "dftrace-writer") == 0 && (t->tv_nsec / 20000000) % 2) {
        t->tv_nsec += 300000;
        if (t->tv_nsec >= 1000000000)
            t->tv_sec += 1, t->tv_nsec -= 1000000000;
    }
    return rc;
}
"""


def test_a_step_begins_with_the_call_it_began_in_while_the_clock_is_steered(tmp_path):
    # netG's nap at its entry outlasts the writer's wake (250 ms), so a clock model is published
    # between the call's start and the graph call that ends the step in it
    shim = preload_shim(tmp_path, "wandering_clock", WANDERING_WRITER_CLOCK)
    code = PROGRAM.replace(f"time.sleep({SLEEP_S})", f"time.sleep(0.3 if who == 'netG' else {SLEEP_S})")
    code = code.replace("range(8)", "range(5)").replace("sys.argv[1]", repr("tail"))
    p = run_py(code, tmp_path, {**ENV, "LD_PRELOAD": str(shim)})
    assert p.returncode == 0, p.stderr[-3000:]
    (path,) = traces(tmp_path, "tr-*")
    events = read_events(path)
    steps = {e["args"]["step"]: e for e in events if e.get("cat") == "step"}
    calls = [e for e in events if e.get("cat") == "module" and e["name"] == "netG" and "graph" not in e["args"]]
    assert [e["args"]["step"] for e in calls] == [1, 2, 3, 4]
    for e in calls:  # the step begins where the call did, to the µs, and holds it
        step = steps[e["args"]["step"]]
        assert step["ts"] == e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"], (e, step)
