"""The growth forecast said: which of fp32's forecasts (harness.lab.diagnose.curves) concerns a
recipe's run, in the words of its status "overflows fp16 ahead" (harness.lab.diagnose.rules), and
the fix it recommends (the op's module, or the loss, kept in fp32; amp-bf16).
"""

from __future__ import annotations

from harness.lab.diagnose.observed import GRADIENT, REFERENCE, Diagnosis, Forecast, Run
from harness.lab.diagnose.wording import fix_modules, in_loss, modules_named, where


def forecast_said(run: Run, diagnosis: Diagnosis) -> str | None:
    """The soonest forecast that concerns the run, in words, its fix noted on the run; None
    where none does."""
    ahead = forecast_for(run, diagnosis)
    if ahead is None:
        return None
    if ahead.op == GRADIENT:
        return (
            f"the gradient's largest entry grows about {ahead.growth:.3g} per step "
            f"({ahead.first:.3g} at step 1, {ahead.peak:.3g} at step {diagnosis.steps}); at this "
            f"rate it overflows fp16 near step {ahead.step}{_range(ahead)}, where a loss scaler "
            f"needs a scale under 1 (--horizon {diagnosis.horizon}). A forecast from "
            f"{diagnosis.steps} steps, not a measurement: --verify {2 * ahead.step} trains to "
            "twice that step. Fix: use amp-bf16 (fp32's range), or a loss scaled down"
        )
    run.keep_fp32.extend(fix_modules([ahead.op]))
    run.loss_fp32 = run.loss_fp32 or in_loss([ahead.op])
    grows = (
        f"its largest input grows about {ahead.growth:.3g} per step ({ahead.first:.3g} at step 1, "
        f"{ahead.peak:.3g} at step {diagnosis.steps}; fp16's exp overflows past {ahead.limit:.2f})"
        if ahead.measured == "input"
        else f"its output grows about {ahead.growth:.3g} per step ({ahead.first:.3g} at step 1, "
        f"{ahead.peak:.3g} at step {diagnosis.steps}"
        + (", as a square grows" if ahead.power > 1.5 else "")
        + ")"
    )
    return (
        f"{where(ahead.op)}: {grows}; at this rate it overflows fp16 near step {ahead.step}"
        f"{_range(ahead)} (--horizon {diagnosis.horizon}). A forecast from {diagnosis.steps} "
        f"steps, not a measurement: --verify {2 * ahead.step} trains to twice that step. Fix: "
        f"keep {', '.join(modules_named([ahead.op]))} in fp32, or use amp-bf16 (fp32's range)"
    )


def forecast_for(run: Run, diagnosis: Diagnosis) -> Forecast | None:
    """The soonest of fp32's forecasts that concerns this run: an op it computes in fp16, or
    the gradient's largest entry (an fp16 gradient, scaled or not)."""
    fp16 = run.computed_fp16()
    return next(
        (f for f in diagnosis.runs[REFERENCE].forecasts if f.op in fp16 or f.op == GRADIENT), None
    )


def _range(ahead: Forecast) -> str:
    if ahead.slowing <= ahead.step:
        return ""
    return f" (near step {ahead.slowing} if its growth keeps slowing as over these steps)"
