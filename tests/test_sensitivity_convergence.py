"""scenarios/test_convergence.py can fail: when AMP really does train worse, each test of it fails
with an assertion that names its claim.

The break: a GradScaler whose step() drops three updates in four without backing off the scale,
as if they had overflowed. amp-fp16 (the recipe that uses the scaler) then needs about four times
the steps to reach the target loss and ends less accurate, which the scenario must see as AMP
slower beyond its margins (PIT4-SMALL-CONVERGENCE) and as an accuracy loss beyond the parity
margin (HDL-ACCURACY).
"""

from __future__ import annotations

from conftest import assert_fails_naming
from torch.amp.grad_scaler import GradScaler, OptState

MODULE = "test_convergence.py"
_step = GradScaler.step


def _step_dropping_three_in_four(self, optimizer, *args, **kwargs):
    self._calls = getattr(self, "_calls", 0) + 1
    if self._calls % 4:
        # Skip optimizer.step(), keeping the bookkeeping update() expects after a step.
        self._per_optimizer_states[id(optimizer)]["stage"] = OptState.STEPPED
        return None
    return _step(self, optimizer, *args, **kwargs)


def test_scaler_dropping_updates_fails_both_claims(run_scenario, monkeypatch):
    # One run of the whole module (its tests share the control's runs): both tests fail.
    monkeypatch.setattr(GradScaler, "step", _step_dropping_three_in_four)
    result = run_scenario(MODULE)
    for claim in ("PIT4-SMALL-CONVERGENCE", "HDL-ACCURACY"):
        assert_fails_naming(result, claim, failed=2)


def test_module_passes_unpatched(run_scenario):
    run_scenario(MODULE).assert_outcomes(passed=2)
