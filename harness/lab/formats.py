"""What arithmetic in a floating-point dtype shows about it, measured from tensors on a device
(never read from a table): the machine epsilon by halving, the largest power of two by doubling
until inf, the smallest normal and subnormal by halving, and the bit pattern of that inf.
scenarios/test_formats.py (FP16 vs FP32) and scenarios/test_bf16.py (bf16) measure with it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# The integer dtype of each float's width: to read a value's bit pattern.
INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}


@dataclass(frozen=True)
class Format:
    """What arithmetic in one dtype shows about it."""

    eps: float  # 2**-mantissa: the smallest eps with 1 + eps != 1
    max_pow2: float  # the largest finite power of two
    max_finite: float
    min_normal: float  # the smallest power of two x with x + x*eps != x
    min_subnormal: float  # the last non-zero value when halving 1 until zero
    inf_bits: int  # the bit pattern of the inf reached by doubling

    @property
    def mantissa_bits(self) -> int:
        return round(-math.log2(self.eps))

    @property
    def exponent_bits(self) -> int:
        # The largest exponent is the bias, 2**(e-1) - 1.
        return round(math.log2(math.log2(self.max_pow2) + 1)) + 1


def measure_format(dtype: torch.dtype, device: torch.device) -> Format:
    one = torch.tensor(1.0, dtype=dtype, device=device)
    eps = one
    while bool((one + eps / 2) != one):
        eps = eps / 2
    pow2 = one
    while bool(torch.isfinite(pow2 * 2)):
        pow2 = pow2 * 2
    normal = one
    while bool((normal / 2 + normal / 2 * eps) != normal / 2):
        normal = normal / 2
    tiny = one
    while bool((tiny / 2) != 0):
        tiny = tiny / 2
    return Format(
        eps=eps.item(),
        max_pow2=pow2.item(),
        max_finite=(pow2 * (2 - eps)).item(),
        min_normal=normal.item(),
        min_subnormal=tiny.item(),
        inf_bits=(pow2 * 2).view(INT_VIEW[dtype]).item(),
    )
