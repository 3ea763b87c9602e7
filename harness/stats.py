"""Statistics for verdicts: a difference between two recipes is decided only by its interval.

A claim such as "AMP costs accuracy" is decided only when the confidence interval of the
measured difference lies entirely on one side of the margin that matters; when it straddles
the margin, the honest verdict is `inconclusive`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Difference:
    """mean(b - a) over paired samples (the same seeds in both arms), with its interval."""

    mean: float
    low: float
    high: float
    p_value: float  # two-sided paired t-test of "no difference"
    n: int
    confidence: float

    def within(self, margin: float) -> bool:
        """The whole interval lies inside (-margin, +margin): no gap larger than the margin."""
        return -margin < self.low and self.high < margin

    def beyond(self, margin: float) -> bool:
        """The whole interval lies outside [-margin, +margin], on one side: a real gap."""
        return self.low > margin or self.high < -margin

    def describe(self, unit: str = "", digits: int = 3) -> str:
        return (
            f"{self.mean:+.{digits}g}{unit} ({self.confidence:.0%} CI {self.low:+.{digits}g} to "
            f"{self.high:+.{digits}g}{unit}, n={self.n}, p={self.p_value:.2g})"
        )


def paired_difference(a, b, confidence: float = 0.95) -> Difference:
    """The difference b - a of paired measurements, with a t-interval."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.size < 2:
        raise ValueError(
            f"need two paired samples of the same size >= 2, got {a.size} and {b.size}"
        )
    diff = b - a
    if np.all(diff == diff[0]):  # no spread: the t-test is undefined, the interval is a point
        return Difference(
            float(diff[0]),
            float(diff[0]),
            float(diff[0]),
            1.0 if diff[0] == 0 else 0.0,
            diff.size,
            confidence,
        )
    result = stats.ttest_rel(b, a)
    interval = result.confidence_interval(confidence)
    return Difference(
        float(diff.mean()), float(interval.low), float(interval.high), float(result.pvalue),
        diff.size, confidence,
    )  # fmt: skip
