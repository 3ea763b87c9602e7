"""scenarios/test_formats.py can fail: each test breaks the PyTorch behaviour one scenario test
measures (fp16 rounding, subnormals, element sizes, the fp32 -> fp16 conversion, GradScaler's
skipped step) and checks that the scenario then fails with an assertion naming its claim."""

from __future__ import annotations

import torch
from conftest import assert_failed_on, assert_fails_naming

MODULE = "test_formats.py"


def test_the_module_passes_unpatched(run_scenario):
    run_scenario(MODULE).assert_outcomes(passed=5)


def test_bits_fail_when_addition_does_not_round_to_the_dtype(run_scenario, monkeypatch):
    add = torch.Tensor.__add__

    def add_in_float64(self, other):  # 1 + eps is never rounded back to fp16/fp32
        return add(self.double(), other)

    monkeypatch.setattr(torch.Tensor, "__add__", add_in_float64)
    result = run_scenario(MODULE, "-k", "bits")
    assert_fails_naming(result, "FMT-BITS")


def test_range_fails_when_subnormals_are_flushed(run_scenario, monkeypatch):
    divide = torch.Tensor.__truediv__

    def flush_to_zero(self, other):  # halving below the smallest normal gives 0, as under FTZ
        quotient = divide(self, other)
        if not quotient.is_floating_point():
            return quotient
        return torch.where(quotient.abs() < torch.finfo(quotient.dtype).tiny, 0.0, quotient)

    monkeypatch.setattr(torch.Tensor, "__truediv__", flush_to_zero)
    result = run_scenario(MODULE, "-k", "range")
    assert_fails_naming(result, "FMT-RANGE")


def test_bytes_fail_when_fp16_reports_four_bytes(run_scenario, monkeypatch):
    element_size = torch.Tensor.element_size
    monkeypatch.setattr(
        torch.Tensor,
        "element_size",
        lambda self: 4 if self.dtype == torch.float16 else element_size(self),
    )
    result = run_scenario(MODULE, "-k", "bytes")
    assert_fails_naming(result, "FMT-BYTES")


def test_underflow_fails_when_the_cast_flushes_below_6e_8(run_scenario, monkeypatch):
    half = torch.Tensor.half

    def article_half(self, *args, **kwargs):  # the article's rule: below 6e-8 becomes 0
        return half(torch.where(self.abs() < 6e-8, 0.0, self), *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "half", article_half)
    result = run_scenario(MODULE, "-k", "underflow")
    assert_fails_naming(result, "NUM-UNDERFLOW")


def test_overflow_fails_when_the_cast_saturates(run_scenario, monkeypatch):
    half = torch.Tensor.half

    def saturating_half(self, *args, **kwargs):  # 65520 -> 65504 instead of inf
        return half(self.clamp(-65504.0, 65504.0), *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "half", saturating_half)
    result = run_scenario(MODULE, "-k", "overflow")
    assert_fails_naming(result, "NUM-OVERFLOW")


def test_overflow_fails_when_the_scaler_never_skips(run_scenario, monkeypatch):
    def step_always(self, optimizer, *args, **kwargs):  # unscale, then step even on inf
        self.unscale_(optimizer)
        return optimizer.step(*args, **kwargs)

    monkeypatch.setattr(torch.amp.GradScaler, "step", step_always)
    result = run_scenario(MODULE, "-k", "overflow")
    assert_fails_naming(result, "NUM-OVERFLOW")


def test_an_optimizer_that_drops_non_finite_gradients_fails_the_control(run_scenario, monkeypatch):
    # The control's subject broken: Adam itself zeroes inf/NaN gradients before stepping, so
    # the unscaled run stays finite. The scaled run never reaches Adam with an inf (the scaler
    # skips): only the control's assertion can see it.
    step = torch.optim.Adam.step

    def dropping_non_finite(self, *args, **kwargs):
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    param.grad.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", dropping_non_finite)
    result = run_scenario(MODULE, "-k", "test_overflow_edge")
    assert_fails_naming(result, "NUM-OVERFLOW")
    assert_failed_on(result, "*predicted the inf gradient to reach the parameters without*")
