"""scenarios/test_fp8.py can fail: each test breaks what one scenario test measures (torch's FP8
widening, its casts' rounding and overflow, _scaled_mm's scale convention, the granular
quantiser, a scale's floor, autocast, the storage ops, delayed scaling's history) and checks
that the scenario then fails with an assertion naming its claim. The CUDA contract's half runs
only on a GPU (scripts/gpu-check)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_failed_on, assert_fails_naming

from harness.lab import fp8

MODULE = "test_fp8.py"
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_to, _double = torch.Tensor.to, torch.Tensor.double


@pytest.mark.slow
def test_the_module_passes_unpatched(run_scenario):
    result = run_scenario(MODULE)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes["passed"] >= 11, outcomes


def _cast_through(monkeypatch, change):
    """Every cast to an FP8 dtype goes through `change(values, dtype)` first."""

    def to(self, *args, **kwargs):
        dtype = args[0] if args else kwargs.get("dtype")
        if dtype in FP8 and self.is_floating_point() and self.dtype not in FP8:
            return _to(change(self, dtype), dtype)
        return _to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)


def test_the_format_fails_when_e4m3_widens_its_largest_value_to_inf(run_scenario, monkeypatch):
    def double(self, *args, **kwargs):  # an E4M3 with IEEE's inf pattern, as E5M2 has
        out = _double(self, *args, **kwargs)
        return torch.where(out.abs() == 448, out.sign() * math.inf, out) if (
            self.dtype == torch.float8_e4m3fn) else out  # fmt: skip

    monkeypatch.setattr(torch.Tensor, "double", double)
    assert_fails_naming(run_scenario(MODULE, "-k", "e4m3_read"), "FP8-E4M3-FORMAT")


def test_rounding_fails_when_ties_and_near_ties_go_toward_zero(run_scenario, monkeypatch):
    _cast_through(monkeypatch, lambda x, dtype: x * (1 - 2.0**-8))
    assert_fails_naming(run_scenario(MODULE, "-k", "nearest_even"), "FP8-ROUND-NEAREST-EVEN")


def test_e4m3_overflow_fails_on_the_other_side_of_the_release_change(run_scenario, monkeypatch):
    from harness.lab import releases

    before = releases.behaviour("e4m3-cpu-cast-saturates", "cpu") == releases.BEFORE
    if before:  # this torch gives NaN: break it the other way, saturating
        change = lambda x, dtype: x.clamp(-448, 448) if dtype == torch.float8_e4m3fn else x  # noqa: E731
    else:  # this torch saturates: break it back to NaN
        change = lambda x, dtype: torch.where(x.abs() > 464, math.nan, x) if (  # noqa: E731
            dtype == torch.float8_e4m3fn) else x  # fmt: skip
    _cast_through(monkeypatch, change)
    assert_fails_naming(run_scenario(MODULE, "-k", "e4m3_beyond"), "FP8-E4M3-OVERFLOW-SATURATES")


def test_e5m2_overflow_fails_when_the_cast_saturates(run_scenario, monkeypatch):
    _cast_through(
        monkeypatch, lambda x, dtype: x.clamp(-57344, 57344) if dtype == torch.float8_e5m2 else x
    )
    assert_fails_naming(run_scenario(MODULE, "-k", "e5m2_overflows"), "FP8-E5M2-OVERFLOW-INF")


@pytest.mark.skipif(not hasattr(torch, "_scaled_mm"), reason="this torch has no _scaled_mm")
def test_scaled_mm_fails_when_its_scales_quantise_instead(run_scenario, monkeypatch):
    scaled_mm = torch._scaled_mm

    def inverted(a, b, *, scale_a, scale_b, **kwargs):  # the other convention, silently
        return scaled_mm(a, b, scale_a=1 / scale_a, scale_b=1 / scale_b, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", inverted)
    result = run_scenario(MODULE, "-k", "scaled_mm_multiplies or rowwise")
    outcomes = result.parseoutcomes()
    if outcomes.get("skipped") == 2:
        pytest.skip("this torch has no CPU _scaled_mm (from 2.9): nothing to break")
    # Each test that ran fails (rowwise scales skip before 2.12), naming the claim.
    assert outcomes.get("failed") == 2 - outcomes.get("skipped", 0), outcomes
    assert_failed_on(result, "E *FP8-SCALED-MM: *")


def test_gradients_fail_when_e5m2_flushes_its_small_values(run_scenario, monkeypatch):
    def narrow(x, dtype):  # an E5M2 whose range spans 2**12 below its amax, less than E4M3's
        return torch.where(x.abs() < x.abs().max() * 2.0**-12, 0.0, x) if (
            dtype == torch.float8_e5m2) else x  # fmt: skip

    _cast_through(monkeypatch, narrow)
    assert_fails_naming(run_scenario(MODULE, "-k", "gradients"), "FP8-E5M2-FOR-GRADIENTS")


def test_fine_scaling_fails_when_the_quantiser_ignores_its_blocks(run_scenario, monkeypatch):
    quantised = fp8.quantised
    monkeypatch.setattr(
        fp8, "quantised", lambda x, dtype, block, floor=1e-12: quantised(x, dtype, None, floor)
    )
    assert_fails_naming(run_scenario(MODULE, "-k", "fine_grained"), "FP8-FINE-SCALING")


def test_zero_amax_fails_when_every_scale_has_a_floor(run_scenario, monkeypatch):
    scale_for = fp8.scale_for
    monkeypatch.setattr(
        fp8, "scale_for", lambda amax, dtype, floor=1e-12: scale_for(amax, dtype, 1e-12)
    )
    assert_fails_naming(run_scenario(MODULE, "-k", "zero_block"), "FP8-ZERO-AMAX")


def test_no_autocast_fails_when_an_fp8_region_computes_in_fp8(run_scenario, monkeypatch):
    autocast, linear = torch.autocast, torch.nn.functional.linear
    region = []

    class Fp8Autocast(autocast):  # an autocast that honoured an FP8 dtype
        def __init__(self, device_type, dtype=None, **kwargs):
            self.fp8 = dtype if dtype in FP8 else None
            super().__init__(device_type, dtype=torch.bfloat16 if self.fp8 else dtype, **kwargs)

        def __enter__(self):
            region.append(self.fp8)
            return super().__enter__()

        def __exit__(self, *exc):
            region.pop()
            return super().__exit__(*exc)

    def fp8_linear(*args, **kwargs):
        out = linear(*args, **kwargs)
        return out.float().to(region[-1]) if region and region[-1] else out

    monkeypatch.setattr(torch, "autocast", Fp8Autocast)
    monkeypatch.setattr(torch.nn.functional, "linear", fp8_linear)
    assert_fails_naming(run_scenario(MODULE, "-k", "no_fp8_mode"), "FP8-NO-AUTOCAST")


def test_storage_fails_when_fp8_cannot_be_concatenated(run_scenario, monkeypatch):
    cat = torch.cat

    def no_fp8_cat(tensors, *args, **kwargs):
        if any(t.dtype in FP8 for t in tensors):
            raise RuntimeError('"cat_cpu" not implemented for Float8_e4m3fn')
        return cat(tensors, *args, **kwargs)

    monkeypatch.setattr(torch, "cat", no_fp8_cat)
    assert_fails_naming(run_scenario(MODULE, "-k", "for_storage"), "FP8-STORAGE-TYPE")


def test_delayed_scaling_fails_when_the_scale_comes_from_the_step_itself(run_scenario, monkeypatch):
    def current(self, x):  # no history: each step's own amax, i.e. current scaling
        return fp8.current_scaling(x, self.dtype), 0.0

    monkeypatch.setattr(fp8.DelayedScaling, "quantise", current)
    assert_fails_naming(run_scenario(MODULE, "-k", "spike"), "FP8-DELAYED-SCALING-SPIKE")


@pytest.mark.slow
def test_training_fails_when_fp8_loses_the_weight_gradients(run_scenario, monkeypatch):
    backward = fp8._Float8Matmul.backward

    def no_weight_gradient(ctx, grad):  # an FP8 GEMM of the weight gradient that returns 0
        grad_x, grad_w, scaled = backward(ctx, grad)
        return grad_x, torch.zeros_like(grad_w), scaled

    monkeypatch.setattr(fp8._Float8Matmul, "backward", staticmethod(no_weight_gradient))
    assert_fails_naming(run_scenario(MODULE, "-k", "matches_bf16"), "FP8-MATCHES-BF16")
