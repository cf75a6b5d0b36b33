"""Training steps in the trace: step slices, the phases inside them, evaluation, step windows.

A step is one training iteration. Without marks, optimizers decide where it ends:

* every optimizer (``torch.optim.Optimizer``, seen through torch's global
  optimizer hooks: no change to the user's loop; a ``GradScaler.step`` that
  skips ``optimizer.step()`` for inf/NaN gradients counts as a step of it) that
  has stepped in this trace file is one of the training's optimizers (a loop that
  skips the step itself: its ``zero_grad()`` after a backward that no optimizer
  step followed begins the next iteration); a step is
  *complete* once each of them has stepped in it (one optimizer: at its
  ``step()``; a GAN's D and G: at the second of the two; a critic stepping 5
  times per generator step: at the generator's step, so a step is one generator
  iteration);
* a complete step ends where training work starts again: at the first
  DataLoader ``next()`` or ``iter()`` or ``zero_grad()`` (whose slices are held
  back until it is known what follows them) before a backward, an optimizer
  step, or a graph call or Dynamo compile with grad enabled, on the thread
  whose optimizer step completed it (another thread compiling or calling
  graphs meanwhile ends no step of this one's). A ``zero_grad()`` that a
  function which made the optimizer steps calls after them (at the end of the
  loop's body) is the step's own, not the start of the next. So is a graph call
  or compile with grad enabled, nothing held before it, of a model that the
  training's optimizers step but that shares no parameter with the forward that
  began the step's training work: the next iteration begins as this one did
  (DCGAN samples its generator with grad after both optimizers stepped).
  Logging, checkpointing, such samples and other Python
  between the last optimizer step and that point stay in the step, so a step
  lasts as long as the iteration;
* in the trace's first step, a complete step goes on when the training work that follows it at
  once (nothing held between) runs a model, or the step ran one with grad enabled, whose
  trainable parameters no known optimizer steps: its optimizer is still to come in the same
  iteration (DCGAN, each loss computed before its ``zero_grad()``); if a known optimizer zeroes
  or steps first, the step ends at that call (the forwards before it stay in the first step);
* optimizers whose parameters overlap count as one (a wrapper such as SAM and the optimizer
  it steps; a new optimizer for the next fine-tuning phase or epoch and the one it replaces),
  and a new optimizer's first ``zero_grad()`` begins an iteration;
* an optimizer joins the training's optimizers at its first ``zero_grad()`` or
  ``step()``; a complete step that an optimizer joins is not complete any more
  (so the first iteration of a GAN, whose G calls ``zero_grad()`` after D
  stepped, is one step). In a critic loop, the critic steps before the
  generator joins each end a step (warm-up steps);
* an optimizer that stops stepping leaves the training's optimizers when
  another one steps more than twice as often in a step as it did in any whole
  step since the last optimizer joined.

Marks override this: from the first :func:`step` / :func:`step_context` in a
trace file on, the user's marks alone end steps (a mark just after an optimizer
step ends that same step: no empty step; a mark during an evaluation ends the
evaluation, and the step after it begins there; one that ends an evaluation
from the trace's start, before any training work, ends step 0 instead: an
inference loop's marked steps stay steps). After a mark that ended a step
which trained (a backward or an optimizer step), a forward without grad before
the next training work is an evaluation from the mark on, as after a complete
step below. The trace's start is such a mark: before the first training work, a
forward without grad (nanoGPT evaluates at the top of its loop, before any
optimizer step) is an evaluation from the trace's start on, and one of eval-mode
modules with grad is undecided (below); until a step completes, the training's
optimizers are not known, and a model whose parameters require grad counts as
one they step.

Evaluation: with optimizer-driven steps, a graph call with grad disabled while
the step is complete (or evaluation runs already) begins an ``eval`` slice (cat
``eval``) at the point where the step ended (a ``model.eval()`` after the
optimizer steps is held like a data slice: the step ends there; up to a
``model.train()`` before training work is an evaluation even without a graph
call, or with the trace's end after it); it lasts until training work
starts again, holds its own graphs, modules, ops and ``data`` slices, and its
events carry no step. A trailing evaluation segment is an ``eval`` slice, not a
step. A graph call with grad enabled whose modules are all in eval mode
(``model.eval()``: validation without ``no_grad``, or training with frozen
batch norm) is undecided: the step ends there, and what follows is evaluation
unless a backward or an optimizer step comes before the next training work. Its
events carry no step until that is known; the first such call in a trace file
decides the rest of them (``model.eval()`` forwards then mean training, or
evaluation, at once). Training work that follows such a segment's last forward
at once, with no data slice or ``zero_grad`` between (a frozen teacher's or a
GAN generator's forward under ``no_grad``, then the trained model's), or with
one between when the training's optimizers step every module the segment ran
(a generator's samples before the critic's ``zero_grad``), makes the
segment the start of the step, not an evaluation, unless the segment ran the
model trained next (nanoGPT evaluates at the top of its loop) or called one of
its graphs twice (a loop over evaluation batches). Graph calls are seen only in
the step windows: outside them, evaluation stays in the surrounding step, which
is not recorded either. A trainer's evaluation function (:data:`EVALUATIONS`:
``Trainer.evaluate``, Lightning's evaluation loop; patched at a trace file's
open when its module is imported) is an evaluation from its call, after a
complete step or a mark (the trace's start), whether or not a graph runs in it,
to its return, where its ``eval`` slice is written; training work inside it
does not end it, and the next step begins at its return.

Each trace file numbers its steps from 0; step 0 begins when tracing starts
(the trace file opens; after the evaluation that comes before any training
work, if one does), so step N is the N-th iteration. Each step is written as
the slice ``step N`` (cat ``step``) on the thread that ends it, and every event
recorded meanwhile carries ``args.step = N`` (the C core writes the current step
into each record). The last step ends at close, or, when it is complete, at its
last optimizer step (or the end-of-body ``zero_grad()`` after it); what its thread
records after that, before the trace closes, carries its number, and the writer's
nesting ends its slice with the last of it.

Inside a step, each ``next()`` on a DataLoader iterator and each ``iter()`` of a
DataLoader (worker start-up; ``data``), each ``Tensor.backward`` /
``torch.autograd.backward`` / ``torch.autograd.grad`` (``backward``), each
optimizer ``step()`` and ``zero_grad()`` (cat ``optimizer``) are slices of their
own, and so is the work done for the optimizers outside their ``step()``
(cat ``optimizer`` too): gradient clipping, a learning-rate scheduler's step, a
model's ``zero_grad()``, a trainer's optimizer wrapper
(:data:`OPTIMIZER_WRAPPERS`). Outside the step windows (``DFTRACER_STEPS`` or
:func:`set_steps`) these and all op-level events are skipped; step slices are
always written.

Everything here is installed when a trace file opens (a trainer's patches, when
its module is imported later: at that import), never at import, and a
failure inside it turns step tracking off with one message: the user's program
runs on.
"""

from __future__ import annotations

import collections
import functools
import itertools
import operator
import sys
import threading
import weakref
from typing import Optional

import torch
from torch._guards import CompileContext

from .. import _core
from ..schema import ARG_OPTIMIZER, CAT_BACKWARD, CAT_DATA, CAT_EVAL, CAT_OPTIMIZER
from ..session import config, dataloaders, hooks, logger
from . import clock, comm, flight, gc, memory  # their hooks go in with the trace file, like ours

# where the iteration is; UNDECIDED: after a complete step, a forward of eval-mode modules with
# grad enabled (evaluation unless a backward or an optimizer step follows); MARKED: a mark ended a
# step that trained, or the trace began, and no training work has come since (what follows may be
# an evaluation)
TRAIN, COMPLETE, EVAL, UNDECIDED, MARKED = range(5)


class _State:
    number = 0  # the current step's number
    following: Optional[int] = None  # named (name_step) while the step was complete: the next one's
    named = False  # number was given (name_step) before the trace opened: keep it
    start_ns: Optional[int] = None  # when the current step (or evaluation) began; None while no trace is open
    recorded_at = 0  # events recorded when the current step began (is the last step empty?)
    ended = False  # a step ended in this trace file
    explicit = False  # the user marks steps in this trace: optimizer steps no longer end them
    trained = False  # a backward or an optimizer step ran in the current step
    between = False  # after a step_context block, before the next: no step runs
    windows: Optional[tuple] = None
    windows_set = False  # set_steps() was called: DFTRACER_STEPS no longer applies
    ops = False  # a trace is open and the current step is in a window
    broken = False
    mode = TRAIN
    known: set = set()  # the training's optimizers (their _group keys)
    groups: dict = {}  # id(optimizer) -> its _group key
    params: dict = {}  # _group key -> id() of the parameters its optimizers step
    stepped: dict = {}  # _group key -> its steps in the current step
    most: dict = {}  # _group key -> its most steps in one step since the last optimizer joined
    joined = False  # an optimizer joined in the current step (its counts teach nothing)
    complete_ns = 0  # when the current step became complete (its last optimizer step or the zero_grad after)
    completed = False  # a step has completed in this trace file: the training's optimizers are known
    opener: tuple = ()  # the modules (weak references) of the forward that began the step's training work
    # the trace's first step's forwards: id(modules) -> [modules, graph calls, with grad]; whether one
    # with grad trains no parameter that a known optimizer steps (computed when the step is complete)
    runs: dict = {}
    untrained = False
    learning = False  # graph calls call their probe during a training step too (to fill runs)
    probing = False  # the core's forward-probe switch
    going = False  # the complete first step goes on: the next optimizer call decides where it ends
    unstepped = 0  # the thread whose backward no optimizer step has followed yet in this step (0: none)
    thread = 0  # the thread whose optimizer step completed it: only its work ends the step
    # (name, cat, start, end, args, timed, windowed): slices held until it is known what follows
    deferred: list = []
    segment_held = 0  # deferred[:segment_held] precede the evaluation's (undecided segment's) last forward
    step_sites: tuple = ()  # (code, instruction) of each user frame that made the last optimizer step
    # the evaluation's (undecided segment's) forwards: id(modules) -> [modules, graph calls]
    segment: dict = {}
    eval_mode_trains: Optional[bool] = None  # learnt from the first undecided segment of the trace
    evaluating = 0  # calls of a trainer's evaluation function (EVALUATIONS) in progress on the step's thread
    eval_end: Optional[int] = None  # where the last of them returned (its eval slice is written)


_state = _State()
_lock = hooks.fork_safe(threading.RLock())  # a forked child opens its file under it
_local = threading.local()  # per thread: backward depth, optimizer step starts


def _set_mode(mode: int) -> None:
    _state.mode = mode
    _set_probe()


def _set_probe() -> None:
    """Outside a training step, and while the trace's first step learns which models train, graph
    calls call their probe (``forward_probe``), in C."""
    on = _state.mode != TRAIN or _state.learning
    if on != _state.probing:
        _core.set_forward_probe(on)
        _state.probing = on


def _fail(exc: BaseException) -> None:
    """Step tracking stops for good (one message); the traced program is not affected."""
    if not _state.broken:
        _state.broken = True
        _state.ops = False
        _state.learning = False
        _set_mode(TRAIN)
        _core.set_ops_on(True)
        config.get()
        config.log.error("step tracking is off: %s: %s (the trace goes on without step slices)",
                         type(exc).__name__, exc)


def _recorded() -> int:
    # the memory sampler's counter records belong to no step: a step holding only them is empty
    return _core.stats()["recorded"] - memory.samples


def _begin(now: int) -> None:
    """The current step starts at ``now``: its number goes into every record; window on or off."""
    _state.start_ns = now
    _state.learning = _state.learning and not _state.ended
    _set_mode(TRAIN)
    _state.stepped, _state.joined, _state.trained = {}, False, False
    _state.runs, _state.untrained, _state.going, _state.unstepped = {}, False, False, 0
    _state.opener = ()
    _state.eval_end = None
    _enter(_state.number)
    _state.recorded_at = _recorded()


def _enter(number: int) -> None:
    """Step ``number`` is the current one: every record carries it, its window decides ops."""
    _core.set_step(number)
    _state.ops = config.step_selected(_state.windows, number)
    _core.set_ops_on(_state.ops)


def _arm_next() -> None:
    """The step is complete: the next forward graph call ends it, and records only while op-level
    events are on. They go on for it when the next step is in a window (the graph call turns
    them off again when it ends a step into one that is not)."""
    following = _state.number + 1 if _state.following is None else _state.following
    _core.set_ops_on(_state.ops or config.step_selected(_state.windows, following))
    if not _state.ops and config.step_selected(_state.windows, following):
        _core.eager_hold()  # eager ops from here: this step's (dropped) until its end is known, or the next's


def _write(number: int, start: int, end: int) -> None:
    _core.step_slice(number, start, end, memory.step_args())
    flight.step_ended(number, start, end)


def _finish(end: int) -> None:
    """Ends the current step at ``end`` (writing its slice: slices are written in the order they
    end, which the writer's nesting relies on) and begins the next there."""
    if not _state.joined:
        for key, n in _state.stepped.items():
            _state.most[key] = max(_state.most.get(key, 0), n)
    _core.eager_release(_state.ops, end)  # eager ops held since it completed (_arm_next) that ended in it
    _write(_state.number, _state.start_ns, end)
    _state.ended = True
    _state.number = _state.number + 1 if _state.following is None else _state.following
    _state.following = None
    _begin(end)


def _boundary(now: int) -> int:
    """Where a complete step (or an evaluation) ends when training work starts at ``now``: at the
    slices held back since, which belong to what follows (the earliest start: one may hold another,
    a ``region`` around a batch); else at ``now``, or where the compiled model's call that ``now``
    is in began (its slice is what follows); and no later than a call in progress that began since
    the step was complete (:func:`end_no_later_than`)."""
    if _state.deferred:
        at = min(entry[2] for entry in _state.deferred)
    else:
        since = _core.eager_open_since()
        at = min(now, since) if since else now
    return min([at, *(t for t in (a(_state.complete_ns) for a in _end_anchors) if t is not None)])


def end_no_later_than(anchor) -> None:
    """``anchor(since)`` gives the earliest start (ns) of the calls in progress on the calling
    thread that began at ``since`` or later (a trainer's), or None: a complete step ends no later
    than such a call, whose work is what follows."""
    _end_anchors.append(anchor)


def segment_start() -> Optional[int]:
    """When the step or evaluation in progress on the calling thread began (after a trainer's
    evaluation function returned, and until the next step: its return), or None."""
    if threading.get_ident() != _state.thread:
        return None
    return _state.start_ns if _state.eval_end is None else _state.eval_end


def _flush(count: Optional[int] = None) -> None:
    """The slices held back while the boundary was undecided (the first ``count`` of them),
    recorded in what was decided."""
    count = len(_state.deferred) if count is None else count
    deferred, _state.deferred = _state.deferred[:count], _state.deferred[count:]
    for name, cat, start, end, args, timed, windowed in deferred:
        _core.eager_release(_state.ops, end)  # the eager ops that ended before it first (see _ahead)
        if name is not None and (_state.ops or not windowed) and _core.log(name, cat, start, end, args, timed=timed):
            logger.note_arg_issues()
    if not _state.deferred:
        _core.eager_release(_state.ops)  # in the step windows or not, as what was decided


def _eval_slice(end: int) -> int:
    """Writes the evaluation's slice up to ``end``, unless a trainer's evaluation function ended it
    (its slice was written then); returns its end."""
    if _state.eval_end is not None:
        return _state.eval_end
    _core.log("eval", CAT_EVAL, _state.start_ns, end, None)  # evaluation began where the last step ended
    return end


def _end_eval(end: int) -> None:
    _begin(_eval_slice(end))  # the step after the evaluation (its number was taken when the last one ended)


def _end(now: int, block: bool = False) -> None:
    """Ends the current step at ``now`` (writing its slice) and begins the next (explicit marks;
    ``block``: a ``step_context`` block begins, what ran before it is no step)."""
    with _lock:
        if _state.start_ns is None or _state.broken:
            _state.number += 1
            return
        _state.explicit = True
        trained = _state.trained and _state.mode != EVAL
        if _state.mode != TRAIN:
            _flush()  # held after the optimizer steps or during the evaluation, before the mark: theirs
        if _state.mode in (EVAL, UNDECIDED) and (_state.ended or block):
            _end_eval(now)  # the mark ends the evaluation; the step after it begins
        else:  # an evaluation from the trace's start that a mark ends was an inference loop's step 0
            _finish(now)
        if trained:  # a forward without grad before the next training work is an evaluation
            _set_mode(MARKED)
            _state.thread = threading.get_ident()


def _training(now: int, modules=()) -> None:
    """Training work starts at ``now`` (a forward of ``modules``, if known): a complete step
    ends, an evaluation (or an undecided segment: it was one) ends. Training work that follows
    the segment's last forward at once (no data slice, no ``zero_grad`` between) on other
    modules makes the segment the step's start: a frozen teacher's or a generator's forward
    under ``no_grad``. The model that was evaluated training next is validation."""
    with _lock:
        if _state.start_ns is None or _state.broken or threading.get_ident() != _state.thread:
            return
        if _state.going or _state.evaluating:  # (a trainer's evaluation function runs: it is one)
            return
        if _state.mode == COMPLETE and not _state.deferred and _other_model(modules):
            return  # the iteration's own: a sample of a generator after the optimizer steps
        if _state.mode == COMPLETE and not (_state.ended or _state.deferred) and (
                _state.untrained or _untrained([modules])):
            # a model no known optimizer steps trains: its optimizer's first call is still to come
            _state.going = True
            _core.set_ops_on(_state.ops)
            return
        if (_state.mode in (EVAL, UNDECIDED) and _state.eval_end is None
                and (len(_state.deferred) == _state.segment_held or _ran_trained())
                and not _evaluated_after_all(modules)):
            _set_mode(TRAIN)  # the step began where the segment did
            _core.set_step(_state.number)
            _flush()
            _state.opener = modules
            return
        if _state.mode == UNDECIDED:
            _decided(False)
            _flush(_state.segment_held)
        at = _boundary(now)
        if _state.mode == COMPLETE:
            _finish(at)
        elif _state.mode == EVAL:
            _end_eval(at)
        elif _state.mode == MARKED:
            _set_mode(TRAIN)  # the step began at the mark (or where the trace did)
        else:
            return
        _flush()
        _state.opener = modules


def _other_model(modules) -> bool:
    """Whether a forward of ``modules`` runs a model that the training's optimizers step but none
    of the parameters of the forward that began the step's training work (both known): after the
    optimizer steps, that is not the next iteration beginning (it begins as this one did) but this
    one's own work (a GAN's generator sampled after both steps). A model that no known optimizer
    steps is new training work."""
    if not modules or not _state.opener:
        return False
    began = {id(p) for p in _params(_state.opener)}
    params = {id(p) for p in _params(modules)}
    return bool(began) and began.isdisjoint(params) and not params.isdisjoint(_stepped_params())


def _evaluated_after_all(modules) -> bool:
    """Whether the segment that training work follows at once was an evaluation all the same: one
    of its graphs ran twice (a loop over batches), or the training forward's ``modules`` hold a
    parameter of a module it ran (the model trained next was evaluated)."""
    if any(calls > 1 for _, calls in _state.segment.values()):
        return True
    ran = {id(p) for runs, _ in _state.segment.values() for p in _params(runs)}
    return any(id(p) in ran for p in _params(modules))


def _params(modules) -> list:
    """The parameters of the live ones of ``modules`` (weak references)."""
    return [p for m in _alive(modules) for p in m.parameters()]


def _stepped_params() -> set:
    """id() of the parameters that the training's optimizers step."""
    return set().union(*(_state.params.get(k, ()) for k in _state.known))


def _ran_trained() -> bool:
    """Whether every module the segment ran has parameters that the training's optimizers step: a
    GAN generator's samples under ``no_grad`` before the critic's ``zero_grad()`` and forward are
    the iteration's start all the same (an averaged model's evaluation is not: no optimizer
    steps it)."""
    stepped = _stepped_params()
    ran = [_params(runs) for runs, _ in _state.segment.values()]
    if not _state.completed:  # no step has completed: the training's optimizers are still to come
        return bool(ran) and all(any(p.requires_grad for p in params) for params in ran)
    return bool(ran) and all(any(id(p) in stepped for p in params) for params in ran)


def _untrained(runs) -> bool:
    """Whether one of ``runs`` (tuples of weak references to modules) trains parameters that no
    known optimizer steps: a model whose optimizer has not been seen yet."""
    stepped = _stepped_params()
    for modules in runs:
        params = _params(modules)
        if any(p.requires_grad for p in params) and not any(id(p) in stepped for p in params):
            return True
    return False


def _learn(grad: bool, modules, call: bool) -> None:
    """The trace's first step runs ``modules`` (``call``: a graph call, else a compile); those run
    with grad enabled are kept. A graph called again stops the graph calls' probe for the rest of
    the step: it has seen the models of the iteration (the compiles of later ones still tell)."""
    entry = _state.runs.setdefault(id(modules), [modules, 0, False])
    if call and entry[1]:
        _state.learning = False
        _set_probe()
    entry[1] += call
    entry[2] = entry[2] or grad


def _goes_on_to_next(at: int) -> None:
    """A known optimizer zeroes or steps again (from ``at``) while the complete first step went on:
    the next iteration has begun. The step ends there, its forwards recorded since in it (slices
    are written in the order they end: a boundary before them would be moved over them)."""
    _finish(at)
    _flush()


def _segment_runs(modules, starts: bool, call: bool) -> None:
    """The evaluation's (undecided segment's) forward runs ``modules`` (``call``: a graph call,
    else a compile); ``starts``: its first."""
    if starts:
        _state.segment = {}
    if modules:  # each graph's probe holds one tuple of its modules
        _state.segment.setdefault(id(modules), [modules, 0])[1] += call


def _undecided(now: int, modules=(), call: bool = True) -> None:
    """A forward of eval-mode ``modules`` with grad enabled at ``now``: after a complete step, the
    step ends and what follows is undecided."""
    with _lock:
        if _state.start_ns is None or _state.broken or threading.get_ident() != _state.thread:
            return
        _segment_runs(modules, _state.mode in (COMPLETE, MARKED), call)
        if _state.mode in (COMPLETE, MARKED):
            if _state.mode == COMPLETE:
                _finish(_boundary(now))
            _set_mode(UNDECIDED)  # begun where the step did (at the mark, if marked)
            _core.set_step(None)
        if _state.mode == EVAL:
            _flush()
        _state.segment_held = len(_state.deferred)


def _decided(trains: bool) -> None:
    """The undecided segment was training (a backward or an optimizer step came) or evaluation."""
    _state.eval_mode_trains = trains
    if trains:
        _set_mode(TRAIN)
        _core.set_step(_state.number)
    else:
        _set_mode(EVAL)


def _evaluation(now: int, modules=(), call: bool = True) -> None:
    """A graph call of ``modules`` with grad disabled at ``now``: after a complete step, evaluation
    begins."""
    with _lock:
        if _state.start_ns is None or _state.broken or threading.get_ident() != _state.thread:
            return
        _segment_runs(modules, _state.mode in (COMPLETE, MARKED), call)
        if _state.mode in (COMPLETE, MARKED):
            if _state.mode == COMPLETE:
                _finish(_boundary(now))  # a step on each side of an evaluation: never one step
            _set_mode(EVAL)  # begun where the step did (at the mark, if marked)
            _core.set_step(None)  # evaluation belongs to no step
        if _state.mode == EVAL:
            _flush()
        _state.segment_held = len(_state.deferred)


def _held(name: str, cat: str, start: int, end: int, args: Optional[dict] = None, tail: bool = False) -> None:
    """A data or ``zero_grad`` slice: recorded now inside a step; held back while the step is
    complete or evaluation runs (it belongs to whatever comes next), unless it is the ``tail`` of
    the complete step's iteration (which, if it is the last, ends after it)."""
    if tail:
        _state.complete_ns = end
        if not _state.deferred:  # the iteration's own (see _ahead); those after it wait for the next
            _core.eager_release(_state.ops, end)  # step's start, which may come before its first graph call
    elif _state.mode != TRAIN and _defer((name, cat, start, end, args, False, True)):
        return
    if _state.ops:
        _slice(name, cat, start, args, end)


def _defer(entry: tuple, behind: bool = False) -> bool:
    """Holds ``entry`` back (a ``deferred`` item) if it ends on the step's thread while the step is
    complete or evaluation runs (``behind``: only behind slices held already); False: not held."""
    with _lock:
        if _state.mode == TRAIN or threading.get_ident() != _state.thread or (behind and not _state.deferred):
            return False
        _state.deferred.append(entry)
        _ahead()
        return True


def _ahead() -> None:
    """A data or ``zero_grad`` slice (or ``model.eval()``) on the step's thread while the step is
    complete, evaluation runs, or after a mark (the trace's start) before training work: the eager
    ops from here until what follows is decided (the slice's own too) are held back in the core and recorded with the held
    slices in the order they end (:func:`_flush`; the writer places a thread's events in that
    order), in what they are."""
    if _state.mode != TRAIN and not _state.going and threading.get_ident() == _state.thread:
        _core.eager_hold()


def hold(name: str, cat: str, start: int, end: int, args: Optional[dict] = None, timed: bool = False,
         windowed: bool = True) -> bool:
    """Holds a slice that ends on the step's thread while earlier ones are held back (a collective
    or a ``region`` between ``zero_grad()`` and the forward): the writer places a thread's slices
    in the order they end, so it is recorded after them, in whatever they turn out to begin (the
    step it carries is the one current then; ``windowed``: only if that step is in the step
    windows). False: nothing is held; record it now."""
    return bool(_state.deferred) and _defer((name, cat, start, end, args, timed, windowed), behind=True)


def _group(optimizer) -> int:
    """The key of the optimizers that step ``optimizer``'s parameters: a wrapper (SAM, Lookahead)
    and the optimizer it steps, or an optimizer and the one it replaced (a new optimizer for the
    next epoch or fine-tuning phase), count as one."""
    key = _state.groups.get(id(optimizer))
    if key is None:
        try:
            params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        except (AttributeError, KeyError, TypeError):  # an optimizer-like object of its own shape
            params = set()
        key = next((k for k, ps in _state.params.items() if not ps.isdisjoint(params)), id(optimizer))
        _state.params.setdefault(key, set()).update(params)
        _state.groups[id(optimizer)] = key
        try:
            weakref.finalize(optimizer, _state.groups.pop, id(optimizer), None)  # its id may be reused
        except TypeError:  # a class with __slots__ and no __weakref__: kept until the trace closes
            pass
    return key


def _join(optimizer, at: Optional[int] = None) -> int:
    """``optimizer`` is one of the training's optimizers from now on (returned: its group's key);
    a complete step that it joins is not complete any more. ``at``: when its call began."""
    with _lock:
        if _state.start_ns is None:
            return 0
        key = _group(optimizer)
        if key in _state.known:
            if _state.going and threading.get_ident() == _state.thread:
                _goes_on_to_next(_core.now_ns() if at is None else at)
            return key
        _state.known.add(key)
        if _state.explicit:  # marks end the steps: known only for what it trains (_ran_trained)
            return key
        _state.most, _state.joined = {}, True
        if _state.mode == COMPLETE:
            _state.going = False  # what went on was this iteration's
            _set_mode(TRAIN)
            _core.set_ops_on(_state.ops)
            _flush()
        return key


def _optimizer_stepped(optimizer, now: int) -> None:
    """After an optimizer step: it joins the training's optimizers or counts; is the step complete?"""
    with _lock:
        if _state.start_ns is None or _state.broken or _state.explicit:
            _local.__dict__.pop("data", None)  # a batch before this step is not the first traced step's
            _local.__dict__.pop("before_open", None)  # nor the work before it (see before_open)
            return
        key = _join(optimizer)
        _state.unstepped = 0
        stepped = _state.stepped
        stepped[key] = stepped.get(key, 0) + 1
        if any(n > 2 * _state.most[k] for k, n in stepped.items() if k in _state.most):
            _state.known = set(stepped)  # an optimizer that stopped stepping leaves
        if all(k in stepped for k in _state.known):
            _state.step_sites = _user_sites(sys._getframe(1))
            _state.untrained = not _state.ended and _untrained(runs for runs, _, grad in _state.runs.values() if grad)
            _set_mode(COMPLETE)
            _state.completed = True
            _state.complete_ns = now
            _state.thread = threading.get_ident()
            _arm_next()


def _on_open() -> None:
    try:
        with _lock:
            if _state.broken:
                return
            if not _state.windows_set:
                _state.windows = config.get().steps
            _install()
            if not _state.named:  # every trace file numbers its steps from 0
                _state.number = 0
            _state.named = _state.ended = _state.explicit = _state.between = False
            _state.following = None
            _state.known, _state.most, _state.deferred = set(), {}, []
            _state.groups, _state.params = {}, {}
            _state.eval_mode_trains = None
            _state.evaluating = 0
            _state.learning = True
            _state.completed = False
            # opened lazily (inside a compile): the step began with the work in progress on this thread
            data = _local.__dict__.pop("data", None)
            kept = _local.__dict__.pop("before_open", ())
            anchors = [t for t in (a() for a in _open_anchors) if t is not None]
            if getattr(_local, "stepping", 0):  # opened inside an optimizer step: it is the first step's
                anchors += _local.__dict__.get("opt", {}).values()
            _begin(min([_core.now_ns(), *anchors, *(data or ()), *(e[2] for e in kept)]))
            if data and _state.ops:
                _slice("data", CAT_DATA, data[0], None, data[1])
            if _state.ops:
                for name, cat, start, end, args, timed in kept:
                    _core.log(name, cat, start, end, args, timed=timed)
            # the trace's start is the first step's mark: an evaluation before any training work is one
            _set_mode(MARKED)
            _state.thread = threading.get_ident()
    except Exception as exc:  # never let tracing break the program
        _fail(exc)


_open_anchors: list = []  # see begin_no_later_than
_end_anchors: list = []  # see end_no_later_than
BEFORE_OPEN_MAX = 1024  # events kept per thread by before_open (the oldest dropped)


def keeps_before_open() -> bool:
    """Whether no trace is open yet, one may open lazily (at the first compile), and nothing
    compiles on this thread: work done now is kept with :func:`before_open`."""
    return (_state.start_ns is None and not _state.broken and not _core.is_open() and config.get().enable
            and not compiling_here())


def before_open(name: str, cat: str, start: int, end: int, args: Optional[dict] = None, timed: bool = False) -> None:
    """An event on the calling thread before the trace opened (a collective, such as FSDP2's first
    all-gather in the root module's pre-forward hook, before the first compiled call opens the
    trace): if the trace opens lazily on this thread before an optimizer step, the first step
    begins no later than its start and it is recorded in that step; an optimizer step drops it."""
    kept = _local.__dict__.get("before_open")
    if kept is None:
        kept = _local.before_open = collections.deque(maxlen=BEFORE_OPEN_MAX)
    kept.append((name, cat, start, end, args, timed))


def begin_no_later_than(anchor) -> None:
    """``anchor()`` gives the start (ns) of work in progress on the calling thread (a compile), or
    None: a trace that opens during that work begins its first step no later than its start."""
    _open_anchors.append(anchor)


def _on_close() -> None:
    """The step in progress is written if it is complete, or if steps ended before it and anything
    was recorded in it (not after a ``step_context`` block); evaluation in progress is an ``eval``
    slice."""
    try:
        with _lock:
            if _state.start_ns is not None and not _state.broken:
                now = _core.now_ns()
                if _state.mode in (EVAL, UNDECIDED):  # undecided at the end: no backward came
                    _flush()
                    _eval_slice(now)
                elif _state.mode == COMPLETE and _state.deferred and _state.deferred[0][0] is None:
                    _evaluated(now)  # model.eval() came: an evaluation ends the trace
                elif _state.mode == COMPLETE:
                    _write(_state.number, _state.start_ns, now if _state.going else _state.complete_ns)
                    _flush()
                else:
                    if (_state.ended and not _state.between
                            and (_state.deferred or _recorded() > _state.recorded_at)):
                        _write(_state.number, _state.start_ns, now)
                    _flush()  # held since a mark (nothing is held otherwise)
            _state.start_ns = None
            _state.learning = False
            _set_mode(TRAIN)
            _state.ops = False
            _core.set_step(None)
            _core.set_ops_on(True)
    except Exception as exc:
        _fail(exc)


# ---- public API -------------------------------------------------------------

def step() -> None:
    """Ends the current step now; the next one begins. For loops without an optimizer, or to
    decide where iterations end: from the first call on, only these marks end steps."""
    try:
        _end(_core.now_ns())
    except Exception as exc:
        _fail(exc)


class step_context:
    """``with step_context(): ...``: the block is one step (from its start to its end).

    Time between blocks belongs to no step slice; events recorded there carry
    the number of the step that follows. Blocks are not nested.
    """

    def __enter__(self):
        try:
            with _lock:
                if _state.start_ns is not None and not _state.broken:
                    now = _core.now_ns()
                    if _state.mode == MARKED:  # held between the blocks: this step's
                        _set_mode(TRAIN)
                        _flush()
                    elif _state.mode != TRAIN:  # a complete step or an evaluation ends here
                        _end(now, block=True)
                    _state.start_ns = now
                _state.explicit, _state.between = True, False
        except Exception as exc:
            _fail(exc)
        return self

    def __exit__(self, *exc):
        step()
        _state.between = True
        return False


def set_steps(spec: Optional[str]) -> None:
    """Selects the steps whose op-level events are recorded, as ``DFTRACER_STEPS`` does.

    ``spec``: comma-separated ``A-B``, ``A``, ``A-`` or ``A-B:K`` (e.g. ``"10-12,100-"``,
    ``"0-:100"``); ``None`` or ``""``: every step. Overrides ``DFTRACER_STEPS``; a bad
    value raises ``ValueError``.
    """
    windows = config.parse_steps(spec or "")
    with _lock:
        _state.windows, _state.windows_set = windows, True
        if _state.start_ns is not None and not _state.broken:
            _enter(_state.number)


def name_step(number) -> None:
    """Names the step that the next training work is in (``Dynamo.update(step=...)``); later steps
    count on from ``number``.

    In a step, that is the current step (its later events carry ``number``). Once the step is
    complete (after its optimizer steps, before training work starts again) it is the step that
    follows: the finished step keeps its number, and so do the events until it ends. During an
    evaluation it is the step after it: evaluation events carry no step.

    Any integer type (``int``, NumPy integers, 0-d integer tensors) is accepted; another value
    is ignored with a warning, since it comes from the user's loop and must not stop it.
    """
    try:
        number = operator.index(number)
        if not 0 <= number < 2**62:  # the trace's integers are int64: room to count on
            raise ValueError
    except (TypeError, ValueError):
        config.get()  # sets up the dftrace_dynamo logger
        config.log.warning("step=%r ignored: a step is named by an integer from 0 to 2**62", number)
        return
    with _lock:
        _state.named = _state.start_ns is None
        tracking = not (_state.named or _state.broken)
        if tracking and _state.mode == COMPLETE:
            _state.following = number  # taken when the step ends (_finish)
            _arm_next()
            return
        _state.number = number
        if tracking and _state.mode in (TRAIN, MARKED):  # during an evaluation: the step after it
            _enter(number)


def _forward(grad: bool, modules=(), call: bool = True, now: Optional[int] = None, running=None) -> None:
    """Forward work begins (``modules``: weak references to those it runs, if known; ``call``: a
    graph call, else a compile): with grad enabled training work, without it evaluation (once
    the step is complete); with grad enabled and every module in eval mode, undecided until
    learnt. ``running()``: see :func:`probe_for` (never called per evaluation call)."""
    runs = None  # the modules this call runs (running() walks frames: called once, where needed)
    if _state.mode != TRAIN and not _state.going:  # the first step goes on until an optimizer call says where it ends
        try:
            now = _core.now_ns() if now is None else now
            if grad and (not _eval_mode(modules) or _state.eval_mode_trains):
                runs = running() if running else modules
                _training(now, runs)
            elif not grad or _state.eval_mode_trains is False:
                _evaluation(now, modules, call)
            else:
                _undecided(now, modules, call)
        except Exception as exc:
            _fail(exc)
    if _state.mode == TRAIN and _state.learning:  # also the forward that began the step's training
        try:
            _learn(grad, runs if runs is not None else running() if running else modules, call)
        except Exception as exc:
            _fail(exc)


def _alive(modules) -> list:
    """The modules still alive of ``modules`` (weak references)."""
    return [m for m in (ref() for ref in modules) if m is not None]


def _eval_mode(modules) -> bool:
    alive = _alive(modules)
    return bool(alive) and not any(m.training for m in alive)


def forward_probe(grad: bool) -> None:
    """The ``probe`` of a forward graph call: ``GraphCall`` calls it with the call's grad mode, in
    the step windows, while no training step is in progress (``_set_mode``); inside a step a graph
    call costs no Python call for it."""
    _forward(grad)


def probe_for(modules, running=None):
    """The probe of a forward graph compiled for ``modules`` (weak references: a compiled graph
    must not keep a model alive): their eval mode counts, too. ``running()``, if given, returns
    the modules a call of that graph really runs (Dynamo shares a graph between modules of one
    structure); it walks frames, so it is called only where identity decides."""
    if not modules:
        return forward_probe

    def probe(grad: bool) -> None:
        _forward(grad, modules, running=running)

    return probe


def compile_starts(modules=(), now: Optional[int] = None) -> None:
    """A Dynamo compile of the forward of ``modules`` begins (at ``now``, default: now): forward
    work under the grad mode it compiles for (decided now, so that the compile lands in what
    follows, not in the step before it)."""
    _forward(torch.is_grad_enabled(), modules, call=False, now=now)


# ---- patch points -------------------------------------------------------------

def _slice(name: str, cat: str, start: int, args: Optional[dict] = None, end: Optional[int] = None) -> None:
    try:
        _core.log(name, cat, start, _core.now_ns() if end is None else end, args)
    except Exception as exc:
        _fail(exc)


def _work(now: int) -> None:
    """Training work begins (runs whether or not ops are recorded: steps end everywhere); an
    undecided segment was the step's start."""
    if _state.mode != TRAIN:
        try:
            with _lock:
                if _state.mode == UNDECIDED and threading.get_ident() == _state.thread:
                    _decided(True)
                    _flush()
            _training(now)
        except Exception as exc:
            _fail(exc)
    _state.trained = True  # in the step that the work is in (_training may have begun it)


def _optimizer_begins(optimizer) -> int:
    """An optimizer step begins now (returned): the optimizer joins, training work goes on."""
    now = _core.now_ns()
    try:
        _join(optimizer, now)
    except Exception as exc:
        _fail(exc)
    _work(now)
    return now


def _step_wrapper_code():
    """The code of torch's wrapper around each optimizer class's step(), which calls the step hooks
    (None if this torch has none: every call is then taken for an outer one)."""
    try:
        return torch.optim.Optimizer.profile_hook_step(lambda *args, **kwargs: None).__code__
    except Exception:
        return None


_STEP_WRAPPER = _step_wrapper_code()


def _inner_step(optimizer) -> bool:
    """Whether the step hook runs for a step() that a step() of the same optimizer called: torch
    wraps the step() of each optimizer class, so a subclass's step() calling ``super().step()``
    calls the hooks twice, nested; the outer call is the optimizer's step."""
    frame, seen = sys._getframe(1), 0
    while frame is not None:
        if frame.f_code is _STEP_WRAPPER and frame.f_locals.get("self") is optimizer:
            seen += 1
            if seen > 1:
                return True
        frame = frame.f_back
    return False


def _optimizer_pre_hook(optimizer, args, kwargs):
    _local.stepping = getattr(_local, "stepping", 0) + 1  # an LBFGS closure's zero_grad() is inside
    if _inner_step(optimizer):
        return
    now = _optimizer_begins(optimizer)
    if _state.ops or _state.start_ns is None:  # no trace yet: one may open inside (a closure's compile)
        _local.__dict__.setdefault("opt", {})[id(optimizer)] = now


def _optimizer_post_hook(optimizer, args, kwargs):
    _local.post_hooks = getattr(_local, "post_hooks", 0) + 1  # see _wrap_scaler_step
    _local.stepping = max(getattr(_local, "stepping", 0) - 1, 0)
    if _inner_step(optimizer):
        return
    try:
        now = _core.now_ns()
        start = _local.__dict__.get("opt", {}).pop(id(optimizer), None)
        if start is not None and _state.ops:
            cls = type(optimizer).__name__
            _core.log(f"{cls}.step", CAT_OPTIMIZER, start, now, {ARG_OPTIMIZER: cls})
        _optimizer_stepped(optimizer, now)
    except Exception as exc:
        _fail(exc)


def compiling_here() -> bool:
    """Whether Dynamo traces the caller, or a compile runs it on this thread: a patched function
    must then run the original only. (``torch.compiler.is_compiling()`` is process-wide: true
    while any thread compiles.)"""
    return torch.compiler.is_dynamo_compiling() or CompileContext.try_get() is not None


def _wrap_backward(original):
    @functools.wraps(original)
    def traced(*args, **kwargs):
        if compiling_here() or getattr(_local, "backward", 0):  # nested calls: the outermost is the slice
            return original(*args, **kwargs)
        start = _core.now_ns()
        _work(start)
        _state.unstepped = threading.get_ident()
        if not _state.ops:
            return original(*args, **kwargs)
        _local.backward = 1
        try:
            return original(*args, **kwargs)
        finally:
            _local.backward = 0
            _slice("backward", CAT_BACKWARD, start)
            if original.__name__ == "backward":  # what follows is no forward (events.eager): an
                # optimizer closure's caller, or code between backward and the optimizer
                _core.set_eager_phase(_core.PHASE_OPTIMIZER if getattr(_local, "stepping", 0) else _core.PHASE_NONE)

    return traced


def _wrap_data(original, name: str):
    """``next()`` on a DataLoader iterator, ``iter()`` of a DataLoader: a data slice."""
    @functools.wraps(original)
    def fetch(self, *args):
        if compiling_here():
            return original(self, *args)
        if _state.start_ns is None:
            if _state.broken or name != "data":
                return original(self, *args)
            start = _core.now_ns()  # no trace yet: this batch begins the first step if one opens lazily
            result = original(self, *args)
            _local.data = (start, _core.now_ns())
            return result
        start = _core.now_ns()
        _ahead()
        result = original(self, *args)  # StopIteration loaded nothing: no event
        try:
            _held(name, CAT_DATA, start, _core.now_ns())
        except Exception as exc:
            _fail(exc)
        return result

    return fetch


def _wrap_scaler_step(original):
    """``GradScaler.step``: when the gradients hold inf or NaN it skips ``optimizer.step()``
    (often, early in fp16 training); the iteration still ends as if the optimizer had stepped."""
    @functools.wraps(original)
    def step(self, optimizer, *args, **kwargs):
        if compiling_here():
            return original(self, optimizer, *args, **kwargs)
        seen = getattr(_local, "post_hooks", 0)
        result = original(self, optimizer, *args, **kwargs)
        if getattr(_local, "post_hooks", 0) == seen:  # skipped: no optimizer slice, the step counts
            now = _optimizer_begins(optimizer)
            try:
                _optimizer_stepped(optimizer, now)
            except Exception as exc:
                _fail(exc)
        return result

    return step


def _wrap_train(original):
    """``Module.train(False)`` (``model.eval()``) after a complete step: the iteration's work has
    ended, what follows (an evaluation, or the next iteration) begins here. Held as a point that
    records nothing, like a data slice (:func:`_boundary`). ``Module.train()`` while that point is
    the first thing held: what ran between was an evaluation, though no graph ran in it (a
    trainer's evaluation of an uncompiled copy of the model)."""
    @functools.wraps(original)
    def train(self, mode=True):
        if (_state.mode == COMPLETE and not _state.going and threading.get_ident() == _state.thread
                and not compiling_here()):
            try:
                with _lock:
                    if not mode and not _state.deferred:
                        now = _core.now_ns()
                        _defer((None, None, now, now, None, False, True))
                    elif mode and _state.deferred and _state.deferred[0][0] is None:
                        _evaluated(_core.now_ns())
            except Exception as exc:
                _fail(exc)
        return original(self, mode)

    return train


def _evaluated(now: int) -> None:
    """The complete step ended at ``model.eval()`` (the first slice held); from there to ``now`` was
    an evaluation with the slices held meanwhile; the next step begins now."""
    _finish(_boundary(now))
    _set_mode(EVAL)
    _core.set_step(None)
    _flush()
    _end_eval(now)


# A trainer's evaluation functions, patched when their module is imported (or at a trace file's
# open, when it was before) (module, class, method): their call is an evaluation, whether or not a
# graph runs in it
EVALUATIONS = (("transformers.trainer", "Trainer", "evaluate"),
               ("lightning.pytorch.loops.evaluation_loop", "_EvaluationLoop", "run"),
               ("pytorch_lightning.loops.evaluation_loop", "_EvaluationLoop", "run"))


# The trainers' optimizer wrappers (module, class, method), patched as EVALUATIONS: the step of the
# object a trainer steps, around the optimizer's own (its pre/post hooks run inside)
OPTIMIZER_WRAPPERS = (("accelerate.optimizer", "AcceleratedOptimizer", "step"),
                      ("lightning.pytorch.core.optimizer", "LightningOptimizer", "step"),
                      ("pytorch_lightning.core.optimizer", "LightningOptimizer", "step"))


def _evaluation_begins() -> bool:
    """A trainer's evaluation function is called: after a complete step (or a mark, or the trace's
    start, before training work) an evaluation begins here, as at a graph call without grad, and
    lasts at least until the function returns. Whether it counts (its return then ends it)."""
    with _lock:
        if (_state.start_ns is None or _state.broken or _state.explicit or threading.get_ident() != _state.thread
                or _state.mode == TRAIN):  # (in an incomplete step: the step's own work)
            return False
        now = _core.now_ns()
        if _state.mode == COMPLETE:
            _state.going = False
            _finish(_boundary(now))
        if _state.mode == UNDECIDED:
            _decided(False)
        elif _state.mode != EVAL:
            _set_mode(EVAL)
            _core.set_step(None)
        _flush()
        _state.evaluating += 1
        _state.eval_end = None
        return True


def _evaluation_ends() -> None:
    """The evaluation function returns: the evaluation ends here (its slice is written now, after
    the slices held in it: the writer nests what ended before it inside it); the next step begins
    here when training work comes (until then records carry no step, and eager ops are held: they
    are that step's, or no step's if the trace ends first)."""
    with _lock:
        _state.evaluating = max(_state.evaluating - 1, 0)
        if not _state.evaluating and _state.mode == EVAL and _state.start_ns is not None:
            _flush()
            _state.eval_end = _eval_slice(_core.now_ns())
            _ahead()  # eager ops from here: the next step's if training work comes, else no step's


def _wrap_evaluation(original):
    @functools.wraps(original)
    def evaluate(*args, **kwargs):
        if compiling_here():
            return original(*args, **kwargs)
        try:
            began = _evaluation_begins()
        except Exception as exc:
            _fail(exc)
            began = False
        try:
            return original(*args, **kwargs)
        finally:
            if began:
                try:
                    _evaluation_ends()
                except Exception as exc:
                    _fail(exc)

    return evaluate


def _wrap_zero_grad(original):
    @functools.wraps(original)
    def zero_grad(self, *args, **kwargs):
        if compiling_here():
            return original(self, *args, **kwargs)
        start = _core.now_ns()
        phase = _core.set_eager_phase(_core.PHASE_OPTIMIZER)
        try:
            _ahead()
            return original(self, *args, **kwargs)
        finally:
            _core.set_eager_phase(phase)
            try:
                seen = id(self) in _state.groups  # a new optimizer's first zero_grad() begins an iteration
                _join(self, start)
                if seen:
                    _after_skipped_step(sys._getframe(1), start)
                cls = type(self).__name__
                _held(f"{cls}.zero_grad", CAT_OPTIMIZER, start, _core.now_ns(), {ARG_OPTIMIZER: cls},
                      seen and _ends_iteration(sys._getframe(1)))
            except Exception as exc:
                _fail(exc)

    return zero_grad


def _wrap_optimizer_side(original, name: Optional[str] = None, begins: bool = False):
    """Work for the optimizers outside their own ``step()``: gradient clipping, a learning-rate
    scheduler's step, a model's ``zero_grad()``, a trainer's optimizer wrapper around ``step()``.
    An optimizer slice (``name``, else ``<class>.<method>``) in the step it ran in: the step view's
    optimizer time (nested in an optimizer slice, it is that slice's own time). A wrapper
    (``begins``) is training work from its call, as the optimizer step it makes; a trace that
    opens inside it (at the first compile, in the closure) begins its first step no later."""
    @functools.wraps(original)
    def traced(*args, **kwargs):
        if compiling_here():
            return original(*args, **kwargs)
        start = _core.now_ns()
        if begins:
            _work(start)
        waiting = begins and _state.start_ns is None and not _state.broken
        if not (_state.ops or waiting):
            return original(*args, **kwargs)
        if waiting:
            _local.wrapping = start
        phase = _core.set_eager_phase(_core.PHASE_OPTIMIZER)
        try:
            return original(*args, **kwargs)
        finally:
            _core.set_eager_phase(phase)
            if waiting:
                _local.wrapping = None
            end = _core.now_ns()
            label = name or f"{type(args[0]).__name__}.{original.__name__}"
            try:
                if _state.ops and not hold(label, CAT_OPTIMIZER, start, end):  # held: in what it begins
                    _slice(label, CAT_OPTIMIZER, start, end=end)
            except Exception as exc:
                _fail(exc)

    return traced


begin_no_later_than(lambda: getattr(_local, "wrapping", None))


def _after_skipped_step(frame, at: int) -> None:
    """A known optimizer's ``zero_grad()`` (from ``frame``, at ``at``) after a backward that no
    optimizer step followed: the iteration skipped its step (``if torch.isfinite(loss):
    optimizer.step()``), the next begins here. Not inside an optimizer's step (an LBFGS
    closure) or method (SAM's ``first_step``)."""
    with _lock:
        if (_state.mode != TRAIN or _state.explicit or _state.start_ns is None or _state.broken
                or _state.unstepped != threading.get_ident() or getattr(_local, "stepping", 0)
                or isinstance(frame.f_locals.get("self"), torch.optim.Optimizer)):
            return
        _finish(at)


def _user_sites(frame, depth: int = 16) -> tuple:
    """(code, instruction) of the user's frames from ``frame`` outward, innermost first."""
    sites = []
    frame = hooks.user_frame(frame)
    while frame is not None and len(sites) < depth:
        sites.append((frame.f_code, frame.f_lasti))
        frame = hooks.user_frame(frame.f_back)
    return tuple(sites)


def _ends_iteration(frame) -> bool:
    """Whether a ``zero_grad()`` called from ``frame`` ends the complete step's iteration: nothing
    is held since its optimizer steps, and a function that made them (the loop, or a helper it
    called) calls it after them (at the end of the loop's body; at its top, it begins the next
    iteration), directly or through a wrapper (accelerate's ``AcceleratedOptimizer``)."""
    if _state.mode != COMPLETE or _state.deferred or threading.get_ident() != _state.thread:
        return False
    sites = dict(_state.step_sites)
    for code, at in _user_sites(frame):  # the innermost frame that made the steps decides
        if code in sites:
            return at > sites[code]
    return False


def _torch_autograd():
    return torch.autograd


def _dataloader_iter():
    from torch.utils.data import dataloader

    return dataloader._BaseDataLoaderIter


def _dataloader():
    from torch.utils.data import dataloader

    return dataloader.DataLoader


def _optimizer_hook(register_name: str, hook):
    # a compiled optimizer step calls the hook eagerly, from a graph break: Dynamo tracing into it
    # would warn the user about _core's builtins
    hook = torch._dynamo.disable(hook)

    def register():
        from torch.optim import optimizer

        return getattr(optimizer, register_name)(hook)

    return register


GROUP = "steps"
for _hook in (
    hooks.Registration("optimizer step pre-hook", GROUP,
                       _optimizer_hook("register_optimizer_step_pre_hook", _optimizer_pre_hook)),
    hooks.Registration("optimizer step post-hook", GROUP,
                       _optimizer_hook("register_optimizer_step_post_hook", _optimizer_post_hook)),
    hooks.Patch("torch.autograd.backward", GROUP, _torch_autograd, "backward", _wrap_backward),
    hooks.Patch("torch.autograd.grad", GROUP, _torch_autograd, "grad", _wrap_backward),
    hooks.Patch("DataLoader iterator __next__", GROUP, _dataloader_iter, "__next__",
                lambda original: _wrap_data(original, "data")),
    hooks.Patch("DataLoader __iter__", GROUP, _dataloader, "__iter__",
                lambda original: _wrap_data(original, "DataLoader.__iter__")),
    hooks.Patch("Optimizer.zero_grad", GROUP, lambda: torch.optim.Optimizer, "zero_grad", _wrap_zero_grad),
    hooks.Patch("Module.train", GROUP, lambda: torch.nn.Module, "train", _wrap_train),
    hooks.Patch("Module.zero_grad", GROUP, lambda: torch.nn.Module, "zero_grad", _wrap_optimizer_side),
    hooks.Patch("clip_grad_norm_", GROUP, lambda: torch.nn.utils, "clip_grad_norm_",
                functools.partial(_wrap_optimizer_side, name="clip_grad_norm_")),
    hooks.Patch("clip_grad_value_", GROUP, lambda: torch.nn.utils, "clip_grad_value_",
                functools.partial(_wrap_optimizer_side, name="clip_grad_value_")),
    # clip_grad_norm_'s two halves (accelerate calls them: the norm of gradients on several meshes)
    hooks.Patch("get_total_norm", GROUP, lambda: torch.nn.utils, "get_total_norm",
                functools.partial(_wrap_optimizer_side, name="get_total_norm")),
    hooks.Patch("clip_grads_with_norm_", GROUP, lambda: torch.nn.utils, "clip_grads_with_norm_",
                functools.partial(_wrap_optimizer_side, name="clip_grads_with_norm_")),
    hooks.Patch("LRScheduler.step", GROUP, lambda: torch.optim.lr_scheduler.LRScheduler, "step",
                _wrap_optimizer_side),
    hooks.Patch("ReduceLROnPlateau.step", GROUP, lambda: torch.optim.lr_scheduler.ReduceLROnPlateau, "step",
                _wrap_optimizer_side),
    hooks.Patch("GradScaler.step", GROUP, lambda: torch.amp.GradScaler, "step", _wrap_scaler_step),
):
    hooks.declare(_hook)
for (_module, _cls, _method), _wrap in itertools.chain(
        zip(EVALUATIONS, itertools.repeat(_wrap_evaluation)),
        zip(OPTIMIZER_WRAPPERS, itertools.repeat(functools.partial(_wrap_optimizer_side, begins=True)))):
    hooks.declare(hooks.Patch(f"{_cls}.{_method} of {_module}", GROUP + " trainers",
                              functools.partial(lambda m, c: getattr(sys.modules[m], c), _module, _cls),
                              _method, _wrap))


def _install_trainers() -> None:
    """The evaluation functions and optimizer wrappers of the trainers imported by now."""
    for module, cls, method in EVALUATIONS + OPTIMIZER_WRAPPERS:
        if hasattr(sys.modules.get(module), cls):
            hooks.install_one(f"{cls}.{method} of {module}")


# the trainers imported later, at their import: a learning-rate scheduler binds the optimizer
# wrapper's step function to the instance when it is created, before a trace may open
hooks.declare(hooks.ImportWatch("trainer modules import", GROUP + " imports",
                                {m for m, _, _ in EVALUATIONS + OPTIMIZER_WRAPPERS}, _install_trainers))


def _install() -> None:
    """At every trace file: torch's global optimizer hooks and the patches (each once); the
    trainers' evaluation functions and optimizer wrappers (now, or when imported)."""
    hooks.install(GROUP)
    dataloaders.install()
    _install_trainers()
    hooks.install(GROUP + " imports")


logger.add_hooks(_on_open, _on_close)
logger.set_holder(functools.partial(hold, windowed=False))  # regions: in every step
if _core.is_open():  # a trace opened before this module was imported
    _on_open()
elif config.get().enable:  # a trace will open lazily: see the batch that begins its first step
    _install()
