"""Compile-side events: Dynamo frame compiles, graph breaks, recompiles, backend work.

Every record goes into the trace (category ``dynamo_compile``) when a log is
open, and to the registered listeners whether or not one is::

    from dftrace_dynamo import compile_events

    with compile_events.collect() as records:
        compiled(x)
    breaks = [r for r in records if r["kind"] == "graph_break"]

A record is a dict with at least ``kind``, ``name``, ``start_ns``, ``end_ns``
(``_core.now_ns`` clock) and, where known, ``compile_id`` (``"frame/attempt"``),
``frame`` (function being compiled), ``location`` (``file:line``) and ``reason``.
Kinds:

``compile``          one Dynamo frame compile (its duration; a ``reason`` when Dynamo gave up
                     on the frame, which then runs eagerly), or a lazy backward compile
``graph_break``      ``reason`` why Dynamo split the frame, ``location`` of the user code
``recompile``        ``reason``: the guard that failed, ``location`` of the frame
``backend``          our backend's work on one captured graph (``graph``, ``level``,
                     ``inner``: the wrapped backend, if any)
``instrument``       rewriting one graph (``graph``, ``phase``, ``nodes``)

Dynamo's hooks are process-wide: once installed (by the first tracing backend
or ``collect()``) every Dynamo compile in the process is reported.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import time
import types
import weakref
from typing import Callable, Iterator, Optional

import torch

from .. import _core
from ..events import steps
from ..session import config, hooks
from ..schema import ARG_KIND, CAT_COMPILE
from . import sites

_listeners: list[Callable[[dict], None]] = []
_seen = {"frames": 0, "break": None}  # Dynamo frame compiles ended in this process; the first graph break
_lock = threading.Lock()
_state = threading.local()  # the compiles in progress on this thread (innermost last)


def add_listener(fn: Callable[[dict], None]) -> None:
    """Calls ``fn(record)`` for every compile-side record from now on (installs the hooks)."""
    install()
    with _lock:
        _listeners.append(fn)


def remove_listener(fn: Callable[[dict], None]) -> None:
    with _lock:
        _listeners.remove(fn)


@contextlib.contextmanager
def collect() -> Iterator[list]:
    """Collects the records emitted inside the ``with`` block into the yielded list."""
    records: list = []
    add_listener(records.append)
    try:
        yield records
    finally:
        remove_listener(records.append)


def frames_seen() -> tuple[int, Optional[dict]]:
    """(Dynamo frame compiles ended in this process, the first graph break record or None)."""
    return _seen["frames"], _seen["break"]


def emit(kind: str, name: str, start_ns: int, end_ns: int, **fields) -> dict:
    """Writes one compile-side event and hands its record to the listeners."""
    args = {ARG_KIND: kind, **{k: v for k, v in fields.items() if v is not None}}  # kind: for summary's graphs view
    _core.log(name, CAT_COMPILE, start_ns, end_ns, args)
    record = dict(args, name=name, start_ns=start_ns, end_ns=end_ns)
    if kind == "graph_break" and _seen["break"] is None:
        _seen["break"] = record
    for fn in list(_listeners):
        try:
            fn(record)
        except Exception as exc:  # a broken listener must not break the user's compile
            config.log.warning("compile_events listener %r failed: %s", fn, exc)
    return record


def current() -> Optional[dict]:
    """The frame compile in progress on this thread: ``compile_id``, ``frame``, ``location``, ``start_ns``."""
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


def _earliest_start() -> Optional[int]:
    # a trace opening inside a compile (lazily) begins its first step no later than that compile
    return min((info["start_ns"] for info in getattr(_state, "stack", ())), default=None)


steps.begin_no_later_than(_earliest_start)


def _callback_handler():
    from torch._dynamo.callback import callback_handler

    return callback_handler


def _remove_end_callback() -> None:
    handler = _callback_handler()
    if _end_in_flight in handler.end_callbacks:  # torch._dynamo.reset() clears them
        handler.remove_end_callback(_end_in_flight)


def _end_callback() -> "hooks.Hook":
    return hooks.Registration("dynamo end callback", "compile in flight",
                              lambda: _callback_handler().register_end_callback(_end_in_flight),
                              _remove_end_callback)


GROUP = "compile"
hooks.declare(hooks.Patch("dynamo install_callbacks", GROUP, _callback_handler, "install_callbacks",
                           lambda original: _traced(original)))


def install() -> None:
    """Hooks Dynamo's compile callbacks (once per process).

    Dynamo runs its start/end callbacks once for a group of overlapping
    compiles (all threads together), so the hook wraps the context manager
    that every compile enters: each compile on each thread is seen.
    """
    from torch._guards import CompileContext

    with _lock:
        if hooks.installed("dynamo install_callbacks"):
            return
        hooks.install(GROUP)
        # Hooked while a frame compiles (the first backend call): that compile
        # did not enter through the hook; its end callback closes its record.
        compile_id = CompileContext.current_compile_id()
        if compile_id is None:
            return
        hooks.install_one(hooks.declare(_end_callback()).name)
    info = _start("dynamo", str(compile_id), _dynamo_start_ns(), breaks_seen=0)
    info["in_flight"] = True
    _push(info)


def _traced(install_callbacks):
    @contextlib.contextmanager
    def traced(trigger, compile_id):
        _push(_start(getattr(trigger, "name", "DYNAMO").lower(), compile_id))
        try:
            with install_callbacks(trigger, compile_id):
                yield
        except Exception as exc:
            _state.stack[-1]["failed"] = exc
            raise
        finally:
            _end(_state.stack.pop())

    return traced


def _push(info: dict) -> None:
    _state.__dict__.setdefault("stack", []).append(info)


def _end_in_flight(args) -> None:
    stack = getattr(_state, "stack", None)
    if stack and stack[0]["compile_id"] == getattr(args, "compile_id", None) and stack[0].get("in_flight"):
        _end(stack.pop(0))


def _dynamo_start_ns() -> Optional[int]:
    """When the frame compile in progress began (Dynamo's preparations before its callbacks
    included), or None if no compile is: the outermost one's metrics hold it."""
    from torch._dynamo.utils import get_metrics_context

    metrics = get_metrics_context()
    wall_start = getattr(metrics, "_start_time_ns", None)
    if not wall_start or getattr(metrics, "_level", 1) != 1:
        return None
    return _core.now_ns() - (time.time_ns() - wall_start)


def _compiling_frame() -> Optional[types.FrameType]:
    # Dynamo passes the code object and the frame's locals only to its own _compile(); find it on the stack.
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "_compile" and "torch/_dynamo" in frame.f_code.co_filename.replace("\\", "/"):
            return frame if isinstance(frame.f_locals.get("code"), types.CodeType) else None
        frame = frame.f_back
    return None


def _break_reasons() -> list:
    from torch._dynamo.utils import graph_break_reasons

    return graph_break_reasons


def _first_paragraph(text: str) -> str:
    return text.strip().split("\n\n", 1)[0]


def _start(trigger: str, compile_id: Optional[str], started_ns: Optional[int] = None,
           breaks_seen: Optional[int] = None) -> dict:
    compiling = _compiling_frame() if trigger == "dynamo" else None
    modules = ()
    if compiling is not None:
        code = compiling.f_locals["code"]
        f_locals = _owner_locals(compiling, code)
        modules = _frame_modules(compiling, f_locals)
    start = started_ns
    if start is None:  # decided before the compile begins, so that it lands in what follows
        start = (_dynamo_start_ns() if compiling is not None else None) or _core.now_ns()
        steps.compile_starts(modules, start)
    info = {"compile_id": compile_id, "trigger": trigger, "start_ns": start, "frame": None, "location": None,
            "breaks_seen": len(_break_reasons()) if breaks_seen is None else breaks_seen}
    if compiling is not None:
        # the compiled frame's locals and globals name its modules (sites.user_stacks); held until its end
        info["locals"], info["globals"], info["modules"] = f_locals, compiling.f_locals.get("globals"), modules
        info["code"] = code
        _register_modules(compiling, f_locals)
        info["frame"] = code.co_name
        info["location"] = f"{code.co_filename}:{code.co_firstlineno}"
        if _in_torch(code.co_filename):  # a wrapper of torch's around the user's code
            info.update(_user_code(compiling, f_locals), in_torch=True)
        reason = _recompile_reason()
        if reason:
            emit("recompile", "recompile", start, start, reason=_guard_text(reason), detail=reason,
                 frame=info["frame"], location=info["location"], module=info.get("module"),
                 compile_id=info["compile_id"])
    return info


_RESUME = re.compile(r"^torch_dynamo_resume_in_(.+)_at_\d+$")


def _receiver(code: types.CodeType, f_locals: dict):
    """The object a method's frame runs on: its ``self``, or its first argument whatever its name
    (``def forward(s, x)``) when the object's class has the method of that code; else None."""
    if "self" in f_locals:
        return f_locals["self"]
    if code.co_argcount and code.co_varnames[0] in f_locals:
        obj = f_locals[code.co_varnames[0]]
        try:
            method = getattr(type(obj), code.co_name, None)
        except Exception:  # a metaclass's __getattr__: not a method found there
            return None
        if getattr(method, "__code__", None) is code:
            return obj
    return None


def _owner_locals(compiling: types.FrameType, code: types.CodeType) -> dict:
    """The compiled frame's locals, its method's receiver as ``self`` whatever its name. A resume
    function (the rest of a function after a graph break) holds only the live ones: its receiver
    is taken from the function it resumes, which is running further up the stack."""
    f_locals = compiling.f_locals.get("locals") or {}
    if "self" in f_locals:
        return f_locals
    resumed = _RESUME.match(code.co_name)
    if resumed is None:
        owner = _receiver(code, f_locals)
    else:
        owner, frame = None, compiling.f_back
        while frame is not None and owner is None:
            if frame.f_code.co_name == resumed[1]:
                owner = _receiver(frame.f_code, frame.f_locals)
            frame = frame.f_back
    return f_locals if owner is None else {**f_locals, "self": owner}


def _frame_values(compiling: types.FrameType, f_locals: dict) -> list:
    """The frame's locals and its closure's contents, bound methods as their objects."""
    cells = compiling.f_locals.get("closure") or ()
    values = [*f_locals.values(), *(getattr(c, "cell_contents", None) for c in cells)]
    # only bound methods: any other object's __getattr__ may raise (torch.backends.cuda's does)
    return [value.__self__ if isinstance(value, types.MethodType) else value for value in values]


def _frame_modules(compiling: types.FrameType, f_locals: dict) -> tuple:
    """Weak references to the modules the frame runs: ``self``, a model passed in, and what
    ``torch.compile(model)``'s wrapper closes over; those holding parameters, if any do (a loss
    module stays in training mode when the model is put in eval mode)."""
    found = {id(v): v for v in _frame_values(compiling, f_locals) if isinstance(v, torch.nn.Module)}
    weighted = [m for m in found.values() if next(m.parameters(), None) is not None]
    return tuple(weakref.ref(module) for module in weighted or found.values())


def running_modules(info: dict) -> Optional[Callable[[], tuple]]:
    """For a graph of the frame compile ``info``: a function that, called from a call of the
    graph, returns the modules that call runs. Dynamo shares a graph between modules of one
    structure (their parameters are inputs: twin models, a GAN's two MLPs), so the compiled
    modules are not always the running ones: the receiver of the compiled frame's running copy
    (or, for a wrapper of torch's, of the nearest frame above it with one) is."""
    modules, code = info.get("modules"), info.get("code")
    if not modules or code is None:
        return None
    others = weakref.WeakKeyDictionary()  # a module the graph also runs for: the weak references to it

    def running() -> tuple:
        try:
            receiver = _running_receiver(code)
        except Exception:  # an odd frame or module: the modules as compiled
            return modules
        if receiver is None or any(ref() is receiver for ref in modules):
            return modules
        found = others.get(receiver)
        if found is None:
            found = others[receiver] = (weakref.ref(receiver),)
        return found

    return running


_FRAMES = 48  # from a graph call up to the compiled frame: torch's wrappers and the backend's


def _running_receiver(code: types.CodeType) -> Optional[torch.nn.Module]:
    """The module whose call runs the frame of ``code`` now on this thread's stack (Dynamo runs a
    copy of the code with its name and file), or of one of the 3 frames above it."""
    frame, above = sys._getframe(1), -1
    for _ in range(_FRAMES):
        if frame is None or above > 2:
            return None
        f_code = frame.f_code
        if above >= 0 or (f_code.co_name == code.co_name and f_code.co_filename == code.co_filename):
            above += 1
            # f_locals builds a dict: only where a receiver can be (an argument, or a closure's self)
            if f_code.co_argcount or "self" in f_code.co_freevars:
                receiver = _receiver(code if above == 0 else f_code, frame.f_locals)
                if isinstance(receiver, torch.nn.Module):
                    return getattr(receiver, "_orig_mod", receiver)  # torch.compile's wrapper: the user's
        frame = frame.f_back
    return None


def _register_modules(compiling: types.FrameType, f_locals) -> None:
    """The modules a compiled frame holds (its ``self``, a model passed to it) are the user's roots,
    unless already known inside one (:func:`.sites.register`); so are the modules whose code calls
    it from eager code further up the stack (a compiled submodule of an eager model), outermost first."""
    callers = []
    frame = compiling.f_back
    while frame is not None:
        # torch's frames and ours (a compiled module's call, events.eager) run no user's module
        owner = _receiver(frame.f_code, frame.f_locals) if not hooks.not_user(frame.f_code.co_filename) else None
        if isinstance(owner, torch.nn.Module):
            callers.append(owner)
        frame = frame.f_back
    for value in [*reversed(callers), *(f_locals or {}).values()]:
        if isinstance(value, torch.nn.Module):
            sites.register(value, compiling)


def _user_code(compiling: types.FrameType, f_locals: dict) -> dict:
    """Where torch compiles code of its own (``external_utils``' wrappers, ``Module.__call__``):
    the module (class, path) or function it wraps, from the frame's locals and closure, located at
    the first caller outside torch."""
    found, module = {}, None
    for value in _frame_values(compiling, f_locals):
        if isinstance(value, torch.nn.Module):
            module = value
            found = {"frame": type(value).__name__, "module": sites.register(value)}
            break
        if isinstance(value, types.FunctionType) and not _in_torch(value.__code__.co_filename):
            found = {"frame": value.__qualname__}
    frame = hooks.user_frame(compiling.f_back)
    if frame is not None:
        found["location"] = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    if module is not None and not found["module"]:  # a root: by the caller's name for it (D, model)
        found["module"] = sites.root_name(module, compiling)
    return found


def _in_torch(filename: str) -> bool:
    return filename.startswith(hooks.torch_dir())


def _recompile_reason() -> Optional[str]:
    # Dynamo stores the failed guard of a recompile in the metrics of the compile in progress.
    from torch._dynamo.utils import get_metrics_context

    return getattr(get_metrics_context(), "_metrics", {}).get("recompile_reason")


def _guard_text(reason: str) -> str:
    # "0/0: n == 2   # return x * n  # file:16 in f\nUser stack trace: ..." -> "n == 2"
    first = reason.strip().splitlines()[0]
    first = first.split(": ", 1)[1] if ": " in first and "/" in first.split(": ", 1)[0] else first
    return first.split("  #", 1)[0].strip()


def _user_location(stack) -> Optional[str]:
    """``file:line`` of the innermost user frame of a Dynamo user stack (its last frame if none)."""
    stack = stack or []
    frame = next((f for f in reversed(stack) if not hooks.not_user(f.filename)), stack[-1] if stack else None)
    return f"{frame.filename}:{frame.lineno}" if frame else None


def _eager_fallback(exc: Optional[BaseException]) -> Optional[str]:
    """Why Dynamo gave up on the whole frame (it then runs eagerly, in no graph), or None: a graph
    break it could not resume from, which torch records in no list of graph breaks."""
    from torch._dynamo.exc import Unsupported, UserError

    if not isinstance(exc, (Unsupported, UserError)):
        return None
    return f"the frame runs eagerly, in no graph: {_first_paragraph(str(exc))}"


def _end(info: dict) -> None:
    end = _core.now_ns()
    breaks, fallback = 0, None
    if info["trigger"] == "dynamo":  # frame compiles hold Dynamo's compile lock: the break list is theirs
        _seen["frames"] += 1
        reasons = _break_reasons()
        seen = info["breaks_seen"] if info["breaks_seen"] <= len(reasons) else 0
        breaks = len(reasons) - seen
        for reason in reasons[seen:]:
            emit("graph_break", "graph break", end, end, reason=_first_paragraph(reason.reason),
                 location=_user_location(reason.user_stack), frame=info["frame"], compile_id=info["compile_id"])
        # a frame of torch's own (an optimizer's step wrapper) running eagerly is no news of the user's code
        fallback = None if info.get("in_torch") else _eager_fallback(info.get("failed"))
        if fallback:
            breaks += 1
            emit("graph_break", "graph break", end, end, reason=fallback,
                 location=_user_location(getattr(info["failed"], "real_stack", None)) or info["location"],
                 frame=info["frame"], compile_id=info["compile_id"])
    name = f"dynamo compile {info['frame']}" if info["frame"] else f"compile ({info['trigger']})"
    emit("compile", name, info["start_ns"], _core.now_ns(), frame=info["frame"], location=info["location"],
         module=info.get("module"), compile_id=info["compile_id"], trigger=info["trigger"], graph_breaks=breaks,
         **({"reason": fallback} if fallback else {}))
