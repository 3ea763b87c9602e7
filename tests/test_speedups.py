"""The A/A control of a timing comparison decides what the comparison may decide: with synthetic
ratios, a tight control lets a verdict stand, one too wide for the threshold it guards makes the
verdict inconclusive, and one that tells identical arms apart is a failure of the scenario. The
GPU scenarios' decision functions follow it; they run on the CPU here."""

from __future__ import annotations

import pytest
from conftest import load_scenario

from harness import speedups
from harness.measure import Ratio

speed = load_scenario("test_speed.py")
memory_speed = load_scenario("test_memory_speed.py")

M, B = 10**6, 10**9
SIZES = [M, 10 * M, 100 * M, B]


def ratio(low: float, high: float) -> Ratio:
    return Ratio((low * high) ** 0.5, low, high, 0.95, 10)


TIGHT = ratio(0.98, 1.03)  # identical arms, not told apart, well within 1/1.1-1.1x
WIDE = ratio(0.85, 1.2)  # contains 1, but reaches past 1.1x: noise as large as the gain
APART = ratio(1.06, 1.12)  # excludes 1, outside 0.97-1.03: identical arms told apart
BELOW, ABOVE = ratio(0.9, 1.0), ratio(1.3, 1.5)  # against 1.1


@pytest.mark.parametrize(
    ("control", "state"),
    [
        (TIGHT, "holds"),
        (ratio(1.005, 1.02), "holds"),  # excludes 1 by a hair a tight interval resolves
        (WIDE, "too wide"),
        (ratio(0.95, 1.1), "too wide"),  # reaches the threshold itself
        (ratio(0.9, 1.05), "too wide"),  # 0.9 < 1/1.1: as wide on the slow side
        (APART, "differs"),
        (ratio(0.8, 0.95), "differs"),
        (ratio(1.06, 1.3), "differs"),  # told apart beats too wide
    ],
)
def test_the_control_state_reads_location_then_width(control, state):
    assert speedups.control_state(control, 1.1) == state


def test_a_wider_threshold_tolerates_a_wider_control():
    assert speedups.control_state(WIDE, 1.25) == "holds"
    with pytest.raises(ValueError, match="gains above 1.03x"):
        speedups.control_state(TIGHT, 1.02)


def test_a_guarded_verdict_stands_only_where_the_control_holds():
    decision = ("confirmed", "fp16 over fp32 is inside the band")
    verdict, reason = speedups.guarded(decision, speedups.CONTROL, TIGHT, 1.1)
    assert verdict == "confirmed" and "within 0.909-1.1x" in reason
    verdict, reason = speedups.guarded(decision, speedups.CONTROL, WIDE, 1.1)
    assert verdict == "inconclusive"
    assert "although the intervals say confirmed" in reason
    assert "fp32-again over fp32" in reason and WIDE.describe() in reason
    assert "reaches past 0.909-1.1x" in reason
    verdict, reason = speedups.guarded(decision, speedups.CONTROL, APART, 1.1)
    assert verdict == "inconclusive" and "tells identical arms apart" in reason


# --- HDL-SPEED: against 1.1x and the article's 1.35-2.25x band -------------------------------


@pytest.mark.parametrize(
    ("control", "verdict"),
    [(None, "confirmed"), (TIGHT, "confirmed"), (WIDE, "inconclusive"), (APART, "inconclusive")],
)
def test_hdl_speed_is_decided_only_under_a_holding_control(control, verdict):
    assert memory_speed.speed_verdict(ratio(1.7, 1.9), control) == verdict


def test_hdl_speed_refuted_needs_a_holding_control_too():
    assert memory_speed.speed_verdict(ratio(0.98, 1.02), TIGHT) == "refuted"
    assert memory_speed.speed_verdict(ratio(0.98, 1.02), WIDE) == "inconclusive"


# --- FMT-SPEED: the matmul's own A/A control, the fp16 arm timed twice ------------------------


@pytest.mark.parametrize(
    ("control", "verdict", "words"),
    [
        (TIGHT, "confirmed", "A/A control fp16-again over fp16"),
        (WIDE, "inconclusive", "reaches past 0.909-1.1x"),
        (APART, "inconclusive", "tells identical arms apart"),
    ],
)
def test_fmt_speed_is_decided_only_under_a_holding_control(control, verdict, words):
    decided, reason = speed.verdict_fmt_speed(ratio(3, 5), ratio(1.0, 1.2), control=control)
    assert decided == verdict
    assert words in reason and "inside the 2-8x band" in reason


# --- PIT4: one control per model size --------------------------------------------------------


def test_small_no_gain_is_undecided_where_a_small_size_control_is_too_wide():
    ratios = [BELOW, BELOW, ABOVE, ABOVE]
    assert speed.verdict_small_no_gain(SIZES, ratios, controls=[TIGHT] * 4)[0] == "confirmed"
    verdict, reason = speed.verdict_small_no_gain(SIZES, ratios, controls=[WIDE, *[TIGHT] * 3])
    assert verdict == "inconclusive"
    assert "undecided at 1M" in reason and "too wide at 1M (0.85-1.2x)" in reason
    # A control too wide at a size the claim does not read changes nothing.
    controls = [TIGHT, TIGHT, WIDE, APART]
    assert speed.verdict_small_no_gain(SIZES, ratios, controls=controls)[0] == "confirmed"


def test_only_above_1b_and_the_crossover_need_the_control_at_each_size():
    ratios = [BELOW, BELOW, BELOW, ABOVE]
    verdict, _ = speed.verdict_only_above_1b(SIZES, ratios, controls=[TIGHT] * 4)
    assert verdict == "confirmed"
    assert speed.crossover(SIZES, ratios, controls=[TIGHT] * 4) == B
    assert speed.crossover(SIZES, ratios, controls=[TIGHT, TIGHT, TIGHT, WIDE]) is None
    verdict, reason = speed.verdict_only_above_1b(
        SIZES, ratios, controls=[TIGHT, TIGHT, TIGHT, APART]
    )
    assert verdict == "inconclusive" and "differs at 1B (1.06-1.12x)" in reason
    verdict, reason = speed.verdict_only_above_1b(SIZES, ratios, controls=[WIDE, *[TIGHT] * 3])
    assert verdict == "inconclusive" and "too wide at 1M" in reason
    with pytest.raises(ValueError, match="4 sizes but 3 controls"):
        speed.verdict_only_above_1b(SIZES, ratios, controls=[TIGHT] * 3)
