"""scenarios/test_gradient_explosion.py fails, naming its claim, when GradScaler is broken.

Each test replaces one GradScaler method (torch.amp.GradScaler is
torch.amp.grad_scaler.GradScaler) with a plausible wrong version, runs one scenario test
in-process and expects it to fail with an assertion that starts with the claim ID. The broken
versions keep the scaler's bookkeeping consistent (stage, found_inf), so the scenario fails on
its prediction, not on an internal assertion of GradScaler.
"""

from __future__ import annotations

import pytest
from conftest import assert_failed_on, assert_fails_naming, unscale_without_dividing
from torch.amp.grad_scaler import GradScaler, OptState

MODULE = "test_gradient_explosion.py"
_step, _update = GradScaler.step, GradScaler.update


def _update_never_backs_off(self, new_scale=None):
    """On inf/NaN the scale stays where it was: the start-up scale is never calibrated."""
    before = self.get_scale()
    _update(self, new_scale)
    if self.is_enabled() and self.get_scale() < before:
        self._scale.fill_(before)


def _step_never_skips(self, optimizer, *args, **kwargs):
    """Unscale if not done yet, then call optimizer.step() whatever the gradients hold."""
    if not self.is_enabled():
        return _step(self, optimizer, *args, **kwargs)
    state = self._per_optimizer_states[id(optimizer)]
    if state["stage"] is OptState.READY:
        self.unscale_(optimizer)  # records found_inf too, so update() still backs off
    state["stage"] = OptState.STEPPED
    return optimizer.step(*args, **kwargs)


@pytest.mark.parametrize(
    ("method", "broken", "test", "claim"),
    [
        ("update", _update_never_backs_off, "calibration_not_explosion", "PIT1-EXPLOSION"),
        ("step", _step_never_skips, "diverges_in_fp32_too", "PIT1-EXPLOSION"),
        ("unscale_", unscale_without_dividing, "clips_scaled_gradients", "PIT1-GRADNORM"),
    ],
    ids=lambda v: v if isinstance(v, str) else v.__name__.strip("_"),
)
def test_scenario_fails_when_grad_scaler_is_broken(
    monkeypatch, run_scenario, method, broken, test, claim
):
    monkeypatch.setattr(GradScaler, method, broken)
    result = run_scenario(MODULE, "-k", test)
    assert_fails_naming(result, claim)


def test_module_passes_unpatched(run_scenario):
    run_scenario(MODULE).assert_outcomes(passed=3)


def test_a_healthy_run_whose_norm_jumps_fails_the_no_false_alarm_control(monkeypatch, run_scenario):
    """Every run's reported grad norm 30x larger from its 11th step on (each run is STEPS = 20
    steps, run one after the other): the never-diverging run now leaves 10x its own start, and
    PRACTICE-SMOKE's control must see it. Judged against the healthy run's own maximum, as
    before, it could not: the jump raises the maximum with it."""
    from harness.lab import recipes

    norm, calls = recipes.total_grad_norm, []

    def jumping(params):
        calls.append(1)
        return norm(params) * (30.0 if (len(calls) - 1) % 20 >= 10 else 1.0)

    monkeypatch.setattr(recipes, "total_grad_norm", jumping)
    result = run_scenario(MODULE, "-k", "diverges_in_fp32_too")
    assert_fails_naming(result, "PRACTICE-SMOKE")
    assert_failed_on(result, "*PRACTICE-SMOKE: predicted no alarm on the run that never*")
