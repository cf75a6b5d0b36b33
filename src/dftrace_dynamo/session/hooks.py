"""Every hook the tracer puts into torch and Python, installed and removed in one place.

Each hook is declared by the module it serves (steps, DataLoader workers, compile
events, process exit, fork, signals) as one of the kinds below, with a name and
a group. :func:`install` installs a group's hooks, each once; :func:`remove_all`
takes every installed hook out again, restoring exactly what it replaced, so a
program (or a test) finds torch and Python as they were.

Nothing is installed at import. Fork callbacks cannot be unregistered from
Python, so one dispatcher is registered with ``os.register_at_fork`` on first
use and calls only the fork hooks installed at that moment, after freeing the
locks declared :func:`fork_safe`.
"""

from __future__ import annotations

import atexit
import functools
import os
import signal
import sys
import threading
from typing import Any, Callable, Optional

_lock = threading.RLock()
_declared: dict[str, "Hook"] = {}  # by name, in declaration order
_fork_dispatcher = False
_MISSING = object()


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# the tracer's own hooks (optimizer hooks, backward and zero_grad wrappers, module hooks) that
# Dynamo may trace into; the CLI and graph tools hold user-facing code (the demo's model)
_OURS = tuple(_PACKAGE_DIR + part for part in (f"backend{os.sep}", f"events{os.sep}", f"session{os.sep}",
                                               "dftracer.py", "integrations.py"))


@functools.lru_cache(maxsize=None)
def torch_dir() -> str:
    return os.path.dirname(sys.modules["torch"].__file__) + os.sep


def not_user(filename: str) -> bool:
    """torch's code, or the tracer's hooks: what a user's location points past."""
    return filename.startswith(torch_dir()) or filename.startswith(_OURS)


def user_frame(frame):
    """The first frame from ``frame`` outward that is the user's (:func:`not_user`), or None."""
    while frame is not None and not_user(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


class Hook:
    """A named change to torch or Python that can be put in and taken out again."""

    def __init__(self, name: str, group: str):
        self.name, self.group = name, group
        self.installed = False

    def _install(self) -> None:
        raise NotImplementedError

    def _remove(self) -> None:
        raise NotImplementedError


class Patch(Hook):
    """``owner().attr = wrap(original)``; removing puts the original back.

    ``owner`` is called at install time, so declaring a patch of torch does not import it.
    If something else replaced the attribute after us, removing leaves theirs in place.
    ``wrap`` gets the attribute as looked up (a bound method, a function).
    """

    def __init__(self, name: str, group: str, owner: Callable[[], Any], attr: str, wrap: Callable):
        super().__init__(name, group)
        self.owner, self.attr, self.wrap = owner, attr, wrap
        self._target = self._own = self.replacement = None

    def _install(self) -> None:
        self._target = self.owner()
        # what the object itself held (an inherited or class attribute is not copied onto it)
        self._own = vars(self._target).get(self.attr, _MISSING)
        self.replacement = self.wrap(getattr(self._target, self.attr))
        _frame_never_compiled(self.replacement)
        setattr(self._target, self.attr, self.replacement)

    def _remove(self) -> None:
        if vars(self._target).get(self.attr) is self.replacement:
            if self._own is _MISSING:
                delattr(self._target, self.attr)
            else:
                setattr(self._target, self.attr, self._own)
        self._target = self._own = self.replacement = None


def _frame_never_compiled(fn) -> None:
    """Dynamo still inlines ``fn`` into the frames it compiles, but never compiles ``fn``'s frame,
    nor the frames it calls, when ``fn`` runs eagerly from a compiled function's graph break: such
    a compile takes the wrapper's "Dynamo is tracing" branch for good (and the tracer's helpers'),
    skipping its recording. (torch's own code is never compiled there either: its files are skipped.)"""
    eval_frame = getattr(sys.modules.get("torch._C._dynamo"), "eval_frame", None)
    code = getattr(fn, "__code__", None)
    try:
        skip = eval_frame._FrameAction.SKIP
        eval_frame.set_code_exec_strategy(code, eval_frame._FrameExecStrategy(skip, skip))
    except (AttributeError, TypeError):  # another torch, or not a Python function
        pass


class Registration(Hook):
    """``register()``, undone by ``unregister()``, or else by ``remove()`` on what ``register()``
    returned (torch's ``RemovableHandle``)."""

    def __init__(self, name: str, group: str, register: Callable[[], Any],
                 unregister: Optional[Callable[[], None]] = None):
        super().__init__(name, group)
        self.register, self.unregister, self._handle = register, unregister, None

    def _install(self) -> None:
        self._handle = self.register()

    def _remove(self) -> None:
        if self.unregister is not None:
            self.unregister()
        else:
            self._handle.remove()
        self._handle = None


class ImportWatch(Hook):
    """A ``sys.meta_path`` finder that only hooks the loading of ``modules``: it runs ``then()``
    once such a module has executed (whatever the order in which the program imports it and
    opens its trace)."""

    def __init__(self, name: str, group: str, modules, then: Callable[[], None]):
        super().__init__(name, group)
        self.modules, self.then = frozenset(modules), then

    def _install(self) -> None:
        sys.meta_path.insert(0, self)

    def _remove(self) -> None:
        sys.meta_path.remove(self)

    def find_spec(self, name, path, target=None):
        if name not in self.modules:
            return None
        # the first watch of the name runs every watch's then(); each asks the other finders only
        watches = [f for f in sys.meta_path if isinstance(f, ImportWatch) and name in f.modules]
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if not isinstance(finder, ImportWatch) and find else None
            if spec is not None and spec.loader is not None:
                execute = spec.loader.exec_module

                def exec_module(module):
                    execute(module)
                    for watch in watches:
                        watch.then()

                spec.loader.exec_module = exec_module
                return spec
        return None


class AtExit(Hook):
    """``atexit.register(fn)``; removing unregisters it."""

    def __init__(self, name: str, group: str, fn: Callable[[], None]):
        super().__init__(name, group)
        self.fn = fn

    def _install(self) -> None:
        atexit.register(self.fn)

    def _remove(self) -> None:
        atexit.unregister(self.fn)


class AtFork(Hook):
    """Runs ``fn()`` in a forked child while installed."""

    def __init__(self, name: str, group: str, fn: Callable[[], None]):
        super().__init__(name, group)
        self.fn = fn

    def _install(self) -> None:
        global _fork_dispatcher
        if not _fork_dispatcher:
            _fork_dispatcher = True
            os.register_at_fork(after_in_child=_after_fork_in_child)

    def _remove(self) -> None:
        pass  # the dispatcher skips hooks that are not installed


class AfterProcessFork(Hook):
    """Runs ``fn()`` in a ``multiprocessing`` child right after ``Process._bootstrap`` dropped
    the finalizers it inherited (``multiprocessing.util.register_after_fork``)."""

    def __init__(self, name: str, group: str, fn: Callable[[], None]):
        super().__init__(name, group)
        self.fn = fn

    def _run(self) -> None:  # multiprocessing calls func(obj): obj is this hook
        if self.installed:
            self.fn()

    def _install(self) -> None:
        from multiprocessing import util

        util.register_after_fork(self, AfterProcessFork._run)

    def _remove(self) -> None:
        from multiprocessing import util

        for key, value in list(util._afterfork_registry.items()):
            if value is self:
                del util._afterfork_registry[key]


class Signal(Hook):
    """``signal.signal(sig, handler)``; removing restores the previous handler if ours is current."""

    def __init__(self, name: str, group: str, sig: int, handler: Callable):
        super().__init__(name, group)
        self.sig, self.handler, self.previous = sig, handler, None

    def _install(self) -> None:
        self.previous = signal.signal(self.sig, self.handler)

    def _remove(self) -> None:
        if signal.getsignal(self.sig) is self.handler:
            signal.signal(self.sig, self.previous)


def declare(hook: Hook) -> Hook:
    """Makes ``hook`` known (not installed); a name declared again replaces an uninstalled one."""
    with _lock:
        old = _declared.get(hook.name)
        if old is not None and old.installed:
            return old
        _declared[hook.name] = hook
        return hook


def install(group: str) -> None:
    """Installs every declared hook of ``group`` that is not installed yet."""
    with _lock:
        for hook in list(_declared.values()):
            if hook.group == group:
                _install(hook)


def install_one(name: str) -> None:
    with _lock:
        _install(_declared[name])


def _install(hook: Hook) -> None:
    if not hook.installed:
        hook._install()
        hook.installed = True


def installed(name: str) -> bool:
    hook = _declared.get(name)
    return hook is not None and hook.installed


def remove_one(name: str) -> None:
    hook = _declared.get(name)
    if hook is not None:
        _remove([hook])


def remove(group: str) -> None:
    """Removes the installed hooks of ``group``, last declared first."""
    _remove([h for h in _declared.values() if h.group == group])


def remove_all() -> None:
    """Removes every installed hook, last declared first, restoring what each replaced."""
    _remove(list(_declared.values()))


def _remove(hooks: list) -> None:
    with _lock:
        for hook in reversed(hooks):
            if hook.installed:
                hook.installed = False
                hook._remove()


_fork_locks: list = []  # fork_safe()


def fork_safe(lock):
    """``lock`` (a threading Lock or RLock), made free again in a forked child before any fork hook
    runs: a thread of the parent that held it is not there to release it. Returns ``lock``."""
    _fork_locks.append(lock)
    return lock


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.RLock()  # a thread of the parent may have held it
    for lock in _fork_locks:
        lock._at_fork_reinit()  # what threading does for its own locks
    for hook in list(_declared.values()):
        if isinstance(hook, AtFork) and hook.installed:
            hook.fn()
