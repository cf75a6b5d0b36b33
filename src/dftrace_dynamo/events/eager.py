"""Op events of the ops that run outside compiled graphs (eager ops).

Code Dynamo leaves eager (after a graph break, a module it skips such as ``nn.LSTM``, a
loss computed outside the compiled model, an optimizer's ``step()``) runs ATen ops that
no graph instruments. torch reports every ATen op to its RecordFunction observers; its
ITT profiler (``ProfilerState.ITT``) is one whose calls go through exported C function
pointers of ``libtorch_cpu`` (``__itt_task_begin_ptr__3_0``, ...). The C extension points
them at its own functions (``_core.eager_install``), which record each outermost ATen op
of the thread as an op event (``cat:"dynamo"``, ``args.level == "eager"``) while op-level
events are recorded, outside compiled graphs and compiles. See docs/design.rst
("Eager ops") for why this and not a dispatch mode.

Eager module calls: while ops are observed, torch's global forward pre/post hooks are
``_core.eager_module_enter`` / ``eager_module_exit`` (C functions: Dynamo makes no frame of
them); Dynamo traces them as no-ops (:func:`torch._dynamo.substitute_in_graph`), so no compiled
graph holds them and they stay in while any thread compiles. Each eager module call's ops carry
its path (``args.module``) and the call is a module slice, as the resolver the backend sets
(:func:`set_module_resolver`) says.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import sys
import threading
import warnings
import weakref

from .. import _core, schema
from ..session import config, hooks, logger

LEVEL = "eager"  # args.level of eager op events
_DOMAIN = "_ZN5torch8profilerL11_itt_domainE"  # torch's ITT domain (a static of itt_wrapper.cpp)
_BEGIN = "__itt_task_begin_ptr__3_0"
_SCOPES = ("FUNCTION", "BACKWARD_FUNCTION")  # ATen ops, and autograd's engine (phase backward)


class _State:
    installed = None  # None: not tried; True / False: torch's ITT calls reach us or not
    domain = None  # the ITT domain we gave torch (kept alive)
    sites: dict = {}  # op name -> site
    thread = None  # the thread whose ATen ops are observed (ITT profiling is per thread)
    forked = False  # a forked child (a DataLoader worker): it runs no step, its ops are not observed
    paused = False  # stopped while torch.profiler runs on that thread
    resolver = None  # (module, caller) -> (path, slice, keep) of an eager module call (the backend's)
    traced_away = None  # None: not tried; whether Dynamo traces the module hooks as no-ops
    tags: dict = {}  # path -> tags id of ,"module":path
    slice_sites: dict = {}  # (path, module type) -> module slice site
    entries: dict = {}  # id(module) -> (weakref, tags, site), read by _core.eager_module_enter


_state = _State()
_lock = threading.Lock()


class _Domain(ctypes.Structure):  # ittnotify's __itt_domain; torch reads flags only
    _fields_ = [("flags", ctypes.c_int), ("nameA", ctypes.c_char_p), ("nameW", ctypes.c_void_p),
                ("extra1", ctypes.c_int), ("extra2", ctypes.c_void_p), ("next", ctypes.c_void_p)]


def _symbols(path: str, names: tuple) -> dict:
    """``{name: st_value}`` of these symbols of the ELF shared object at ``path`` (its
    ``.symtab``, else ``.dynsym``); names not found are left out."""
    import numpy as np

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"\x7fELF" or m[4] != 2 or m[5] != 1:  # 64-bit little-endian only
            return {}
        shoff, = struct.unpack_from("<Q", m, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", m, 0x3A)
        heads = [struct.unpack_from("<IIQQQQIIQQ", m, shoff + i * shentsize) for i in range(shnum)]
        found = {}
        for kind in (2, 11):  # SHT_SYMTAB, SHT_DYNSYM
            for h in heads:
                if h[1] != kind:
                    continue
                strtab = heads[h[6]]
                strings = m[strtab[4]:strtab[4] + strtab[5]]
                syms = np.frombuffer(m, dtype=np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"),
                                                        ("shndx", "<u2"), ("value", "<u8"), ("size", "<u8")]),
                                     count=h[5] // 24, offset=h[4])
                for name in names:
                    at = strings.find(b"\0" + name.encode() + b"\0")
                    if name in found or at < 0:
                        continue
                    hit = np.nonzero(syms["name"] == at + 1)[0]
                    if len(hit):
                        found[name] = int(syms["value"][hit[0]])
                del syms
        return found


def _install() -> bool:
    """Points torch's ITT calls at the C extension, once; whether they reach it."""
    import torch

    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    if not os.path.exists(path) or not _core.eager_install(path):
        return False
    values = _symbols(path, (_DOMAIN, _BEGIN))
    if len(values) != 2:
        return False
    lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    base = ctypes.addressof(ctypes.c_void_p.in_dll(lib, _BEGIN)) - values[_BEGIN]
    domain = ctypes.c_void_p.from_address(base + values[_DOMAIN])
    if not domain.value:  # no ITT collector loaded: torch created no domain
        _state.domain = _Domain(flags=1, nameA=b"PyTorch")
        domain.value = ctypes.addressof(_state.domain)
    return True


def _intern(names) -> None:
    """Sites of these op names (interned once each), handed to the C extension."""
    new = False
    for name in names:
        if name not in _state.sites:
            _state.sites[name] = _core.intern_site(name, schema.CAT_OP, {schema.ARG_LEVEL: LEVEL})
            new = True
    if new:
        _core.set_eager_sites(_state.sites)


def _op_names() -> list:
    import torch

    return sorted({n.split(".", 1)[0] for n in torch._C._dispatch_get_all_op_names()})


def sync() -> None:
    """Gives ops registered since (custom ops) their sites, once one of them ran."""
    if _state.thread is not None and _core.eager_missed():
        _intern(_op_names())


def _profiler_config():
    from torch._C._profiler import ProfilerConfig, ProfilerState, RecordScope, _ExperimentalConfig

    cfg = ProfilerConfig(ProfilerState.ITT, False, False, False, False, False, _ExperimentalConfig())
    return cfg, {getattr(RecordScope, s) for s in _SCOPES}


def _start() -> None:
    """Observes this thread's ATen ops (the thread that opened the trace)."""
    import torch
    from torch._C._autograd import _enable_profiler

    with _lock:
        if _state.installed is None:
            _state.installed = _install()
            if _state.installed:
                _intern(_op_names())
                hooks.install(GROUP)
        if not _state.installed:
            config.log.warning("eager ops are not recorded: this torch build (%s) has no ITT hooks to "
                               "observe ATen ops through", torch.__version__)
            return
        if _state.thread is not None or torch._C._autograd._profiler_enabled():  # the user profiles
            return
        cfg, scopes = _profiler_config()
        _enable_profiler(cfg, set(), scopes)
        # torch's observers miss the first op call that begins after they are enabled on a
        # thread (the program's first op, or the outer op of its first nested ones): an op of
        # ours takes that place, recorded as none (as a compile's)
        _core.eager_compiling(1)
        try:
            torch.empty(0)
        finally:
            _core.eager_compiling(-1)
        _core.set_eager_observing(True)
        _state.thread = threading.get_ident()
        _modules_on()


def _stop() -> None:
    from torch._C._autograd import _disable_profiler

    if _state.thread == threading.get_ident():
        _state.thread = None
        _core.eager_release(_core.ops_on())
        _modules_off()
        _core.set_eager_observing(False)
        _disable_profiler()


def _in_child() -> None:
    """A forked child inherits its parent's observed thread: its held records are dropped and its
    ops no longer observed (a DataLoader worker's collate belongs to no step; its file stays
    only if it records something else)."""
    _state.forked = True
    if _state.thread == threading.get_ident():
        from torch._C._autograd import _disable_profiler

        _state.thread = None
        _core.eager_release(False)
        _modules_off()
        _core.set_eager_observing(False)
        _disable_profiler()


def _on_open() -> None:
    if not config.get().eager_ops or "torch" not in sys.modules or _state.forked:
        return
    try:
        _start()
    except Exception as exc:  # the program runs on without eager ops
        _state.installed = False
        config.log.warning("eager ops are not recorded: %s: %s", type(exc).__name__, exc)


def _on_close() -> None:
    try:
        _stop()
    except Exception as exc:
        config.log.warning("eager ops: %s: %s", type(exc).__name__, exc)


# ---- eager module calls: their paths and slices --------------------------------------------

MODULES = "eager modules"  # the global module hooks' group
# torch warns on each call of a torch.compile'd module while global module hooks exist (they
# would see its wrapper too); the resolver leaves the wrapper out
_WRAPPER_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"


def set_module_resolver(resolver) -> None:
    """``resolver(module, caller) -> (path, slice, keep)``: the path the ops of an eager call of
    ``module`` (called from ``caller``'s call, None at the top) carry (None: the caller's), whether
    the call is a module slice (or its ``(name, module type)`` where they are not the path and
    ``module``'s class: a ``torch.compile`` wrapper's call is the compiled model's), whether the
    answer holds for the module's later calls."""
    _state.resolver = resolver


def forget(module) -> None:
    """``module``'s later calls ask the resolver again."""
    _state.entries.pop(id(module), None)


def _resolve(module, caller):
    try:
        path, has_slice, keep = _state.resolver(module, None if caller is None else caller)
        key = has_slice if isinstance(has_slice, tuple) else (path, type(module).__name__)
        if key[0] is None:
            entry = (weakref.ref(module), 0, 0)
        else:
            tags = 0 if path is None else _state.tags.get(path)  # 0: the caller's path
            if tags is None:
                tags = _state.tags[path] = _core.intern_tags({schema.ARG_MODULE: path})
            site = 0
            if has_slice:
                site = _state.slice_sites.get(key)
                if site is None:
                    site = _state.slice_sites[key] = _core.intern_site(key[0], schema.CAT_MODULE,
                                                                       {schema.ARG_MODULE_TYPE: key[1]})
            entry = (weakref.ref(module), tags, site)
        if keep:
            _state.entries[id(module)] = entry
        return entry
    except Exception as exc:  # the call runs on, its ops without a path
        config.log.warning("eager ops: no module path for %s: %s: %s", type(module).__name__, type(exc).__name__, exc)
        _state.entries[id(module)] = (weakref.ref(module), 0, 0)
        return None


def _modules_on() -> None:
    if _state.resolver is None:
        return
    import torch

    if not torch._dynamo.config.skip_nnmodule_hook_guards:  # Dynamo would recompile when they come and go
        config.log.warning("eager ops carry no module paths: torch._dynamo.config.skip_nnmodule_hook_guards is off")
        return
    if not _traced_away():
        return
    _state.entries.clear()  # paths are the trace file's
    # the module call of a torch.compile'd module runs under Dynamo's frame hook: no frame of ours is compiled
    _core.set_eager_modules(_state.entries, torch._dynamo.disable(_resolve), torch.is_grad_enabled)
    warnings.filterwarnings("ignore", _WRAPPER_WARNING, UserWarning)
    hooks.install(MODULES)


def _nothing(*_args):
    """What Dynamo traces in place of the module hooks: compiled graphs have their own paths."""
    return None


def _traced_away() -> bool:
    """Dynamo traces the module hooks as no-ops (once); without that (an older torch) it would
    break every graph at them: eager ops carry no module paths then (one line says so)."""
    if _state.traced_away is None:
        import torch

        try:
            for hook in (_core.eager_module_enter, _core.eager_module_exit):
                torch._dynamo.substitute_in_graph(hook, skip_signature_check=True)(_nothing)
            _state.traced_away = True
        except (AttributeError, TypeError, ValueError) as exc:
            _state.traced_away = False
            config.log.warning("eager ops carry no module paths: this torch (%s) cannot trace module hooks "
                               "away (%s: %s)", torch.__version__, type(exc).__name__, exc)
    return _state.traced_away


def _modules_off() -> None:
    hooks.remove(MODULES)
    _core.set_eager_modules(None, None, None)
    warnings.filters[:] = [f for f in warnings.filters if not (f[0] == "ignore" and f[1] is not None
                                                                and f[1].pattern == _WRAPPER_WARNING)]


def _module_hooks():
    from torch.nn.modules import module

    return module


def _optimized_module():
    from torch._dynamo import eval_frame

    return eval_frame.OptimizedModule


def _wrap_compiled_call(original):
    """A ``torch.compile``'d module's call, while the only global module hooks are ours and it has
    none of its own: our hooks called directly around its forward, skipping torch's call path for
    modules with hooks and its warning about global hooks (together about 14,000 instructions per
    call, benchmarks/results_eager.rst)."""
    import torch
    from torch._dynamo import eval_frame

    module = _module_hooks()
    pre, post = module._global_forward_pre_hooks, module._global_forward_hooks
    tracing = torch._C._get_tracing_state
    enter, leave = _core.eager_module_enter, _core.eager_module_exit

    def __call__(self, *args, **kwargs):
        if (len(pre) == 1 and len(post) == 1 and not (module._global_backward_pre_hooks or module._global_backward_hooks
                                                      or self._forward_pre_hooks or self._forward_hooks
                                                      or self._backward_pre_hooks or self._backward_hooks
                                                      or tracing())):
            enter(self, args)
            try:
                with eval_frame._set_in_optimized_module():
                    return self.forward(*args, **kwargs)
            finally:
                leave(self, args, None)
        return original(self, *args, **kwargs)
    return __call__


# ---- hooks: compiles are not eager ops; torch.profiler takes over the observers it needs ----

def _compile_start(_args) -> None:
    _core.eager_compiling(1)


def _compile_end(_args) -> None:
    _core.eager_compiling(-1)


def _callbacks():
    from torch._dynamo.callback import callback_handler

    return callback_handler


def _wrap_clear(original):
    """``torch._dynamo.reset()`` clears Dynamo's callbacks: ours go back in at once (without them
    compiles would be eager ops)."""
    def clear(*args, **kwargs):
        result = original(*args, **kwargs)
        handler = _callbacks()
        handler.register_start_callback(_compile_start)
        handler.register_end_callback(_compile_end)
        _core.eager_compiling(0)
        return result
    return clear


def _optimizer_pre(_opt, _args, _kwargs) -> None:
    _core.set_eager_phase(_core.PHASE_OPTIMIZER)


def _optimizer_post(_opt, _args, _kwargs) -> None:
    _core.set_eager_phase(_core.PHASE_FORWARD)
    try:
        sync()
    except Exception as exc:  # never the user's optimizer step's error
        config.log.warning("eager ops: %s: %s", type(exc).__name__, exc)


def _wrap_profiler_enable(original):
    """torch.profiler on this thread: ours stops for it, and starts again after it."""
    def _enable_profiler(*args, **kwargs):
        if _state.thread == threading.get_ident():
            _on_close()
            _state.paused = True
        return original(*args, **kwargs)
    return _enable_profiler


def _wrap_profiler_disable(original):
    def _disable_profiler(*args, **kwargs):
        result = original(*args, **kwargs)
        if _state.paused and _core.is_open():
            _state.paused = False
            _on_open()
        return result
    return _disable_profiler


def _optimizer_hook(register, hook):
    def install():
        import torch

        # a compiled optimizer step calls the hook eagerly, from a graph break
        from torch.optim import optimizer

        return getattr(optimizer, register)(torch._dynamo.disable(hook))
    return install


def _profiler_module():
    import torch.autograd.profiler

    return torch.autograd.profiler


GROUP = "eager ops"
for _hook in (
    hooks.Registration("compile start (eager ops)", GROUP,
                       lambda: _callbacks().register_start_callback(_compile_start),
                       lambda: _callbacks().remove_start_callback(_compile_start)),
    hooks.Registration("compile end (eager ops)", GROUP,
                       lambda: _callbacks().register_end_callback(_compile_end),
                       lambda: _callbacks().remove_end_callback(_compile_end)),
    hooks.Registration("optimizer step pre-hook (eager ops)", GROUP,
                       _optimizer_hook("register_optimizer_step_pre_hook", _optimizer_pre)),
    hooks.Registration("optimizer step post-hook (eager ops)", GROUP,
                       _optimizer_hook("register_optimizer_step_post_hook", _optimizer_post)),
    hooks.Patch("torch._dynamo callbacks' clear (eager ops)", GROUP, _callbacks, "clear", _wrap_clear),
    hooks.Patch("torch.autograd.profiler._enable_profiler", GROUP, _profiler_module, "_enable_profiler",
                _wrap_profiler_enable),
    hooks.Patch("torch.autograd.profiler._disable_profiler", GROUP, _profiler_module, "_disable_profiler",
                _wrap_profiler_disable),
    hooks.AtFork("eager ops: a forked child observes none", GROUP, _in_child),
):
    hooks.declare(_hook)
for _hook in (
    hooks.Registration("module forward pre-hook (eager modules)", MODULES,
                       lambda: _module_hooks().register_module_forward_pre_hook(_core.eager_module_enter)),
    hooks.Registration("module forward hook (eager modules)", MODULES,
                       lambda: _module_hooks().register_module_forward_hook(_core.eager_module_exit, always_call=True)),
    hooks.Patch("torch.compile'd modules' call (eager modules)", MODULES, _optimized_module, "__call__",
                _wrap_compiled_call),
):
    hooks.declare(_hook)

logger.add_hooks(_on_open, _on_close)
if _core.is_open():  # a trace opened before this module was imported
    _on_open()
