"""Known bugs of scaled dot-product attention in half precision."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from harness.lab.autocast import torch_compile
from harness.lab.known_bugs.reproduction import Observed, reproduces


def _nan_fraction(tensor: torch.Tensor) -> float:
    return float(torch.isnan(tensor.float()).float().mean())


@reproduces(
    "KB-SDPA-FULLY-MASKED-ROW-NAN",
    devices=("cpu", "cuda"),
    control="the same batch with the padding row left attending to itself (no row fully masked)",
)
def sdpa_fully_masked_row(device: torch.device, control: bool) -> Observed:
    """A left-padded bf16 batch of 6 positions under a causal mask: position 0 is padding,
    masked out as a key, so query row 0 (which may only see key 0) is all False. A training step
    whose loss leaves the padding row out."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 2, 6, 8, generator=generator).to(device, torch.bfloat16).requires_grad_()
        for _ in range(3)
    )
    mask = torch.ones(6, 6, dtype=torch.bool, device=device).tril()
    mask[:, 0] = False  # the padding position is nobody's key
    if control:
        mask[0, 0] = True  # the workaround: the padding row attends to itself
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    loss = out[..., 1:, :].float().pow(2).mean()  # the padding row is left out of the loss
    loss.backward()
    out_nan = _nan_fraction(out)
    grad_nan = max(_nan_fraction(t.grad) for t in (q, k, v))
    loss_value = float(loss.detach())
    row = "attending to itself" if control else "fully masked"
    return Observed(
        harm=out_nan > 0 or grad_nan > 0 or loss_value != loss_value,
        says=(
            f"bf16 SDPA on {device.type}, padding row {row}: {out_nan:.0%} of the output and up "
            f"to {grad_nan:.0%} of a q/k/v gradient NaN (loss over the real rows {loss_value:.4g})"
        ),
        numbers={"output_nan_fraction": out_nan, "grad_nan_fraction": grad_nan},
    )


# --- inductor and the backward of attention in low precision -------------------------------------


class _AttentionNorm(nn.Module):
    """A fused q/k/v Linear, attention over its three chunks, and a LayerNorm: the attention
    block of a small transformer."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.norm(F.scaled_dot_product_attention(q, k, v))


@reproduces(
    "KB-INDUCTOR-SDPA-BWD-LOWP-ASSERT",
    devices=("cpu",),
    control="the same step run eagerly",
    slow=True,
)
def inductor_sdpa_backward(device: torch.device, control: bool) -> Observed:
    """A training step of _AttentionNorm under bf16 autocast, compiled by inductor at static
    shapes (torch.compile's first compile) or, in the control, run eagerly."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = _AttentionNorm().to(device)
    x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0)).to(device)
    arm = "run eagerly" if control else "compiled by inductor at static shapes"
    with torch_compile.denormals_kept():
        try:
            call = model if control else torch_compile.fresh(model, "inductor", dynamic=False)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                out = call(x)
            loss = out.float().pow(2).mean()
            loss.backward()
            failed, result = "", f"runs (loss {float(loss.detach()):.4g})"
        except Exception as exc:  # BackendCompilerFailed, InductorError, AssertionError, ...
            failed = torch_compile.error_line(exc)
            result = f"raises {failed}"
    return Observed(
        harm=bool(failed),
        says=(
            f"a training step of Linear -> SDPA -> LayerNorm under bf16 autocast {arm}: "
            f"{int(bool(failed))} of 1 steps failed; it {result}"
        ),
        numbers={"raised": float(bool(failed))},
    )
