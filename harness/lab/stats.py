"""Statistics for verdicts: a difference between two recipes is decided only by its interval.

A claim such as "AMP costs accuracy" is decided only when the confidence interval of the
measured difference lies entirely on one side of the margin that matters; when it straddles
the margin, the honest verdict is `inconclusive`.

Differences without spread. When every pair differs by the same amount (three seeds that each
need the same number of steps in both recipes, or accuracies that agree to the validation
sample: these are integers, and multiples of 100/val_size points), the t-interval has zero width,
yet three pairs say little: a fourth seed could differ. Zero spread is impossible under the
t-interval's normal model, so the interval falls back to one that needs no model: the range of n
samples covers their median with probability 1 - 2 * 2**-n (the sign test), whatever the
distribution, discrete ones included. With all n differences equal that range is a point, a
valid interval once 1 - 2 * 2**-n reaches the confidence (6 pairs at 95%); with fewer pairs no
interval at that confidence exists, and the difference decides nothing (`decidable` is False).
A claim of exact equality would be decided by `no_spread and mean == 0` directly; no claim of
this catalogue is one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


def pairs_without_spread(confidence: float = 0.95) -> int:
    """The fewest pairs that decide when all their differences are equal: the smallest n with
    1 - 2 * 2**-n >= confidence (6 at 95%, 8 at 99%)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie between 0 and 1, got {confidence}")
    n = 2
    while 1 - 2 * 0.5**n < confidence:
        n += 1
    return n


@dataclass(frozen=True)
class Difference:
    """mean(b - a) over paired samples (the same seeds in both arms), with its interval.

    Without spread and with fewer than `pairs_without_spread(confidence)` pairs, the interval is
    the whole line (-inf, +inf): within() and beyond() are then both False."""

    mean: float
    low: float
    high: float
    p_value: float  # two-sided: paired t-test of "no difference"; sign test without spread
    n: int
    confidence: float
    no_spread: bool = False  # every pair differed by exactly `mean`

    @property
    def decidable(self) -> bool:
        """The interval is finite: it can lie inside or outside a margin."""
        return math.isfinite(self.low) and math.isfinite(self.high)

    def within(self, margin: float) -> bool:
        """The whole interval lies inside (-margin, +margin): no gap larger than the margin."""
        return -margin < self.low and self.high < margin

    def beyond(self, margin: float) -> bool:
        """The whole interval lies outside [-margin, +margin], on one side: a real gap."""
        return self.low > margin or self.high < -margin

    def describe(self, unit: str = "", digits: int = 3) -> str:
        mean = f"{self.mean:+.{digits}g}{unit}"
        if not self.decidable:
            return (
                f"{mean} (no spread in {self.n} pairs: undecided; a distribution-free "
                f"{self.confidence:.0%} interval needs {pairs_without_spread(self.confidence)})"
            )
        interval = (
            f"{self.confidence:.0%} CI {self.low:+.{digits}g} to {self.high:+.{digits}g}{unit}, "
            f"n={self.n}, p={self.p_value:.2g}"
        )
        if self.no_spread:
            return f"{mean} ({interval}; no spread: the median's distribution-free interval)"
        return f"{mean} ({interval})"


def paired_difference(a, b, confidence: float = 0.95) -> Difference:
    """The difference b - a of paired measurements, with a t-interval; without spread, the
    distribution-free interval of the median (see the module's docstring)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.size < 2:
        raise ValueError(
            f"need two paired samples of the same size >= 2, got {a.size} and {b.size}"
        )
    diff = b - a
    # No spread: the t-test is undefined. A spread within rounding of the measured values (an
    # interpolated 20 steps that is 20.000000000000004 on one seed) is none either.
    if np.ptp(diff) <= 1e-9 * max(np.abs(a).max(), np.abs(b).max()):
        d, n = float(np.median(diff)), diff.size
        # The sign test: n differences all on one side of 0 by chance, 2 * 2**-n.
        p_value = 1.0 if d == 0 else min(1.0, 2 * 0.5**n)
        if n < pairs_without_spread(confidence):
            return Difference(d, -math.inf, math.inf, p_value, n, confidence, no_spread=True)
        return Difference(d, d, d, p_value, n, confidence, no_spread=True)
    result = stats.ttest_rel(b, a)
    interval = result.confidence_interval(confidence)
    return Difference(
        float(diff.mean()), float(interval.low), float(interval.high), float(result.pvalue),
        diff.size, confidence,
    )  # fmt: skip


def sign_flip_p(gaps: Sequence[float]) -> float:
    """The exact two-sided p of paired gaps' mean under "no effect" (each gap's sign a coin toss):
    the share of the 2**K sign patterns whose mean is as far from 0 as the observed one. No model
    of the gaps' distribution: K seeds' training runs are few, and their gaps far from normal."""
    observed = abs(sum(gaps)) * (1 - 1e-12)  # a tie (the observed pattern itself) counts
    sizes = [abs(g) for g in gaps]
    hits = sum(
        abs(sum(sign * size for sign, size in zip(signs, sizes, strict=True))) >= observed
        for signs in itertools.product((1, -1), repeat=len(sizes))
    )
    return hits / 2 ** len(sizes)
