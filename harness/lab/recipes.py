"""Precision recipes: the unit of comparison.

A recipe is bound to a device and then used through four verbs, in training-loop order:

    with get("amp-fp16").bind(device) as precision:   # sets (and later restores) TF32 flags
        model = precision.prepare(model)             # 1. cast/move the model
        with precision.forward():                    # 2. the autocast context, if any
            loss = loss_fn(model(precision.cast_input(x)), y)
        precision.backward(loss)                     # 3. scaled or plain backward
        report = precision.step(optimizer)           # 4. unscale, measure, clip, step, update

A team's own recipe is a `Recipe(...)` built with the same fields, by keyword (bf16 parameters
without autocast, a scaler of its own, a model conversion such as fp8 linears); `step` takes a
list of optimizers that share the one scaler (docs/writing-a-scenario.md, "Your own recipe").
"""

from __future__ import annotations

import contextlib
import inspect
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.common.errors import HarnessError, closest
from harness.lab.machine.device import DeviceInfo
from harness.lab.tf32 import restore_tf32, set_tf32, tf32_settings

# What torch.autocast computes in, and the dtypes a model's parameters train in.
AUTOCAST_DTYPES = (torch.float16, torch.bfloat16)
PARAM_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class RecipeUnsupported(HarnessError):
    """The recipe cannot run on this device; the message is a skip reason."""


@dataclass(frozen=True)
class Recipe:
    """A precision recipe. Built-in ones come from `get(name)`; a team builds its own, by keyword:
    `Recipe("bf16-params", "bfloat16 parameters, no autocast", param_dtype=torch.bfloat16)`.
    Each field is checked when the recipe is built: a wrong one is a HarnessError naming the
    file and line that built it, the field and the fix."""

    name: str  # recorded as the recipe (record.param(recipe=...)): letters, digits, - _ . +
    summary: str  # one line: what the recipe does to a training step
    autocast_dtype: torch.dtype | None = None  # the dtype autocast computes in; None: no autocast
    # Loss scaling: False, True (torch.amp.GradScaler(device)), or a function of the device type
    # returning an enabled GradScaler of your own (init_scale, growth_interval, a subclass).
    scaler: bool | Callable[[str], torch.amp.GradScaler] = False
    param_dtype: torch.dtype = torch.float32  # the dtype `prepare` casts the parameters to
    tf32: bool = False  # TF32 matmul and cuDNN flags while the recipe is bound
    # Capabilities the recipe needs (built-in, or a team's scenarios/capabilities.py); name them
    # in the test's @pytest.mark.requires too, which skips or fails before the test runs: `bind`
    # raises RecipeUnsupported with the reason when one is lacking.
    needs: tuple[str, ...] = ()
    # Applied by `prepare` after the move and cast: a module swap (fp8 linears), a freeze.
    convert: Callable[[torch.nn.Module], torch.nn.Module] | None = None
    # file:line of the code that built it: what an error found later (convert's result) names.
    built_at: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "built_at", _builder())
        problem = _recipe_problem(self)
        if problem:
            raise HarnessError(f"{self.built_at}: Recipe({self.name!r}): {problem}")

    @property
    def reduced_dtype(self) -> torch.dtype | None:
        """The 16-bit dtype the recipe computes in (its autocast's, or its parameters'), if any."""
        if self.autocast_dtype is not None:
            return self.autocast_dtype
        return self.param_dtype if self.param_dtype != torch.float32 else None

    def unsupported_reason(self, device: DeviceInfo) -> str | None:
        reason = device.missing(*self.needs)
        return f"recipe {self.name} {reason}" if reason else None

    def bind(self, device: DeviceInfo) -> Precision:
        reason = self.unsupported_reason(device)
        if reason:
            raise RecipeUnsupported(reason)
        return Precision(self, device)


_RECIPE_NAME = re.compile(r"[A-Za-z0-9][\w.+-]*")


def _recipe_problem(recipe: Recipe) -> str | None:
    """What is wrong with a recipe's fields, with the fix; None when nothing is."""
    if not isinstance(recipe.name, str) or not _RECIPE_NAME.fullmatch(recipe.name):
        return "name: use letters, digits and - _ . + (it is recorded), e.g. 'bf16-params'"
    if not isinstance(recipe.summary, str) or not recipe.summary.strip():
        return "summary: say in one line what the recipe does to a training step"
    if recipe.autocast_dtype is not None and recipe.autocast_dtype not in AUTOCAST_DTYPES:
        return (
            f"autocast_dtype={recipe.autocast_dtype!r}: use a floating torch.dtype autocast "
            f"computes in, {' or '.join(map(str, AUTOCAST_DTYPES))} (it disables itself with a "
            "warning for another), or None for no autocast"
        )
    if recipe.param_dtype not in PARAM_DTYPES:
        return (
            f"param_dtype={recipe.param_dtype!r}: use a floating torch.dtype parameters train "
            f"in, {', '.join(map(str, PARAM_DTYPES))}; for fp8 matmuls keep them float32 and "
            "swap the layers with convert= (harness.lab.fp8.to_float8_linears)"
        )
    if not isinstance(recipe.tf32, bool):
        # tf32="no" is a non-empty string, true to Python: it turned TF32 on.
        return f"tf32={recipe.tf32!r}: use True or False"
    if not isinstance(recipe.scaler, bool) and not callable(recipe.scaler):
        return (
            f"scaler={recipe.scaler!r}: use True (torch.amp.GradScaler(device)), False, or a "
            "function of the device type, e.g. lambda device: torch.amp.GradScaler(device, "
            "init_scale=2.0**10)"
        )
    if not isinstance(recipe.needs, tuple) or not all(isinstance(n, str) for n in recipe.needs):
        # needs=("bf16_autocast") is a string, not a tuple: the commonest slip.
        example = (recipe.needs,) if isinstance(recipe.needs, str) else ("bf16_autocast",)
        return f"needs={recipe.needs!r}: use a tuple of capability names, e.g. needs={example!r}"
    if recipe.convert is not None and not _takes_one_argument(recipe.convert):
        return f"convert={recipe.convert!r}: use a function taking the model and returning it"
    return None


def _takes_one_argument(fn: object) -> bool:
    if not callable(fn):
        return False
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        return False
    except ValueError:  # a builtin without a signature: judged by its call
        return True
    return True


def _builder() -> str:
    """file:line of the code that built the recipe (outside this module and the dataclass)."""
    here = Path(__file__).resolve()
    frame = sys._getframe(1)  # the frames alone: inspect.stack() reads every frame's source
    while frame is not None:
        name = frame.f_code.co_filename
        if name != "<string>" and Path(name).resolve() != here:
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return str(here)


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
    skipped: bool  # the scaler found inf/NaN and skipped optimizer.step() (of any optimizer)
    grad_norm: float  # total L2 norm of the true (unscaled) gradients, computed in float32
    skipped_each: tuple[bool, ...] = ()  # per optimizer, in the order `step` was given them


Optimizers = torch.optim.Optimizer | Sequence[torch.optim.Optimizer]


class Precision:
    """A recipe bound to a device: a context manager that owns the TF32 flags and the scaler."""

    def __init__(self, recipe: Recipe, device: DeviceInfo):
        self.recipe = recipe
        self.device = device
        self.scaler = _scaler(recipe, device.type)
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
        model = model.to(device=self.device.torch_device, dtype=self.recipe.param_dtype)
        if self.recipe.convert is None:
            return model
        converted = self.recipe.convert(model)
        if not isinstance(converted, torch.nn.Module):
            recipe = self.recipe
            raise HarnessError(
                f"{recipe.built_at}: Recipe({recipe.name!r}): convert returned {converted!r}, "
                "not a module: return the model (a swap made in place returns it too)"
            )
        return converted

    def cast_input(self, x: torch.Tensor) -> torch.Tensor:
        """Move a batch to the device; floating inputs follow the parameters' dtype (a half or
        bf16-parameter model takes its inputs in that dtype)."""
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

    def step(self, optimizer: Optimizers, clip_norm: float | None = None) -> StepReport:
        """Unscale, measure, clip, step (or skip on inf/NaN), update the scale. `optimizer` may
        be a list of optimizers sharing this scaler: each is unscaled and stepped, the norm and
        clipping cover all their parameters, and one `scaler.update()` follows all the steps,
        as GradScaler requires."""
        optimizers = _each(optimizer)
        params = [p for opt in optimizers for group in opt.param_groups for p in group["params"]]
        scale = self.scaler.get_scale() if self.scaler is not None else 1.0
        if self.scaler is not None:
            # Divide the gradients by the scale *before* measuring or clipping them: clipping
            # scaled gradients would clip values up to `scale` times too large.
            for opt in optimizers:
                self.scaler.unscale_(opt)
        grad_norm = total_grad_norm(params)
        if clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, clip_norm)
        self._step_each(optimizers)
        skipped = tuple(self._skipped(opt) for opt in optimizers)
        if self.scaler is not None:
            self.scaler.update()
        return StepReport(scale, any(skipped), grad_norm, skipped)

    def update(self, optimizer: Optimizers) -> None:
        """The optimizer step alone, as timing runs it: nothing measured or read back to the host
        (no gradient norm, no get_scale(), no .item()). With a scaler, scaler.step unscales and
        skips optimizer.step() on inf/NaN (a fused optimizer takes the inf check on the device),
        and one update() after all the optimizers backs the scale off."""
        self._step_each(_each(optimizer))
        if self.scaler is not None:
            self.scaler.update()

    def _step_each(self, optimizers: tuple[torch.optim.Optimizer, ...]) -> None:
        for opt in optimizers:
            if self.scaler is None:
                opt.step()
            else:
                self.scaler.step(opt)

    def _skipped(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether the scaler skipped this optimizer's step: the inf/NaN it found in that
        optimizer's gradients, which scaler.step itself reads to decide (a fused optimizer gets
        the same flag), kept per optimizer until update() (torch 2.4 to 2.14). The scale falling
        says only that some optimizer overflowed, and nothing under a scaler that never backs
        off."""
        if self.scaler is None:
            return False
        found = self.scaler._found_inf_per_device(optimizer)
        return bool(sum(float(flag) for flag in found.values()))


def _each(optimizer: Optimizers) -> tuple[torch.optim.Optimizer, ...]:
    optimizers = (optimizer,) if isinstance(optimizer, torch.optim.Optimizer) else tuple(optimizer)
    if not optimizers or not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
        raise HarnessError(
            f"Precision.step/update: {optimizer!r} is not an optimizer or a list of them: pass "
            "torch.optim optimizers, e.g. precision.step([encoder_opt, decoder_opt])"
        )
    return optimizers


def _scaler(recipe: Recipe, device_type: str) -> torch.amp.GradScaler | None:
    """The recipe's scaler on this device. Always name the device: GradScaler's default, "cuda",
    silently disables itself on the CPU (and a team's factory is held to the same)."""
    if recipe.scaler is False:
        return None
    if recipe.scaler is True:
        return torch.amp.GradScaler(device_type)
    made = recipe.scaler(device_type)
    if not isinstance(made, torch.amp.GradScaler) or not made.is_enabled():
        raise HarnessError(
            f"recipe {recipe.name}: scaler({device_type!r}) returned {made!r}, not an enabled "
            "torch.amp.GradScaler: return torch.amp.GradScaler(device, ...) with the device it "
            "is given (without it GradScaler means 'cuda' and disables itself elsewhere)"
        )
    return made


def total_grad_norm(params) -> float:
    """The L2 norm over all gradients, in float32 so a float16 model's norm does not overflow."""
    norms = [
        torch.linalg.vector_norm(p.grad.detach().float()) for p in params if p.grad is not None
    ]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else math.nan
