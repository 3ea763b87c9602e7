"""The fixes `amp-harness diagnose` recommends, as code that applies them: a recommendation is
tried (for the quick look's steps, and for `--verify N` steps) before it is believed.

- `modules`: keep these modules in fp32: their parameters fp32, their inputs cast to fp32 and
  autocast off inside them (their outputs cast back to fp16 in a `half` model), as one does by
  hand with `torch.autocast(device_type, enabled=False)` around a block;
- `loss_fp32`: the loss computed outside autocast (`torch.autocast(device_type, enabled=False)`)
  on the model's outputs cast to fp32: casting the outputs inside autocast is not enough, since
  autocast runs the loss's own matmul (a contrastive loss's similarities) in fp16 again; the
  nested disabled region is how torch.autocast's documentation forces a subregion's dtype
  (https://pytorch.org/docs/stable/amp.html#torch.autocast, "autocast(enabled=False)
  subregions can be nested in autocast-enabled regions");
- `adam_eps`: AdamW with this epsilon (1e-8, torch's default, is 0 in fp16: a `half` model's
  optimizer then divides by zero);
- a fix that is another recipe (amp-bf16, amp-fp16's GradScaler) is that recipe's own run.

Each fix's `code()` is what a user applies, and where: the same code the fix runs here.
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
    loss_fp32: bool = False  # the loss computed outside autocast on fp32 outputs

    def describe(self) -> str:
        parts = []
        if self.modules:
            shown = ", ".join(self.modules[:4]) + (
                f" (+{len(self.modules) - 4} more)" if len(self.modules) > 4 else ""
            )
            parts.append(f"{shown} in fp32")
        if self.loss_fp32:
            parts.append("the loss computed outside autocast on fp32 outputs")
        if self.adam_eps is not None:
            parts.append(f"AdamW eps {self.adam_eps:g}")
        return f"{self.recipe} with {' and '.join(parts)}"

    def code(self, device_type: str) -> list[str]:
        """The lines a user adds to apply the fix, each saying where it goes: what the fix runs
        here (keep_in_fp32, loss_in_fp32, AdamW's eps), written in plain PyTorch."""
        lines = []
        if self.modules:
            lines += [
                "# after building the model, before creating the optimizer:",
                "def keep_in_fp32(module):",
                "    module.float()",
                "    inner = module.forward",
                "    def forward(*args, **kwargs):",
                "        args = [a.float() if torch.is_tensor(a) and a.is_floating_point() else a"
                " for a in args]",
                "        kwargs = {k: v.float() if torch.is_tensor(v) and v.is_floating_point()"
                " else v for k, v in kwargs.items()}",
                f"        with torch.autocast({device_type!r}, enabled=False):",
                "            out = inner(*args, **kwargs)",
                "        return out.half() if HALF_MODEL else out  # HALF_MODEL: model.half() used",
                "    module.forward = forward",
                *(f"keep_in_fp32(model.get_submodule({m!r}))" for m in self.modules),
            ]
        if self.loss_fp32:
            lines += [
                "# in the training step, the forward under autocast as before, then the loss"
                " outside it:",
                "out = model(x)",
                f"with torch.autocast({device_type!r}, enabled=False):",
                "    loss = loss_fn(out.float(), y)  # a tuple of outputs: each one .float()",
            ]
        if self.adam_eps is not None:
            lines += [
                "# where the optimizer is created:",
                f"optimizer = torch.optim.AdamW(model.parameters(), lr=LR, eps={self.adam_eps:g})",
            ]
        return lines


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


def loss_in_fp32(loss, device_type: str):
    """`loss` computed outside autocast, on the outputs cast to fp32 (each floating tensor of a
    tuple or dict): what Fix.code shows a user."""

    def computed(out, y):
        with torch.autocast(device_type, enabled=False):
            return loss(tree_map(_to(torch.float32), out), y)

    return computed


def _to(dtype: torch.dtype):
    def cast(x):
        return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    return cast
