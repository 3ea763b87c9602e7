"""`amp-harness diagnose --verify N`: the ground truth the quick look is judged by.

After the quick look, every recipe is trained N steps from the same weights on the same
batches, and fp32 again from weights drawn under other seeds (by the factory where it takes
`seed`, as the quick look drew them) and on the batches in another order (fp32's seed spread,
harness.lab.diagnose.runs.seed_spread: the end of the loss curve from the re-drawn weights, the
held-out loss from both), and every fix the quick look recommended too, with, for a fix that
changes the optimizer (AdamW's eps), fp32 under the same change as its reference.
Each long run gets a truth from what training did:
- **diverges**: the weights went: a loss non-finite (from which step) whose weights are inf/NaN
  or whose loss recomputed in fp32 on the final weights is off fp32's held-out loss beyond the
  noise, parameters inf/NaN at the end, or a scaler that took at most half of the steps or
  whose scale fell under 1;
- **the logged loss overflows**: losses non-finite, but the weights finite and their held-out
  loss recomputed in fp32 within fp32's spread: the value reported overflowed fp16, not the
  training (a trainer that stops on a non-finite loss is still hurt);
- **harmed**: the end of its loss curve, or its held-out loss, worse than fp32's beyond 5%,
  beyond twice fp32's seed spread and beyond the loss floor (the drift rule's yardstick,
  harness.lab.diagnose.curves.beyond_noise), or it learned less than half of what fp32 learned;
- **differs from fp32**: better than fp32's beyond the same margins: not fp32's run either (a
  `half` AdamW with eps 1e-4 whose fp16 second moments are 0 takes steps twice fp32's size);
- **trains as fp32**: none of these, both ways.
A prediction holds when "safe" meets "trains as fp32", and any other status meets any other
truth (a "safe" that differs from fp32 either way is a miss); a fix holds when its run trains
as its reference.
"""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

from torch import nn

from harness.lab import recipes, stats
from harness.lab.diagnose.curves import beyond_noise, end_gap, loss_floor, window
from harness.lab.diagnose.fixes import Fix
from harness.lab.diagnose.growth import forecast_for
from harness.lab.diagnose.observed import REFERENCE, Diagnosis, Run
from harness.lab.diagnose.rules import (
    NOT_RUN,
    OVERFLOWS_AHEAD,
    OVERFLOWS_WITHIN_NOISE,
    REFERENCE_STATUS,
    SAFE,
)
from harness.lab.diagnose.runs import (
    SEED,
    Redraw,
    Replay,
    Setting,
    redrawer,
    run_recipe,
    seed_spread,
)
from harness.lab.diagnose.thresholds import NOISE_FACTOR

HELD_OUT = 4  # batches after the trained ones, scored in eval mode at the end
# --verify --seeds: a gap is called where a paired sign-flip test over the seeds puts its mean
# under ALPHA (six seeds at least: all six gaps on one side is p = 2/64, five could never reach
# it) and it is beyond fp32's seed spread and PAIRED_MARGIN of fp32's loss.
ALPHA = 0.05
PAIRED_MIN_SEEDS = 6
PAIRED_MAX_SEEDS = 16  # 2**16 sign patterns per gap: the exact test stays under a second
PAIRED_MARGIN = 0.01
DIVERGES, HARMED, FINE = "diverges", "harmed", "trains as fp32"
DIFFERS = "differs from fp32"  # better than fp32 beyond its seed spread: another run
LOGGED_OVERFLOW = "the logged loss overflows"  # the value reported went, not the weights


def verify(
    diagnosis: Diagnosis, initial: nn.Module, replay: Replay, held_out: list, setting: Setting,
    fixes: dict[str, Fix], redraw: Redraw | None = None, seeds: int = 1,
) -> dict:  # fmt: skip
    """The long runs' truths against the quick look's statuses, as a JSON-able dict:
    steps, seeds, noise, rows (one per recipe: predicted, truth, why, held) and fixes (one per
    fix: recipe, fix, reference, truth, why, held). With `seeds` > 1, every run is trained from
    that many initialisations (`initial`, then `redraw`'s) and judged paired (`_paired_truth`)."""
    long = {"held_out": held_out, "watch": False}
    weights, note = [initial], ""
    if seeds > 1:
        weights, note = _initialisations(initial, redraw, seeds)

    def trained(name: str, fix: Fix | None = None) -> list[Run]:
        # Each initialisation with dropout masks of its own, as a rerun draws them: the same
        # masks under every seed would make the seeds' gaps agree more than reruns do.
        return [
            run_recipe(name, w, replay, setting, fix=fix, seed=SEED + i, **long)[0]
            for i, w in enumerate(weights)
        ]

    references = trained(REFERENCE)
    if seeds > 1:
        noise = Noise(
            statistics.stdev(_end(r.loss) for r in references),
            statistics.stdev(r.held_out_loss or 0.0 for r in references),
        )

        def judged(runs: list[Run], against: list[Run]) -> tuple[str, str]:
            return _paired_truth(runs, against, noise)
    else:
        reference = references[0]
        spread, note = seed_spread(
            initial, replay, setting, redraw=redraw, reorder=True, held_out=held_out
        )
        noise = Noise(
            # The reordered runs' loss curves are on other batches: their held-out loss alone.
            max(end_gap(run.loss, reference.loss) for run in spread[::2]),
            max(_held_gap(run, reference) for run in spread),
        )

        def judged(runs: list[Run], against: list[Run]) -> tuple[str, str]:
            return _truth(runs[0], against[0], noise)

    rows, forecasts = [], []
    for name, quick in diagnosis.runs.items():
        if quick.status in (NOT_RUN,) or quick.unsupported:
            continue
        runs = references if name == REFERENCE else trained(name)
        truth, why = judged(runs, references)
        if quick.status == OVERFLOWS_AHEAD:
            forecasts.append((quick, runs[0], truth, why))
        rows.append(
            {
                "recipe": name,
                "predicted": quick.status,
                "truth": truth,
                "why": why,
                "held": None if quick.status == REFERENCE_STATUS else _held(quick.status, truth),
                "loss": _mean(_end(run.loss) for run in runs),
                "held_out_loss": _mean(run.held_out_loss for run in runs),
                "lead": _lead(quick, diagnosis) if quick.status == SAFE and truth != FINE else "",
            }
        )
    checked = []
    for name, fix in fixes.items():
        runs = trained(name, fix)
        against = references
        if fix.adam_eps is not None:  # the fix's own change to AdamW is not fp16's doing
            against = trained(REFERENCE, Fix(REFERENCE, adam_eps=fix.adam_eps))
        truth, why = judged(runs, against)
        checked.append(
            {"recipe": name, "fix": fix.describe(), "reference": against[0].fix or REFERENCE,
             "truth": truth, "why": why, "held": truth == FINE}
        )  # fmt: skip
    return {
        "steps": len(replay.taken),
        "seeds": seeds,
        "noise": noise.loss,
        "held_out_noise": noise.held_out,
        "noise_note": note,
        "rows": rows,
        "fixes": checked,
        "forecasts": [
            _forecast_held(quick, diagnosis, run, (truth, why), _fix_truth(checked, quick.recipe))
            for quick, run, truth, why in forecasts
        ],
    }


def _lead(quick: Run, diagnosis: Diagnosis) -> str:
    """For a "safe" that training proved wrong, where to look first: the op this recipe computes
    in fp16 whose peak grew the most over the quick look in fp32 (a lead, not a finding: the
    long runs observe the loss alone)."""
    ops, fp16 = diagnosis.runs[REFERENCE].ops, quick.computed_fp16()
    ratio, op = 1.0, ""
    for key, x in ops.items():  # in the order they ran: of two that grew alike, the maker
        if key in fp16 and len(x.peaks) > 1 and x.peaks[0] > 0:
            grew = x.peaks[-1] / x.peaks[0]
            if grew > ratio * 1.01:
                ratio, op = grew, key
    if not op:
        return ""
    peaks = ops[op].peaks
    return (
        f"the fp16 op whose peak grew the most in fp32's {len(peaks)} steps is {op} "
        f"({peaks[0]:.3g} to {peaks[-1]:.3g}, x{ratio:.2g}): a lead, not a measurement; try it "
        "in fp32 (or amp-bf16) with --verify"
    )


def _fix_truth(checked: list[dict], recipe: str) -> str | None:
    return next((fix["truth"] for fix in checked if fix["recipe"] == recipe), None)


def _forecast_held(
    quick: Run, diagnosis: Diagnosis, run: Run, truth: tuple[str, str], fixed: str | None
) -> dict:
    """A recipe's forecast (status OVERFLOWS_AHEAD) against its long run: the step its loss or
    parameters first went non-finite, against the step forecast. `held`: True where it went by
    the end (earlier or later than forecast), or where the run was harmed with every loss finite
    and the fix (`fixed`, its truth) trains as fp32 (an overflow a norm turns into zeros says
    nothing in the loss's value); False where nothing of that came by twice the step forecast (a
    false alarm); None where the run stopped before that (not tested, or later than forecast)."""
    ahead = forecast_for(quick, diagnosis)
    went = run.first_nonfinite_loss() or (None if run.params_finite else len(run.loss))
    said = f"{quick.recipe}: {ahead.op} forecast to overflow fp16 near step {ahead.step}"
    if went is not None:
        held = True
        words = f"{said}; training's loss first non-finite at step {went}: the forecast came true"
    elif truth[0] in (HARMED, DIVERGES) and fixed == FINE:
        held = True
        words = (
            f"{said}; every loss finite, but training was {truth[0]} ({truth[1]}) and with the "
            "fix it trains as fp32: the forecast came true, silently"
        )
    elif len(run.loss) >= 2 * ahead.step:
        held = False
        words = f"{said}; nothing overflowed in {len(run.loss)} steps: a FALSE ALARM of it"
    else:
        held = None
        words = (
            f"{said}; nothing overflowed in {len(run.loss)} steps: untested, or later than "
            f"forecast (--verify {2 * ahead.step} settles it)"
        )
    return {"recipe": quick.recipe, "op": ahead.op, "step": ahead.step, "went": went,
            "held": held, "words": words}  # fmt: skip


def _initialisations(
    initial: nn.Module, redraw: Redraw | None, seeds: int
) -> tuple[list[nn.Module], str]:
    """`initial` and `seeds` - 1 more initialisations (seeds 1, 2, ...), and how they were drawn."""
    draw = redrawer(initial, redraw)
    drawn = [draw(seed) for seed in range(1, seeds)]
    notes = {note for _model, note in drawn} - {""}
    return [initial, *(model for model, _note in drawn)], next(iter(notes), "")


def _mean(values) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


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
    went = _went(run, reference, noise)
    if went:
        return went
    if run is reference:
        return FINE, f"end loss {_end(run.loss):.4g}, held-out {run.held_out_loss:.4g}"
    return _compared(run, reference, noise)


def _went(run: Run, reference: Run, noise: Noise) -> tuple[str, str] | None:
    """Diverged, or its logged loss overflowed; None where training went through."""
    if run.error:
        return DIVERGES, f"raised {run.error}"
    bad = run.first_nonfinite_loss()
    if bad:
        count = sum(not math.isfinite(v) for v in run.loss)
        went = f"loss non-finite from step {bad} ({count} of {len(run.loss)} steps)"
        if run.logged_loss_overflow() and not _off(run.fp32_loss, reference, noise):
            return LOGGED_OVERFLOW, (
                f"{went}, but the parameters stayed finite and their held-out loss recomputed in "
                f"fp32 is {run.fp32_loss:.4g} (fp32's {reference.held_out_loss:.4g}, its own "
                f"spread {noise.held_out:.3g}): the value reported overflowed fp16, not the "
                "training"
            )
        return DIVERGES, went
    if not run.params_finite:
        return DIVERGES, "parameters inf/NaN at the end"
    if recipes.get(run.recipe).scaler and run.scaler_stalled():
        taken = len(run.skips) - run.skipped
        return DIVERGES, (
            f"the scaler took {taken} of {len(run.skips)} steps, scale {run.scale[0]:g} -> "
            f"{run.scale[-1]:g}"
        )
    return None


def _off(loss: float | None, reference: Run, noise: Noise) -> bool:
    """A held-out loss beyond fp32's, either way, past the drift rule's margins."""
    base = reference.held_out_loss or 0.0
    return loss is None or beyond_noise(
        abs(loss - base), base, noise.held_out, loss_floor(reference)
    )


def _compared(run: Run, reference: Run, noise: Noise) -> tuple[str, str]:
    """Harmed, differs (better) or trains as fp32: the end of the loss curve and the held-out
    loss against the reference's, both ways."""
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
    against = f"{reference.fix} " if reference.fix else "fp32 "
    words, better = [], False
    for what, gap, base, spread in gaps:
        words.append(
            f"{what} {gap / max(abs(base), floor):+.2%} vs {against}(fp32's own seed spread "
            f"{spread / max(abs(base), floor):.2%})"
        )
        if beyond_noise(abs(gap), base, spread, floor):
            if gap > 0:
                return HARMED, "; ".join(words)
            better = True
    # Learning little where fp32 learned: tiny gradients flushed to zero stall a model.
    learned = reference.loss[0] - ref_end
    own = run.loss[0] - (_end(run.loss) or 0.0)
    if learned > max(NOISE_FACTOR * noise.loss, floor) and own < learned / 2:
        words.append(f"learned {own / learned:.0%} of what fp32 learned")
        return HARMED, "; ".join(words)
    if better:
        return DIFFERS, "; ".join([*words, "better beyond the spread: not fp32's run"])
    return FINE, "; ".join(words)


def _paired_truth(runs: list[Run], references: list[Run], noise: Noise) -> tuple[str, str]:
    """What training did over the seeds, each run against fp32 from its own initialisation:
    diverges (or its logged loss overflows) on any seed; harmed, or differs from fp32, where the
    mean relative gap is consistent (sign_flip_p under ALPHA) and beyond fp32's seed spread (its
    standard deviation, relative), PAIRED_MARGIN and the loss floor; trains as fp32 otherwise.
    tests/helpers/zoo_truth.py's judge_paired applies the same test in its own words on purpose: the
    truth diagnose is measured against imports none of diagnose's judgement."""
    count = len(runs)
    went = [(seed, found) for seed, (run, reference) in enumerate(zip(runs, references,
            strict=True)) if (found := _went(run, reference, noise))]  # fmt: skip
    for kind in (DIVERGES, LOGGED_OVERFLOW):
        on = [(seed, why) for seed, (truth, why) in went if truth == kind]
        if on:
            seed, why = on[0]
            return kind, f"on {len(on)} of {count} seeds (seed {seed}: {why})"
    if runs is references:
        return FINE, (
            f"end loss {_mean(_end(r.loss) for r in runs):.4g}, held-out "
            f"{_mean(r.held_out_loss for r in runs):.4g} on average over {count} seeds"
        )
    measures = [("loss", lambda r: _end(r.loss))]
    if all(r.held_out_loss is not None for r in [*runs, *references]):
        measures.append(("held-out loss", lambda r: r.held_out_loss))
    words, beyond = [], []
    for what, value in measures:
        base = [value(r) for r in references]
        floors = [loss_floor(r) for r in references]
        gaps = [(value(run) - b) / max(abs(b), floor)
                for run, b, floor in zip(runs, base, floors, strict=True)]  # fmt: skip
        mean, p = statistics.fmean(gaps), stats.sign_flip_p(gaps)
        middle = abs(statistics.fmean(base))
        spread = statistics.stdev(base) / max(middle, statistics.fmean(floors))
        floor = statistics.fmean(floors) / max(middle, statistics.fmean(floors))
        words.append(
            f"{what} {mean:+.2%} on average over {count} seeds (p {p:.2g}; fp32's seed spread "
            f"±{spread:.2%})"
        )
        if p < ALPHA and abs(mean) > max(spread, PAIRED_MARGIN, floor):
            beyond.append(mean)
    why = "; ".join(words)
    if any(mean > 0 for mean in beyond):
        return HARMED, why
    learned = _mean(r.loss[0] - _end(r.loss) for r in references)
    own = _mean(r.loss[0] - _end(r.loss) for r in runs)
    floor = _mean(loss_floor(r) for r in references)
    if learned > max(NOISE_FACTOR * noise.loss, floor) and own < learned / 2:
        return HARMED, f"{why}; learned {own / learned:.0%} of what fp32 learned"
    if beyond:
        return DIFFERS, f"{why}: consistently better beyond the spread, not fp32's run"
    return FINE, why


def _held(predicted: str, truth: str) -> bool:
    """A prediction against the truth: "safe" and "overflows fp16, harm within noise" (no
    measurable harm) hold where the run trains as fp32; every other status where it does not."""
    return (truth == FINE) if predicted in (SAFE, OVERFLOWS_WITHIN_NOISE) else truth != FINE
