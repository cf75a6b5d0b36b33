"""DataLoader workers still alive when the program exits keep their events.

At exit multiprocessing terminates the daemon processes still running (SIGTERM),
and a DataLoader worker then dies at once in torch's own SIGTERM handler, before
it writes its last events: a persistent DataLoader held in a global, or a loop
left with ``break``, has such workers. Before those exit hooks run, this module
shuts the workers down the way DataLoader itself does (``_shutdown_workers``),
so each worker leaves its loop and exits normally, closing its trace file.
"""

from __future__ import annotations

import atexit
import weakref

from . import config

_live: "weakref.WeakSet" = weakref.WeakSet()
_installed = False
_hooked = False


def install() -> None:
    """Tracks multi-process DataLoader iterators from now on (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    from torch.utils.data import dataloader

    cls = dataloader._MultiProcessingDataLoaderIter
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _live.add(self)
        _hook()

    cls.__init__ = __init__


def _hook() -> None:
    global _hooked
    if not _hooked:
        _hooked = True
        # atexit runs last-registered first: this runs before the hooks torch and
        # multiprocessing registered when they were imported (before any iterator)
        atexit.register(_shutdown)


def _shutdown() -> None:
    for it in list(_live):
        try:
            it._shutdown_workers()
        except Exception as exc:  # never let exit fail because of us
            config.log.warning("could not stop DataLoader workers at exit: %s", exc)
