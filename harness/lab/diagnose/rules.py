"""The rules that judge what `amp-harness diagnose` observed (harness.lab.diagnose.observed), and
the statuses they set (docs/diagnose.md lists each rule with the measurement behind it; the
thresholds are harness.lab.diagnose.thresholds).

A recipe is called **safe** only when every rule had evidence to check and none fired: every
loss finite, no skip recurring at a scale the scaler had settled on (its back-offs from its
initial scale are calibration, wherever they fall), the scale not collapsed, no op that
fp16 computes within reach of 65504 (now, or at the measured growth within the horizon), a first
gradient that points where fp32's does, and a loss within fp32's own spread. Each other status
names what breaks and the fix, and the fix is tried (harness.lab.diagnose.fixes) before it is shown.
"""

from __future__ import annotations

import math
import statistics

import torch

from harness.lab import recipes
from harness.lab.diagnose import growth, scaler_words
from harness.lab.diagnose.curves import beyond_noise, end_gap, loss_floor, window
from harness.lab.diagnose.fixes import FP16_SAFE_EPS
from harness.lab.diagnose.observed import REFERENCE, Diagnosis, Run
from harness.lab.diagnose.thresholds import (
    COSINE_KEPT,
    COSINE_MIN,
    DRIFT_MAX,
    FP16_MAX,
    HEADROOM_FACTOR,
    MOMENTS_LOST_MAX,
    NOISE_FACTOR,
    UNDERFLOW_MAX,
    UNDERFLOW_SEVERE,
)
from harness.lab.diagnose.wording import (
    autocast_policy,
    fix_modules,
    in_loss,
    margin,
    module_of,
    modules_named,
    other_device_note,
)

# Statuses, the most severe first: a recipe gets the first that applies, and every reason.
REGRESSION = "capability regression"
FAILS = "fails"
NOT_JUDGED = "not judged"
KEEP_IN_FP32 = "keep layers in fp32 or use bf16"
OPTIMIZER_IN_FP16 = "keep the optimizer state in fp32"
NEEDS_SCALING = "needs loss scaling"
NORMS_IN_FP32 = "keep norm layers in fp32"
LOSES_PRECISION = "loses precision"
UNSTABLE = "unstable"
# Nothing overflows in the steps seen, but an op's growth over them reaches fp16's overflow
# within --horizon: a forecast, said as one, with its fix.
OVERFLOWS_AHEAD = "overflows fp16 ahead"
DRIFTS = "drifts"
# An op's fp16 output overflowed here, yet every loss stayed finite, the weights and the scaler
# fine and the loss within fp32's seed spread: the overflow is said, its harm is not measurable
# at this noise, and its fix is an option, not an alarm.
OVERFLOWS_WITHIN_NOISE = "overflows fp16, harm within noise"
SAFE = "safe"
STATUSES = (
    REGRESSION, FAILS, NOT_JUDGED, KEEP_IN_FP32, OPTIMIZER_IN_FP16, NEEDS_SCALING, NORMS_IN_FP32,
    LOSES_PRECISION, UNSTABLE, OVERFLOWS_AHEAD, DRIFTS, OVERFLOWS_WITHIN_NOISE, SAFE,
)  # fmt: skip
NOT_RUN, REFERENCE_STATUS = "not run", "reference"  # a recipe the device lacks; fp32 itself
# The statuses a diagnosis can end with that are no judgement of the model: the command exits 1.
BROKEN = (REGRESSION, NOT_JUDGED)


# --- the rules -----------------------------------------------------------------------------------


def judge(run: Run, diagnosis: Diagnosis) -> None:
    """Sets the run's status, the most severe that applies, and every reason."""
    reference = diagnosis.runs[REFERENCE]
    if run.unsupported:
        run.status = REGRESSION if run.regression else NOT_RUN
        run.reasons = [run.unsupported]
    elif run is reference:
        broken = reference.first_nonfinite_loss() or not reference.params_finite
        run.status = NOT_JUDGED if broken else REFERENCE_STATUS
        run.reasons = [_reference_broken(reference) if broken else _safe(run, diagnosis)]
    elif reference.status == NOT_JUDGED:
        run.status, run.reasons = NOT_JUDGED, ["fp32 itself diverged: no recipe is judged"]
    else:
        found = _findings(run, diagnosis)
        run.findings = [s for s in STATUSES if s in found]
        run.status = next((s for s in STATUSES if s in found), SAFE)
        run.reasons = [r for s in STATUSES for r in found.get(s, [])] or [_safe(run, diagnosis)]


def _findings(run: Run, diagnosis: Diagnosis) -> dict[str, list[str]]:
    reference = diagnosis.runs[REFERENCE]
    found: dict[str, list[str]] = {}
    if run.error:
        found[FAILS] = [f"raised {run.error}"]
    recipe = recipes.get(run.recipe)
    fp16 = torch.float16 in (recipe.autocast_dtype, recipe.param_dtype)
    run.drift_abs = end_gap(run.loss, reference.loss)
    ref_end = statistics.fmean(window(reference.loss)) if reference.loss else 0.0
    run.drift = run.drift_abs / max(abs(ref_end), loss_floor(reference))
    if fp16:
        _overflow(run, diagnosis, found)
        _growth(run, diagnosis, found)
        _optimizer_state(run, diagnosis, found)
        _underflow(run, recipe, diagnosis, found)
    _norms(run, diagnosis, found)
    _precision(run, diagnosis, found)
    _stability(run, recipe, found)
    _direction_unmeasured(run, recipe, found)
    _drift(run, diagnosis, found)
    return found


def _overflow(run: Run, diagnosis: Diagnosis, found: dict) -> None:
    """fp16 computes an op within reach of 65504, or its output overflowed (at step 1, from
    the initial weights, or under a scaler, which skips the bad steps)."""
    fp16 = run.computed_fp16()
    hot = [k for k in diagnosis.hot_ops() if k in fp16]
    step, origin = run.first_nonfinite or (0, "")
    overflowed = origin in fp16 and (step == 1 or recipes.get(run.recipe).scaler)
    if not (hot or overflowed):
        return
    reference = diagnosis.runs[REFERENCE].ops
    named = diagnosis.sources(hot) if hot else []
    if overflowed and origin not in named:
        named.append(origin)
    words = [
        f"{k} peak |x| {reference[k].peak:.4g} in fp32 ({margin(reference[k].peak)})"
        for k in named
        if k in reference
    ]
    if overflowed:
        words.append(f"{origin}'s fp16 output overflowed at step {step}")
    if recipes.get(run.recipe).param_dtype == torch.float32:  # autocast's lists chose fp16
        words.extend(
            note
            for k in named
            if (note := other_device_note(k, diagnosis.device_type, diagnosis.torch))
        )
    run.keep_fp32.extend(fix_modules(named))
    run.loss_fp32 = run.loss_fp32 or in_loss(named)
    keep = f"keep {', '.join(modules_named(named))} in fp32, or use amp-bf16 (fp32's range)"
    if not _within_noise(run, diagnosis, fp16):
        found[KEEP_IN_FP32] = [f"{keep}: " + "; ".join(words)]
        return
    calls = sum(x.nonfinite for x in run.ops.values())
    found[OVERFLOWS_WITHIN_NOISE] = [
        f"{'; '.join(words)}: the overflow is real ({calls} op call(s) held inf/NaN; their "
        f"values are lost, as inf or as the zeros a norm makes of them), yet every loss stayed "
        f"finite, the weights finite, the scaler stepping, and the loss within {run.drift:.2%} "
        f"of fp32's (fp32's own seed spread {spread(diagnosis)}): its harm is not measurable at "
        f"this noise over {len(run.loss)} steps. An option, not an alarm: {keep}, tried below; "
        "--verify N --seeds K measures a harm smaller than one run's spread"
    ]


def _within_noise(run: Run, diagnosis: Diagnosis, fp16: set[str]) -> bool:
    """An fp16 op's output overflowed in this run (not a peak near 65504 alone: that is a
    warning of what comes) under a scaler, and nothing else shows: losses and weights finite,
    the scaler stepping without recurring skips, the loss within fp32's seed spread."""
    origin = (run.first_nonfinite or (0, ""))[1]
    if origin not in fp16 or run.first_nonfinite_loss() or not run.params_finite:
        return False
    # A scaler only: it skips the steps whose gradients the overflow makes inf, and its skips say
    # so; without one the overflowed values' gradients are zeroed silently (a hand-written
    # RMSNorm's square: amp-fp16 trained as fp32 over 150 steps, amp-fp16-noscaler ended 218%
    # worse, tests/helpers/zoo_edges.py's patch_rmsnorm).
    if not recipes.get(run.recipe).scaler:
        return False
    if run.scaler_stalled() or run.scaler_course().recurs(len(run.skips)):
        return False
    reference = diagnosis.runs[REFERENCE]
    base = statistics.fmean(window(reference.loss))
    return not beyond_noise(run.drift_abs, base, diagnosis.noise, loss_floor(reference))


def _growth(run: Run, diagnosis: Diagnosis, found: dict) -> None:
    """An op this recipe computes in fp16 (or its gradient), inside fp16's range in every step
    seen, whose growth in fp32 reaches fp16's overflow within the horizon: a forecast, its own
    status (harness.lab.diagnose.growth says it, the fix tried)."""
    if KEEP_IN_FP32 in found or OVERFLOWS_WITHIN_NOISE in found:  # the overflow is here already
        return
    said = growth.forecast_said(run, diagnosis)
    if said:
        found[OVERFLOWS_AHEAD] = [said]


def _optimizer_state(run: Run, diagnosis: Diagnosis, found: dict) -> None:
    """A half model's AdamW holds its state in fp16: eps 1e-8 is 0 there and second moments
    underflow, so an update divides by zero once a gradient entry is small. Seen as losses that
    are finite at step 1 (the weights are the initial ones) and not after. With an eps fp16
    holds, the same underflow is quieter: the entries whose second moment is 0 step by m/eps,
    not AdamW's step, and the run leaves fp32's, either way, after the quick look's window."""
    recipe = recipes.get(run.recipe)
    bad = run.first_nonfinite_loss()
    if recipe.param_dtype != torch.float16 or diagnosis.optimizer != "adamw":
        return
    reasons = []
    if bad is not None and bad >= 2 and _eps_vanishes():
        run.adam_eps = FP16_SAFE_EPS
        reasons.append(
            f"losses finite at step 1, non-finite from step {bad}: AdamW's eps 1e-8 is 0 in "
            "fp16 and its second moments underflow there, so its update divides by zero; train "
            "with autocast (amp-fp16 or amp-bf16: fp32 parameters and optimizer state), or AdamW "
            "eps >= 1e-4, or SGD"
        )
    if run.moments_lost > MOMENTS_LOST_MAX:
        reasons.append(
            f"{run.moments_lost:.1%} of AdamW's entries that have a first moment have a second "
            "moment of exactly 0 in fp16 (g^2 underflowed; in fp32 none would): they step by "
            "m/eps, not AdamW's m/sqrt(v): a different optimizer on those entries, which over "
            "150 steps left fp32's run on some models, worse or better (gpt2, llama, bert, t5: "
            "1-39% away; small NeoX, Phi, DeBERTa: 8-35% better), and stayed within its spread "
            "on others; the share says how much of the run differs, not whether it is harmed; "
            "train with autocast (amp-fp16 or amp-bf16: fp32 optimizer state)"
        )
    if reasons:
        found[OPTIMIZER_IN_FP16] = reasons


def _eps_vanishes() -> bool:
    return float(torch.tensor(1e-8, dtype=torch.float16)) == 0.0


def _underflow(run: Run, recipe: recipes.Recipe, diagnosis: Diagnosis, found: dict) -> None:
    if recipe.scaler:
        return
    lost = diagnosis.runs[REFERENCE].underflow
    if lost <= UNDERFLOW_MAX or (lost <= UNDERFLOW_SEVERE and _direction_kept(run)):
        return
    share = "non-zero entries" if diagnosis.optimizer == "adamw" else "squared norm"
    found[NEEDS_SCALING] = [
        f"at the last step {lost:.2%} of the gradient's {share} would round to zero in fp16 "
        f"(measured in fp32; {run.zero_gradients:.2%} of this run's entries were zero): use "
        "amp-fp16 (GradScaler) or amp-bf16"
    ]


def _direction_kept(run: Run) -> bool:
    return run.cosine is not None and math.isfinite(run.cosine) and run.cosine >= COSINE_KEPT


def _norms(run: Run, diagnosis: Diagnosis, found: dict) -> None:
    """A norm layer whose statistics are 16-bit here and reach fp16's range in fp32, or held
    inf/NaN here, or whose op is the first to output inf/NaN at step 1."""
    reference = diagnosis.runs[REFERENCE].norms
    step, origin = run.first_nonfinite or (0, "")
    flagged = []
    for name, norm in run.norms.items():
        if not norm.half:
            continue
        peak = reference[name].stat_peak if name in reference else 0.0
        if norm.stat_nonfinite:
            flagged.append(f"{name} ({norm.stat_nonfinite} running statistics inf/NaN)")
        elif peak * HEADROOM_FACTOR >= FP16_MAX:
            flagged.append(f"{name} (running statistics up to {peak:.4g} in fp32, {margin(peak)})")
        elif step == 1 and module_of(origin) == name:
            flagged.append(f"{name} (its fp16 output overflowed at step 1)")
    if flagged:
        run.keep_fp32.extend(n for n in run.norms if any(f.startswith(f"{n} (") for f in flagged))
        found[NORMS_IN_FP32] = [
            "norm layers whose 16-bit statistics leave fp16's range: "
            + ", ".join(flagged)
            + " (keep them in fp32, as autocast does)"
        ]


def _precision(run: Run, diagnosis: Diagnosis, found: dict) -> None:
    if run.cosine is None or not math.isfinite(run.cosine) or run.cosine >= COSINE_MIN:
        return
    if NEEDS_SCALING in found:  # gradients flushed to zero: the underflow explains it
        return
    if run.kernel_faults:  # a kernel's unwritten entries (garbage, 6e20) explain it: not rounding
        return  # _stability names the kernel and keeps its module, not every large op's, in fp32
    largest = _largest(diagnosis)
    lost = "the direction is lost to rounding"
    if chaotic(run):
        # fp32's own direction turns as far under a rounding of its weights: the cosine cannot
        # tell this run's precision from the model's sensitivity. What is left as evidence is
        # where the rounding falls: on the ops that hold the largest values, or not (a fix that
        # keeps them in fp32 trains as fp32 does; _safe says why the cosine decided nothing).
        largest = [op for op in largest if op in run.ops and run.ops[op].dtype != "float32"]
        if not largest:
            return
        lost = (
            f"fp32's own turns as far (cosine {run.rounding_cosine:.3f}) when its weights are "
            f"rounded to {_dtype_name(run)}, so the cosine alone proves nothing, but the ops with "
            f"the largest values compute in {_dtype_name(run)} here"
        )
    suspects = diagnosis.sources(largest)
    run.keep_fp32.extend(fix_modules(suspects))
    run.loss_fp32 = run.loss_fp32 or in_loss(suspects)
    found[LOSES_PRECISION] = [
        f"its first gradient, from fp32's weights and batch, has a cosine of {run.cosine:.3f} "
        f"with fp32's, under the {COSINE_MIN} a kept direction needs (COSINE_MIN): {lost}; the "
        "largest values are in "
        f"{', '.join(suspects)} (keep {', '.join(modules_named(suspects))} in fp32)"
    ]


def _direction_unmeasured(run: Run, recipe: recipes.Recipe, found: dict) -> None:
    """No status rests on a cosine that could not be measured: a first gradient that holds
    inf/NaN even recomputed without loss scaling (runs.run_recipe) leaves the direction check
    undone, and says why that is a finding, not a pass."""
    if run.error or run.cosine is None or math.isfinite(run.cosine):
        return  # None: no gradient to hold (a run built by hand); finite: measured
    dtype = _dtype_name(run)
    found.setdefault(UNSTABLE, []).append(
        "its first gradient could not be held against fp32's: it holds inf/NaN"
        + (" even recomputed without loss scaling" if recipe.scaler else "")
        + f", so the cosine that says whether {dtype} keeps the gradient's direction is "
        f"undefined and no call here rests on it; a {dtype} gradient that overflows unscaled "
        "leaves a scaler nothing but a scale under 1 (keep the op that makes it in fp32, or "
        "use amp-bf16)"
    )


def chaotic(run: Run) -> bool:
    """fp32's own first gradient loses its direction when its weights are rounded to the run's
    dtype (measured only where the run's cosine is low)."""
    return run.rounding_cosine is not None and not run.rounding_cosine >= COSINE_MIN


def _dtype_name(run: Run) -> str:
    return str(recipes.get(run.recipe).reduced_dtype).removeprefix("torch.")


def _largest(diagnosis: Diagnosis) -> list[str]:
    """The ops within HEADROOM_FACTOR of the largest fp32 value: where rounding costs most
    (the same attention logits in every layer, not the one layer that peaked highest)."""
    ops = diagnosis.runs[REFERENCE].ops
    top = max((x.peak for x in ops.values()), default=0.0)
    return [k for k, x in ops.items() if x.peak * HEADROOM_FACTOR >= top > 0]


def _stability(run: Run, recipe: recipes.Recipe, found: dict) -> None:
    """Never safe: a non-finite loss (said as the logged value's overflow when the weights and
    the loss recomputed in fp32 are fine), a minority of steps taken, a collapsed scale, skips
    recurring at a scale the scaler had settled on, parameters no longer finite."""
    reasons = []
    if run.first_nonfinite_loss():
        reasons.append(_nonfinite_losses(run))
    if recipe.scaler and run.skips:
        reasons.extend(scaler_words.failures(run))
    if not run.params_finite:
        reasons.append("parameters inf/NaN after the last step")
    if run.kernel_faults:
        dtype = str(recipe.autocast_dtype or recipe.param_dtype).removeprefix("torch.")
        modules = [fault.split(" (", 1)[0] for fault in run.kernel_faults]
        run.keep_fp32.extend(modules)
        reasons.append(
            f"this device's {dtype} convolution kernel returned an inf/NaN gradient from finite "
            f"inputs whose fp32 gradient is finite, run again at the shape the model gave it: "
            f"{'; '.join(run.kernel_faults)}. A fault of the kernel (torch {torch.__version__}), "
            f"not of {dtype}'s range: its parameters go inf/NaN once it strikes, which "
            f"{len(run.loss)} steps may not show (keep {', '.join(modules)} in fp32)"
        )
    if reasons:
        found.setdefault(UNSTABLE, []).extend(reasons)


def _nonfinite_losses(run: Run) -> str:
    nonfinite = sum(not math.isfinite(v) for v in run.loss)
    where = run.first_nonfinite
    counted = (
        f"{nonfinite} of {len(run.loss)} losses non-finite, from step {run.first_nonfinite_loss()}"
        + (f" (first inf/NaN op: {where[1]}, step {where[0]})" if where else "")
    )
    if not run.logged_loss_overflow():
        return counted
    return (
        f"the logged loss overflows fp16 (the value reported, not the training): {counted}; the "
        f"parameters stayed finite and the loss recomputed in fp32 on the final weights is "
        f"{run.fp32_loss:.4g} (a trainer that stops or early-stops on a non-finite loss is hurt)"
    )


def _drift(run: Run, diagnosis: Diagnosis, found: dict) -> None:
    if not math.isfinite(run.drift_abs):
        return  # non-finite losses: _stability has it
    reference = diagnosis.runs[REFERENCE]
    base = statistics.fmean(window(reference.loss))
    if beyond_noise(run.drift_abs, base, diagnosis.noise, loss_floor(reference)):
        ends = statistics.fmean(window(run.loss)) - base
        meaning = (
            "below it: this run learned faster than fp32 in these steps, which is no harm but "
            "another run than fp32's; --verify N shows whether it lasts"
            if ends < 0
            else "above it: not fp32's run"
        )
        found[DRIFTS] = [
            f"over the last {len(window(run.loss))} steps the loss left fp32's by "
            f"{run.drift:.2%} ({run.drift_abs:.3g} in the loss's units), beyond "
            f"{DRIFT_MAX:.0%} and beyond {NOISE_FACTOR:g}x fp32's own seed spread "
            f"({spread(diagnosis)}): {meaning}"
        ]


def spread(diagnosis: Diagnosis) -> str:
    """fp32's own seed spread as the gaps beside it are said: in percent of fp32's loss at the
    end of the window, then in the loss's units."""
    reference = diagnosis.runs[REFERENCE]
    base = max(abs(statistics.fmean(window(reference.loss))), loss_floor(reference))
    return f"{diagnosis.noise / base:.2%}, {diagnosis.noise:.3g} in the loss's units"


def _reference_broken(reference: Run) -> str:
    bad = reference.first_nonfinite_loss()
    where = (
        f" (first inf/NaN op: {reference.first_nonfinite[1]})" if reference.first_nonfinite else ""
    )
    if bad:
        return (
            f"the fp32 reference's loss is non-finite from step {bad}{where}: the model diverges "
            "without any reduced precision (lower --lr, check the data); no recipe is judged"
        )
    return "the fp32 reference's parameters are inf/NaN after the last step; no recipe is judged"


def _safe(run: Run, diagnosis: Diagnosis) -> str:
    reference = diagnosis.runs[REFERENCE]
    ops = reference.ops
    peak = max((x.peak for x in ops.values()), default=0.0)
    words = [
        f"{len(run.loss)} steps, final loss {run.loss[-1]:.4g}"
        if run is reference
        else f"every loss finite, within {run.drift:.2%} of fp32 at the end (fp32's own seed "
        f"spread {spread(diagnosis)}) over {len(run.loss)} steps",
        f"largest fp32 value of any op {peak:.4g} ({margin(peak)})",
    ]
    if run is reference and diagnosis.noise_note:
        words.append(diagnosis.noise_note)
    if run.cosine is not None and math.isfinite(run.cosine):
        words.append(
            f"first gradient's cosine with fp32's {run.cosine:.3f}"
            + (
                " (its own first gradient, scaled, overflowed and the scaler skipped step 1: "
                "measured on the same gradient recomputed without loss scaling)"
                if run.cosine_unscaled
                else ""
            )
        )
    if chaotic(run):
        words.append(
            f"the cosine decides nothing here: fp32's own first gradient turns to a cosine of "
            f"{run.rounding_cosine:.3f} when its weights are rounded to {_dtype_name(run)}, and "
            "the ops with the largest values compute in float32 in this run"
        )
    recipe = recipes.get(run.recipe)
    unscaled_fp16 = (
        torch.float16 in (recipe.autocast_dtype, recipe.param_dtype) and not recipe.scaler
    )
    if unscaled_fp16 and reference.underflow > UNDERFLOW_MAX:
        words.append(
            f"note: {reference.underflow:.2%} of the gradient's entries are under fp16's "
            f"smallest value, all tiny: its first gradient keeps fp32's direction, so it trains"
        )
    if run.skips and recipe.scaler:
        words.append(scaler_words.calibration(run))
    if recipe.autocast_dtype is not None and recipe.param_dtype == torch.float32:
        words.append(autocast_policy(diagnosis.device_type, diagnosis.torch))
    if run is not reference:
        words.append(f"only {len(run.loss)} steps seen: --verify N trains longer")
    return "; ".join(words)
