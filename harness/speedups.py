"""The comparison every AMP speed claim times: one training step under five recipes, the
speed-ups read off it, and its A/A control, the fp32 recipe timed a second time.

Used by scenarios/test_speed.py (per model size) and test_memory_speed.py (HDL-SPEED), so that
both time the same arms and hold their control to the same band.
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
# The control's ratio must contain 1, or at least lie within 3% of it: identical arms can differ
# by a hair that a tight interval resolves, never by the 10% a gain is decided at.
CONTROL_BAND = (0.97, 1.03)


def speedups(comparison: Comparison) -> dict[str, Ratio]:
    """`<arm>_over_<baseline>` -> how many times faster the arm ran, for every series."""
    return {f"{arm}_over_{base}": comparison.ratio(base, arm) for arm, base in SERIES}


def control_holds(ratio: Ratio) -> bool:
    """The control's interval contains 1, or lies within CONTROL_BAND."""
    low, high = CONTROL_BAND
    return ratio.low <= 1.0 <= ratio.high or low < ratio.low <= ratio.high < high


def tf32_flags(device: DeviceInfo) -> dict[str, bool]:
    """The TF32 switches each arm's recipe runs with, as `tf32.<recipe>.<flag>` parameters."""
    flags = {}
    for recipe in sorted(set(ARMS.values())):
        with recipes.get(recipe).bind(device):
            flags.update({f"tf32.{recipe}.{flag}": on for flag, on in recipes.tf32_flags().items()})
    return flags
