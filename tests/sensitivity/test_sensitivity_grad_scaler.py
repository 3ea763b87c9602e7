"""scenarios/test_grad_scaler.py fails, naming its claim, when GradScaler is broken.

Each test replaces one GradScaler method (torch.amp.GradScaler is
torch.amp.grad_scaler.GradScaler) with a plausible wrong version, runs the scenario in-process
and expects one failure whose assertion starts with the claim ID. The broken versions keep the
scaler's bookkeeping consistent, so the scenario fails on its prediction, not on an internal
assertion of GradScaler.
"""

from __future__ import annotations

import pytest
from conftest import assert_failed_on, assert_fails_naming, unscale_without_dividing
from torch.amp.grad_scaler import GradScaler, OptState

MODULE = "test_grad_scaler.py"
_step, _update = GradScaler.step, GradScaler.update


def _scale_returns_the_loss(self, outputs):
    return outputs


def _step_never_skips(self, optimizer, *args, **kwargs):
    """The article's mental model: always call optimizer.step() on the gradients as they are."""
    if not self.is_enabled():
        return _step(self, optimizer, *args, **kwargs)
    self._check_inf_per_device(optimizer)  # so that update() still backs off
    self._per_optimizer_states[id(optimizer)]["stage"] = OptState.STEPPED
    return optimizer.step(*args, **kwargs)


def _update_grows_on_inf(self, new_scale=None):
    """The article's SCL-NAN-INCREASES: double the scale when a step found inf/NaN."""
    if not self.is_enabled():
        return _update(self, new_scale)
    found_inf = any(
        bool(found.item())
        for state in self._per_optimizer_states.values()
        for found in state["found_inf_per_device"].values()
    )
    return _update(self, self.get_scale() * 2.0 if found_inf else new_scale)


@pytest.mark.parametrize(
    ("method", "broken", "test", "claim"),
    [
        ("scale", _scale_returns_the_loss, "multiplies_the_loss", "SCL-SCALE"),
        ("unscale_", unscale_without_dividing, "divides_the_gradients_back", "SCL-STEP-UNSCALES"),
        ("step", _step_never_skips, "divides_the_gradients_back", "SCL-STEP-UNSCALES"),
        ("step", _step_never_skips, "already_skips", "PIT3-CHECK-BEFORE-STEP"),
        ("update", _update_grows_on_inf, "backs_off_on_inf", "SCL-UPDATE-DYNAMIC"),
        ("update", _update_grows_on_inf, "halve_the_scale", "SCL-NAN-INCREASES"),
    ],
    ids=lambda v: v if isinstance(v, str) else v.__name__.strip("_"),
)
def test_scenario_fails_when_grad_scaler_is_broken(
    monkeypatch, run_scenario, method, broken, test, claim
):
    monkeypatch.setattr(GradScaler, method, broken)
    result = run_scenario(MODULE, "-k", test)
    assert_fails_naming(result, claim)


def _update_with_the_default_factors(self, new_scale=None):
    """update() that ignores the scaler's own growth and backoff factors (x2 and x0.5 always):
    the default scaler's history stays right, the control's does not."""
    self._growth_factor, self._backoff_factor = 2.0, 0.5
    return _update(self, new_scale)


def test_an_update_that_ignores_its_factors_fails_the_control(monkeypatch, run_scenario):
    # The control's own subject broken: only its assertion can see it.
    monkeypatch.setattr(GradScaler, "update", _update_with_the_default_factors)
    result = run_scenario(MODULE, "-k", "backs_off_on_inf")
    assert_fails_naming(result, "SCL-UPDATE-DYNAMIC")
    assert_failed_on(result, "*SCL-UPDATE-DYNAMIC: predicted a scaler with factors*")


def test_module_passes_unpatched(run_scenario):
    run_scenario(MODULE).assert_outcomes(passed=5)
