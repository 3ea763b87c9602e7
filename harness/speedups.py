"""The comparison every AMP speed claim times: one training step under five recipes, the
speed-ups read off it, and its A/A control, the fp32 recipe timed a second time.

Used by scenarios/test_speed.py (per model size) and test_memory_speed.py (HDL-SPEED), so that
both time the same arms and hold their control to the same rules (`control_state`), which
test_speed.py's matmul comparison follows too with an A/A arm of its own.
"""

from __future__ import annotations

from harness import recipes
from harness.devices import DeviceInfo
from harness.measure import Comparison, Ratio

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


def speedups(comparison: Comparison) -> dict[str, Ratio]:
    """`<arm>_over_<baseline>` -> how many times faster the arm ran, for every series."""
    return {f"{arm}_over_{base}": comparison.ratio(base, arm) for arm, base in SERIES}


def control_state(ratio: Ratio, threshold: float) -> str:
    """What an A/A control (the same arm timed twice, interleaved) lets the comparison decide,
    for decisions about a speed-up of `threshold`x (> 1):

    - 'differs': identical arms told apart (the interval excludes 1 and leaves CONTROL_BAND):
      the timing is biased; the scenario fails on it, and no verdict rests on the comparison;
    - 'too wide': identical arms not told apart, but the interval reaches beyond
      [1/threshold, threshold]: the noise of identical arms is as large as the gain decided, so
      the verdicts resting on the comparison are `inconclusive`;
    - 'holds': the interval lies within (1/threshold, threshold) and contains 1 or lies within
      CONTROL_BAND: the comparison decides."""
    if threshold <= CONTROL_BAND[1]:
        raise ValueError(f"a control guards gains above {CONTROL_BAND[1]}x, not {threshold}x")
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


def tf32_flags(device: DeviceInfo) -> dict[str, bool]:
    """The TF32 switches each arm's recipe runs with, as `tf32.<recipe>.<flag>` parameters."""
    flags = {}
    for recipe in sorted(set(ARMS.values())):
        with recipes.get(recipe).bind(device):
            flags.update({f"tf32.{recipe}.{flag}": on for flag, on in recipes.tf32_flags().items()})
    return flags
