"""Hostile trace files: every command that reads traces stays in bounded memory,
and answers bad input with one line and exit status 2, never a traceback."""

import json
import zlib

import pytest

from scripts.clitools import assert_bad_input, cli
from subproc import python
from tracefile import read_events

OP = {"name": "op", "cat": "dynamo", "ph": "X", "pid": 1, "tid": 1, "ts": 1_760_000_000_000_000, "dur": 5,
      "args": {"node": "n", "module": "m"}}
# the CLI under an address-space limit; DuckDB (summary) reserves about 1 GiB of it on its own
LIMITED = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({0}, {0})); "
           "from dftrace_dynamo.cli import main; sys.exit(main(sys.argv[1:]))")
GIB = 1 << 30


def write(path, *events, raw=()):
    """A trace in the DFTracer layout: ``[``, ``events`` as JSON lines, then the ``raw`` lines, ``]``."""
    lines = ["[", *(json.dumps(e) for e in events), *raw, "]"]
    path.write_text("\n".join(lines) + "\n")
    return path


def cli_limited(limit, *args):
    return python(["-c", LIMITED.format(limit), *map(str, args)])


@pytest.fixture(scope="module", params=[250, 1000], ids=["255KB", "1MB"])
def bomb(request, tmp_path_factory):
    """A gzip of ``[``, a GB or so of newlines, one event, ``]``: 255 KB or 1 MB on disk."""
    path = tmp_path_factory.mktemp("bomb") / f"bomb{request.param}.pfw.gz"
    comp, block = zlib.compressobj(9, zlib.DEFLATED, 31), b"\n" * (1 << 20)
    with open(path, "wb") as f:
        f.write(comp.compress(b"[\n"))
        for _ in range(request.param):
            f.write(comp.compress(block))
        f.write(comp.compress(json.dumps(OP).encode() + b"\n]\n") + comp.flush())
    return path


def test_newline_bomb_validate(bomb):
    p = cli_limited(GIB, "validate", bomb)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "(1 events)" in p.stdout and "Unknown trace type" in p.stdout  # Perfetto sniffs only newlines


def test_newline_bomb_convert(bomb, tmp_path):
    p = cli_limited(GIB, "convert", bomb, "-o", tmp_path / "out.pfw")
    assert p.returncode == 0, p.stderr[-2000:]
    assert read_events(str(tmp_path / "out.pfw")) == [OP]


def test_newline_bomb_merge(bomb, tmp_path):
    p = cli_limited(GIB, "merge", bomb, "-o", tmp_path / "out.pfw")
    assert p.returncode == 0, p.stderr[-2000:]
    assert [e for e in read_events(str(tmp_path / "out.pfw")) if e["ph"] == "X"] == [OP]


@pytest.mark.parametrize("bomb", [1000], indirect=True, ids=["1MB"])  # 255 KB fits even decoded whole
def test_newline_bomb_summary(bomb):
    p = cli_limited(2 * GIB, "summary", bomb)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "1 file, 1 process: 1 op events" in p.stdout


def test_blank_lines_only(tmp_path):
    blank = tmp_path / "blank.pfw.gz"
    blank.write_bytes(zlib.compress(b"\n \n\t\n" * 100_000, wbits=31))
    p = cli("validate", blank)
    assert p.returncode == 1 and "blank lines only" in p.stdout
    for args in (["summary"], ["merge", "-o", tmp_path / "m.pfw"], ["convert", "-o", tmp_path / "c.pfw"]):
        assert_bad_input(cli(args[0], blank, *args[1:]), "blank lines only")


WRONG = [("tid", [1, 2], "'tid' is an array ([1,2]), not an integer"),
         ("pid", {"a": 1}, "'pid' is an object"),
         ("pid", "7", "'pid' is a string"),
         ("pid", 1.5, "'pid' is a number (1.5), not an integer"),
         ("ts", "10", "'ts' is a string"),
         ("dur", True, "'dur' is a boolean"),
         ("args", [1], "'args' is an array"),
         ("name", 5, "'name' is a number (5), not a string"),
         ("cat", ["dynamo"], "'cat' is an array"),
         ("ph", ["X"], "'ph' is an array")]  # a number is DFTracer 2.1+'s ph (tests/test_migration.py)
READERS = ["validate", "convert", "split", "merge"]


def run_command(command, trace, tmp_path):
    """``command`` on ``trace`` with whatever else it needs."""
    extra = {"convert": ["-o", tmp_path / "c.pfw"], "split": ["--split", "--max-events", "1", "-o", tmp_path / "parts"],
             "merge": ["-o", tmp_path / "m.pfw"], "diff": [trace]}.get(command, [])
    return cli("convert" if command == "split" else command, trace, *extra)


@pytest.mark.parametrize("command", READERS)
@pytest.mark.parametrize("field, value, message", WRONG, ids=[f"{f}-{type(v).__name__}" for f, v, _ in WRONG])
def test_wrong_typed_field(tmp_path, command, field, value, message):
    trace = write(tmp_path / "t.pfw", OP, dict(OP, **{field: value}), dict(OP, ts=OP["ts"] + 10))
    assert_bad_input(run_command(command, trace, tmp_path), f"{trace}: line 3: event field {message}")
    assert not [p for p in tmp_path.rglob("*") if p != trace]  # no output, not even a part of one


@pytest.mark.parametrize("command", ["summary", "diff"])
@pytest.mark.parametrize("field, value", [("tid", [1, 2]), ("ts", "10"), ("args", [1]), ("name", 5)])
def test_wrong_typed_field_summary(tmp_path, command, field, value):
    trace = write(tmp_path / "t.pfw", OP, dict(OP, **{field: value}), dict(OP, ts=OP["ts"] + 10))
    assert_bad_input(run_command(command, trace, tmp_path), f"'{field}' is")


def test_field_of_the_wrong_type_in_a_one_line_array(tmp_path):
    trace = tmp_path / "a.json"
    trace.write_text(json.dumps([OP, dict(OP, tid=[1])]))
    assert_bad_input(cli("validate", trace), "line 1: event field 'tid' is an array")


def test_huge_times_are_a_problem_not_a_crash(tmp_path):
    trace = write(tmp_path / "t.pfw", OP, dict(OP, ts=1e308, dur=1e308))
    p = cli("validate", trace)
    assert p.returncode == 1 and "line 3: X event at ts 1e+308 with dur 1e+308 ends beyond 2^63 ns" in p.stdout
    assert cli("merge", trace, "-o", tmp_path / "m.pfw").returncode == 0


def test_plot_shows_names_as_plain_text(tmp_path):
    names = ["$x^2$", r"$\frac{a}{$", "a$b", "\\", "50%_{x}"]
    trace = write(tmp_path / "t.pfw", *(dict(OP, name=n, ts=OP["ts"] + 10 * i, args={"node": "n", "module": n})
                                        for i, n in enumerate(names)))
    for view in ("op", "module"):
        png = tmp_path / f"{view}.png"
        p = cli("summary", trace, "--by", view, "--plot", png)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert all(n in p.stdout for n in names)


BIG = 100 << 20


@pytest.fixture(scope="module")
def oversized(tmp_path_factory):
    """A trace whose line 3 is one event of about 100 MB."""
    path = tmp_path_factory.mktemp("big") / "big.pfw"
    return write(path, OP, dict(OP, ts=OP["ts"] + 10, args={"node": "n", "blob": "x" * BIG}),
                 dict(OP, ts=OP["ts"] + 20))


def test_oversized_line_is_refused_by_validate_and_dropped_by_convert(oversized, tmp_path):
    p = cli_limited(GIB, "validate", oversized)
    assert p.returncode == 1, p.stderr[-2000:]
    assert "1 problem (2 events)" in p.stdout
    assert "line 3: a line of 104,857,7" in p.stdout and "longer than the 16 MiB a trace line may have" in p.stdout
    p = cli_limited(GIB, "convert", oversized, "-o", tmp_path / "c.pfw")
    assert p.returncode == 0 and "dropped line 3, a line of 104,857,7" in p.stderr, p.stderr[-2000:]
    assert len(read_events(str(tmp_path / "c.pfw"))) == 2


def test_oversized_line_same_message_in_summary(oversized):
    problem = next(line for line in cli("validate", oversized).stdout.splitlines() if "line 3:" in line)
    assert_bad_input(cli("summary", oversized), f"{oversized}: {problem.strip()}")


def test_merge_output_inside_a_merged_directory_is_refused(tmp_path):
    runs = tmp_path / "run"
    runs.mkdir()
    write(runs / "a.pfw", OP)
    write(runs / "b.pfw", dict(OP, pid=2, tid=2))
    assert_bad_input(cli("merge", runs, "-o", runs / "merged.pfw.gz"), "inside the input directory")
    assert_bad_input(cli("merge", tmp_path, "-o", runs / "sub.pfw"), "inside the input directory")
    assert sorted(p.name for p in runs.iterdir()) == ["a.pfw", "b.pfw"]
    assert cli("merge", runs, "-o", tmp_path / "merged.pfw.gz").returncode == 0
    assert cli("merge", runs, "-o", runs / "merged.json").returncode == 0  # not read as a trace later


def test_a_file_without_run_id_during_a_run_joins_it(tmp_path):
    # what dftracer_split writes: the start record (with the run_id) in one part only
    start = dict(OP, name="start", cat="dftracer", dur=0, args={"run_id": "r1"})
    parts = [write(tmp_path / "a.pfw", start, OP), write(tmp_path / "b.pfw", dict(OP, ts=OP["ts"] + 3)),
             write(tmp_path / "c.pfw", dict(OP, ts=OP["ts"] + 7))]  # overlaps b only
    p = cli("summary", *parts, "--format", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["runs"] == [{"run": "run r1", "files": list(map(str, parts))}]


@pytest.mark.parametrize("how", ["run_id", "time"])
def test_merge_refuses_two_runs_as_summary_does(tmp_path, how):
    if how == "run_id":  # the same times, two launches of dftrace-dynamo run
        a, b = ([dict(OP, name="start", cat="dftracer", dur=0, args={"run_id": r}), OP] for r in ("r1", "r2"))
    else:  # no run_id, one run an hour after the other
        a, b = [OP], [dict(OP, ts=OP["ts"] + 3600 * 10**6)]
    a, b = write(tmp_path / "a.pfw", *a), write(tmp_path / "b.pfw", *b)
    listed = "(run r1: {0}; run r2: {1})" if how == "run_id" else "run started"
    summary = assert_bad_input(cli("summary", a, b), "2 different runs", listed.format(a, b), "--all-runs")
    merge = assert_bad_input(cli("merge", a, b, "-o", tmp_path / "m.pfw"), "--all-runs")
    assert merge.split(": error: ")[1].split("); ")[0] == summary.split(": error: ")[1].split("); ")[0]
    assert not (tmp_path / "m.pfw").exists()
    p = cli("merge", a, b, "-o", tmp_path / "m.pfw", "--all-runs")
    assert p.returncode == 0 and "2 processes from 2 files" in p.stdout
