"""FP16 vs FP32 as formats: FMT-BITS, FMT-RANGE, FMT-BYTES, NUM-UNDERFLOW, NUM-OVERFLOW.

Everything is measured from tensors on the session's device, never read from a table:
- the mantissa width from the machine epsilon found by halving (1 + eps != 1 in the dtype), the
  exponent width from the largest finite power of two (doubling until inf) and, as a cross-check,
  from the bit pattern of that inf;
- the range endpoints by halving until zero and doubling until inf, and the relative rounding
  error below the smallest normal (where the article's lower bounds, the subnormal minima, lie);
- the bytes of real tensors and of a model's parameters before and after `.half()`;
- the exact fp32 -> fp16 rounding edges (bisection over fp32 bit patterns) at both ends, a tiny
  fp16 gradient that becomes 0 unless the loss is scaled, and what an inf gradient does with and
  without `torch.amp.GradScaler`.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from harness.lab.formats import INT_VIEW, Format, measure_format

ARTICLE_BITS = {torch.float16: (5, 10), torch.float32: (8, 23)}  # (exponent, mantissa)
LOSS_SCALE = 65536.0  # GradScaler's default init_scale


def pattern_bits(fmt: Format, dtype: torch.dtype) -> tuple[int, int]:
    """(exponent, mantissa) widths read off the inf bit pattern: all exponent bits set."""
    width = torch.iinfo(INT_VIEW[dtype]).bits
    exponent = bin(fmt.inf_bits & (2**width - 1)).count("1")
    return exponent, width - 1 - exponent


def relative_rounding_error(value: float, dtype: torch.dtype, device: torch.device) -> float:
    exact = torch.tensor(value, dtype=torch.float64, device=device)
    return ((exact.to(dtype).double() - exact).abs() / exact).item()


def to_fp16(values: list[float], device: torch.device) -> list[float]:
    """Round fp32 values to fp16 on the device, the conversion an fp16 model applies."""
    return torch.tensor(values, dtype=torch.float32, device=device).half().float().tolist()


def fp16_cast_edge(low: float, high: float, changed, device: torch.device) -> tuple[float, float]:
    """The two adjacent fp32 values between `low` and `high` where `changed(fp16 value)` flips:
    a bisection over fp32 bit patterns (monotonic for positive floats)."""

    def bits(x: float) -> int:
        return torch.tensor(x, dtype=torch.float32).view(torch.int32).item()

    def value(b: int) -> float:
        return torch.tensor(b, dtype=torch.int32).view(torch.float32).item()

    lo, hi = bits(low), bits(high)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if changed(to_fp16([value(mid)], device)[0]):
            hi = mid
        else:
            lo = mid
    return value(lo), value(hi)


def article_number(measured: float, article: str) -> bool:
    """True when `measured`, written with the article's significant digits, is its number."""
    digits = len(article.split("e")[0].replace(".", "")) - 1
    return float(f"{measured:.{digits}e}") == float(article)


@pytest.mark.claim("FMT-BITS")
def test_exponent_and_mantissa_bits_are_measured(amp_device, record):
    device = amp_device.torch_device
    measured, pattern = {}, {}
    for dtype in (torch.float16, torch.float32, torch.bfloat16):
        fmt = measure_format(dtype, device)
        measured[dtype] = (fmt.exponent_bits, fmt.mantissa_bits)
        pattern[dtype] = pattern_bits(fmt, dtype)
        name = str(dtype).removeprefix("torch.")
        record.metric(
            **{
                f"{name}/exponent_bits": measured[dtype][0],
                f"{name}/mantissa_bits": measured[dtype][1],
                f"{name}/eps": fmt.eps,
                f"{name}/pattern_exponent_bits": pattern[dtype][0],
            }
        )

    agree = measured == pattern
    as_article = all(measured[d] == bits for d, bits in ARTICLE_BITS.items())
    verdict = "inconclusive" if not agree else "confirmed" if as_article else "refuted"
    f16, f32, b16 = (measured[d] for d in (torch.float16, torch.float32, torch.bfloat16))
    p16, p32 = pattern[torch.float16], pattern[torch.float32]
    record.verdict(
        "FMT-BITS",
        verdict,
        f"measured exponent/mantissa bits (eps by halving, max power of two by doubling): fp16 "
        f"{f16[0]}/{f16[1]}, fp32 {f32[0]}/{f32[1]} (article 5/10 and 8/23); the inf bit "
        f"patterns give fp16 {p16[0]}/{p16[1]}, fp32 {p32[0]}/{p32[1]}; bf16 {b16[0]}/{b16[1]}",
    )
    assert f16 == (5, 10), f"FMT-BITS: predicted fp16 5/10 exponent/mantissa bits, got {f16}"
    assert f32 == (8, 23), f"FMT-BITS: predicted fp32 8/23 exponent/mantissa bits, got {f32}"
    assert agree, f"FMT-BITS: arithmetic {measured} and bit-pattern {pattern} widths disagree"
    # Negative control: the same probe on bfloat16 gives 8/7, not fp16's row.
    assert b16 == (8, 7) and b16 != f16, f"FMT-BITS: predicted bf16 8/7 (not fp16's), got {b16}"


@pytest.mark.claim("FMT-RANGE")
def test_range_endpoints_and_the_subnormal_collapse(amp_device, record):
    device = amp_device.torch_device
    f16 = measure_format(torch.float16, device)
    f32 = measure_format(torch.float32, device)
    b16 = measure_format(torch.bfloat16, device)
    for name, fmt in (("float16", f16), ("float32", f32)):
        record.metric(
            **{
                f"{name}/min_subnormal": fmt.min_subnormal,
                f"{name}/min_normal": fmt.min_normal,
                f"{name}/max": fmt.max_finite,
            }
        )
    # Relative rounding error of one value below the smallest normal and one above it.
    err16 = {v: relative_rounding_error(v, torch.float16, device) for v in (1e-7, 1e-3)}
    err32 = {v: relative_rounding_error(v, torch.float32, device) for v in (1e-44, 1e-30)}
    record.metric(
        **{
            "float16/rel_err_1e-7": err16[1e-7],
            "float16/rel_err_1e-3": err16[1e-3],
            "float32/rel_err_1e-44": err32[1e-44],
            "float32/rel_err_1e-30": err32[1e-30],
        }
    )

    endpoints = (
        article_number(f16.min_subnormal, "6e-8")
        and f16.max_finite == 65504
        and article_number(f32.min_subnormal, "1.4e-45")
        and article_number(f32.max_finite, "3.4e38")
    )
    collapse16 = err16[1e-7] > f16.eps / 2  # worse than the half-ulp bound of normal numbers
    collapse32 = err32[1e-44] > f32.eps / 2
    verdict = "refuted" if not endpoints else "partly" if collapse16 or collapse32 else "confirmed"
    ftz = f32.min_subnormal == f32.min_normal  # halving jumped from the smallest normal to 0
    flushed = " (fp32 subnormals flushed to zero on this device)" if ftz else ""
    record.verdict(
        "FMT-RANGE",
        verdict,
        f"measured fp16 {f16.min_subnormal:.3g}..{f16.max_finite:.6g}, fp32 "
        f"{f32.min_subnormal:.3g}..{f32.max_finite:.3g}{flushed} (article 6e-8..65504, "
        f"1.4e-45..3.4e38); those minima are subnormal: below the smallest normal (fp16 "
        f"{f16.min_normal:.3g}, fp32 {f32.min_normal:.3g}) precision collapses: fp16 rounds 1e-7 "
        f"with relative error {err16[1e-7]:.2g} vs {err16[1e-3]:.2g} at 1e-3, fp32 1e-44 with "
        f"{err32[1e-44]:.2g} vs {err32[1e-30]:.2g} at 1e-30",
    )
    predicted = {
        "fp16": (2**-24, 2**-14, 65504.0),
        "fp32": (2**-149, 2**-126, (2 - 2**-23) * 2**127),
    }
    for name, fmt in (("fp16", f16), ("fp32", f32)):
        got = (fmt.min_subnormal, fmt.min_normal, fmt.max_finite)
        assert got == predicted[name], (
            f"FMT-RANGE: predicted {name} min subnormal/min normal/max {predicted[name]}, got {got}"
        )
    assert err16[1e-7] > 0.1, f"FMT-RANGE: predicted fp16 error > 10% at 1e-7, got {err16[1e-7]}"
    # Negative control: a normal value, in the same dtype, keeps the half-ulp precision; and the
    # same probe on bfloat16 gives another maximum than fp16's 65504.
    assert err16[1e-3] <= 2**-11, (
        f"FMT-RANGE: predicted fp16 error <= 2**-11 at 1e-3, got {err16[1e-3]}"
    )
    assert b16.max_finite != f16.max_finite, f"FMT-RANGE: bf16 max equals fp16's: {b16.max_finite}"


@pytest.mark.claim("FMT-BYTES")
def test_bytes_per_element_and_model_memory(amp_device, record):
    device = amp_device.torch_device
    n = 1000
    sizes = {}
    for dtype in (torch.float16, torch.float32, torch.bfloat16):
        tensor = torch.zeros(n, dtype=dtype, device=device)
        sizes[dtype] = (tensor.element_size(), tensor.untyped_storage().nbytes())
        name = str(dtype).removeprefix("torch.")
        record.metric(
            **{
                f"{name}/element_size": sizes[dtype][0],
                f"{name}/storage_bytes_per_{n}": sizes[dtype][1],
            }
        )

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 10)).to(device)
    fp32_bytes = sum(p.untyped_storage().nbytes() for p in model.parameters())
    model.half()
    fp16_bytes = sum(p.untyped_storage().nbytes() for p in model.parameters())
    record.metric(model_fp32_bytes=fp32_bytes, model_fp16_bytes=fp16_bytes)

    article = {torch.float16: (2, 2 * n), torch.float32: (4, 4 * n)}
    as_article = all(sizes[d] == want for d, want in article.items())
    halved = 2 * fp16_bytes == fp32_bytes
    record.verdict(
        "FMT-BYTES",
        "confirmed" if as_article and halved else "refuted",
        f"element_size fp16 {sizes[torch.float16][0]}, fp32 {sizes[torch.float32][0]} (bf16 "
        f"{sizes[torch.bfloat16][0]}); storage of {n} elements {sizes[torch.float16][1]} vs "
        f"{sizes[torch.float32][1]} bytes; model parameters {fp32_bytes} bytes in fp32 -> "
        f"{fp16_bytes} after .half()",
    )
    # The fp32 row is the negative control: a probe that always answered 2 would fail it.
    for dtype, want in article.items():
        assert sizes[dtype] == want, (
            f"FMT-BYTES: predicted {dtype} element_size/storage bytes {want}, got {sizes[dtype]}"
        )
    assert halved, f"FMT-BYTES: predicted .half() to halve {fp32_bytes} bytes, got {fp16_bytes}"


def tiny_fp16_gradient(scale: float, device: torch.device) -> torch.Tensor:
    """d(x * 1e-4)/dx with an upstream gradient of 2e-4 * scale, all in fp16: true value 2e-8."""
    x = torch.ones(4, dtype=torch.float16, device=device, requires_grad=True)
    y = x * 1e-4
    y.backward(torch.full_like(y, 2e-4) * scale)
    return x.grad.float() / scale


@pytest.mark.claim("NUM-UNDERFLOW")
def test_underflow_edge_and_a_vanishing_gradient(amp_device, record):
    device = amp_device.torch_device
    probes = [2e-8, 2**-25, 3.5e-8, 5e-8, 2**-24, 6e-8]
    cast = dict(zip(probes, to_fp16(probes, device), strict=True))
    last_zero, first_kept = fp16_cast_edge(2**-26, 2**-24, lambda h: h != 0, device)
    above_edge = to_fp16([first_kept], device)[0]
    unscaled = tiny_fp16_gradient(1.0, device)
    scaled = tiny_fp16_gradient(LOSS_SCALE, device)
    record.metric(
        flush_threshold=last_zero,
        first_kept=first_kept,
        first_kept_fp16=above_edge,
        grad_fp16=unscaled[0].item(),
        grad_fp16_scaled=scaled[0].item(),
        **{f"fp16_of_{v:.3g}": h for v, h in cast.items()},
    )

    # The article: everything below 6e-8 becomes 0. Measured: only what is <= last_zero does.
    if article_number(last_zero, "6e-8"):
        verdict = "confirmed"
    else:
        verdict = "partly" if last_zero > 0 else "refuted"
    record.verdict(
        "NUM-UNDERFLOW",
        verdict,
        f"fp32->fp16 rounds to 0 up to {last_zero:.4g} = 2**{math.log2(last_zero):g} (article: "
        f"below 6e-8): 2e-8 -> {cast[2e-8]:g}, the next fp32 {first_kept:.9g} -> "
        f"{above_edge:.3g}, 3.5e-8 -> {cast[3.5e-8]:.3g}, 5e-8 -> {cast[5e-8]:.3g}; an fp16 "
        f"gradient of 2e-8 becomes {unscaled[0].item():g}, with the loss scaled by "
        f"{LOSS_SCALE:g} it survives as {scaled[0].item():.3g}",
    )
    assert cast[2**-25] == 0.0, f"NUM-UNDERFLOW: predicted 2**-25 -> 0 in fp16, got {cast[2**-25]}"
    assert (last_zero, above_edge) == (2**-25, 2**-24), (
        f"NUM-UNDERFLOW: predicted the fp16 flush edge at 2**-25 (next fp32 -> 2**-24), got "
        f"{last_zero} (next {first_kept} -> {above_edge})"
    )
    for v in (3.5e-8, 5e-8, 2**-24):
        assert cast[v] == 2**-24, f"NUM-UNDERFLOW: predicted {v} -> 2**-24 in fp16, got {cast[v]}"
    assert torch.all(unscaled == 0), (
        f"NUM-UNDERFLOW: predicted a 2e-8 fp16 gradient -> 0, got {unscaled.tolist()}"
    )
    # Negative control: the same gradient under a loss scale of 65536 survives (GradScaler's fix).
    assert torch.allclose(scaled, torch.full_like(scaled, 2e-8), rtol=1e-2), (
        f"NUM-UNDERFLOW: predicted the scaled fp16 gradient to survive as ~2e-8, got "
        f"{scaled.tolist()}"
    )


def overflowing_half_linear(device: torch.device) -> torch.Tensor:
    """Cross-entropy of a `.half()` Linear whose logits are 4 * 200 * 100 = 80000 > 65504."""
    model = torch.nn.Linear(4, 2).to(device).half()
    with torch.no_grad():
        model.weight.fill_(200.0)
        model.bias.zero_()
    logits = model(torch.full((3, 4), 100.0, device=device).half())
    return F.cross_entropy(logits, torch.tensor([0, 1, 0], device=device))


def step_with_inf_gradient(scaler: torch.amp.GradScaler | None, device: torch.device):
    """One Adam step of an fp32 Linear whose weight gradient gets an injected inf; returns the
    parameters before, after, and the next loss."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(3, 4, device=device), torch.tensor([0, 1, 0], device=device)
    before = [p.detach().clone() for p in model.parameters()]
    loss = F.cross_entropy(model(x), y)
    if scaler is None:
        loss.backward()
        model.weight.grad[0, 0] = float("inf")
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        model.weight.grad[0, 0] = float("inf")
        scaler.step(optimizer)
        scaler.update()
    with torch.no_grad():
        next_loss = F.cross_entropy(model(x), y).item()
    return before, [p.detach() for p in model.parameters()], next_loss


@pytest.mark.claim("NUM-OVERFLOW")
@pytest.mark.requires("half_training", "grad_scaler")
def test_overflow_edge_forward_nan_and_inf_gradient(amp_device, record):
    device = amp_device.torch_device
    probes = [65504.0, 65519.99, 65520.0]
    cast = dict(zip(probes, to_fp16(probes, device), strict=True))
    last_finite, first_inf = fp16_cast_edge(65504.0, 2.0**17, math.isinf, device)
    forward_loss = overflowing_half_linear(device).item()

    scaler = torch.amp.GradScaler(device.type)
    scale_before = scaler.get_scale()
    before, scaled_after, scaled_next = step_with_inf_gradient(scaler, device)
    scale_after = scaler.get_scale()
    unchanged = all(torch.equal(a, b) for a, b in zip(before, scaled_after, strict=True))
    scaled_finite = all(bool(torch.isfinite(p).all()) for p in scaled_after)
    # Negative control: the same inf gradient without a scaler reaches the parameters.
    _, plain_after, plain_next = step_with_inf_gradient(None, device)
    plain_bad = sum(int((~torch.isfinite(p)).sum()) for p in plain_after)
    record.metric(
        last_finite=last_finite,
        first_inf=first_inf,
        forward_loss=forward_loss,
        scale_before=scale_before,
        scale_after=scale_after,
        scaled_next_loss=scaled_next,
        plain_nonfinite_params=plain_bad,
        plain_next_loss=plain_next,
        **{f"fp16_of_{v:.7g}": h for v, h in cast.items()},
    )

    last_finite_fp16 = to_fp16([last_finite], device)[0]
    threshold_as_article = last_finite == 65504.0  # then anything above 65504 becomes inf
    story_under_scaler = not (scaled_finite and math.isfinite(scaled_next))
    overflows = math.isinf(cast[65520.0]) and not math.isfinite(forward_loss)
    if not overflows:
        verdict = "refuted"
    else:
        verdict = "confirmed" if threshold_as_article and story_under_scaler else "partly"
    record.verdict(
        "NUM-OVERFLOW",
        verdict,
        f"fp32->fp16: 65504 -> {cast[65504.0]:g}, 65519.99 -> {cast[65519.99]:g}, the last "
        f"finite fp32 {last_finite:.8g} -> {last_finite_fp16:g}, the first inf at {first_inf:g} "
        f"(article: above 65504); a .half() Linear with logits 80000 gives loss {forward_loss} "
        f"(forward overflow, inf - inf); an injected inf gradient under GradScaler: parameters "
        f"unchanged={unchanged} and finite={scaled_finite}, next loss {scaled_next:.4f}, scale "
        f"{scale_before:g} -> {scale_after:g}; without a scaler {plain_bad} parameter(s) "
        f"non-finite after Adam's step and the next loss {plain_next}",
    )
    assert cast == {65504.0: 65504.0, 65519.99: 65504.0, 65520.0: math.inf}, (
        f"NUM-OVERFLOW: predicted 65504 -> 65504, 65519.99 -> 65504, 65520 -> inf, got {cast}"
    )
    assert first_inf == 65520.0, (
        f"NUM-OVERFLOW: predicted the first fp16 inf at 65520, got {first_inf}"
    )
    assert not math.isfinite(forward_loss), (
        f"NUM-OVERFLOW: predicted a non-finite loss after a forward overflow, got {forward_loss}"
    )
    assert unchanged and scaled_finite and math.isfinite(scaled_next), (
        "NUM-OVERFLOW: predicted GradScaler to skip the step on an inf gradient (parameters "
        f"unchanged and finite), got unchanged={unchanged}, finite={scaled_finite}"
    )
    assert scale_after == scale_before / 2, (
        f"NUM-OVERFLOW: predicted the scale to halve, got {scale_before} -> {scale_after}"
    )
    assert plain_bad > 0 and not math.isfinite(plain_next), (
        f"NUM-OVERFLOW: predicted the inf gradient to reach the parameters without a scaler, got "
        f"{plain_bad} non-finite and next loss {plain_next}"
    )
