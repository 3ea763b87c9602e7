"""The interval logic verdicts rely on."""

from __future__ import annotations

import math

import pytest

from harness.lab.stats import paired_difference, pairs_without_spread


def test_a_clear_gap_is_beyond_its_margin():
    diff = paired_difference([0.70, 0.71, 0.69, 0.70], [0.60, 0.62, 0.58, 0.61])
    assert diff.mean == pytest.approx(-0.0975)
    assert diff.beyond(0.05) and not diff.within(0.05)


def test_no_gap_is_within_its_margin():
    diff = paired_difference([0.70, 0.71, 0.69, 0.70], [0.701, 0.709, 0.691, 0.70])
    assert diff.within(0.01) and not diff.beyond(0.01)


def test_noise_decides_nothing():
    diff = paired_difference([0.70, 0.60, 0.80], [0.75, 0.55, 0.85])
    assert not diff.within(0.02) and not diff.beyond(0.02)
    assert diff.low < 0 < diff.high


@pytest.mark.parametrize("gap", [0.0, 11.0])
def test_three_pairs_without_spread_decide_nothing(gap):
    # Three seeds that each took the same steps in both recipes (or `gap` more): a fourth could
    # differ, and no 95% interval exists without a model of the spread.
    diff = paired_difference([59, 56, 65], [59 + gap, 56 + gap, 65 + gap])
    assert diff.no_spread and not diff.decidable
    assert not diff.within(10) and not diff.beyond(10)
    assert not diff.within(1e9) and not diff.beyond(0)
    assert "no spread in 3 pairs: undecided" in diff.describe()
    assert (diff.low, diff.high) == (-math.inf, math.inf) and diff.mean == gap


def test_enough_pairs_without_spread_decide_by_the_median():
    # Six equal differences: all six land on one side of the median with probability 2/64.
    same = paired_difference([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6])
    assert same.decidable and (same.low, same.high, same.p_value) == (0.0, 0.0, 1.0)
    assert same.within(0.5) and not same.beyond(0.5)
    slower = paired_difference([1, 2, 3, 4, 5, 6], [12, 13, 14, 15, 16, 17])
    assert slower.beyond(10) and slower.p_value == pytest.approx(2 / 64)
    assert "no spread: the median's distribution-free interval" in slower.describe()


def test_the_pairs_needed_without_spread_follow_the_sign_test():
    for confidence, n in ((0.95, 6), (0.99, 8), (0.9, 5)):
        assert pairs_without_spread(confidence) == n
    assert not paired_difference([0.0] * 7, [1.0] * 7, confidence=0.99).decidable


def test_unpaired_input_is_refused():
    with pytest.raises(ValueError, match="paired samples"):
        paired_difference([1.0, 2.0], [1.0])


def test_a_spread_within_rounding_is_no_spread():
    """Interpolated measurements: 20 steps late on every seed, give or take the last bit."""
    diff = paired_difference([30.0, 31.0, 32.0], [50.0, 51.000000000000004, 52.0])
    assert diff.no_spread and not diff.decidable


def test_the_sign_flip_p_is_exact():
    """All K gaps of one sign: 2 of the 2**K patterns are as extreme (all +, all -)."""
    from harness.lab.stats import sign_flip_p

    assert sign_flip_p([0.1] * 6) == 2 / 64
    assert sign_flip_p([0.1, -0.1]) == 1.0
    assert sign_flip_p([0.3, 0.1, 0.1]) == 2 / 8  # only +++ and --- reach |0.5|
