"""FP8 measured from tensors: the two formats bit pattern by bit pattern, casts against an exact
reference, scaled quantisation at three granularities, and a reference model of delayed
scaling (scenarios/test_fp8.py, docs/fp8.md).

Nothing here is read from a table: a format's values are its 256 bit patterns viewed as the
dtype and widened to float64 by torch; the reference rounding is computed from those values
(the nearest, ties to the even bit pattern), never from a formula of the format. A scale is
what torch's `_scaled_mm` takes: the factor that *dequantises* (x ~= q * scale), so quantising
divides by it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial

import torch

# A build without the float8 dtypes (the supported range starts at torch 2.4, and not every
# build has them) still imports this module, with None for each: the FP8 scenarios skip with
# `lacking()` as their reason, and the speed scenarios' fp8 arms are held to the capabilities.
_DTYPES = ("float8_e4m3fn", "float8_e5m2")
E4M3, E5M2 = (getattr(torch, name, None) for name in _DTYPES)
FORMATS = {"e4m3": E4M3, "e5m2": E5M2}


def lacking() -> str | None:
    """Why this torch cannot run FP8 at all, as a skip reason; None where it has both dtypes
    (read now: torch is asked, not this module's import)."""
    missing = [name for name in _DTYPES if not hasattr(torch, name)]
    if not missing:
        return None
    return f"needs torch's float8 dtypes: torch {torch.__version__} has no {', '.join(missing)}"


def short(dtype: torch.dtype) -> str:
    return next((name for name, d in FORMATS.items() if d == dtype), str(dtype))


# --- the formats, pattern by pattern ------------------------------------------------------------


@dataclass(frozen=True)
class Patterns:
    """What the 256 bit patterns of an 8-bit float are, as torch widens them."""

    values: tuple[float, ...]  # by pattern, 0..255 (NaN where the pattern is NaN)

    @property
    def finite(self) -> list[float]:
        return [v for v in self.values if math.isfinite(v)]

    @property
    def max_finite(self) -> float:
        return max(self.finite)

    @property
    def min_subnormal(self) -> float:
        return min(v for v in self.finite if v > 0)

    @property
    def nan_patterns(self) -> list[int]:
        return [p for p, v in enumerate(self.values) if math.isnan(v)]

    @property
    def inf_patterns(self) -> list[int]:
        return [p for p, v in enumerate(self.values) if math.isinf(v)]

    def min_normal(self, mantissa_bits: int) -> float:
        """The smallest positive value whose spacing to the next is 2**-mantissa_bits of it:
        below it the spacing stays that of the subnormals (gradual underflow)."""
        positive = sorted(v for v in set(self.finite) if v > 0)
        gaps = {v: nxt - v for v, nxt in zip(positive, positive[1:], strict=False)}
        return min(v for v, gap in gaps.items() if gap == v * 2.0**-mantissa_bits)

    def mantissa_bits(self) -> int:
        """Read off the values: the spacing just above 1 is 2**-mantissa_bits."""
        above = min(v for v in self.finite if v > 1.0)
        return round(-math.log2(above - 1.0))


def patterns(dtype: torch.dtype, device: torch.device | str = "cpu") -> Patterns:
    bits = torch.arange(256, dtype=torch.int32, device=device).to(torch.uint8)
    return Patterns(tuple(bits.view(dtype).double().cpu().tolist()))


# --- casts against the exact reference ---------------------------------------------------------


def cast(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`values` cast to the FP8 dtype and widened back to float64: what torch's cast kept."""
    return values.to(dtype).double()


def nearest_even(value: float, table: Patterns) -> float:
    """The reference rounding of a finite `value` within the format's range: the nearest finite
    value, a tie going to the even bit pattern (an even last mantissa bit)."""
    candidates = sorted(
        ((abs(v - value), p) for p, v in enumerate(table.values) if math.isfinite(v)),
        key=lambda c: (c[0], c[1] % 2, c[1]),
    )
    return table.values[candidates[0][1]]


def adjacent(table: Patterns) -> list[tuple[float, float]]:
    """Every pair of adjacent positive finite values, zero and the subnormals included: their
    midpoints are where round-to-nearest-even and every other rule part ways."""
    values = sorted(v for v in set(table.finite) if v >= 0)
    return list(zip(values, values[1:], strict=False))


# --- scaled quantisation -------------------------------------------------------------------------


def scale_for(amax: torch.Tensor, dtype: torch.dtype, floor: float | None = 1e-12) -> torch.Tensor:
    """The dequantising scale mapping `amax` to the format's largest value: amax / max. With
    `floor`, amax is clamped from below first (an all-zero block gets a finite scale); without
    it, an all-zero block's scale is 0 and quantising divides by it."""
    if floor is not None:
        amax = amax.clamp(min=floor)
    return amax.double() / torch.finfo(dtype).max


def quantised(x: torch.Tensor, dtype: torch.dtype, block: tuple[int, int] | None,
              floor: float | None = 1e-12) -> torch.Tensor:  # fmt: skip
    """`x` (2-D) quantised to `dtype` with one scale per block of shape `block` (None: one for
    the whole tensor; (1, n): per row; (1, 128): DeepSeek-V3's tiles; (128, 128): its weight
    blocks), then dequantised in float64: what a matmul on the FP8 operands sees."""
    rows, cols = x.shape
    br, bc = block or (rows, cols)
    assert rows % br == 0 and cols % bc == 0, f"{tuple(x.shape)} does not tile by {(br, bc)}"
    tiles = x.double().reshape(rows // br, br, cols // bc, bc)
    amax = tiles.abs().amax(dim=(1, 3), keepdim=True)
    scale = scale_for(amax, dtype, floor)
    q = (tiles / scale).to(dtype)
    return (q.double() * scale).reshape(rows, cols)


def relative_error(approx: torch.Tensor, exact: torch.Tensor, mask: torch.Tensor | None = None):
    """|approx - exact| / |exact|, over `mask` (the entries judged) where given; the median."""
    exact, approx = exact.double(), approx.double()
    keep = (exact != 0) if mask is None else mask & (exact != 0)
    return ((approx - exact).abs()[keep] / exact.abs()[keep]).median().item()


# --- FP8 GEMMs as a GPU runs them (scenarios/test_fp8_speed.py, test_speed.py) --------------------


def scaled_mm(qa: torch.Tensor, qb: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              **options) -> torch.Tensor:  # fmt: skip
    """torch._scaled_mm's product (`scale_a`, `scale_b` dequantise); some releases return it
    in a tuple with an amax."""
    out = torch._scaled_mm(qa, qb, scale_a=scale_a, scale_b=scale_b, **options)
    return out[0] if isinstance(out, tuple) else out


def column_major(x: torch.Tensor) -> torch.Tensor:
    """`x`'s values stored transposed: the layout cuBLASLt takes an FP8 GEMM's second operand
    in (a weight's transpose, as nn.Linear uses it, is already so)."""
    return x.t().contiguous().t()


def quantise_tensorwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` in E4M3 with one dynamic scale (its own amax, floored) and that dequantising scale in
    float32, the operands `_scaled_mm` takes: what dynamic tensorwise scaling does to each GEMM
    input every step. The cast keeps `x`'s layout (a column-major `x` stays so)."""
    scale = scale_for(x.abs().amax(), E4M3).float()
    return (x / scale).to(E4M3), scale


def prequantised_gemm(a: torch.Tensor, b: torch.Tensor, out_dtype=torch.bfloat16):
    """A call of a @ b's FP8 kernel alone, its inputs quantised once beforehand (Transformer
    Engine's "pre-quantized" GEMM): tensorwise scales, `b` column-major, `out_dtype` out."""
    (qa, sa), (qb, sb) = quantise_tensorwise(a), quantise_tensorwise(column_major(b))
    return partial(scaled_mm, qa, qb, sa, sb, out_dtype=out_dtype)


def quantising_gemm(a: torch.Tensor, b: torch.Tensor, out_dtype=torch.bfloat16):
    """A call of a @ b from high-precision inputs that quantises both on every call (amax,
    scale, cast), then runs the FP8 kernel: what a training step with dynamic tensorwise scaling
    pays per GEMM (Transformer Engine's "autocast" number), unfused, as eager runs it."""
    b = column_major(b)

    def call() -> torch.Tensor:
        (qa, sa), (qb, sb) = quantise_tensorwise(a), quantise_tensorwise(b)
        return scaled_mm(qa, qb, sa, sb, out_dtype=out_dtype)

    return call


# --- delayed scaling: a reference model of Transformer Engine's recipe --------------------------


@dataclass
class DelayedScaling:
    """Transformer Engine's DelayedScaling, as its docs state it: each step quantises with a
    scale computed from the amax *history* of earlier steps (the step's own amax is recorded
    after it is quantised): scale = fp8_max / (max(history) * 2**margin), values multiplied by
    it before the cast (TE's scale is the quantising one, the inverse of `_scaled_mm`'s)."""

    dtype: torch.dtype = E4M3
    history_len: int = 16
    margin: int = 0
    history: list[float] = field(default_factory=list)

    def quantise(self, x: torch.Tensor) -> tuple[torch.Tensor, float]:
        """`x` through FP8 with this step's delayed scale, dequantised; and the scale used."""
        fp8_max = torch.finfo(self.dtype).max
        amax = max(self.history) if self.history else float(x.abs().max())
        scale = fp8_max / (amax * 2.0**self.margin)
        out = (x.double() * scale).to(self.dtype).double() / scale
        self.history = (self.history + [float(x.abs().max())])[-self.history_len :]
        return out, scale


def current_scaling(x: torch.Tensor, dtype: torch.dtype = E4M3) -> torch.Tensor:
    """The same cast with the step's own amax (current scaling): the control of a spike."""
    return quantised(x.reshape(1, -1), dtype, None).reshape(x.shape)


# --- FP8 training, emulated: linears through E4M3 forward and E5M2 backward ---------------------


def _through(x: torch.Tensor, dtype: torch.dtype, scaled: bool) -> torch.Tensor:
    """`x` quantised to `dtype` and back to its own dtype, with one scale for the tensor (the
    current amax; none where not `scaled`: the raw values cast, as if no scale were kept)."""
    if not scaled:
        return x.to(dtype).to(x.dtype)
    return quantised(x.reshape(1, -1), dtype, None).reshape(x.shape).to(x.dtype)


class _Float8Matmul(torch.autograd.Function):
    """x @ w.T with x and w through E4M3 and the incoming gradient through E5M2, each with one
    scale per tensor: Micikevicius et al.'s recipe, as torchao's Float8Linear computes it with
    tensor-wise scaling, emulated in float32 (the products of FP8 values are exact there)."""

    @staticmethod
    def forward(ctx, x, weight, scaled):
        xq, wq = _through(x, E4M3, scaled), _through(weight, E4M3, scaled)
        ctx.save_for_backward(xq, wq)
        ctx.scaled = scaled
        return xq @ wq.t()

    @staticmethod
    def backward(ctx, grad):
        xq, wq = ctx.saved_tensors
        gq = _through(grad, E5M2, ctx.scaled)
        grad_x = gq @ wq
        grad_w = gq.reshape(-1, gq.shape[-1]).t() @ xq.reshape(-1, xq.shape[-1])
        return grad_x, grad_w, None


class Float8Linear(torch.nn.Linear):
    """A Linear whose matmul goes through FP8 (forward E4M3, gradients E5M2), its weight kept in
    float32 as master weights. `scaled=False`: no scaling, the negative control."""

    scaled: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _Float8Matmul.apply(x, self.weight, self.scaled)
        return out + self.bias if self.bias is not None else out


def to_float8_linears(model: torch.nn.Module, scaled: bool = True) -> torch.nn.Module:
    """`model` with every nn.Linear made a Float8Linear in place (weights kept): the `convert`
    of an FP8 recipe (harness.lab.recipes.Recipe)."""
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = Float8Linear
            module.scaled = scaled
    return model
