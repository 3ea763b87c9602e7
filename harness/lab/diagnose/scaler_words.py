"""What a GradScaler's course says, in words: how it failed (the rules' "unstable"), or how it
calibrated (a safe run's line). Its skips are read as observed.scaler_course sorts them.
"""

from __future__ import annotations

from harness.lab.diagnose.observed import CALIBRATED, Run
from harness.lab.diagnose.thresholds import SCALE_FLOOR


def failures(run: Run) -> list[str]:
    """A scaler that failed, in words (rules' UNSTABLE): a minority of steps taken, a collapsed
    scale, skips recurring at a scale it had settled on; none where it calibrated (a minority
    of steps taken included: the look's first steps skipped, each a back-off, then steps taken,
    Run.scaler_calibration)."""
    taken = len(run.skips) - run.skipped
    course = run.scaler_course()
    scale = f"scale {run.scale[0]:g} -> {run.scale[-1]:g}"
    if taken * 2 <= len(run.skips) and run.scaler_calibration() != CALIBRATED:
        forward = run.first_nonfinite_loss() is not None
        seeking = not course.recurrent and run.scale[-1] >= SCALE_FLOOR and not forward
        return [
            f"the scaler took {taken} of {len(run.skips)} steps ({scale})"
            + (
                ": it was still seeking its scale, so more --steps may see it settle "
                "(or fall under 1: fp16's gradients overflowing unscaled)"
                if seeking
                else ": the loss is inf/NaN in the forward, which no loss scale can mend (the "
                "scale only multiplies the backward)"
                if forward
                else ""
            )
        ]
    if run.scale[-1] < SCALE_FLOOR:
        return [f"the scale collapsed below {SCALE_FLOOR:g} ({scale})"]
    if course.recurs(len(run.skips)):
        return [
            f"{len(course.recurrent)} step(s) skipped at or below the scale {course.settled:g} "
            f"the scaler had settled on at step {course.settled_at} (steps "
            f"{_steps(course.recurrent)}; {scale}): fp16's gradients keep overflowing a scale "
            "that had held, beyond its calibration"
        ]
    return []


def _steps(steps: list[int]) -> str:
    return ", ".join(str(s) for s in steps)


def calibration(run: Run) -> str:
    """A safe scaler's course, in words: its back-offs and where it settled."""
    course = run.scaler_course()
    if not run.skipped:
        return f"the scaler skipped no step (scale {run.scale[0]:g} held)"
    words = (
        f"the scaler calibrated: {len(course.calibration)} back-off(s) from {run.scale[0]:g} "
        f"(step {_steps(course.calibration)}) to {run.scale[-1]:g}"
    )
    if course.recurrent:
        words += (
            f", and {len(course.recurrent)} skip(s) at a scale it had held (step "
            f"{_steps(course.recurrent)}), one more halving, as calibration does"
        )
    if run.skips[-1]:
        words += ", its last at the last step: more --steps show where it settles"
    return words
