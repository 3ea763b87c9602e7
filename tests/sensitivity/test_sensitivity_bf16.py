"""scenarios/test_bf16.py can fail: each test breaks the behaviour one bf16 claim rests on (bf16
autocast's range, the rounding of a bf16 weight update, bf16 rounding itself) and checks that
the scenario then fails with an assertion naming its claim."""

from __future__ import annotations

import torch
from conftest import assert_failed_on, assert_fails_naming
from torch.amp.grad_scaler import GradScaler

MODULE = "test_bf16.py"


def test_the_module_passes_unpatched(run_scenario):
    run_scenario(MODULE).assert_outcomes(passed=3)


def test_no_scaler_fails_when_bf16_autocast_computes_in_fp16(run_scenario, monkeypatch):
    init = torch.autocast.__init__

    def fp16_instead(self, device_type, dtype=None, *args, **kwargs):  # bf16 with fp16's range
        init(
            self, device_type, torch.float16 if dtype == torch.bfloat16 else dtype, *args, **kwargs
        )

    monkeypatch.setattr(torch.autocast, "__init__", fp16_instead)
    result = run_scenario(MODULE, "-k", "small_gradients")
    assert_fails_naming(result, "BF16-NO-SCALER")


def test_master_weights_fail_when_sgd_keeps_a_hidden_fp32_copy(run_scenario, monkeypatch):
    step, masters = torch.optim.SGD.step, {}

    def step_in_fp32(self, closure=None):  # bf16 parameters updated through an fp32 master
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype == torch.bfloat16 and p.grad is not None:
                    master = masters.setdefault(id(p), p.detach().float())
                    master.add_(p.grad.float(), alpha=-group["lr"])
                    p.data.copy_(master)
                    p.grad = None  # the original step leaves it alone
        return step(self, closure)

    monkeypatch.setattr(torch.optim.SGD, "step", step_in_fp32)
    result = run_scenario(MODULE, "-k", "half_a_bf16_ulp")
    assert_fails_naming(result, "BF16-MASTER-WEIGHTS")


def test_range_precision_fails_when_addition_does_not_round_to_bf16(run_scenario, monkeypatch):
    add = torch.Tensor.__add__

    def add_in_float64(self, other):  # 1 + eps is never rounded back to bf16
        return add(self.double(), other)

    monkeypatch.setattr(torch.Tensor, "__add__", add_in_float64)
    result = run_scenario(MODULE, "-k", "range_of_fp32")
    assert_fails_naming(result, "BF16-RANGE-PRECISION")


def test_a_scaler_that_does_not_scale_fails_the_control(run_scenario, monkeypatch):
    # The control's subject broken: GradScaler.scale hands the loss back unscaled, so the fp16
    # fix flushes the small gradients too. bf16 and unscaled fp16 are untouched: only the
    # control's assertion can see it.
    scale = GradScaler.scale  # called, so that the scaler's state exists for step()
    monkeypatch.setattr(GradScaler, "scale", lambda self, loss: scale(self, loss) / self._scale)
    result = run_scenario(MODULE, "-k", "without_a_scaler")
    assert_fails_naming(result, "BF16-NO-SCALER")
    assert_failed_on(result, "*BF16-NO-SCALER: predicted GradScaler to keep the fp16*")
