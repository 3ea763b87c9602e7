"""The fixes `amp-harness diagnose` recommends, as code that applies them: a recommendation is
tried (for the quick look's steps, and for `--verify N` steps) before it is believed.

- `modules`: keep these modules in fp32: their parameters fp32, their inputs cast to fp32 and
  autocast off inside them (their outputs cast back to fp16 in a `half` model), as one does by
  hand with `torch.autocast(device_type, enabled=False)` around a block;
- `adam_eps`: AdamW with this epsilon (1e-8, torch's default, is 0 in fp16: a `half` model's
  optimizer then divides by zero);
- a fix that is another recipe (amp-bf16, amp-fp16's GradScaler) is that recipe's own run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._pytree import tree_map

from harness.lab.machine.device import DeviceInfo
from harness.lab.recipes import Precision, Recipe

# An AdamW epsilon fp16 holds as a normal number (fp16's smallest normal is 6.1e-5).
FP16_SAFE_EPS = 1e-4


@dataclass(frozen=True)
class Fix:
    recipe: str  # the recipe the fix is applied to
    modules: tuple[str, ...] = ()  # kept in fp32
    adam_eps: float | None = None

    def describe(self) -> str:
        parts = []
        if self.modules:
            shown = ", ".join(self.modules[:4]) + (
                f" (+{len(self.modules) - 4} more)" if len(self.modules) > 4 else ""
            )
            parts.append(f"{shown} in fp32")
        if self.adam_eps is not None:
            parts.append(f"AdamW eps {self.adam_eps:g}")
        return f"{self.recipe} with {' and '.join(parts)}"


class Fixed(Precision):
    """A recipe bound to a device, with modules of the model kept in fp32 once it is prepared."""

    def __init__(self, recipe: Recipe, device: DeviceInfo, modules: tuple[str, ...]):
        super().__init__(recipe, device)
        self.modules = modules

    def prepare(self, model: nn.Module) -> nn.Module:
        model = super().prepare(model)
        for name in self.modules:
            keep_in_fp32(model.get_submodule(name), self.device.type, self.recipe.param_dtype)
        return model


def keep_in_fp32(module: nn.Module, device_type: str, model_dtype: torch.dtype) -> None:
    """Run `module` in fp32 whatever the recipe around it does."""
    module.float()
    inner = module.forward

    def forward(*args, **kwargs):
        args, kwargs = tree_map(_to(torch.float32), (args, kwargs))
        with torch.autocast(device_type, enabled=False):
            out = inner(*args, **kwargs)
        # A half model's next layer expects fp16; under autocast the next op casts as it needs.
        return out if model_dtype == torch.float32 else tree_map(_to(model_dtype), out)

    module.forward = forward


def _to(dtype: torch.dtype):
    def cast(x):
        return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    return cast
