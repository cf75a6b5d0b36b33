"""A mergeable quantile sketch with a relative-error bound (DDSketch's log buckets).

A value ``v > 0`` falls in bucket ``i = ceil(log_gamma(v))`` with
``gamma = (1 + ALPHA) / (1 - ALPHA)``; the bucket stands for ``2 gamma^i / (gamma + 1)``,
which is within ``ALPHA`` (relative) of every value of the bucket (Masson, Rim
and Lee, *DDSketch*, VLDB 2019). Negative values have buckets of their own, zero
(and anything below :data:`MIN_VALUE` in magnitude) one bucket. Merging adds the
bucket counts, so a sketch merged from parts equals the sketch of the whole.

:meth:`Sketch.quantile` interpolates between the two closest ranks as DuckDB's
``quantile_cont`` does, from the two ranks' estimates: for non-negative values
each estimate is within ``ALPHA`` of the exact rank value, so the interpolation
is within ``ALPHA`` of the exact ``quantile_cont``. The first and last ranks are
the exact minimum and maximum.

Bucket keys are one integer, the same in Python (:func:`key`), in SQL
(:func:`key_sql`) and in the aggregate records of the trace files.
"""

import math

ALPHA = 0.01  # relative accuracy of every quantile
GAMMA = (1 + ALPHA) / (1 - ALPHA)
LN_GAMMA = math.log(GAMMA)
MIN_VALUE = 1e-9  # smaller magnitudes go to the zero bucket
NEGATIVE = 1 << 32  # key of a negative value: -NEGATIVE - (its magnitude's index)
ZERO = 1 << 33  # key of the zero bucket


def key(v):
    """The bucket key of ``v`` (not NaN)."""
    if v > MIN_VALUE:
        return math.ceil(math.log(v) / LN_GAMMA)
    if v < -MIN_VALUE:
        return -NEGATIVE - math.ceil(math.log(-v) / LN_GAMMA)
    return ZERO


def key_sql(column):
    """SQL giving :func:`key` of ``column`` as BIGINT (NULL for NULL)."""
    return (f"CASE WHEN {column} > {MIN_VALUE} THEN CAST(ceil(ln({column}) / {LN_GAMMA!r}) AS BIGINT) "
            f"WHEN {column} < -{MIN_VALUE} THEN -{NEGATIVE} - CAST(ceil(ln(-{column}) / {LN_GAMMA!r}) AS BIGINT) "
            f"WHEN {column} IS NOT NULL THEN {ZERO} END")


def value(k):
    """The value bucket ``k`` stands for."""
    if k == ZERO:
        return 0.0
    if k <= -NEGATIVE // 2:
        return -2 * GAMMA ** (-NEGATIVE - k) / (GAMMA + 1)
    return 2 * GAMMA ** k / (GAMMA + 1)


class Sketch:
    """Bucket counts plus the exact count, minimum and maximum."""

    __slots__ = ("counts", "n", "min", "max")

    def __init__(self):
        self.counts, self.n = {}, 0
        self.min, self.max = math.inf, -math.inf

    def add(self, v, n=1):
        k = key(v)
        self.counts[k] = self.counts.get(k, 0) + n
        self.n += n
        self.min, self.max = min(self.min, v), max(self.max, v)

    def add_bucket(self, k, n, lo, hi):
        """``n`` values of bucket ``k``, the least ``lo`` and the greatest ``hi``."""
        self.counts[k] = self.counts.get(k, 0) + n
        self.n += n
        self.min, self.max = min(self.min, lo), max(self.max, hi)

    def merge(self, other):
        for k, n in other.counts.items():
            self.counts[k] = self.counts.get(k, 0) + n
        self.n += other.n
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)
        return self

    def _ranks(self, ranks):
        """Estimates of the values of the given 0-based ranks (sorted)."""
        out, seen, i = [], 0, 0
        for k in sorted(self.counts, key=value):
            seen += self.counts[k]
            while i < len(ranks) and ranks[i] < seen:
                r = ranks[i]
                est = self.min if r == 0 else self.max if r == self.n - 1 else value(k)
                out.append(min(max(est, self.min), self.max))
                i += 1
        return out

    def quantile(self, q):
        """Estimate of DuckDB's ``quantile_cont(q)``; None when empty."""
        if not self.n:
            return None
        pos = (self.n - 1) * q
        lo = int(pos)
        hi = min(lo + 1, self.n - 1)
        v_lo, v_hi = self._ranks([lo, hi]) if hi != lo else self._ranks([lo]) * 2
        return v_lo + (v_hi - v_lo) * (pos - lo)
