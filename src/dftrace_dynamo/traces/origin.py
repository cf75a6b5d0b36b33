"""Where a wait began: the chain of waits through collectives and point-to-point operations,
and what in the rank it began on was slower than on its peers.

A rank that arrives last at an operation makes the others wait; but when it arrived late only
because it had waited itself, earlier in the step, for another rank, the delay began there.
Per step, each wait of a rank ``q`` at an operation whose last arrival is ``L`` is split:

* the part inherited: how much more ``L`` had waited than ``q`` in its earlier operations of the
  step (at most the wait itself), charged, latest wait first, through those operations of ``L``
  to their own last arrivals, by the same rule;
* the rest: ``L``'s own delay, charged to ``L`` (the origin) as time ``q`` lost to it.

The **excess** of a rank in a step, per phase (data, forward, backward, optimizer, gc, trainer,
eager code: the untraced rest) and per module path (its ops' time), is its time there minus the
median of the other ranks' in the same step."""

import statistics

import numpy as np

PHASES = ("data", "forward", "backward", "optimizer", "gc", "trainer", "eager code")


def charges(ops):
    """Per (origin rank, rank that lost the time): the time lost in one step. ``ops``: the
    step's matched operations, each ``{rank: (arrival, wait)}`` on one clock (wait: the time
    the rank sat in it before the last member arrived)."""
    timeline, last, waited_before = {}, [], {}  # rank -> its (arrival, op); op -> last arrival
    for k, members in enumerate(ops):
        last.append(max(members, key=lambda q: members[q][0]))
        for q, (arrive, _) in members.items():
            timeline.setdefault(q, []).append((arrive, k))
    position = {}
    for q, own in timeline.items():
        own.sort()
        total = 0.0
        for i, (_, k) in enumerate(own):
            position[(q, k)] = i
            waited_before[(q, k)] = total
            total += ops[k][q][1]
    lost = {}

    def charge(k, via, amount, loser, depth=0):
        origin = last[k]
        if origin == via:
            return
        inherited = min(max(waited_before[(origin, k)] - waited_before[(via, k)], 0.0), amount)
        own = amount - inherited
        if own > 0 and origin != loser:
            lost[(origin, loser)] = lost.get((origin, loser), 0.0) + own
        if depth > len(ops):  # each call goes to an earlier operation: a bound, never reached
            return
        for _, j in reversed(timeline[origin][:position[(origin, k)]]):
            if inherited <= 0:
                break
            part = min(inherited, ops[j][origin][1])
            if part > 0:
                charge(j, origin, part, loser, depth + 1)
                inherited -= part

    for k, members in enumerate(ops):
        for q, (_, wait) in members.items():
            if wait > 0:
                charge(k, q, wait, q)
    return lost


def per_neighbour(lost, ranks):
    """Per rank: the median, over the other ranks that lost time to it in the step, of what each
    lost (0 where none did), and how many did."""
    out = {}
    for r in ranks:
        values = [v for (o, _), v in lost.items() if o == r and v > 0]
        out[r] = (statistics.median(values) if values else 0.0, len(values))
    return out


def excess(values):
    """``values``: a row per rank and a column per step: each rank's value minus the median of
    the other ranks' in the same step."""
    values = np.asarray(values, float)
    n = len(values)
    if n < 2:
        return np.zeros_like(values)
    others = np.stack([np.median(np.delete(values, i, axis=0), axis=0) for i in range(n)])
    return values - others


def cause(i, phase_excess, module_excess):
    """What in rank ``i`` was slower than on its peers: the phase with the largest median excess
    over the steady steps and, when that is forward or backward, the module whose ops' time has
    the largest; None when nothing was slower. ``phase_excess``: {phase: array rank × step};
    ``module_excess``: {module: array rank × step}."""
    medians = {p: float(np.median(v[i])) for p, v in phase_excess.items() if v.shape[1]}
    if not medians:
        return None
    phase = max(medians, key=medians.get)
    if medians[phase] <= 0:
        return None
    out = {"phase": phase, "excess_us": medians[phase]}
    modules = {m: float(np.median(v[i])) for m, v in module_excess.items() if v.shape[1]}
    if modules and phase in ("forward", "backward"):
        module = max(modules, key=modules.get)
        if modules[module] > 0:
            out.update(module=module, module_excess_us=modules[module])
    return out
