"""``traces/`` as the stages of one pipeline (docs/design.rst, "Trace analysis"): a file → its
verified source (aggregate records or events) → per-file partials → merged → views → report, each
module importing only its own stage or those below it (function-local imports too), no import
circle, and an engine that maps one per-file function over the files and nothing else."""

import ast
import pathlib
import textwrap

import dftrace_dynamo.traces
from dftrace_dynamo.traces import engines
from dftrace_dynamo.traces.summary import summarize
from scripts import tracegen

TRACES = pathlib.Path(dftrace_dynamo.traces.__file__).parent
PACKAGE = "dftrace_dynamo.traces"
# lowest first: a module may import modules of its own stage or of a stage before it
STAGES = (
    ("file", {"reader", "writer", "clock", "fullscan"}),
    ("shared analyses", {"kinds", "sketch", "compiles", "steps", "runs", "kernels", "origin", "ranks"}),
    ("other commands", {"convert", "merge", "split", "validate", "perfetto_proto"}),
    ("verified source", {"trust", "aggregates", "events"}),
    ("per-file partials", {"partials"}),
    ("engines", {"engines"}),
    ("merged", {"merged"}),
    ("views", {"views"}),
    ("report", {"report"}),
    ("summary", {"summary"}),
    ("diff", {"diff"}),
)
STAGE_OF = {module: i for i, (_, modules) in enumerate(STAGES) for module in modules}
PIPELINE = {m for _, modules in STAGES[3:] for m in modules}
OTHER_COMMANDS = STAGES[2][1]


def imports(source, module):
    """(traces module, name or None) for every import of a ``traces`` module in ``source``, the
    code of ``traces/<module>.py``, at any depth (function-local imports too)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = f"{PACKAGE}.{module}".split(".")[:-node.level]
                base = ".".join(parts + ([base] if base else []))
            found = [(base, alias.name) for alias in node.names]
        else:
            continue
        for target, name in found:
            if target == PACKAGE and name:  # from . import events
                out.add((name, None))
            elif target.startswith(PACKAGE + "."):
                out.add((target[len(PACKAGE) + 1:].split(".")[0], name))
    return out


def graph():
    return {p.stem: imports(p.read_text(), p.stem) for p in TRACES.glob("*.py") if p.stem != "__init__"}


def test_the_import_reader_sees_every_form_of_import():
    code = textwrap.dedent("""
        import os
        from . import events, sketch
        from .reader import TraceError
        from ..schema import CAT_OP
        from dftrace_dynamo.traces.merged import merge
        import dftrace_dynamo.traces.views

        def later():
            from .summary import summarize
            if True:
                from ..traces import report
    """)
    assert imports(code, "partials") == {("events", None), ("sketch", None), ("reader", "TraceError"),
                                         ("merged", "merge"), ("views", None), ("summary", "summarize"),
                                         ("report", None)}


def test_every_module_of_traces_has_its_stage():
    assert set(graph()) == set(STAGE_OF), "place each module of traces/ in a stage (docs/design.rst)"


def test_the_design_describes_every_stage():
    design = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "design.rst").read_text()
    section = design[design.index("Trace analysis (``dftrace_dynamo.traces``)"):]
    assert [m for m in sorted(PIPELINE) if f"``{m}" not in section] == []


def test_no_module_imports_a_stage_above_it():
    upward = sorted(f"{m} ({STAGES[STAGE_OF[m]][0]}) imports {d} ({STAGES[STAGE_OF[d]][0]})"
                    for m, deps in graph().items() for d, _ in deps
                    if d in STAGE_OF and m in STAGE_OF and STAGE_OF[d] > STAGE_OF[m])
    assert upward == []
    assert not [(m, d) for m, deps in graph().items() if m in PIPELINE for d, _ in deps if d in OTHER_COMMANDS]


def test_no_import_circle():
    edges = {m: {d for d, _ in deps} for m, deps in graph().items()}
    circles, state = [], {}

    def visit(module, path):
        state[module] = "open"
        for dep in sorted(edges.get(module, ())):
            if state.get(dep) == "open":
                circles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_an_engine_maps_one_per_file_function_and_nothing_else():
    pipeline = {(d, name) for d, name in graph()["engines"] if d in PIPELINE}
    assert pipeline == {("partials", "of_files")}
    # the summary reaches the files only through an engine
    assert not {d for d, _ in graph()["summary"]} & {"trust", "aggregates", "events", "partials"}


def test_the_local_engine_calls_it_once_for_all_files(tmp_path, monkeypatch):
    from dftrace_dynamo.traces import partials

    paths = [str(tracegen.write(tmp_path / f"t{i}.pfw", 50 * (i + 1), pid=100 + i)) for i in range(3)]
    calls, real = [], partials.of_files

    def counted(paths, indices, source, options, **kwargs):
        calls.append((list(indices), source, kwargs.get("whole")))
        return real(paths, indices, source, options, **kwargs)

    monkeypatch.setattr(partials, "of_files", counted)
    result = summarize(paths, all_runs=True)
    # no aggregate records: the files' records looked for, then one scan of all their events
    assert calls == [([0, 1, 2], "aggregates", True), ([0, 1, 2], "events", True)]
    assert result["op_events"] == 50 + 100 + 150 and result["scan"]["quantiles"] == "exact"
    calls.clear()
    shares = engines.Local().map(paths, "events", {"views": ["op"], "module_depth": None, "include_warmup": False,
                                                   "step_samples": False})
    assert calls == [([0, 1, 2], "events", True)] and len(shares) == 1 and shares[0][1] is None
