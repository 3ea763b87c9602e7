"""Known bugs of GradScaler itself (its inf check, skipped steps, the scale's update)."""

from __future__ import annotations

import warnings

import torch

from harness.lab.known_bugs.reproduction import Observed, reproduces


def _first_real_lr(device: torch.device, skips: int, guard: bool) -> float:
    """SGD with a 10-step linear LR warmup under GradScaler: the first `skips` steps overflow.
    Returns the learning rate of the first step that changes the weights. With `guard`, the
    scheduler steps only where the scale did not drop (the step was not skipped)."""
    weight = torch.nn.Parameter(torch.ones(4, device=device))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**16)
    for step in range(8):
        gradient = torch.full((4,), float("inf") if step < skips else 1.0, device=device)
        lr = optimizer.param_groups[0]["lr"]
        before = weight.detach().clone()
        scaler.scale((weight * gradient).sum()).backward()
        scale = scaler.get_scale()
        scaler.step(optimizer)  # skips optimizer.step() on the inf, and returns None either way
        scaler.update()
        if not guard or scaler.get_scale() >= scale:
            with warnings.catch_warnings():
                # After a skipped first step the scheduler warns that it ran before
                # optimizer.step(): the one hint a user gets, and only on the first step.
                warnings.simplefilter("ignore", UserWarning)
                warmup.step()
        optimizer.zero_grad()
        if not torch.equal(before, weight.detach()):
            return lr
    return float("nan")


@reproduces(
    "KB-GRADSCALER-SCHEDULER-DESYNC",
    devices=("cpu", "cuda"),
    control="the same loop stepping the scheduler only where the scale did not drop",
)
def gradscaler_scheduler_desync(device: torch.device, control: bool) -> Observed:
    lr = _first_real_lr(device, skips=3, guard=control)
    expected = 0.1  # the warmup's first rate: 1/10 of the base
    scheduler = "only after real steps" if control else "every iteration"
    return Observed(
        harm=abs(lr - expected) > 1e-9,
        says=(
            f"10-step LR warmup, the first 3 steps skipped by GradScaler on inf gradients, the "
            f"scheduler stepped {scheduler}: the first real update runs at lr {lr:.3g} where the "
            f"warmup starts at {expected:.3g} ({lr / expected:.3g}x)"
        ),
        numbers={"first_real_lr": lr, "warmup_first_lr": expected},
    )
