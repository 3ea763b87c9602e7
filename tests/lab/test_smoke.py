"""harness.lab.smoke: PRACTICE-SMOKE's detector, judged from the run's own first steps."""

from __future__ import annotations

import math

from harness.lab import smoke

INF = math.inf


def _alarm(norms, skipped=None):
    return smoke.first_alarm(norms, skipped or [False] * len(norms))


def test_start_up_calibration_skips_are_not_an_alarm():
    # GradScaler's start-up: inf norms, skipped, before any step is taken; then a steady run.
    norms = [INF, INF, INF, 1.0, 1.2, 0.9, 1.1, 0.8, 1.0]
    skipped = [True, True, True] + [False] * 6
    assert smoke.reference(norms, skipped) == (5, 1.0)
    assert _alarm(norms, skipped) is None


def test_a_lone_skip_is_calibration_and_persisting_skips_warn():
    steady = [1.0] * 12
    lone = [False] * 6 + [True] + [False] * 5  # after a growth of the scale: harmless
    assert _alarm(steady, lone) is None
    persisting = [False] * 6 + [True, False, True] + [False] * 3
    alarm = _alarm(steady, persisting)
    assert alarm.step == 8 and "second skipped step" in alarm.why


def test_a_norm_leaving_ten_times_its_start_warns():
    norms = [1.0, 2.0, 1.5, 9.0, 16.0, 30.0]  # the median of the first three is 1.5
    alarm = _alarm(norms)
    assert alarm.step == 4 and "16 against 1.5" in alarm.why
    # Without a scaler an overflow is not skipped: a non-finite norm warns at once.
    assert _alarm([1.0, 1.0, 1.0, math.nan]).step == 3


def test_too_early_to_judge_is_no_alarm():
    assert smoke.reference([1.0, INF], [False, True]) is None
    assert _alarm([1.0, 100.0]) is None
