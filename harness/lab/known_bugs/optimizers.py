"""Known bugs of fused and foreach optimizers beside AMP."""

from __future__ import annotations

import torch

from harness.lab.known_bugs.reproduction import Observed, Unavailable, reproduces

_N = 4096  # parameters: large enough that freed memory is reused for the momentum buffer
_POISON = 1e6  # what freed memory is filled with, so that an unwritten buffer is visibly wrong


def _fused_sgd_after_skipped_step(device: torch.device, fused: bool) -> float:
    """SGD(momentum=0.9) under GradScaler: an inf gradient skips the first step, then one real
    step with gradient 1 (unscaled) and lr 0.1. A momentum buffer created by the real step holds
    the gradient, so the weight goes 1 -> 0.9; returns the largest distance from 0.9."""
    weight = torch.nn.Parameter(torch.ones(_N, device=device))
    kind = {"fused": True} if fused else {"foreach": False}
    try:
        optimizer = torch.optim.SGD([weight], lr=0.1, momentum=0.9, **kind)
    except (RuntimeError, TypeError) as error:  # fused SGD on the CPU comes with 2.4
        raise Unavailable(f"fused SGD on {device.type}: {error}") from None
    scaler = torch.amp.GradScaler(device.type, init_scale=1024.0)
    scaler.scale((weight * torch.full((_N,), float("inf"), device=device)).sum()).backward()
    junk = [torch.full((_N,), _POISON, device=device) for _ in range(8)]
    del junk  # freed: the allocator hands this memory out next
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    scaler.scale(weight.sum()).backward()
    scaler.step(optimizer)
    scaler.update()
    distance = float((weight.detach() - 0.9).abs().max())
    return distance if distance == distance else float("inf")  # NaN: as far as it gets


@reproduces(
    "KB-FUSED-SGD-SKIPPED-MOMENTUM",
    devices=("cpu", "cuda"),
    control="the same loop with the single-tensor SGD (foreach=False)",
)
def fused_sgd_skipped_momentum(device: torch.device, control: bool) -> Observed:
    # Five tries: whether the allocator reuses the poisoned memory can vary from one to the next.
    worst = max(_fused_sgd_after_skipped_step(device, fused=not control) for _ in range(5))
    kind = "single-tensor" if control else "fused"
    return Observed(
        harm=worst > 1e-4,
        says=(
            f"{kind} SGD, momentum 0.9, lr 0.1, first step skipped by GradScaler on an inf "
            f"gradient: after the next step the weights are off the expected 0.9 by up to "
            f"{worst:.3g}"
        ),
        numbers={"distance_from_expected": worst},
    )


@reproduces(
    "KB-ADAM-FP16-EPS-NAN",
    devices=("cpu", "cuda"),
    control="the same step with the fused Adam (fused=True), which adds eps in fp32",
)
def adam_fp16_eps_nan(device: torch.device, control: bool) -> Observed:
    """One Adam step on fp16 weights of 1.0 with gradients (0, 1e-3, 0, 1): with eps 1e-8 added
    in fp16 (where it is 0), sqrt(v) + eps is 0 wherever v underflows, and m / 0 is NaN or inf."""
    weight = torch.nn.Parameter(torch.ones(4, device=device, dtype=torch.float16))
    kind = {"fused": True} if control else {"foreach": False}
    try:
        optimizer = torch.optim.Adam([weight], lr=1e-3, **kind)
    except (RuntimeError, TypeError) as error:  # fused Adam on the CPU comes with 2.4
        raise Unavailable(f"fused Adam on {device.type}: {error}") from None
    weight.grad = torch.tensor([0.0, 1e-3, 0.0, 1.0], device=device, dtype=torch.float16)
    optimizer.step()
    after = weight.detach().float()
    bad = int((~torch.isfinite(after)).sum())
    name = "fused" if control else "single-tensor"
    return Observed(
        harm=bad > 0,
        says=(
            f"{name} Adam(lr=1e-3, eps=1e-8), one step on fp16 weights 1.0 with gradients "
            f"(0, 1e-3, 0, 1): the weights become {[round(v, 4) for v in after.tolist()]} "
            f"({bad} of 4 not finite)"
        ),
        numbers={"nonfinite_weights": float(bad)},
    )
