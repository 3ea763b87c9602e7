"""Known bugs of float8 casts and their saturation."""

from __future__ import annotations

import torch

from harness.lab.known_bugs.reproduction import Observed, Unavailable, reproduces

_E4M3_MAX = 448.0


@reproduces(
    "KB-E4M3-CPU-CAST-NAN",
    devices=("cpu",),
    control="the same quantisation clamping to +-448 before the cast",
)
def e4m3_cpu_cast_nan(device: torch.device, control: bool) -> Observed:
    if not hasattr(torch, "float8_e4m3fn"):
        raise Unavailable("torch.float8_e4m3fn")
    # A per-tensor scale from a stale amax (delayed scaling): this batch has one outlier that
    # lands at 500 after scaling, past e4m3's largest finite 448.
    generator = torch.Generator().manual_seed(0)
    activations = torch.randn(8, 16, generator=generator).to(device) * 50
    activations[3, 5] = 500.0
    if control:
        activations = activations.clamp(-_E4M3_MAX, _E4M3_MAX)  # the workaround
    quantised = activations.to(torch.float8_e4m3fn).float()
    weight = torch.randn(16, 4, generator=generator).to(device)
    out = quantised @ weight
    nan_elements = int(torch.isnan(quantised).sum())
    nan_rows = int(torch.isnan(out).any(dim=1).sum())
    what = "clamped to 448 first" if control else "cast as it is"
    return Observed(
        harm=nan_elements > 0,
        says=(
            f"an activation of 500 {what} to float8_e4m3fn on {device.type}: {nan_elements} "
            f"NaN element(s) in the cast, {nan_rows} of 8 matmul output rows NaN"
        ),
        numbers={"nan_elements": float(nan_elements), "nan_output_rows": float(nan_rows)},
    )
