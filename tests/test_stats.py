"""The interval logic verdicts rely on."""

from __future__ import annotations

import pytest

from harness.stats import paired_difference


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


def test_identical_samples_give_a_point_interval():
    diff = paired_difference([1.0, 2.0], [1.0, 2.0])
    assert (diff.low, diff.high, diff.p_value) == (0.0, 0.0, 1.0)


def test_unpaired_input_is_refused():
    with pytest.raises(ValueError, match="paired samples"):
        paired_difference([1.0, 2.0], [1.0])
