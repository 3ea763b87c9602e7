"""Recipes: what each one does to the model, the autocast context, the scaler and TF32."""

from __future__ import annotations

import pytest
import torch

from harness import devices, recipes
from harness.errors import HarnessError

CPU = devices.resolve("cpu")


def one_step(name: str, loss_factor: float = 1.0) -> tuple[recipes.Precision, recipes.StepReport]:
    torch.manual_seed(0)
    with recipes.get(name).bind(CPU) as precision:
        model = precision.prepare(torch.nn.Linear(8, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with precision.forward():
            out = model(precision.cast_input(torch.randn(16, 8)))
            loss = out.float().pow(2).mean() * loss_factor
        precision.backward(loss)
        return precision, precision.step(optimizer)


def test_unknown_recipe_names_the_known_ones_and_the_closest():
    with pytest.raises(HarnessError, match=r"unknown recipe 'amp_fp16'.*closest: amp-fp16"):
        recipes.get("amp_fp16")


def test_tf32_on_the_cpu_is_unsupported_with_a_reason():
    with pytest.raises(recipes.RecipeUnsupported, match=r"recipe tf32 needs CUDA"):
        recipes.get("tf32").bind(CPU)


def test_fp32_turns_tf32_off_while_active_and_restores_it():
    saved = recipes.tf32_flags()
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with recipes.get("fp32").bind(CPU):
            assert not any(recipes.tf32_flags().values())
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved["cuda.matmul.allow_tf32"]


@pytest.mark.parametrize(
    ("name", "out_dtype", "param_dtype", "scale"),
    [
        ("fp32", torch.float32, torch.float32, 1.0),
        ("amp-fp16", torch.float16, torch.float32, 65536.0),
        ("amp-fp16-noscaler", torch.float16, torch.float32, 1.0),
        ("amp-bf16", torch.bfloat16, torch.float32, 1.0),
        ("half", torch.float16, torch.float16, 1.0),
    ],
)
def test_each_recipe_on_the_cpu(name, out_dtype, param_dtype, scale):
    with recipes.get(name).bind(CPU) as precision:
        model = precision.prepare(torch.nn.Linear(8, 4))
        with precision.forward():
            out = model(precision.cast_input(torch.randn(2, 8)))
    assert (out.dtype, model.weight.dtype) == (out_dtype, param_dtype)
    _, report = one_step(name)
    assert report.scale == scale and not report.skipped and report.grad_norm > 0


def test_the_scaler_is_bound_to_the_device_not_cuda():
    precision, _ = one_step("amp-fp16")
    assert precision.scaler.is_enabled()  # GradScaler() without a device is disabled on a CPU


def test_grad_norm_is_reported_after_unscaling():
    _, fp32 = one_step("fp32")
    _, amp = one_step("amp-fp16")
    assert amp.grad_norm == pytest.approx(fp32.grad_norm, rel=1e-2)  # not 65536 x larger


def test_an_inf_gradient_is_a_skipped_step_with_a_backed_off_scale():
    precision, report = one_step("amp-fp16", loss_factor=float("inf"))
    assert report.skipped and report.scale == 65536.0
    assert precision.scaler.get_scale() == 32768.0


def test_a_wrapped_timing_arm_runs_with_its_recipes_tf32_flags():
    seen = []
    arm = recipes.get("fp32").bind(CPU).wrap(lambda: seen.append(recipes.tf32_flags()))
    before = recipes.tf32_flags()
    torch.backends.cudnn.allow_tf32 = True
    try:
        arm()
        assert seen == [{"cuda.matmul.allow_tf32": False, "cudnn.allow_tf32": False}]
        assert torch.backends.cudnn.allow_tf32 is True  # restored after the call
    finally:
        torch.backends.cudnn.allow_tf32 = before["cudnn.allow_tf32"]
