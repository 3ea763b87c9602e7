"""The harm a compiled autocast(enabled=False) region does to float16 training: a GradScaler loop
of a model whose float32 head sits in such a region, eager or compiled, step by step.

Eager runs the region's backward in float32; AOTAutograd traces a compiled region's backward
under the autocast its forward ran in (torch._functorch.config.backward_pass_autocast's
default, "same_as_forward"; pytorch/pytorch#153044, #179804), so the head's weight gradient is
computed in float16 and overflows at a loss scale eager's float32 holds. GradScaler then skips
the step and halves the scale until the scaled gradient fits float16: the compiled model does
not train while the eager one does. Shared by scenarios/test_compiled_parity.py (the claim) and
harness.lab.known_bugs.parity (the known bug's reproduction).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from harness.lab.autocast import torch_compile

INIT_SCALE = 2.0**16  # GradScaler's default
BATCH, WIDTH = 8, 4


class DisabledRegion(nn.Module):
    """A low-precision matmul under autocast, then an autocast(enabled=False) region holding a
    float32 Linear: eager runs the region's backward in float32."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mix", torch.ones(WIDTH, WIDTH))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x @ self.mix  # float16 under autocast: 4.0 each
        with torch.autocast(x.device.type, enabled=False):
            return self.head(hidden.float())


@dataclass(frozen=True)
class ScaledHistory:
    """Per step of the loop: the loss, the scale after update(), whether the step was skipped
    (the scale went down), and the head weight's non-finite gradient entries."""

    losses: list[float]
    scales: list[float]
    skipped: list[bool]
    nonfinite: list[int]
    moved: float  # how far the head's weight moved over the loop

    @property
    def steps_skipped(self) -> int:
        return sum(self.skipped)


def scaled_training(
    device: torch.device,
    backend: str | None,
    setting=None,
    steps: int = 4,
    lr: float = 1e-3,
    init_scale: float = INIT_SCALE,
) -> ScaledHistory:
    """`steps` GradScaler steps (from `init_scale`) of DisabledRegion under float16 autocast, its
    forward compiled afresh with `backend` (eager where None), with `setting` (a
    torch_compile.Setting) in force where given. Flush-to-zero is left as it was (2.4's
    inductor kernels turn it on for the process)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = DisabledRegion().to(device)
    start = model.head.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale)
    x = torch.ones(BATCH, WIDTH, device=device)
    losses, scales, skipped, nonfinite = [], [], [], []
    with (
        setting.applied() if setting else contextlib.nullcontext(),
        torch_compile.denormals_kept(),
    ):
        call = model if backend is None else torch_compile.fresh(model, backend)
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.float16):
                loss = call(x).float().sum()
            scale = scaler.get_scale()
            scaler.scale(loss).backward()
            nonfinite.append(int((~torch.isfinite(model.head.weight.grad)).sum()))
            scaler.step(optimizer)
            scaler.update()
            losses.append(float(loss.detach()))
            scales.append(scaler.get_scale())
            skipped.append(scaler.get_scale() < scale)
    moved = float((model.head.weight.detach() - start).abs().max())
    return ScaledHistory(losses, scales, skipped, nonfinite, moved)
