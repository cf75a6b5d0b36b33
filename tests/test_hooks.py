"""Import watches (session.hooks.ImportWatch): several watching one module all run, once, when it
is imported, whatever else is on sys.meta_path (the step tracker and the trainer-code slices both
watch ``transformers.trainer``)."""

import sys

from dftrace_dynamo.session import hooks


def test_two_watches_of_one_module_each_run_once_at_its_import(tmp_path, monkeypatch):
    (tmp_path / "watched_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = []
    watches = [hooks.ImportWatch(f"test watch {i}", "test watches", {"watched_mod"},
                                 lambda i=i: calls.append((i, sys.modules["watched_mod"].VALUE)))
               for i in range(2)]
    for watch in watches:
        watch._install()
    try:
        import watched_mod  # noqa: F401
    finally:
        for watch in watches:
            watch._remove()
        sys.modules.pop("watched_mod", None)
    assert sorted(calls) == [(0, 1), (1, 1)]
