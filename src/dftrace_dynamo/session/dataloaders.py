"""DataLoader workers still alive when the program exits keep their events.

At exit multiprocessing terminates the daemon processes still running (SIGTERM),
and a DataLoader worker then dies at once in torch's own SIGTERM handler, before
it writes its last events: a persistent DataLoader held in a global, or a loop
left with ``break``, has such workers. Before those exit hooks run, this module
shuts the workers down the way DataLoader itself does (``_shutdown_workers``),
so each worker leaves its loop and exits normally, closing its trace file.
"""

from __future__ import annotations

import sys
import weakref

from . import config, hooks

_live: "weakref.WeakSet" = weakref.WeakSet()


def _track(init):
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _live.add(self)
        # atexit runs last-registered first: registered now, this runs before the hooks
        # torch and multiprocessing registered when they were imported (before any iterator)
        hooks.install(EXIT_GROUP)

    return __init__


def _iterator_class():
    from torch.utils.data import dataloader

    return dataloader._MultiProcessingDataLoaderIter


GROUP, EXIT_GROUP = "dataloader", "dataloader exit"
hooks.declare(hooks.Patch("DataLoader worker iterator __init__", GROUP, _iterator_class, "__init__", _track))


def install() -> None:
    """Tracks multi-process DataLoader iterators from now on (once per process)."""
    hooks.install(GROUP)


def install_when_imported() -> None:
    """:func:`install` now if DataLoader's module is loaded, else as soon as it is (whatever the
    order in which the program imports torch and opens its trace)."""
    if _MODULE in sys.modules:
        install()
    else:
        hooks.install(IMPORT_GROUP)


_MODULE = "torch.utils.data.dataloader"
IMPORT_GROUP = "dataloader import"
hooks.declare(hooks.ImportWatch("DataLoader module import", IMPORT_GROUP, (_MODULE,), install))


def _shutdown() -> None:
    for it in list(_live):
        try:
            it._shutdown_workers()
        except Exception as exc:  # never let exit fail because of us
            config.log.warning("could not stop DataLoader workers at exit: %s", exc)


hooks.declare(hooks.AtExit("DataLoader workers shut down at exit", EXIT_GROUP, _shutdown))
