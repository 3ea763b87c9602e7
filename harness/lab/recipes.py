"""Precision recipes: the unit of comparison.

A recipe is bound to a device and then used through four verbs, in training-loop order:

    with get("amp-fp16").bind(device) as precision:   # sets (and later restores) TF32 flags
        model = precision.prepare(model)             # 1. cast/move the model
        with precision.forward():                    # 2. the autocast context, if any
            loss = loss_fn(model(precision.cast_input(x)), y)
        precision.backward(loss)                     # 3. scaled or plain backward
        report = precision.step(optimizer)           # 4. unscale, measure, clip, step, update
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness.common.errors import HarnessError, closest
from harness.lab.devices import DeviceInfo
from harness.lab.tf32 import restore_tf32, set_tf32, tf32_settings


class RecipeUnsupported(HarnessError):
    """The recipe cannot run on this device; the message is a skip reason."""


@dataclass(frozen=True)
class Recipe:
    name: str
    summary: str
    autocast_dtype: torch.dtype | None  # None: no autocast
    scaler: bool  # loss scaling with torch.amp.GradScaler
    param_dtype: torch.dtype  # the dtype of the trained parameters
    tf32: bool  # TF32 matmul and cuDNN flags while the recipe is active
    needs: tuple[str, ...]  # device capabilities, see harness.lab.devices.CAPABILITY_TEXT

    def unsupported_reason(self, device: DeviceInfo) -> str | None:
        reason = device.missing(*self.needs)
        return f"recipe {self.name} {reason}" if reason else None

    def bind(self, device: DeviceInfo) -> Precision:
        reason = self.unsupported_reason(device)
        if reason:
            raise RecipeUnsupported(reason)
        return Precision(self, device)


RECIPES = {
    r.name: r
    for r in (
        Recipe(
            "fp32", "float32 throughout, TF32 explicitly off", None, False, torch.float32, False, ()
        ),
        Recipe(
            "tf32",
            "float32 parameters, TF32 tensor-core matmuls and convolutions",
            None,
            False,
            torch.float32,
            True,
            ("cuda", "tf32"),
        ),
        Recipe(
            "amp-fp16",
            "autocast float16 + GradScaler, float32 parameters",
            torch.float16,
            True,
            torch.float32,
            False,
            ("fp16_autocast", "grad_scaler"),
        ),
        Recipe(
            "amp-fp16-noscaler",
            "autocast float16 without loss scaling",
            torch.float16,
            False,
            torch.float32,
            False,
            ("fp16_autocast",),
        ),
        Recipe(
            "amp-bf16",
            "autocast bfloat16, no loss scaling needed",
            torch.bfloat16,
            False,
            torch.float32,
            False,
            ("bf16_autocast",),
        ),
        Recipe(
            "half",
            "model.half(): float16 parameters and activations, no autocast",
            None,
            False,
            torch.float16,
            False,
            ("half_training",),
        ),
    )
}


def get(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise HarnessError(
            f"unknown recipe {name!r}: known recipes are {', '.join(RECIPES)} "
            f"(closest: {closest(name, RECIPES)})"
        ) from None


@dataclass
class StepReport:
    scale: float  # the loss scale this step's backward used (1.0 without a scaler)
    skipped: bool  # the scaler found inf/NaN and skipped optimizer.step()
    grad_norm: float  # total L2 norm of the true (unscaled) gradients, computed in float32


class Precision:
    """A recipe bound to a device: a context manager that owns the TF32 flags and the scaler."""

    def __init__(self, recipe: Recipe, device: DeviceInfo):
        self.recipe = recipe
        self.device = device
        # Always name the device: GradScaler's default, "cuda", silently disables itself on CPU.
        self.scaler = torch.amp.GradScaler(device.type) if recipe.scaler else None
        self._saved_tf32: dict[str, object] | None = None

    def __enter__(self) -> Precision:
        self._saved_tf32 = tf32_settings()
        set_tf32(self.recipe.tf32)
        return self

    def __exit__(self, *exc) -> None:
        restore_tf32(self._saved_tf32)

    def wrap(self, fn: Callable[[], object]) -> Callable[[], None]:
        """`fn` as a timing arm: each call runs with this recipe's TF32 flags set, then restored
        (arms of several recipes interleave in one process)."""

        def run() -> None:
            with self:
                fn()

        return run

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(device=self.device.torch_device, dtype=self.recipe.param_dtype)

    def cast_input(self, x: torch.Tensor) -> torch.Tensor:
        """Move a batch to the device; floating inputs follow a half model into float16."""
        x = x.to(self.device.torch_device)
        return x.to(self.recipe.param_dtype) if x.is_floating_point() else x

    def forward(self):
        """The context the forward pass (model and loss) runs in."""
        if self.recipe.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.recipe.autocast_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is not None:
            # Multiply the loss by the scale so small fp16 gradients do not flush to zero.
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def step(self, optimizer: torch.optim.Optimizer, clip_norm: float | None = None) -> StepReport:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        scale = self.scaler.get_scale() if self.scaler is not None else 1.0
        if self.scaler is not None:
            # Divide the gradients by the scale *before* measuring or clipping them: clipping
            # scaled gradients would clip values up to `scale` times too large.
            self.scaler.unscale_(optimizer)
        grad_norm = total_grad_norm(params)
        if clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, clip_norm)
        self.update(optimizer)
        if self.scaler is None:
            return StepReport(scale, False, grad_norm)
        return StepReport(scale, self.scaler.get_scale() < scale, grad_norm)

    def update(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer step alone, as timing runs it: nothing measured or read back to the host
        (no gradient norm, no get_scale(), no .item()). With a scaler, scaler.step unscales and
        skips optimizer.step() on inf/NaN (a fused optimizer takes the inf check on the device),
        and update() backs the scale off."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()


def total_grad_norm(params) -> float:
    """The L2 norm over all gradients, in float32 so a float16 model's norm does not overflow."""
    norms = [
        torch.linalg.vector_norm(p.grad.detach().float()) for p in params if p.grad is not None
    ]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else math.nan
