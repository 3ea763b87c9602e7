"""Whether a metric moved beyond its noise: the numbers a comparison judges a metric change by.

Metric keys that differ only in a `seed<N>`, `round<N>` or `rank<N>` path component
(`mlp/amp-fp16/seed0/val_accuracy`, `.../seed1/...`) are repetitions of one quantity
(`quantities`), and the two sample sets are compared with Welch's t-test (`welch`); the size of a
change is relative to the first run's mean (`relative`). Apart from harness.reports.compare:
plain arithmetic on samples, which knows nothing of verdicts, claims or environments.
"""

from __future__ import annotations

import math
import re
import statistics

_REPETITION = re.compile(r"^(seed|round|rank)\d+$")


def quantities(metrics: dict) -> dict[str, dict[str, float | str]]:
    """{quantity: {metric key: value}}: keys that differ only in seed<N>, round<N> or rank<N>
    are samples of one quantity."""
    grouped: dict[str, dict[str, float | str]] = {}
    for key, value in metrics.items():
        parts = [_REPETITION.sub(r"\1*", part) for part in key.split("/")]
        grouped.setdefault("/".join(parts), {})[key] = value
    return grouped


def relative(before: float, after: float) -> float:
    if before == 0:
        return 0.0 if after == 0 else math.copysign(math.inf, after)
    return (after - before) / abs(before)


def welch(xs: list[float], ys: list[float]) -> float:
    """Two-sided p-value of Welch's t-test (unequal variances)."""
    if len(set(xs)) == 1 and len(set(ys)) == 1:
        # No spread on either side (a count that is the same on every seed): the t statistic
        # is undefined, and any difference is beyond the noise.
        return 1.0 if xs[0] == ys[0] else 0.0
    # scipy.special's t distribution, not scipy.stats.ttest_ind: the same p-value, and stats
    # takes half a second to import (`amp-harness upgrade` answers in under a second). Here, not
    # at the top: few sessions compare.
    from scipy.special import stdtr

    var_x, var_y = statistics.variance(xs) / len(xs), statistics.variance(ys) / len(ys)
    t = (statistics.fmean(xs) - statistics.fmean(ys)) / math.sqrt(var_x + var_y)
    # Welch-Satterthwaite's degrees of freedom
    df = (var_x + var_y) ** 2 / (var_x**2 / (len(xs) - 1) + var_y**2 / (len(ys) - 1))
    return float(2 * stdtr(df, -abs(t)))


def size(relative: float) -> float:
    return 0.0 if math.isnan(relative) else abs(relative)


def percent(relative: float) -> str:
    return "n/a" if math.isnan(relative) else f"{relative:+.1%}"
