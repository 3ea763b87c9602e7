"""The comparison every AMP speed claim times: one training step under five recipes, the
speed-ups read off it, and its A/A control, the fp32 recipe timed a second time.

Used by scenarios/test_speed.py (per model size) and test_memory_speed.py (HDL-SPEED), so that
both time the same arms and hold their control to the same rules (`control_state`), which
test_speed.py's matmul comparison follows too with an A/A arm of its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from harness.lab import recipes, tf32
from harness.lab.machine.device import DeviceInfo
from harness.lab.measure import Comparison, Ratio

# Arm -> recipe. "fp32-again" is the negative control: the fp32 recipe a second time.
ARMS = {
    "fp32": "fp32",
    "fp32-again": "fp32",
    "tf32": "tf32",
    "amp-fp16": "amp-fp16",
    "amp-bf16": "amp-bf16",
}
SERIES = (  # (arm, baseline): the arm's speed-up over the baseline
    ("amp-fp16", "fp32"),
    ("amp-bf16", "fp32"),
    ("amp-fp16", "tf32"),
    ("amp-bf16", "tf32"),
    ("tf32", "fp32"),
    ("fp32-again", "fp32"),
)
CONTROL = "fp32-again_over_fp32"
# Identical arms "differ" when the control's interval excludes 1 and leaves this band: a tight
# interval may resolve a hair between them (which arm ran first in a round, clocks settling),
# never the 10% a gain is decided at.
CONTROL_BAND = (0.97, 1.03)


NOT_TIMED = "not timed (no TF32 on this GPU)"  # a TF32 series on a GPU without TF32


def arms(device: DeviceInfo) -> dict[str, str]:
    """ARMS on this device: the tf32 arm only where the GPU has TF32. A V100 or T4 (none: the
    GPUs the article's speed-ups describe) compares AMP against strict fp32 alone; TF32 expected
    and broken raises CapabilityRegression (DeviceInfo.optional)."""
    if device.optional("tf32") is None:
        return dict(ARMS)
    return {arm: recipe for arm, recipe in ARMS.items() if recipe != "tf32"}


def speedups(comparison: Comparison) -> dict[str, Ratio]:
    """`<arm>_over_<baseline>` -> how many times faster the arm ran, for every series whose two
    arms were timed."""
    timed = comparison.times
    return {
        f"{arm}_over_{base}": comparison.ratio(base, arm)
        for arm, base in SERIES
        if arm in timed and base in timed
    }


def described(ratios: dict[str, Ratio], name: str) -> str:
    """A series' ratio for the evidence, or why it is absent (no TF32 on this GPU)."""
    ratio = ratios.get(name)
    return ratio.describe() if ratio else NOT_TIMED


def control_state(ratio: Ratio, threshold: float) -> str:
    """What an A/A control (the same arm timed twice, interleaved) lets the comparison decide,
    for decisions about a speed-up of `threshold`x (> 1):

    - 'differs': identical arms told apart (the interval excludes 1 and leaves CONTROL_BAND):
      the timing is biased; the scenario fails on it, and no verdict rests on the comparison;
    - 'too wide': identical arms not told apart, but the interval reaches beyond
      [1/threshold, threshold] (or rests on too few rounds to mean anything): the noise of
      identical arms is as large as the gain decided, so the verdicts resting on the comparison
      are `inconclusive`;
    - 'holds': the interval lies within (1/threshold, threshold) and contains 1 or lies within
      CONTROL_BAND: the comparison decides."""
    if threshold <= CONTROL_BAND[1]:
        raise ValueError(f"a control guards gains above {CONTROL_BAND[1]}x, not {threshold}x")
    if not ratio.enough_rounds:  # its interval means nothing either way (measure.min_rounds)
        return "too wide"
    band_low, band_high = CONTROL_BAND
    if not (ratio.low <= 1.0 <= ratio.high or band_low < ratio.low <= ratio.high < band_high):
        return "differs"
    if ratio.low <= 1 / threshold or ratio.high >= threshold:
        return "too wide"
    return "holds"


def describe_control(name: str, ratio: Ratio, threshold: float) -> str:
    """The control's ratio and what it lets the comparison decide, for the evidence."""
    bounds = f"{1 / threshold:.3g}-{threshold:g}x"
    said = {
        "holds": f"within {bounds}",
        "too wide": (
            f"reaches past {bounds}: identical arms vary as much as the {threshold:g}x gain "
            "decided, so the comparison decides nothing"
        ),
        "differs": (
            f"tells identical arms apart (excludes 1 and leaves {CONTROL_BAND[0]:g}-"
            f"{CONTROL_BAND[1]:g}x), so the comparison decides nothing"
        ),
    }[control_state(ratio, threshold)]
    return f"A/A control {name.replace('_over_', ' over ')} {ratio.describe()} {said}"


def guarded(
    decision: tuple[str, str], name: str, control: Ratio, threshold: float
) -> tuple[str, str]:
    """A (verdict, reason) decided from a comparison, kept where its A/A control holds and
    `inconclusive` otherwise; the reason says what the control showed either way."""
    verdict, reason = decision
    note = describe_control(name, control, threshold)
    if control_state(control, threshold) == "holds":
        return verdict, f"{reason}; {note}"
    return "inconclusive", f"{reason}; inconclusive although the intervals say {verdict}: {note}"


def token_batch(
    device: torch.device, vocab: int, batch: int, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and targets for training_step, the same on every call (random, not
    zeros: zeros run faster on this hardware)."""
    generator = torch.Generator(device=device).manual_seed(0)
    inputs, targets = (
        torch.randint(vocab, (batch, seq_len), generator=generator, device=device) for _ in range(2)
    )
    return inputs, targets


def training_step(
    precision: recipes.Precision,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    keep_grads: bool = False,
) -> None:
    """One bare training step of a language model through the recipe's verbs, as timing and
    memory passes run it: none of harness.lab.train's monitoring (no gradient norm, no get_scale(),
    no .item()) and no synchronisation: the timer synchronises once, at the end of its region.
    The loss is taken on fp32 logits in every recipe (autocast would cast them anyway).

    keep_grads: zero the gradients in place before the step and keep them allocated (the memory
    model counts them); else free them after it, so several arms' models fit side by side."""
    if keep_grads:
        optimizer.zero_grad(set_to_none=False)
    with precision.forward():
        loss = F.cross_entropy(model(tokens).flatten(0, 1).float(), targets.flatten())
    precision.backward(loss)
    precision.update(optimizer)
    if not keep_grads:
        optimizer.zero_grad(set_to_none=True)


# A skipped step (GradScaler found inf/NaN at its first, too large scale) creates no AdamW state;
# each skip halves the scale, so a few steps reach one that is taken.
WARMUP_STEPS_MAX = 8


def unstepped(optimizer: torch.optim.Optimizer) -> int:
    """How many trained parameters have no optimizer state yet: AdamW creates its moments at the
    first step it takes, so a timing or memory window after a skipped warm-up would include it."""
    return sum(
        1
        for group in optimizer.param_groups
        for p in group["params"]
        if p.requires_grad and not optimizer.state.get(p)
    )


def warm_up(
    step: Callable[[], object],
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None = None,
) -> int:
    """Call `step` until `optimizer` holds state for every trained parameter and the last step
    was not skipped by `scaler` (its scale did not fall), at most WARMUP_STEPS_MAX times; the
    steps run. Assert `unstepped(optimizer) == 0` afterwards: a scaler that skips every step
    leaves it above 0. The scale is read here, outside any timed region."""
    for calls in range(1, WARMUP_STEPS_MAX + 1):
        before = scaler.get_scale() if scaler is not None else None
        step()
        taken = scaler is None or scaler.get_scale() >= before
        if taken and not unstepped(optimizer):
            return calls
    return WARMUP_STEPS_MAX


def skipped_while_timed(scales: dict[str, float], precisions: dict[str, recipes.Precision]):
    """Arms whose GradScaler scale fell since `scales` (read after the warm-up): steps skipped
    inside the timed rounds, which would time a step without its optimizer update. Growth needs
    2000 clean steps in a row, so within a comparison a scale only falls by skipping."""
    return {
        arm: (scales[arm], precisions[arm].scaler.get_scale())
        for arm in scales
        if precisions[arm].scaler.get_scale() < scales[arm]
    }


def scales(precisions: dict[str, recipes.Precision]) -> dict[str, float]:
    """Each scaler arm's current loss scale (read after the warm-up, outside the timing)."""
    return {arm: p.scaler.get_scale() for arm, p in precisions.items() if p.scaler is not None}


def tf32_flags(device: DeviceInfo) -> dict[str, bool]:
    """The TF32 switches each arm's recipe runs with, as `tf32.<recipe>.<flag>` parameters."""
    flags = {}
    for recipe in sorted(set(arms(device).values())):
        with recipes.get(recipe).bind(device):
            flags.update({f"tf32.{recipe}.{flag}": on for flag, on in tf32.tf32_flags().items()})
    return flags
