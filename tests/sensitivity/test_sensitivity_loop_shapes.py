"""scenarios/test_loop_shapes.py fails, naming the claim and the shape, when the scaler or an
optimizer goes wrong in one loop shape only.

Each break below is confined to one shape (the first is the regression that left the rest of
the suite green: a scaler checking only an optimizer's first param group). The module is run
whole under it: exactly that shape's test fails, on an assertion naming the claim and the case,
its recorded verdict names the cases where the claim stopped holding beside those where it
still held, and every other shape's test passes.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import assert_failed_on, assert_fails_naming
from torch.amp.grad_scaler import GradScaler, OptState

MODULE = "test_loop_shapes.py"
TESTS = 7  # the module's tests, fused=True's included
_unscale_grads, _unscale, _update, _step = (
    GradScaler._unscale_grads_,
    GradScaler.unscale_,
    GradScaler.update,
    GradScaler.step,
)
_fused_adam = torch._fused_adam_


def _unscale_the_first_group_only(self, optimizer, *args):
    """A scaler that unscales and checks the first param group of each optimizer, and no
    other: the rest step on gradients 65536x too large, an inf there goes unseen."""
    return _unscale_grads(self, SimpleNamespace(param_groups=optimizer.param_groups[:1]), *args)


def _update_reading_the_first_optimizer(self, new_scale=None):
    """update() that backs off for an inf only the first optimizer stepped found."""
    for state in list(self._per_optimizer_states.values())[1:]:
        found = state["found_inf_per_device"]
        state["found_inf_per_device"] = {device: torch.zeros_like(f) for device, f in found.items()}
    return _update(self, new_scale)


def _unscale_again(self, optimizer):
    """unscale_ that a second call in the same step applies again, dividing the gradients
    twice, instead of raising."""
    state = self._per_optimizer_states[id(optimizer)]
    if state["stage"] is OptState.UNSCALED:
        state["stage"] = OptState.READY
    return _unscale(self, optimizer)


def _fused_adam_ignoring_found_inf(*args, found_inf=None, **kwargs):
    """Fused Adam's kernel (AdamW's is torch._fused_adamw_) stepping whatever the scaler found."""
    return _fused_adam(*args, **kwargs)


def _step_giving_zeros_to_missing_gradients(self, optimizer, *args, **kwargs):
    """scaler.step that hands every parameter without a gradient a zero one first."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
    return _step(self, optimizer, *args, **kwargs)


# (where, what, the replacement, the test that fails, the claim, the case its failing assertion
# names, the claim's recorded verdict and the shapes its evidence names on the failing side)
BREAKS = [
    (GradScaler, "_unscale_grads_", _unscale_the_first_group_only, "param_groups",
     "SCL-STEP-UNSCALES", "param group no_decay", "partly", "not in no_decay, head"),
    (GradScaler, "update", _update_reading_the_first_optimizer, "several_optimizers",
     "SCL-UPDATE-DYNAMIC", "inf_in_discriminator", "partly", "not in inf_in_discriminator"),
    (GradScaler, "unscale_", _unscale_again, "accumulated", "SCL-STEP-UNSCALES",
     "second unscale_", "partly", "not in unscale_ each micro-batch"),
    (torch, "_fused_adam_", _fused_adam_ignoring_found_inf,
     "implementations_unscale_and_skip[fused]", "PIT3-CHECK-BEFORE-STEP", "fused Adam",
     "partly", "in SGD.first_step, Adam.inf, Adam.nan"),
    (GradScaler, "step", _step_giving_zeros_to_missing_gradients, "without_a_gradient",
     "SCL-STEP-UNSCALES", "head_b (no gradient)", "refuted",
     "not in step 1 through head_a, step 2 through head_b"),
]  # fmt: skip


def _records(pytester: pytest.Pytester) -> list[dict]:
    lines = (pytester.path / "reports" / "journal.jsonl").read_text().splitlines()
    return [e["record"] for e in map(json.loads, lines) if e["type"] == "record"]


@pytest.mark.parametrize(
    ("owner", "name", "broken", "test", "claim", "case", "verdict", "shapes"),
    BREAKS,
    ids=[b[2].__name__.strip("_") for b in BREAKS],
)
def test_a_break_in_one_shape_fails_that_shape_alone(
    run_scenario, pytester, monkeypatch, owner, name, broken, test, claim, case, verdict, shapes
):
    monkeypatch.setattr(owner, name, broken)
    result = run_scenario(MODULE)
    assert_fails_naming(result, claim, passed=TESTS - 1)
    assert_failed_on(result, f"*{claim}: *{case}*")
    (failed,) = [r for r in _records(pytester) if r["outcome"] == "failed"]
    assert test in failed["test"], failed["test"]
    recorded = {v["claim"]: v for v in failed["verdicts"]}[claim]
    assert recorded["verdict"] == verdict and shapes in recorded["evidence"], recorded


def test_the_module_passes_unbroken(run_scenario):
    run_scenario(MODULE).assert_outcomes(passed=TESTS)
