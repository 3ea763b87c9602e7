"""`amp-harness diagnose --verify N`: the ground truth the quick look is judged by.

After the quick look, every recipe is trained N steps from the same weights on the same
batches, fp32 three times (as it is, and twice with its weights perturbed: fp32's own spread,
measured as the quick look measures it), and every fix the quick look recommended too. Each
long run gets a truth from what training did:
- **diverges**: a loss non-finite (from which step), parameters inf/NaN at the end, or a scaler
  that took at most half of the steps or whose scale fell under 1;
- **harmed**: the end of its loss curve, or its held-out loss (eval mode, HELD_OUT batches it
  never trained on), worse than fp32's beyond 5%, beyond twice fp32's own spread and beyond
  the loss floor (the drift rule of harness.lab.diagnose_rules);
- **trains as fp32**: neither.
A prediction holds when "safe" meets "trains as fp32", and any other status meets "diverges" or
"harmed"; a fix holds when its run trains as fp32.
"""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

from torch import nn

from harness.lab import recipes
from harness.lab.diagnose_fixes import Fix
from harness.lab.diagnose_rules import (
    NOISE_FACTOR,
    NOT_RUN,
    REFERENCE,
    REFERENCE_STATUS,
    SAFE,
    Diagnosis,
    Run,
    beyond_noise,
    end_gap,
    loss_floor,
    window,
)
from harness.lab.diagnose_runs import Replay, Setting, perturbed, run_recipe

HELD_OUT = 4  # batches after the trained ones, scored in eval mode at the end
DIVERGES, HARMED, FINE = "diverges", "harmed", "trains as fp32"


def verify(
    diagnosis: Diagnosis, initial: nn.Module, replay: Replay, held_out: list, setting: Setting,
    fixes: dict[str, Fix],
) -> dict:  # fmt: skip
    """The long runs' truths against the quick look's statuses, as a JSON-able dict:
    steps, noise, rows (one per recipe: predicted, truth, why, held) and fixes (one per fix:
    recipe, fix, truth, why, held)."""
    long = {"held_out": held_out, "watch": False}
    reference, _ = run_recipe(REFERENCE, initial, replay, setting, **long)
    spread = perturbed(initial, replay, setting, held_out=held_out)
    noise = Noise(
        max(end_gap(run.loss, reference.loss) for run in spread),
        max(_held_gap(run, reference) for run in spread),
    )
    rows = []
    for name, quick in diagnosis.runs.items():
        if quick.status in (NOT_RUN,) or quick.unsupported:
            continue
        run = (
            reference
            if name == REFERENCE
            else run_recipe(name, initial, replay, setting, **long)[0]
        )
        truth, why = _truth(run, reference, noise)
        rows.append(
            {
                "recipe": name,
                "predicted": quick.status,
                "truth": truth,
                "why": why,
                "held": None if quick.status == REFERENCE_STATUS else _held(quick.status, truth),
                "loss": _end(run.loss),
                "held_out_loss": run.held_out_loss,
            }
        )
    checked = []
    for name, fix in fixes.items():
        run, _ = run_recipe(name, initial, replay, setting, fix=fix, **long)
        truth, why = _truth(run, reference, noise)
        checked.append(
            {"recipe": name, "fix": fix.describe(), "truth": truth, "why": why,
             "held": truth == FINE}
        )  # fmt: skip
    return {
        "steps": len(replay.taken),
        "noise": noise.loss,
        "held_out_noise": noise.held_out,
        "rows": rows,
        "fixes": checked,
    }


class Noise(NamedTuple):
    """fp32's own spread over the long runs: at the end of the loss curve, and held out."""

    loss: float
    held_out: float


def _held_gap(run: Run, reference: Run) -> float:
    if run.held_out_loss is None or reference.held_out_loss is None:
        return 0.0
    return abs(run.held_out_loss - reference.held_out_loss)


def _end(loss: list[float]) -> float | None:
    return statistics.fmean(window(loss)) if loss else None


def _truth(run: Run, reference: Run, noise: Noise) -> tuple[str, str]:
    """What training did, in one word and the numbers behind it."""
    if run.error:
        return DIVERGES, f"raised {run.error}"
    bad = run.first_nonfinite_loss()
    if bad:
        count = sum(not math.isfinite(v) for v in run.loss)
        return DIVERGES, f"loss non-finite from step {bad} ({count} of {len(run.loss)} steps)"
    if not run.params_finite:
        return DIVERGES, "parameters inf/NaN at the end"
    if recipes.get(run.recipe).scaler and run.scaler_stalled():
        taken = len(run.skips) - run.skipped
        return DIVERGES, (
            f"the scaler took {taken} of {len(run.skips)} steps, scale {run.scale[0]:g} -> "
            f"{run.scale[-1]:g}"
        )
    if run is reference:
        return FINE, f"end loss {_end(run.loss):.4g}, held-out {run.held_out_loss:.4g}"
    ref_end = _end(reference.loss) or 0.0
    gaps = [
        ("loss", _end(run.loss) - ref_end, ref_end, noise.loss),
        (
            "held-out loss",
            (run.held_out_loss or 0.0) - (reference.held_out_loss or 0.0),
            reference.held_out_loss or 0.0,
            noise.held_out,
        ),
    ]
    floor = loss_floor(reference)
    words = []
    for what, gap, base, spread in gaps:
        words.append(
            f"{what} {gap / max(abs(base), floor):+.2%} vs fp32 (fp32's own spread {spread:.3g})"
        )
        if beyond_noise(gap, base, spread, floor):
            return HARMED, "; ".join(words)
    # Learning little where fp32 learned: tiny gradients flushed to zero stall a model.
    learned = reference.loss[0] - ref_end
    own = run.loss[0] - (_end(run.loss) or 0.0)
    if learned > max(NOISE_FACTOR * noise.loss, floor) and own < learned / 2:
        words.append(f"learned {own / learned:.0%} of what fp32 learned")
        return HARMED, "; ".join(words)
    return FINE, "; ".join(words)


def _held(predicted: str, truth: str) -> bool:
    return (truth == FINE) if predicted == SAFE else truth in (DIVERGES, HARMED)
