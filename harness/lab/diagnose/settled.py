"""Whether a fix check's few steps can say if the fix held: "not settled" (FixCheck.unsettled says
why) where what the fixed run shows is what the quick look cannot tell from harm, never "held".

- AdamW's fp16 second moments lost, and nothing else: those entries step by m/eps, which longer
  training found harmless on some models and harmful on others (rules.OPTIMIZER_IN_FP16).
- A GradScaler calibrating its initial guess (observed.Run.scaler_calibration): still halving
  from 65536 with every loss finite and too few steps taken to show a scale that holds, or
  calibrated, with a loss above fp32's that the skipped steps explain as well as the fix (the
  run is that many updates behind fp32's). bert_naive_softmax's loss outside autocast under
  amp-fp16 (5 skips of 8, 65536 to 2048) trains as fp32 over 150 steps (docs/diagnose.md).
"""

from __future__ import annotations

import statistics

from harness.lab.diagnose.curves import window
from harness.lab.diagnose.observed import CALIBRATED, SEEKING, Run
from harness.lab.diagnose.rules import DRIFTS, OPTIMIZER_IN_FP16, UNSTABLE

MOMENTS = (
    "only AdamW's fp16 second moments are lost, a different optimizer on those entries that "
    "longer training found harmless on some models and harmful on others; --verify N --seeds K "
    "decides"
)


def unsettled(fixed: Run, reference: Run) -> str:
    """Why the fixed run's look cannot say whether the fix held ("" where it can), judged
    against `reference`, fp32's run (with the fix's optimizer change)."""
    if fixed.findings == [OPTIMIZER_IN_FP16] and not fixed.first_nonfinite_loss():
        return MOMENTS
    course = fixed.scaler_calibration()
    if not course or fixed.kernel_faults or not fixed.findings:
        return ""
    explained = {UNSTABLE} if course == SEEKING else set()
    if _lagging(fixed, reference):
        explained.add(DRIFTS)
    if not set(fixed.findings) <= explained:
        return ""
    taken = len(fixed.skips) - fixed.skipped
    backoffs = (
        f"the scaler skipped the first {fixed.skipped} of {len(fixed.skips)} steps, each "
        f"halving its scale ({fixed.scale[0]:g} -> {fixed.scale[-1]:g}) with every loss finite: "
        "GradScaler calibrating its initial guess"
    )
    if course == CALIBRATED:
        return (
            f"{backoffs}, then took {taken}; its loss is above fp32's, which the {fixed.skipped} "
            "updates it is behind explain as well as the fix could; --verify N decides"
        )
    return f"{backoffs}, and took {taken}: too few to show a scale that holds; --verify N decides"


def _lagging(fixed: Run, reference: Run) -> bool:
    """The run's loss ends above fp32's, as a run some updates behind a falling loss does."""
    ours, theirs = window(fixed.loss), window(reference.loss)
    return bool(ours and theirs) and statistics.fmean(ours) > statistics.fmean(theirs)
