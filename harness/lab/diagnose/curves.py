"""What the rules read off a curve over the steps: the end of a loss curve against fp32's, held to
fp32's own seed spread and the loss's floor (the drift rule's yardstick, which --compile and
--verify hold their gaps to as well), and an op's per-step peaks extended to where fp16 overflows
(the growth forecast).
"""

from __future__ import annotations

import math
import statistics

from harness.lab.diagnose.observed import GRADIENT, Forecast, Run
from harness.lab.diagnose.thresholds import (
    DRIFT_MAX,
    EXP_OPS,
    FORECAST_MIN_STEPS,
    FP16_MAX,
    GROWTH_MIN_RATIO,
    GROWTH_TAU,
    LOSS_FLOOR,
    MAX_POWER,
    MIN_POWER,
    NOISE_FACTOR,
)


def window(values: list[float]) -> list[float]:
    """The end of a loss curve the drift is judged on: its last quarter, at least 2 steps."""
    return values[-max(2, len(values) // 4) :]


def end_gap(run: list[float], reference: list[float]) -> float:
    """Mean |loss - reference loss| over the end window (inf when a loss there is not finite)."""
    pairs = window(list(zip(run, reference, strict=False)))
    if not all(math.isfinite(a) for a, _b in pairs):
        return math.inf
    return statistics.fmean(abs(a - b) for a, b in pairs) if pairs else 0.0


def beyond_noise(gap: float, base: float, spread: float, floor: float) -> bool:
    """The drift rule, for the quick look and --verify alike: a gap in the loss's units that is
    over DRIFT_MAX of `base`, over NOISE_FACTOR times fp32's own `spread`, and over `floor`."""
    return gap / max(abs(base), floor) > DRIFT_MAX and gap > max(NOISE_FACTOR * spread, floor)


def loss_floor(reference: Run) -> float:
    return LOSS_FLOOR * abs(reference.loss[0]) if reference.loss else LOSS_FLOOR


def forecasts(run: Run, horizon: int) -> list[Forecast]:
    """Every op, and the gradient's largest entry, whose growth over the steps reaches fp16's
    overflow within the horizon, the soonest first (`forecast_op`)."""
    peaks = {key: op.peaks for key, op in run.ops.items()}
    peaks[GRADIENT] = run.gradient_peaks  # an fp16 gradient past 65504 needs a scale under 1
    found = [f for key, values in peaks.items() if (f := forecast_op(key, values, horizon))]
    return sorted(found, key=lambda f: f.step)


def forecast(run: Run, horizon: int) -> Forecast | None:
    """The op whose growth reaches fp16's overflow first within the horizon."""
    return next(iter(forecasts(run, horizon)), None)


def forecast_op(key: str, peaks: list[float], horizon: int) -> Forecast | None:
    """Where an op's per-step peaks, extended, reach fp16's overflow; None where they do not
    grow steadily (by GROWTH_MIN_RATIO at least over the steps) or reach it beyond `horizon`.

    What is extended is what overflows: an exp's largest input (the log of its output's peak:
    fp16's exp overflows past ln 65504 = 11.09), any other op's output. Growth counts only where
    it is steady: the value at every step above the first step's, and rising with the steps
    (Kendall's tau at least GROWTH_TAU; a batch's largest value jitters from step to step).
    The curve first + rate * (step - 1) ** power is fitted by least squares on the logs of the
    gains over the first step (power 1 a straight line; a square's growth, a pow or a sum of
    squares of a growing activation, power 2). The power is held to [1, MAX_POWER]: a gain
    that slows over a few steps (an optimizer's first large steps) is extended as a straight
    line, no more, and none faster than a square."""
    if len(peaks) < FORECAST_MIN_STEPS or not all(math.isfinite(y) and y >= 0 for y in peaks):
        return None
    if peaks[-1] < GROWTH_MIN_RATIO * peaks[0]:
        return None
    exp = key.rpartition(":")[2].rstrip("_") in EXP_OPS
    if exp and min(peaks) <= 0:
        return None
    values = [math.log(y) for y in peaks] if exp else list(peaks)
    limit = math.log(FP16_MAX) if exp else FP16_MAX
    first, last = values[0], values[-1]
    if last >= limit or any(v <= first for v in values[1:]) or _tau(values) < GROWTH_TAU:
        return None
    gains = [(math.log(t), math.log(v - first)) for t, v in enumerate(values[1:], 1)]
    fitted = _slope_of(gains)
    power = min(max(fitted, 1.0), MAX_POWER)
    step, rate = _reaches(gains, power, limit - first)
    if step > horizon:
        return None
    # Where the gain slowed over the steps, the step it reaches the limit at if it keeps slowing
    # as it did (the fitted power, under 1): the far end of the forecast's range.
    slowing = _reaches(gains, max(fitted, MIN_POWER), limit - first)[0] if fitted < 1 else step
    growth = rate * power * (len(values) - 1) ** (power - 1)
    return Forecast(key, first, last, growth, max(step, len(values) + 1),
                    "input" if exp else "output", limit, power, max(slowing, step))  # fmt: skip


def _reaches(gains: list[tuple[float, float]], power: float, distance: float) -> tuple[int, float]:
    """The step where first + rate * (step - 1) ** power has gained `distance`, and the rate: the
    mean of the logs of gain / t**power, given the power."""
    rate = math.exp(statistics.fmean(g - power * x for x, g in gains))
    return 1 + math.ceil((distance / rate) ** (1 / power)), rate


def _tau(values: list[float]) -> float:
    """Kendall's tau of the values against their order: 1 rising at every step, 0 no trend."""
    pairs = [(a, b) for i, a in enumerate(values) for b in values[i + 1 :]]
    return sum((b > a) - (b < a) for a, b in pairs) / len(pairs)


def _slope_of(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of y on x."""
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    spread = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / spread if spread else 0.0
