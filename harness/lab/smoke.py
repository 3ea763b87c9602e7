"""PRACTICE-SMOKE's early warning, as a user can run it: from the run's own first batches only.

The article's advice: run an epoch or two first and watch the loss and the gradient norm. A
user has no healthy run beside theirs to compare with, so the reference here is the run's own
start: the median gradient norm (after unscaling) of its first REFERENCE_STEPS steps taken. A
later step warns when its norm leaves FACTOR times that reference (inf or NaN included), or when
the scaler skips a step again within SKIP_WINDOW steps of another skip after the start: a lone
skip is how GradScaler calibrates (at start-up, and after each growth of the scale), persistent
skipping is values out of range.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

REFERENCE_STEPS = 3  # steps taken (not skipped) whose median norm is the reference
FACTOR = 10.0  # a norm above FACTOR x the reference warns
SKIP_WINDOW = 3  # two skips this close after the start warn: the skipping persists


@dataclass(frozen=True)
class Alarm:
    step: int  # the first step that warns
    why: str  # in words, with the numbers


def reference(grad_norms: Sequence[float], skipped: Sequence[bool]) -> tuple[int, float] | None:
    """(the step after which the reference is known, the reference norm), or None when the run
    has not taken REFERENCE_STEPS finite steps: too early to judge."""
    taken = [
        (step, norm)
        for step, (norm, skip) in enumerate(zip(grad_norms, skipped, strict=True))
        if not skip and math.isfinite(norm)
    ][:REFERENCE_STEPS]
    if len(taken) < REFERENCE_STEPS:
        return None
    return taken[-1][0], statistics.median(norm for _, norm in taken)


def first_alarm(grad_norms: Sequence[float], skipped: Sequence[bool]) -> Alarm | None:
    """The first step a user watching this run alone is warned at; None if none warns."""
    known = reference(grad_norms, skipped)
    if known is None:
        return None
    start, ref = known
    last_skip = None
    for step in range(start + 1, len(grad_norms)):
        norm = grad_norms[step]
        if not math.isfinite(norm) or norm > FACTOR * ref:
            why = f"grad norm {norm:.3g} against {ref:.3g} (the median of its first steps)"
            if math.isfinite(norm) or not skipped[step]:
                return Alarm(step, why)
        if skipped[step]:
            if last_skip is not None and step - last_skip <= SKIP_WINDOW:
                return Alarm(step, f"a second skipped step within {SKIP_WINDOW} (at {last_skip})")
            last_skip = step
    return None
