"""The package's shape: one event vocabulary, hooks that come out as they went in, a stub
that matches the C extension, and public imports that keep working without torch."""

import ast
import pathlib
import textwrap

import dftrace_dynamo
from dftrace_dynamo import _core, schema
from subproc import run_py

PACKAGE = pathlib.Path(dftrace_dynamo.__file__).parent
VOCABULARY_PREFIXES = ("CAT_", "ARG_", "PHASE_")


def _module_constants(path):
    """(name, value) of every module-level ``NAME = "text"`` (tuple targets included)."""
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            values = node.value.elts if isinstance(node.value, ast.Tuple) and isinstance(target, ast.Tuple) \
                else [node.value]
            for name, value in zip(names, values):
                if isinstance(name, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
                    yield name.id, value.value


def _schema_family(prefix):
    return {name: value for name, value in vars(schema).items() if name.startswith(prefix) and isinstance(value, str)}


def test_vocabulary_is_declared_once():
    categories, args = _schema_family("CAT_"), _schema_family("ARG_")
    assert len(set(categories.values())) == len(categories) and len(set(args.values())) == len(args)
    assert set(schema.CATEGORIES) == set(categories.values())
    vocabulary = set(categories.values()) | set(args.values()) | set(schema.PHASES)
    elsewhere = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "schema.py":
            continue
        for name, value in _module_constants(path):
            if name.lstrip("_").startswith(VOCABULARY_PREFIXES) or value in vocabulary:
                elsewhere.append(f"{path.relative_to(PACKAGE)}: {name} = {value!r}")
    assert not elsewhere, "event vocabulary declared outside schema.py:\n" + "\n".join(elsewhere)


def test_vocabulary_check_sees_a_copy(tmp_path):
    copy = tmp_path / "reader.py"
    copy.write_text('CAT_OP = "dynamo"\nOTHER, KIND = 1, "module"\n')
    assert dict(_module_constants(copy)) == {"CAT_OP": "dynamo", "KIND": "module"}


def _stub():
    tree = ast.parse((PACKAGE / "_core.pyi").read_text())
    top, classes = set(), {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            top.add(node.target.id)
        elif isinstance(node, ast.ClassDef):
            top.add(node.name)
            classes[node.name] = {n.name if isinstance(n, ast.FunctionDef) else n.target.id
                                  for n in node.body if isinstance(n, (ast.FunctionDef, ast.AnnAssign))}
    return top, classes


def _public(names):
    return {n for n in names if not n.startswith("_")}


def test_core_stub_matches_the_extension():
    top, classes = _stub()
    assert top == _public(dir(_core))
    for name, members in classes.items():
        assert _public(members) == _public(dir(getattr(_core, name))), name


SNAPSHOT = """
import atexit, signal, torch, torch.optim.optimizer as opt
from multiprocessing import util as mp_util
from torch.utils.data import dataloader
from torch._dynamo.callback import callback_handler

def snapshot():
    return {
        "backward": torch.autograd.backward, "grad": torch.autograd.grad,
        "next": vars(dataloader._BaseDataLoaderIter).get("__next__"),
        "mp_init": vars(dataloader._MultiProcessingDataLoaderIter).get("__init__"),
        "zero_grad": vars(torch.optim.Optimizer).get("zero_grad"),
        "pre": dict(opt._global_optimizer_pre_hooks), "post": dict(opt._global_optimizer_post_hooks),
        "install_callbacks": vars(callback_handler).get("install_callbacks"),
        "end_callbacks": list(callback_handler.end_callbacks),
        "ours_afterfork": sum(type(v).__module__ == "dftrace_dynamo.session.hooks"
                              for v in list(mp_util._afterfork_registry.values())),
        "signals": {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)},
    }
"""


def test_hooks_install_and_remove_leave_torch_as_it_was(tmp_path):
    code = SNAPSHOT + textwrap.dedent(f"""
        before = snapshot()
        import dftrace_dynamo
        from dftrace_dynamo import create_backend, dftracer
        from dftrace_dynamo.session import hooks
        imported = snapshot()  # the backend hooks Dynamo's compile entry, to see the first compile begin
        assert sorted(k for k in before if imported[k] != before[k]) == ["install_callbacks"]
        log = dftracer.initialize_log({str(tmp_path / "t")!r})
        model = torch.nn.Linear(4, 2)
        step = torch.compile(model, backend=create_backend(level="aten"))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.utils.data.DataLoader(torch.randn(4, 4), batch_size=2, num_workers=1)
        for x in data:
            step(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        log.finalize()
        during = snapshot()
        changed = sorted(k for k in before if during[k] != before[k])
        assert changed == ["backward", "end_callbacks", "grad", "install_callbacks", "mp_init", "next",
                           "ours_afterfork", "post", "pre", "signals", "zero_grad"], changed
        from dftrace_dynamo.session import dataloaders, logger
        exits = [logger.finalize, dataloaders._shutdown]
        hooks.remove_all()
        after = snapshot()
        assert after == before, sorted(k for k in before if after[k] != before[k])
        assert after["backward"] is before["backward"] and after["next"] is before["next"]
        count = atexit._ncallbacks()
        for fn in exits:  # already unregistered: nothing left to take out
            atexit.unregister(fn)
        assert atexit._ncallbacks() == count
        print("restored")
    """)
    # eager ops on: their hooks (Dynamo's end callbacks among them) must come out too
    result = run_py(code, tmp_path, env={"DFTRACER_BIND_SIGNALS": "1", "DFTRACER_EAGER_OPS": "1"})
    assert result.returncode == 0, result.stderr
    assert "restored" in result.stdout


def test_public_imports_and_no_torch_on_import(tmp_path):
    code = textwrap.dedent("""
        import sys
        import dftrace_dynamo
        from dftrace_dynamo import dftracer, initialize_log, finalize, log_event, region, get_time
        from dftrace_dynamo import schema
        from dftrace_dynamo.session import config, hooks, logger
        from dftrace_dynamo.traces import summary, reader
        import dftrace_dynamo.cli
        assert "torch" not in sys.modules, "importing the package or its trace tools imported torch"
        from importlib.metadata import entry_points
        from dftrace_dynamo import (Dynamo, create_backend, dftracer_dynamo_backend, dynamo, set_steps, step,
                                    step_context, tracer_backend)
        from dftrace_dynamo.backend import TracerBackend
        (backend,) = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "dftrace"]
        assert backend.load() is tracer_backend and isinstance(tracer_backend, TracerBackend)
        import torch
        f = torch.compile(lambda x: x * 2 + 1, backend="dftrace")
        assert torch.equal(f(torch.ones(3)), torch.full((3,), 3.0))
        assert dftracer.initialize_log is initialize_log and callable(dynamo.compile)
        print("ok")
    """)
    result = run_py(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout


def test_after_fork_hooks_run_as_multiprocessing_calls_them():
    from multiprocessing import util

    from dftrace_dynamo.session import hooks

    calls = []
    hook = hooks.declare(hooks.AfterProcessFork("test after fork", "test", lambda: calls.append(1)))
    hooks.install("test")
    util._run_after_forkers()  # what a multiprocessing child runs first
    hooks.remove("test")
    util._run_after_forkers()
    assert calls == [1] and not hook.installed


def test_hooks_come_out_after_dynamo_reset_cleared_its_callbacks(tmp_path):
    """``torch._dynamo.reset()`` empties Dynamo's callback lists, ours with them (the end callback
    of the compile the tracer was first imported in): taking the hooks out afterwards is not an
    error, and leaves torch as it was."""
    code = SNAPSHOT + textwrap.dedent("""
        before = snapshot()

        def backend(gm, example_inputs):  # the tracer imported inside Dynamo's first compile
            from dftrace_dynamo import tracer_backend
            return tracer_backend(gm, example_inputs)

        torch.compile(torch.nn.Linear(4, 2), backend=backend)(torch.randn(3, 4))
        from dftrace_dynamo.backend import compile_events
        from dftrace_dynamo.session import hooks
        assert compile_events._end_in_flight in callback_handler.end_callbacks
        torch._dynamo.reset()
        hooks.remove_all()
        assert snapshot()["end_callbacks"] == before["end_callbacks"]
        print("restored")
    """)
    result = run_py(code, tmp_path, env={"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": str(tmp_path / "t")})
    assert result.returncode == 0 and result.stdout.strip() == "restored", result.stderr
