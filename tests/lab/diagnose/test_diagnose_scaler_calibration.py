"""A GradScaler calibrating its initial guess is not an unstable one (issue 54): the look's first
steps skipped, each halving the scale from 65536 (GradScaler's documented init_scale and
backoff_factor), every loss finite, then steps taken. A recipe's look says it calibrated; a fix
check says so, and "not settled" where the few steps cannot tell the calibration from harm (too
few steps taken, or a loss above fp32's by the updates it skipped), never "held". A scaler that
never settles (its scale under 1, skips recurring at a scale it held, a loss inf in the forward)
stays unstable, and the fix it checks did not hold."""

from __future__ import annotations

import math

import pytest
import torch

from harness.lab import diagnose
from harness.lab.diagnose import SAFE, UNSTABLE
from harness.lab.diagnose import order as diagnose_order
from harness.lab.diagnose.observed import CALIBRATED, SEEKING, Diagnosis, Run
from harness.lab.diagnose.runs import Setting
from harness.lab.machine.device import probe

STEPS = 8
FP32 = [4.0, 3.5, 3.0, 2.5, 2.0, 1.5, 1.0, 0.5]  # a falling loss


def _scaler(leading: int, steps: int = STEPS, init: float = 65536.0) -> tuple[list, list]:
    """The first `leading` steps skipped, each halving the scale the next step uses."""
    skips = [i < leading for i in range(steps)]
    return skips, [init * 0.5 ** min(i, leading) for i in range(steps)]


def _judged(run: Run, reference_loss: list[float]) -> Run:
    reference = Run("fp32", loss=reference_loss)
    found = Diagnosis("f", "cpu", torch.__version__, len(run.loss), {"fp32": reference, "r": run})
    diagnose.judge(reference, found)
    diagnose.judge(run, found)
    return run


def _calibrating_recipe_is_not_unstable() -> None:
    """bert_naive_softmax's case: 5 back-offs from 65536 to 2048, then 3 steps taken."""
    skips, scale = _scaler(5)
    run = _judged(Run("amp-fp16", loss=[1.0] * STEPS, skips=skips, scale=scale), [1.0] * STEPS)
    assert run.scaler_calibration() == CALIBRATED
    assert run.status == SAFE, run.reasons
    assert "the scaler calibrated: 5 back-off(s) from 65536" in run.reasons[0], run.reasons


def test_a_scaler_calibrating_over_most_of_the_look_is_not_unstable():
    _calibrating_recipe_is_not_unstable()


def test_without_the_calibration_rule_the_test_above_fails(monkeypatch):
    """Sensitivity: the rule removed, the old "took at most half the steps" calls it unstable."""
    monkeypatch.setattr(Run, "scaler_calibration", lambda self: "")
    with pytest.raises(AssertionError):
        _calibrating_recipe_is_not_unstable()


@pytest.mark.parametrize(
    ("loss", "course", "says"),
    [
        ([1.0] * STEPS, _scaler(8, init=8.0), "the scaler took 0 of 8 steps"),
        ([1.0] * STEPS, _scaler(7), "still seeking its scale"),
        ([math.inf] * STEPS, _scaler(8), "no loss scale can mend"),
        ([math.inf, *[1.0] * 7], _scaler(5), "1 of 8 losses non-finite"),
        ([1.0] * STEPS, ([True] * 5 + [False] * 3, [65536.0] * STEPS), "the scaler took 3 of 8"),
    ],
    ids=["falls-under-1", "one-step-taken", "inf-forward", "inf-at-a-skip", "no-back-off"],
)
def test_a_scaler_that_does_not_calibrate_stays_unstable(loss, course, says):
    skips, scale = course
    run = _judged(Run("amp-fp16", loss=loss, skips=skips, scale=scale), [1.0] * STEPS)
    assert run.scaler_calibration() != CALIBRATED
    assert run.status == UNSTABLE and any(says in r for r in run.reasons), run.reasons


def _fix_check(monkeypatch, fixed: Run, reference_loss: list[float]):
    """The loss-outside-autocast fix tried on amp-fp16, its run `fixed`, judged by the rules."""
    from harness.lab.diagnose.fixes import Fix

    fixed.fix = Fix("amp-fp16", loss_fp32=True).describe()
    reference = Run("fp32", loss=reference_loss)
    against = Diagnosis("f", "cpu", torch.__version__, len(fixed.loss), {"fp32": reference})
    diagnose.judge(reference, against)
    monkeypatch.setattr(diagnose_order, "run_recipe", lambda *a, **k: (fixed, None))
    run = Run("amp-fp16", loss_fp32=True)
    setting = Setting(probe("cpu"), 1e-3, "adamw", None)
    (check,) = diagnose_order._try_fixes(run, against, None, None, setting, None)
    return check


def test_a_fix_check_whose_scaler_calibrated_behind_fp32s_loss_is_not_settled(monkeypatch):
    """Five steps skipped calibrating: the loss ends where fp32's was five updates earlier, a
    drift the look cannot tell from the fix's harm."""
    skips, scale = _scaler(5)
    fixed = Run("amp-fp16", loss=[4.0] * 5 + FP32[:3], skips=skips, scale=scale)
    check = _fix_check(monkeypatch, fixed, FP32)
    assert fixed.findings == [diagnose.DRIFTS], fixed.reasons  # not UNSTABLE: it calibrated
    assert not check.held and not check.settled, check
    assert "GradScaler calibrating its initial guess, then took 3" in check.unsettled
    # Calibrated with the loss on fp32's: it held.
    skips, scale = _scaler(5)
    fixed = Run("amp-fp16", loss=list(FP32), skips=skips, scale=scale)
    check = _fix_check(monkeypatch, fixed, FP32)
    assert check.held and check.settled and check.status == SAFE, check


def test_a_fix_check_whose_scaler_is_still_halving_is_not_settled(monkeypatch):
    skips, scale = _scaler(7)
    check = _fix_check(monkeypatch, Run("amp-fp16", loss=[1.0] * STEPS, skips=skips, scale=scale),
                       [1.0] * STEPS)  # fmt: skip
    assert check.status == UNSTABLE and not check.held and not check.settled, check
    assert "and took 1: too few to show a scale that holds" in check.unsettled


@pytest.mark.parametrize(
    ("loss", "course"),
    [
        ([1.0] * STEPS, _scaler(8, init=8.0)),
        ([math.inf] * STEPS, _scaler(8)),
        ([1.0] * STEPS, ([True] * 5 + [False] * 3, [65536.0] * STEPS)),
        (  # settled at 32768 at step 2, then skips at 32768 and 16384
            [1.0] * STEPS,
            (
                [s == "x" for s in "x.x.x..."],
                [65536.0, *[32768.0] * 2, *[16384.0] * 2, *[8192.0] * 3],
            ),
        ),
    ],
    ids=["falls-under-1", "inf-forward", "no-back-off", "recurring"],
)
def test_a_fix_check_whose_scaler_never_settles_did_not_hold(monkeypatch, loss, course):
    skips, scale = course
    check = _fix_check(monkeypatch, Run("amp-fp16", loss=loss, skips=skips, scale=scale),
                       [1.0] * STEPS)  # fmt: skip
    assert check.status == UNSTABLE and not check.held and check.settled, check
    assert check.unsettled == ""


def test_a_seeking_scaler_is_named_as_such():
    skips, scale = _scaler(7)
    assert Run("amp-fp16", loss=[1.0] * STEPS, skips=skips, scale=scale).scaler_calibration() == (
        SEEKING
    )
