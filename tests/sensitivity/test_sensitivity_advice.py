"""scenarios/test_advice.py can fail: break what users read (clip_grad_norm_'s norm) and what
the scaler does with the gradients they check, and the scenario fails naming the claim, on the
assertion of the behaviour broken (the negative controls included)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_fails_naming, unscale_without_dividing
from torch.amp.grad_scaler import GradScaler, OptState

MODULE = "test_advice.py"
_clip, _step = torch.nn.utils.clip_grad_norm_, GradScaler.step


def test_the_module_passes_unbroken(run_scenario):
    run_scenario(MODULE).assert_outcomes(passed=2)


def _norm_in_float64(parameters, max_norm, *args, **kwargs):
    """A clip_grad_norm_ that sums squares in float64: huge finite gradients read finite."""
    grads = [p.grad for p in parameters]
    return torch.linalg.vector_norm(torch.cat([g.double().flatten() for g in grads]))


def _norm_of_the_first_tensor(parameters, max_norm, *args, **kwargs):
    """A clip_grad_norm_ that forgets every parameter but the first: the control's subject."""
    return _clip(list(parameters)[:1], max_norm, *args, **kwargs)


def _step_skipping_zeros(self, optimizer, *args, **kwargs):
    """scaler.step that also skips when every gradient is zero: the check would be redundant.
    (The scenario unscales first, so update() finds the inf checks it needs.)"""
    if all(not p.grad.any() for g in optimizer.param_groups for p in g["params"]):
        self._per_optimizer_states[id(optimizer)]["stage"] = OptState.STEPPED
        return None
    return _step(self, optimizer, *args, **kwargs)


def _step_never_skipping(self, optimizer, *args, **kwargs):
    """scaler.step that steps on an inf too: the control's subject (the scaler's own skip)."""
    self._per_optimizer_states[id(optimizer)]["stage"] = OptState.STEPPED
    return optimizer.step(*args, **kwargs)


# (what is broken, the replacement, the test, the claim, what the failing assertion predicted)
BREAKS = [
    ("clip_grad_norm_", _norm_in_float64, "clip_grad_norm", "PIT1-GRADNORM", "an inf norm"),
    ("clip_grad_norm_", _norm_of_the_first_tensor, "clip_grad_norm", "PIT1-GRADNORM", "exact"),
    ("unscale_", unscale_without_dividing, "clip_grad_norm", "PIT1-GRADNORM", "before unscale_"),
    ("step", _step_skipping_zeros, "zero_gradients", "PIT3-CHECK-BEFORE-STEP", "to step on"),
    ("step", _step_never_skipping, "zero_gradients", "PIT3-CHECK-BEFORE-STEP", "to skip an inf"),
]


@pytest.mark.parametrize(
    ("name", "broken", "test", "claim", "says"),
    BREAKS,
    ids=[b[1].__name__.strip("_") for b in BREAKS],
)
def test_a_broken_tool_fails_the_advice(run_scenario, monkeypatch, name, broken, test, claim, says):
    owner = torch.nn.utils if name == "clip_grad_norm_" else GradScaler
    monkeypatch.setattr(owner, name, broken)
    result = run_scenario(MODULE, "-k", test)
    assert_fails_naming(result, claim)
    errors = [line for line in result.outlines if line.startswith("E ")]
    assert any(f"{claim}: predicted" in e and says in e for e in errors), errors
