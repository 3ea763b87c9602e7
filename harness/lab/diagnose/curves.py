"""What the rules read off a curve over the steps: the end of a loss curve against fp32's, held to
fp32's own seed spread and the loss's floor (the drift rule's yardstick, which --compile and
--verify hold their gaps to as well), and an op's per-step peaks extended to fp16's 65504 (the
growth forecast).
"""

from __future__ import annotations

import math
import statistics

from harness.lab.diagnose.observed import Forecast, Run
from harness.lab.diagnose.thresholds import DRIFT_MAX, FP16_MAX, LOSS_FLOOR, NOISE_FACTOR


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


def forecast(run: Run, horizon: int) -> Forecast | None:
    """The op whose straight-line growth reaches fp16's 65504 first within the horizon."""
    best = None
    for key, op in run.ops.items():
        ys = op.peaks
        if len(ys) < 3 or not all(math.isfinite(y) for y in ys) or ys[-1] <= ys[0]:
            continue
        slope = _slope(ys)
        if slope <= 0 or op.peak >= FP16_MAX:
            continue
        step = len(ys) + math.ceil((FP16_MAX - ys[-1]) / slope)
        if step <= horizon and (best is None or step < best.step):
            best = Forecast(key, ys[-1], slope, step)
    return best


def _slope(ys: list[float]) -> float:
    xs = range(1, len(ys) + 1)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
