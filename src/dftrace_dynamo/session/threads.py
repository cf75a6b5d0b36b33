"""The tracer's own Python threads (memory sampler, flight watcher, SIGTERM watcher, CUDA
resolver): started with every signal blocked.

A signal sent to the process (``kill``, Ctrl-C, ``os.kill(os.getpid(), ...)``) is taken by any
thread that does not block it. Python runs its handler only when the main thread next checks
for one; taken by one of our threads just as the main thread blocks (``signal.pause()``, a
lock, a read), the handler waits as long as the main thread does. The C writer thread blocks
signals for the same reason.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable


def start(target: Callable[..., Any], name: str, *args: Any) -> threading.Thread:
    """Starts ``target(*args)`` in a daemon thread that takes no signal."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    # the new thread inherits the mask at creation: no instant in which it takes a signal
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return thread
