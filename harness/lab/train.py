"""One plain training loop and its evaluation, the same for every recipe.

The precision recipe (harness.lab.recipes) is the only thing that varies between runs; the caller
binds it to a device and enters it:

    with recipes.get("amp-fp16").bind(device) as precision:
        history = train(model, precision, task, steps=200, lr=1e-3)
        metrics = evaluate(model, precision, task)

Two hooks let a scenario observe or bend the loop without copying it: `loss_multiplier` (the
backward runs on loss x multiplier: small gradients, as late in training or with a summed loss
over few elements) and `on_step(model, report)`, called after each optimizer step while the
step's unscaled gradients are still in `.grad` (harness.lab.probes.StepGradients keeps their stats).

The optimizer is one of OPTIMIZERS by name, or the scenario's own: a factory `(model, lr) ->`
an optimizer or a list of optimizers (param groups of their own, several optimizers sharing
the recipe's one scaler: `Precision.step` steps each and updates the scale once).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from harness.common.errors import HarnessError, closest
from harness.lab.data import Task
from harness.lab.recipes import Optimizers, Precision, StepReport

# The named optimizers and their settings, all of them (the rest are torch's defaults).
OPTIMIZERS = {
    "adamw": "torch.optim.AdamW(lr=lr): betas (0.9, 0.999), eps 1e-8 (or adam_eps), "
    "weight_decay 0.01",
    "sgd": "torch.optim.SGD(lr=lr, momentum=0.9): no dampening, no Nesterov, no weight decay",
}
OptimizerFactory = Callable[[torch.nn.Module, float], Optimizers]


@dataclass
class History:
    """One entry per training step. A non-finite loss is recorded as it was (inf or nan)."""

    loss: list[float] = field(default_factory=list)
    scale: list[float] = field(default_factory=list)  # loss scale used by the step's backward
    skipped: list[bool] = field(default_factory=list)  # the scaler skipped optimizer.step()
    grad_norm: list[float] = field(default_factory=list)  # of the unscaled gradients
    step_time_s: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, list]:
        """Plain lists of floats and bools; json.dumps writes non-finite floats as NaN/Infinity."""
        return asdict(self)


def train(
    model: torch.nn.Module,
    precision: Precision,
    task: Task,
    steps: int,
    lr: float,
    batch_size: int = 64,
    optimizer: str | OptimizerFactory = "adamw",
    seed: int = 0,
    clip_norm: float | None = None,
    loss_multiplier: float = 1.0,
    on_step: Callable[[torch.nn.Module, StepReport], None] | None = None,
    watch_forward: contextlib.AbstractContextManager | None = None,
    adam_eps: float | None = None,
) -> History:
    """Train `model` in place for `steps` steps; `seed` picks the training batches.

    Backward runs on the task's loss times `loss_multiplier` (the history keeps the task's
    loss); `on_step(model, report)` is called after each step, with the step's gradients still
    in `.grad` (unscaled). `watch_forward`, a context manager entered around each step's forward
    and loss (harness.lab.probes.OpRanges), observes them. `optimizer`: a name of OPTIMIZERS
    or a factory `(model, lr)` returning an optimizer or a list of them, built once the model
    is prepared. `adam_eps`: the "adamw" optimizer's epsilon, when not torch's default.
    Training goes on after a non-finite loss: the scenarios observe divergence, not avoid it.
    """
    # AMP step 1: move (and for "half", cast) the model before the optimizer sees its parameters,
    # so the optimizer holds the tensors that are actually trained.
    model = precision.prepare(model)
    model.train()
    opts = _optimizers(optimizer, model, lr, adam_eps)
    device = precision.device.torch_device
    batches = task.batches(batch_size, seed)
    history = History()

    for _ in range(steps):
        x, y = next(batches)
        # The previous step ended synchronised, so the clock starts with the device idle; the
        # synthetic batch's generation is not timed, its copy to the device is.
        start = time.perf_counter()
        x, y = precision.cast_input(x), y.to(device)

        # AMP step 2: the forward pass, model and loss, under autocast when the recipe has one.
        with precision.forward(), watch_forward or contextlib.nullcontext():
            out = model(x)
            loss = task.loss(out, y)

        for opt in opts:
            opt.zero_grad(set_to_none=True)
        # AMP step 3: backward, on the loss multiplied by the scale when the recipe has a scaler
        # (and by the caller's multiplier, which no scaler knows about).
        precision.backward(loss * loss_multiplier if loss_multiplier != 1.0 else loss)
        # AMP step 4: unscale, measure the gradient norm, clip, step (or skip on inf/NaN) and
        # update the scale (once, after every optimizer's step).
        report = precision.step(opts, clip_norm)

        if device.type == "cuda":
            torch.cuda.synchronize()  # CUDA runs asynchronously: wait, or the time is launch time
        history.step_time_s.append(time.perf_counter() - start)
        history.loss.append(loss.item())
        history.scale.append(report.scale)
        history.skipped.append(report.skipped)
        history.grad_norm.append(report.grad_norm)
        if on_step is not None:  # after the clock: an observer's cost is not the step's
            on_step(model, report)  # the gradients of this step are still in .grad
    return history


def evaluate(model: torch.nn.Module, precision: Precision, task: Task) -> dict[str, float]:
    """Loss and accuracy on the task's validation split, in one batch, as the recipe runs them."""
    was_training = model.training
    model.eval()  # BatchNorm uses its running statistics, as at inference
    try:
        x, y = precision.cast_input(task.val[0]), task.val[1].to(precision.device.torch_device)
        with torch.no_grad(), precision.forward():
            out = model(x)
            return {"val_loss": task.loss(out, y).item(), "val_accuracy": task.accuracy(out, y)}
    finally:
        model.train(was_training)


def _optimizers(
    choice: str | OptimizerFactory, model: torch.nn.Module, lr: float, adam_eps: float | None
) -> tuple[torch.optim.Optimizer, ...]:
    if callable(choice):
        if adam_eps is not None:
            raise HarnessError(
                "train(adam_eps=...) sets the eps of the named optimizer 'adamw': with an "
                "optimizer factory, pass eps in the factory (torch.optim.AdamW(..., eps=...))"
            )
        made = choice(model, lr)
        optimizers = (made,) if isinstance(made, torch.optim.Optimizer) else made
        optimizers = tuple(optimizers) if isinstance(optimizers, list | tuple) else ()
        if not optimizers or not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
            raise HarnessError(
                f"train(optimizer={getattr(choice, '__name__', choice)!r}): the factory returned "
                f"{made!r}: return a torch.optim optimizer or a list of them, e.g. "
                "lambda model, lr: torch.optim.SGD(model.parameters(), lr=lr)"
            )
        problem = _ownership_problem(optimizers, model)
        if problem:
            raise HarnessError(
                f"train(optimizer={getattr(choice, '__name__', choice)!r}): {problem}: build the "
                "optimizers from the model the factory is given, e.g. lambda model, lr: "
                "torch.optim.SGD(model.parameters(), lr=lr); freeze what stays fixed with "
                "requires_grad_(False)"
            )
        return optimizers
    return (named_optimizer(choice, model, lr, adam_eps),)


def _ownership_problem(
    optimizers: tuple[torch.optim.Optimizer, ...], model: torch.nn.Module
) -> str | None:
    """What keeps the optimizers from stepping exactly the model's trainable parameters; None
    where nothing does. A factory that closed over another model steps tensors that are not
    trained: the model would train not at all, every step recorded as if it had."""
    held = {id(p) for opt in optimizers for group in opt.param_groups for p in group["params"]}
    own = {id(p) for p in model.parameters()}
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    foreign = len(held - own)
    untrained = [name for name, p in model.named_parameters() if p.requires_grad
                 and id(p) not in held]  # fmt: skip
    if not foreign and not untrained:
        return None
    said = f"{foreign} of the parameters its optimizers hold are not the model's" if foreign else ""
    if untrained:
        shown = ", ".join(untrained[:3]) + (", ..." if len(untrained) > 3 else "")
        said += ("; " if said else "") + (
            f"{len(untrained)} of the model's {len(trainable)} trainable parameters are in no "
            f"optimizer ({shown})"
        )
    return said


def named_optimizer(
    name: str, model: torch.nn.Module, lr: float, adam_eps: float | None
) -> torch.optim.Optimizer:
    """The optimizer OPTIMIZERS names, over the model's parameters."""
    if name == "adamw":
        if adam_eps is None:
            return torch.optim.AdamW(model.parameters(), lr=lr)
        return torch.optim.AdamW(model.parameters(), lr=lr, eps=adam_eps)
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    raise HarnessError(
        f"unknown optimizer {name!r}: known are {', '.join(OPTIMIZERS)} "
        f"(closest: {closest(name, OPTIMIZERS)}), or pass a factory (model, lr) -> optimizer"
    )
