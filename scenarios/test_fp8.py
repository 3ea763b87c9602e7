"""FP8 beyond the article: the built-in FP8 catalogue (harness/catalogue/claims_fp8.toml).

Decided from tensors on the session's device (harness.lab.fp8), the CPU deciding everything
but the GPU's own contract:
- the two formats read off their 256 bit patterns; casts held against a reference rounding
  computed from those values (nearest, ties to the even pattern) at every midpoint between
  adjacent values, subnormals included; what a cast does beyond the range, per format;
- torch._scaled_mm against a float64 matmul of its dequantised inputs, and the wrong scale
  convention (a wrong answer, not an error); E5M2 against E4M3 on a real gradient; scaling per
  tensor, row, 1x128 tile and 128x128 block against an outlier; a scale without a floor on an
  all-zero block; autocast asked for FP8; which ops FP8 tensors run;
- delayed scaling, on a reference model of Transformer Engine's recipe (harness.lab.fp8), not
  on Transformer Engine;
- on CUDA only (rehearsed on the CPU by tests/sensitivity/test_gpu_scenarios_on_cpu.py):
  _scaled_mm's contract (sm_89+, shapes divisible by 16, a column-major second operand, no
  e5m2 x e5m2) against what the CPU accepts of the same calls, and fast accumulation's error
  against K.

Release-dependent (harness.lab.releases): the CPU cast of a finite overflow or an infinity to
E4M3 gave NaN up to 2.12 and saturates from 2.13; the CPU _scaled_mm exists from 2.9 and takes
rowwise scales from 2.12 (capabilities fp8_scaled_mm, fp8_rowwise_scaled_mm). docs/fp8.md has
each claim's source and what was measured per release.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from harness.lab import models, recipes, releases, stats
from harness.lab.data import make_task
from harness.lab.fp8 import (
    E4M3,
    E5M2,
    DelayedScaling,
    adjacent,
    cast,
    column_major,
    current_scaling,
    lacking,
    nearest_even,
    patterns,
    quantised,
    relative_error,
    scale_for,
    scaled_mm,
    short,
    to_float8_linears,
)
from harness.lab.train import evaluate, train

if lacking():  # a build without float8 dtypes: every test here skips, at collection, saying so
    pytest.skip(lacking(), allow_module_level=True)

F32, F64 = torch.float32, torch.float64
CPU_ONLY_CONTRACT = (
    "measured on the CPU, whose _scaled_mm accepts shapes and dtypes CUDA refuses: this says "
    "nothing about an H200"
)

# --- the formats --------------------------------------------------------------------------------

# Micikevicius et al. 2022, Table 1: (mantissa bits, max, min normal, min subnormal, NaN
# patterns, inf patterns).
TABLE_1 = {
    E4M3: (3, 448.0, 2.0**-6, 2.0**-9, [0x7F, 0xFF], []),
    E5M2: (2, 57344.0, 2.0**-14, 2.0**-16, [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF], [0x7C, 0xFC]),
}


def format_row(dtype: torch.dtype, device: torch.device) -> tuple:
    table = patterns(dtype, device)
    mantissa = table.mantissa_bits()
    return (
        mantissa, table.max_finite, table.min_normal(mantissa), table.min_subnormal,
        table.nan_patterns, table.inf_patterns,
    )  # fmt: skip


def _describe_row(row: tuple) -> str:
    mantissa, top, normal, subnormal, nans, infs = row
    hexes = ", ".join(f"{p:#04x}" for p in nans)
    return (
        f"{mantissa} mantissa bits, max {top:g}, min normal 2**{math.log2(normal):g}, min "
        f"subnormal 2**{math.log2(subnormal):g}, NaN patterns {hexes}, "
        f"{len(infs)} inf pattern(s)"
    )


def _decide_format(record, claim: str, dtype: torch.dtype, other: torch.dtype, device) -> None:
    row, other_row = format_row(dtype, device), format_row(other, device)
    record.key_metric(
        **{f"{short(dtype)}/max": row[1], f"{short(dtype)}/nan_patterns": len(row[4]),
           f"{short(dtype)}/inf_patterns": len(row[5]), f"{short(dtype)}/mantissa_bits": row[0]}
    )  # fmt: skip
    verdict = "confirmed" if row == TABLE_1[dtype] else "refuted"
    record.verdict(
        claim,
        verdict,
        f"the 256 bit patterns of {dtype} widened by torch on {device.type}: {_describe_row(row)} "
        f"(the paper's Table 1: {_describe_row(TABLE_1[dtype])})",
    )
    assert row == TABLE_1[dtype], f"{claim}: predicted {TABLE_1[dtype]}, measured {row}"
    # Negative control: the same reading of the other format gives another row.
    assert other_row != row and other_row == TABLE_1[other], (
        f"{claim}: the reading of {other} gave {other_row}: it cannot tell the formats apart"
    )


@pytest.mark.claim("FP8-E4M3-FORMAT")
def test_e4m3_read_off_its_bit_patterns(amp_device, record):
    _decide_format(record, "FP8-E4M3-FORMAT", E4M3, E5M2, amp_device.torch_device)


@pytest.mark.claim("FP8-E5M2-FORMAT")
def test_e5m2_read_off_its_bit_patterns(amp_device, record):
    _decide_format(record, "FP8-E5M2-FORMAT", E5M2, E4M3, amp_device.torch_device)


# --- rounding -----------------------------------------------------------------------------------

OFF_MIDPOINT = 2.0**-6  # of the gap: just above and below each midpoint


def rounding_cases(dtype: torch.dtype, device) -> tuple[list[float], list[float], list[float]]:
    """(values, what the cast kept, the reference) at every midpoint between adjacent values
    from 0 up (the gradual underflow's among them), just off each, and their negatives."""
    table = patterns(dtype, device)
    values = []
    for low, high in adjacent(table):
        middle, off = (low + high) / 2, (high - low) * OFF_MIDPOINT
        values += [middle, middle + off, middle - off]
    values += [-v for v in values]
    tensor = torch.tensor(values, dtype=F32, device=device)
    kept = cast(tensor, dtype).cpu().tolist()
    exact = tensor.double().cpu().tolist()  # the float32 values, as the cast saw them
    return exact, kept, [nearest_even(v, table) for v in exact]


@pytest.mark.claim("FP8-ROUND-NEAREST-EVEN")
def test_casts_round_to_nearest_even_with_gradual_underflow(amp_device, record):
    device = amp_device.torch_device
    found, controls = {}, {}
    for dtype in (E4M3, E5M2):
        values, kept, reference = rounding_cases(dtype, device)
        wrong = [(v, k, r) for v, k, r in zip(values, kept, reference, strict=True) if k != r]
        found[dtype] = (len(values), wrong)
        # Negative control: rounding toward zero, the reference a wrong rule would give, differs
        # from the cast at the midpoints: the check can tell the rules apart.
        table = patterns(dtype, device)
        toward_zero = [
            max((t for t in table.finite if abs(t) <= abs(v) and t * v >= 0), key=abs)
            for v in values
        ]
        controls[dtype] = sum(k != z for k, z in zip(kept, toward_zero, strict=True))
        half_tiny = table.min_subnormal / 2
        edge = cast(torch.tensor([half_tiny, half_tiny * 1.0001], device=device), dtype)
        record.key_metric(**{f"{short(dtype)}/mismatches": len(wrong)})
        record.metric(**{
            f"{short(dtype)}/cases": len(values),
            f"{short(dtype)}/half_min_subnormal_kept": edge[0].item(),
            f"{short(dtype)}/above_half_min_subnormal_kept": edge[1].item(),
        })  # fmt: skip
    verdict = "confirmed" if not any(w for _, w in found.values()) else "refuted"
    record.verdict(
        "FP8-ROUND-NEAREST-EVEN",
        verdict,
        "; ".join(
            f"{short(d)}: {n} casts at every midpoint between adjacent values (subnormals "
            f"included), 2**-6 of a gap off each and their negatives: {len(w)} differ from the "
            f"nearest-even reference" + (f" (first: {w[0][0]:g} -> {w[0][1]:g}, not {w[0][2]:g})"
                                         if w else "")
            for d, (n, w) in found.items()
        )
        + "; rounding toward zero would differ at "
        + ", ".join(f"{short(d)} {n}" for d, n in controls.items()),
    )  # fmt: skip
    for dtype, (_, wrong) in found.items():
        assert not wrong, f"FP8-ROUND-NEAREST-EVEN: {short(dtype)} cast {wrong[:3]} (v, kept, ref)"
    for dtype, differs in controls.items():
        assert differs > 0, f"FP8-ROUND-NEAREST-EVEN: truncation agreed with every {dtype} case"


# --- beyond the range ---------------------------------------------------------------------------

FINITE_OVERFLOW = (465.0, 500.0, 1e4, 1e30, torch.finfo(F32).max)
E4M3_SATURATION = "e4m3-cpu-cast-saturates"  # harness.lab.releases


def e4m3_beyond(device) -> dict[str, list[float]]:
    values = torch.tensor(FINITE_OVERFLOW, dtype=F32, device=device)
    return {
        "finite": cast(torch.cat([values, -values]), E4M3).cpu().tolist(),
        "inf": cast(torch.tensor([math.inf, -math.inf], device=device), E4M3).cpu().tolist(),
        "in_range": cast(torch.tensor([448.0, 464.0, -448.0], device=device), E4M3).cpu().tolist(),
    }


def _saturates(kept: list[float]) -> bool:
    return all(abs(v) == 448.0 for v in kept)


@pytest.mark.claim("FP8-E4M3-OVERFLOW-SATURATES", "FP8-E4M3-INF-IS-NAN")
def test_e4m3_beyond_its_range(amp_device, record):
    device = amp_device.torch_device
    seen = e4m3_beyond(device)
    before = releases.behaviour(E4M3_SATURATION, device.type) == releases.BEFORE
    finite_nan = all(math.isnan(v) for v in seen["finite"])
    inf_nan = all(math.isnan(v) for v in seen["inf"])
    record.key_metric(
        finite_overflow_saturated=float(_saturates(seen["finite"])),
        inf_to_nan=float(inf_nan),
    )
    said = releases.describe(E4M3_SATURATION, device.type)
    values = (*FINITE_OVERFLOW, *(-v for v in FINITE_OVERFLOW))
    shown = ", ".join(f"{v:g} -> {k:g}" for v, k in zip(values, seen["finite"], strict=True))
    record.verdict(
        "FP8-E4M3-OVERFLOW-SATURATES",
        "confirmed" if _saturates(seen["finite"]) else "refuted" if finite_nan else "partly",
        f"{device.type} casts to e4m3: {shown}; {said}",
    )
    record.verdict(
        "FP8-E4M3-INF-IS-NAN",
        "confirmed" if inf_nan else "refuted",
        f"+-inf -> {seen['inf'][0]:g}, {seen['inf'][1]:g} (the paper: NaN; it also says that a "
        f"finite overflow saturates, which {'this' if inf_nan else 'no'} cast keeps apart from "
        f"an infinity); {said}",
    )
    if before:
        assert finite_nan and inf_nan, (
            f"FP8-E4M3-OVERFLOW-SATURATES: {said}; measured {seen['finite']}, inf {seen['inf']}"
        )
    else:
        assert _saturates(seen["finite"]) and _saturates(seen["inf"]), (
            f"FP8-E4M3-OVERFLOW-SATURATES: {said}; measured {seen['finite']}, inf {seen['inf']}"
        )
    # Negative control: in range, and the tie at 464 (between 448 and the NaN slot's 480),
    # rounds to 448 on every release: the overflow above is the cast's rule, not its rounding.
    assert seen["in_range"] == [448.0, 448.0, -448.0], (
        f"FP8-E4M3-OVERFLOW-SATURATES: 448, 464, -448 cast to {seen['in_range']}"
    )


@pytest.mark.claim("FP8-E5M2-OVERFLOW-INF")
def test_e5m2_overflows_to_infinity(amp_device, record):
    device = amp_device.torch_device
    top = torch.finfo(E5M2).max
    tie = top + (top - 49152.0) / 2  # halfway to the next binade's first value: ties to inf
    beyond = torch.tensor([tie, 1e5, 1e30, math.inf], device=device)
    kept = cast(torch.cat([beyond, -beyond]), E5M2).cpu().tolist()
    below = cast(torch.tensor([top, tie - 1.0], device=device), E5M2).cpu().tolist()
    infinite = all(math.isinf(v) for v in kept)
    record.key_metric(finite_overflow_to_inf=float(infinite))
    record.verdict(
        "FP8-E5M2-OVERFLOW-INF",
        "confirmed" if infinite else "refuted",
        f"{device.type} casts to e5m2 of {tie:g}, 1e5, 1e30, inf and their negatives: "
        + ", ".join(f"{v:g}" for v in kept)
        + f"; {top:g} and {tie - 1:g} (under the tie) -> {below[0]:g}, {below[1]:g}",
    )
    assert infinite, f"FP8-E5M2-OVERFLOW-INF: predicted +-inf, measured {kept}"
    # Negative control: the largest value and one under the tie stay finite.
    assert below == [top, top], f"FP8-E5M2-OVERFLOW-INF: {top:g}, {tie - 1:g} cast to {below}"


# --- _scaled_mm ---------------------------------------------------------------------------------

M, K, N = 32, 64, 48


def _operands(device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two matrices quantised to e4m3 with one dequantising scale each (amax / 448), the
    second column-major as CUDA wants it."""
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(M, K, generator=g) * 3).to(device)
    b = (torch.randn(K, N, generator=g) / 5).to(device)
    sa, sb = (scale_for(x.abs().amax(), E4M3).float() for x in (a, b))
    qa = (a / sa).to(E4M3)
    qb = column_major((b / sb).to(E4M3))
    return qa, qb, sa, sb


def _gap(result: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest error over the scale of the product's terms (sum of |products| per entry)."""
    return ((result.double().cpu() - reference[0]).abs() / reference[1]).max().item()


@pytest.mark.claim("FP8-SCALED-MM")
@pytest.mark.requires("fp8_scaled_mm")
def test_scaled_mm_multiplies_the_dequantised_inputs(amp_device, record):
    device = amp_device.torch_device
    qa, qb, sa, sb = _operands(device)
    da, db = qa.double().cpu() * sa.item(), qb.double().cpu() * sb.item()
    reference = (da @ db, da.abs() @ db.abs())
    out = scaled_mm(qa, qb, sa, sb, out_dtype=F32)
    gap = _gap(out, reference)
    bound = K * torch.finfo(F32).eps  # float32 accumulation over K terms
    default = scaled_mm(qa, qb, sa, sb).dtype  # out_dtype omitted
    # Negative control: the quantising scales (1 / dequantising), the wrong convention: torch
    # raises nothing and answers wrongly.
    wrong = _gap(scaled_mm(qa, qb, 1 / sa, 1 / sb, out_dtype=F32), reference)
    record.metric(max_gap_over_bound=gap / bound, inverse_scales_gap=wrong)
    record.param(shape=f"{M}x{K} @ {K}x{N}", default_out_dtype=str(default))
    holds = gap <= bound and default in (E4M3, E5M2)
    where = CPU_ONLY_CONTRACT if device.type == "cpu" else f"measured on {amp_device.describe()}"
    record.verdict(
        "FP8-SCALED-MM",
        "confirmed" if holds else "refuted",
        f"e4m3 {M}x{K} @ {K}x{N}, one scale each: largest error against the float64 product of "
        f"the dequantised inputs {gap:.2g} of the terms' magnitude (float32's bound over K: "
        f"{bound:.2g}); without out_dtype the result is {default}; the quantising scales "
        f"(1/scale) given instead raise nothing and miss by {wrong:.3g}; {where}",
    )
    assert gap <= bound, f"FP8-SCALED-MM: predicted error <= {bound:.2g}, measured {gap:.3g}"
    assert default in (E4M3, E5M2), f"FP8-SCALED-MM: out_dtype omitted gave {default}"
    assert wrong > 100 * bound, f"FP8-SCALED-MM: inverse scales missed by only {wrong:.3g}"


@pytest.mark.claim("FP8-SCALED-MM")
@pytest.mark.requires("fp8_rowwise_scaled_mm")
def test_rowwise_scales_dequantise_each_row_and_column(amp_device, record):
    device = amp_device.torch_device
    g = torch.Generator().manual_seed(1)
    a = (torch.randn(M, K, generator=g) * torch.logspace(-2, 2, M).unsqueeze(1)).to(device)
    b = torch.randn(K, N, generator=g).to(device)
    sa = scale_for(a.abs().amax(dim=1, keepdim=True), E4M3).float()  # (M, 1)
    sb = scale_for(b.abs().amax(dim=0, keepdim=True), E4M3).float()  # (1, N)
    qa, qb = (a / sa).to(E4M3), column_major((b / sb).to(E4M3))
    da, db = qa.double().cpu() * sa.double().cpu(), qb.double().cpu() * sb.double().cpu()
    reference = (da @ db, da.abs() @ db.abs())
    gap = _gap(scaled_mm(qa, qb, sa, sb, out_dtype=torch.bfloat16), reference)
    bound = 2.0**-8 + K * torch.finfo(F32).eps  # the bfloat16 result's rounding
    # Negative control: the rows' scales swapped end for end: the wrong scale per row.
    swapped = _gap(scaled_mm(qa, qb, sa.flip(0), sb, out_dtype=torch.bfloat16), reference)
    record.metric(rowwise_max_gap=gap, rowwise_swapped_gap=swapped)
    where = CPU_ONLY_CONTRACT if device.type == "cpu" else f"measured on {amp_device.describe()}"
    record.verdict(
        "FP8-SCALED-MM",
        "confirmed" if gap <= bound else "refuted",
        f"rowwise: rows of a spanning 1e-2..1e2, a scale per row of a and per column of b, "
        f"bfloat16 out: largest error {gap:.2g} of the terms' magnitude (bound {bound:.2g}); "
        f"the row scales reversed miss by {swapped:.3g}; {where}",
    )
    assert gap <= bound, f"FP8-SCALED-MM: rowwise error {gap:.3g} over {bound:.2g}"
    assert swapped > 10 * bound, f"FP8-SCALED-MM: reversed row scales missed by {swapped:.3g}"


# --- which format for gradients -----------------------------------------------------------------

GRADIENT_MODELS = (("mlp", 20_000), ("transformer", 20_000))


def real_gradients(device) -> list[torch.Tensor]:
    """Every parameter's gradient of two small models after one backward on their tasks."""
    grads = []
    for kind, params in GRADIENT_MODELS:
        task = make_task(kind, seed=0)
        model = models.build(kind, params, seed=0, **task.model_options).to(device)
        x, y = next(iter(task.batches(64, seed=0)))
        task.loss(model(x.to(device)), y.to(device)).backward()
        grads += [p.grad.double() for p in model.parameters() if p.grad is not None]
    return grads


def through(grads: list[torch.Tensor], dtype: torch.dtype, shared: bool) -> tuple[float, float]:
    """The gradients through `dtype` with one scale per tensor, or one `shared` by all (as one
    loss scale is): (the share of nonzero entries flushed to 0, the median over tensors of the
    relative L2 error)."""
    top = max(g.abs().max() for g in grads)
    flushed = nonzero = 0
    errors = []
    for g in grads:
        if shared:
            scale = scale_for(top, dtype)
            back = (g / scale).to(dtype).double() * scale
        else:
            back = quantised(g.reshape(1, -1), dtype, None).reshape(g.shape).to(g.device)
        flushed += ((back == 0) & (g != 0)).sum().item()
        nonzero += (g != 0).sum().item()
        errors.append(((back - g).norm() / g.norm()).item() if g.norm() > 0 else 0.0)
    return flushed / nonzero, sorted(errors)[len(errors) // 2]


@pytest.mark.claim("FP8-E5M2-FOR-GRADIENTS")
def test_e5m2_keeps_more_of_the_gradients_than_e4m3(amp_device, record):
    grads = real_gradients(amp_device.torch_device)
    found = {(d, shared): through(grads, d, shared) for d in (E4M3, E5M2) for shared in (0, 1)}
    for (d, shared), (flushed, error) in found.items():
        setting = "shared_scale" if shared else "per_tensor"
        record.metric(**{f"{short(d)}/{setting}/flushed": flushed})
        record.metric(**{f"{short(d)}/{setting}/median_rel_l2_error": error})

    def helps(shared: int) -> bool:  # the whole tensor's error: what flushing and rounding cost
        return found[(E5M2, shared)][1] < found[(E4M3, shared)][1]

    verdict = "confirmed" if helps(0) else "partly" if helps(1) else "refuted"
    record.verdict(
        "FP8-E5M2-FOR-GRADIENTS",
        verdict,
        f"{len(grads)} gradient tensors of an mlp and a transformer of 20,000 parameters each, "
        f"one backward: "
        + "; ".join(
            f"{'one scale for all' if shared else 'one scale per tensor'}: e4m3 flushes "
            f"{found[(E4M3, shared)][0]:.2%} of the nonzero entries (median relative L2 error "
            f"{found[(E4M3, shared)][1]:.3g}), e5m2 {found[(E5M2, shared)][0]:.2%} "
            f"({found[(E5M2, shared)][1]:.3g})"
            for shared in (0, 1)
        )
        + ": e5m2's range "
        + ("pays for its lost mantissa bit per tensor" if helps(0) else
           "pays for its lost mantissa bit only where one scale spans every tensor" if helps(1)
           else "does not pay for its lost mantissa bit here"),
    )  # fmt: skip
    # E5M2's range contains E4M3's (31.8 binades against 17.8) whatever the scale: it never
    # flushes more, and a scale shared across tensors is where the range shows.
    for shared in (0, 1):
        assert found[(E5M2, shared)][0] <= found[(E4M3, shared)][0], (
            f"FP8-E5M2-FOR-GRADIENTS: e5m2 flushed more than e4m3: {found}"
        )
    assert found[(E5M2, 1)][0] < found[(E4M3, 1)][0], (
        f"FP8-E5M2-FOR-GRADIENTS: a scale shared by {len(grads)} tensors flushed no more in "
        f"e4m3 than in e5m2: {found}"
    )
    # Negative control: one tensor squeezed into 3 decades below its amax: neither format
    # flushes anything, so the gaps above come from the range.
    narrow = grads[0].abs().max() * 10 ** (-3 * torch.rand_like(grads[0]))
    control = {d: through([narrow], d, shared=False)[0] for d in (E4M3, E5M2)}
    assert control[E4M3] == control[E5M2] == 0.0, f"FP8-E5M2-FOR-GRADIENTS: narrow {control}"


# --- scaling granularity against an outlier -----------------------------------------------------

ROWS, COLS = 256, 512
GRANULARITIES = {
    "tensor": None,
    "row": (1, COLS),
    "1x128 tile": (1, 128),
    "128x128 block": (128, 128),
}
OUTLIER_RATIOS = (1.0, 10.0, 1e2, 1e3, 1e4, 1e5, 1e6)
LOST = 2.0  # accuracy lost: the median error of the other entries doubled


def granularity_errors(device) -> dict[str, list[float]]:
    """Per granularity, the median relative error of the entries other than the outlier, for
    an outlier of each ratio to the tensor's largest ordinary entry."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, COLS, generator=g, dtype=F64).to(device)
    others = torch.ones_like(x, dtype=torch.bool)
    others[7, 9] = False
    errors = {name: [] for name in GRANULARITIES}
    for ratio in OUTLIER_RATIOS:
        y = x.clone()
        y[7, 9] = x.abs().max() * ratio
        for name, block in GRANULARITIES.items():
            errors[name].append(relative_error(quantised(y, E4M3, block), y, others))
    return errors


def lost_at(errors: list[float]) -> float:
    """The first outlier ratio at which the error doubled its no-outlier value; inf if none."""
    return next((r for r, e in zip(OUTLIER_RATIOS, errors, strict=True) if e > LOST * errors[0]),
                math.inf)  # fmt: skip


@pytest.mark.claim("FP8-FINE-SCALING")
def test_fine_grained_scaling_tames_an_outlier(amp_device, record):
    errors = granularity_errors(amp_device.torch_device)
    lost = {name: lost_at(e) for name, e in errors.items()}
    for name, ratio in lost.items():
        key = name.replace(" ", "_")
        record.key_metric(**{f"{key}/lost_at_ratio": ratio if math.isfinite(ratio) else -1.0})
        record.history(**{f"{key}/median_rel_error": errors[name]})
    fine = ("1x128 tile", "128x128 block")
    tamed = all(lost[f] > lost["tensor"] for f in fine)
    some = any(lost[f] > lost["tensor"] for f in fine)
    verdict = "confirmed" if tamed else "partly" if some else "refuted"
    ratios = ", ".join(f"{r:g}" for r in OUTLIER_RATIOS)
    when = [
        f"{n} at x{r:g}" if math.isfinite(r) else f"{n} never (up to x{OUTLIER_RATIOS[-1]:g})"
        for n, r in lost.items()
    ]
    record.verdict(
        "FP8-FINE-SCALING",
        verdict,
        f"e4m3, a {ROWS}x{COLS} normal tensor with one outlier {ratios} times its largest other "
        f"entry: the other entries' median relative error doubled from {'; '.join(when)} "
        f"(errors without an outlier: "
        + ", ".join(f"{n} {e[0]:.3g}" for n, e in errors.items())
        + ")",
    )
    assert tamed, f"FP8-FINE-SCALING: lost accuracy at {lost}"
    # Negative control: per tensor, an outlier does cost the others: the measure sees it.
    assert math.isfinite(lost["tensor"]), f"FP8-FINE-SCALING: per-tensor never lost: {errors}"


# --- a zero amax --------------------------------------------------------------------------------


@pytest.mark.claim("FP8-ZERO-AMAX")
def test_a_scale_without_a_floor_turns_a_zero_block_into_nan(amp_device, record):
    device = amp_device.torch_device
    x = torch.randn(4, 256, dtype=F64, device=device)
    x[2, :128] = 0.0  # one all-zero 1x128 tile
    found = {}
    for floor in (None, 1e-12):
        for name, (tensor, block) in {"zero tensor": (torch.zeros_like(x), None),
                                      "zero tile": (x, (1, 128))}.items():  # fmt: skip
            back = quantised(tensor, E4M3, block, floor=floor)
            zeros = tensor == 0  # what must come back as it went in: the zero entries
            found[(floor, name)] = (torch.isnan(back).sum().item(), bool((back[zeros] == 0).all()))
    nans = {name: found[(None, name)][0] for name in ("zero tensor", "zero tile")}
    record.key_metric(**{f"{n.replace(' ', '_')}/nan_entries_without_floor": v
                         for n, v in nans.items()})  # fmt: skip
    broke = all(nans.values())
    record.verdict(
        "FP8-ZERO-AMAX",
        "confirmed" if broke else "refuted",
        f"scale = amax / 448 without a floor: an all-zero {x.shape[0]}x{x.shape[1]} tensor "
        f"comes back with {nans['zero tensor']} NaN entries, an all-zero 1x128 tile "
        f"{nans['zero tile']}; with amax clamped to 1e-12: "
        + ", ".join(f"{n} {'zero' if found[(1e-12, n)][1] else 'changed'} with "
                    f"{found[(1e-12, n)][0]} NaN" for n in ("zero tensor", "zero tile")),
    )  # fmt: skip
    assert broke, f"FP8-ZERO-AMAX: predicted NaN without a floor, measured {nans}"
    # Negative control: the floor keeps both exact, so the NaN above is the missing floor's.
    assert all(found[(1e-12, n)] == (0, True) for n in ("zero tensor", "zero tile")), (
        f"FP8-ZERO-AMAX: with a floor, the zeros did not come back as zeros: {found}"
    )


# --- autocast and the ops FP8 tensors run -------------------------------------------------------


LINEAR = 8


def autocast_with(device_type: str, dtype: torch.dtype, device) -> tuple[str, str]:
    """(what autocast said: 'refused: ...', 'warned: ...' or 'accepted', the dtype a Linear
    computed in inside the region)."""
    linear = torch.nn.Linear(LINEAR, LINEAR).to(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autocast(device_type=device_type, dtype=dtype):
                out = linear(torch.randn(2, LINEAR, device=device))
        except (RuntimeError, ValueError, AssertionError) as exc:
            return f"refused: {str(exc).splitlines()[0]}", "-"
    said = next((str(w.message).splitlines()[0] for w in caught), None)
    return (f"warned: {said}" if said else "accepted"), str(out.dtype).removeprefix("torch.")


@pytest.mark.claim("FP8-NO-AUTOCAST")
@pytest.mark.requires("bf16_autocast")  # the control's region
def test_autocast_has_no_fp8_mode(amp_device, record):
    device = amp_device.torch_device
    found = {short(d): autocast_with(device.type, d, device) for d in (E4M3, E5M2)}
    control = autocast_with(device.type, torch.bfloat16, device)
    none = all(dtype in ("-", "float32") for _, dtype in found.values())
    record.param(**{f"{name}/autocast": said for name, (said, _) in found.items()})
    record.verdict(
        "FP8-NO-AUTOCAST",
        "confirmed" if none else "refuted",
        "; ".join(f"torch.autocast({device.type!r}, {n}): {s}, a Linear({LINEAR}, {LINEAR}) "
                  f"inside ran in {d}" for n, (s, d) in found.items())
        + f"; with bfloat16 the same Linear ran in {control[1]}",
    )  # fmt: skip
    assert none, f"FP8-NO-AUTOCAST: an FP8 autocast region computed in FP8: {found}"
    # Negative control: the same region with bfloat16 does change the Linear's dtype.
    assert control[1] == "bfloat16", f"FP8-NO-AUTOCAST: the bfloat16 control gave {control}"


STORAGE_OPS = {
    "cast": lambda t: t.float().to(t.dtype),
    "clone": lambda t: t.clone(),
    "view as uint8": lambda t: t.view(torch.uint8),
    "transpose": lambda t: t.t().contiguous(),
    "cat": lambda t: torch.cat([t, t]),
}
ARITHMETIC_OPS = {
    "add": lambda t: t + t,
    "mul": lambda t: t * t,
    "sum": lambda t: t.sum(),
    "relu": lambda t: torch.relu(t),
    "matmul": lambda t: t @ t,
}


def runs(ops: dict, tensor: torch.Tensor) -> dict[str, bool]:
    found = {}
    for name, op in ops.items():
        try:
            op(tensor)
            found[name] = True
        except (RuntimeError, NotImplementedError, TypeError):
            found[name] = False
    return found


@pytest.mark.claim("FP8-STORAGE-TYPE")
@pytest.mark.requires("half_training")  # the control's float16 arithmetic
def test_fp8_tensors_are_for_storage(amp_device, record):
    device = amp_device.torch_device
    tensor = torch.randn(8, 8, device=device).to(E4M3)
    storage, arithmetic = runs(STORAGE_OPS, tensor), runs(ARITHMETIC_OPS, tensor)
    control = runs(ARITHMETIC_OPS, torch.randn(8, 8, device=device).half())
    ran = [n for n, ok in arithmetic.items() if ok]
    record.key_metric(storage_ops_run=sum(storage.values()), arithmetic_ops_run=len(ran))
    verdict = "refuted" if not all(storage.values()) else "partly" if ran else "confirmed"
    record.verdict(
        "FP8-STORAGE-TYPE",
        verdict,
        f"on {device.type}, an 8x8 e4m3 tensor: {sum(storage.values())} of {len(storage)} "
        f"storage ops run ("
        + ", ".join(f"{n} {'runs' if ok else 'refused'}" for n, ok in storage.items())
        + f"); {len(ran)} of {len(arithmetic)} arithmetic ops run ("
        + ", ".join(f"{n} {'runs' if ok else 'refused'}" for n, ok in arithmetic.items())
        + ")"
        + (f": {', '.join(ran)} in FP8, the result rounded to e4m3" if ran else ""),
    )
    assert all(storage.values()), f"FP8-STORAGE-TYPE: a storage op was refused: {storage}"
    # Negative control: float16 runs every arithmetic op of the list, so a refusal above is
    # the FP8 dtype's.
    assert all(control.values()), f"FP8-STORAGE-TYPE: float16 refused {control}"


# --- delayed scaling ----------------------------------------------------------------------------

STEPS, SPIKE_AT, SPIKE = 24, 16, 100.0


def spike_errors(device) -> tuple[float, float, int]:
    """(the relative error of the spike's largest entry under delayed scaling, under current
    scaling, the steps after the spike whose scale still came from it)."""
    g = torch.Generator().manual_seed(0)
    delayed = DelayedScaling(E4M3, history_len=16)
    errors, scales = {}, []
    for step in range(STEPS):
        x = torch.randn(1024, generator=g, dtype=F64).to(device)
        if step == SPIKE_AT:
            x = x * SPIKE
        out, scale = delayed.quantise(x)
        scales.append(scale)
        if step == SPIKE_AT:
            top = x.abs().argmax()
            errors["delayed"] = ((out[top] - x[top]).abs() / x[top].abs()).item()
            now = current_scaling(x)
            errors["current"] = ((now[top] - x[top]).abs() / x[top].abs()).item()
    held = sum(s < scales[SPIKE_AT] / 10 for s in scales[SPIKE_AT + 1 :])
    return errors["delayed"], errors["current"], held


@pytest.mark.claim("FP8-DELAYED-SCALING-SPIKE")
def test_delayed_scaling_saturates_a_spike(amp_device, record):
    delayed, current, held = spike_errors(amp_device.torch_device)
    delayed = math.inf if math.isnan(delayed) else delayed  # a NaN-on-overflow cast
    record.metric(spike_delayed_rel_error=min(delayed, 1e30), spike_current_rel_error=current)
    record.metric(steps_scaled_by_the_spike=held)
    # Which way it went, for the ledger: whether the spike came back as a number at all (a
    # NaN-on-overflow cast gives none: harness.lab.releases 'e4m3-cpu-cast-saturates').
    record.key_metric(spike_lost_to_nan=int(math.isinf(delayed)))
    record.param(history_len=16, margin=0, spike=SPIKE, spike_at=SPIKE_AT)
    verdict = "confirmed" if delayed > 0.5 else "refuted"
    record.verdict(
        "FP8-DELAYED-SCALING-SPIKE",
        verdict,
        f"a reference model of Transformer Engine's DelayedScaling (history 16, margin 0, "
        f"e4m3; not TE itself): {SPIKE_AT} steps of N(0,1), then one x{SPIKE:g}: the spike's "
        f"largest entry comes back with relative error {delayed:.3g} under the delayed scale, "
        f"{current:.2g} under the step's own (current scaling); the {held} steps after it "
        f"quantise with the spike's amax in the history (a scale {SPIKE:g}x smaller)",
    )
    assert delayed > 0.5, f"FP8-DELAYED-SCALING-SPIKE: the spike kept error {delayed:.3g}"
    # Negative control: current scaling quantises the same spike within e4m3's half-ulp.
    assert current <= 2.0**-4, f"FP8-DELAYED-SCALING-SPIKE: current scaling erred {current:.3g}"


# --- CUDA's contract, with what the CPU accepts of it -------------------------------------------

CONTRACT_CASES = {
    "shapes not divisible by 16": dict(m=24, k=40, n=24, b_column_major=True, dtypes=(E4M3, E4M3)),
    "a row-major second operand": dict(m=32, k=32, n=32, b_column_major=False, dtypes=(E4M3, E4M3)),
    "e5m2 x e5m2": dict(m=32, k=32, n=32, b_column_major=True, dtypes=(E5M2, E5M2)),
}


def accepts(device: str, m: int, k: int, n: int, b_column_major: bool, dtypes) -> bool:
    a = torch.randn(m, k, device=device).to(dtypes[0])
    b = torch.randn(k, n, device=device).to(dtypes[1])
    b = column_major(b) if b_column_major else b
    unit = torch.ones((), device=device)
    try:
        scaled_mm(a, b, unit, unit, out_dtype=F32)
    except (RuntimeError, NotImplementedError):
        return False
    return True


@pytest.mark.claim("FP8-CUDA-SCALED-MM-CONTRACT")
@pytest.mark.requires("cuda", "fp8_scaled_mm")
def test_cuda_refuses_what_the_cpu_accepts(amp_device, record):
    cpu = {case: accepts("cpu", **shape) for case, shape in CONTRACT_CASES.items()}
    here = {case: accepts(amp_device.type, **shape) for case, shape in CONTRACT_CASES.items()}
    record.param(**{f"cpu/{c.replace(' ', '_')}": ok for c, ok in cpu.items()})
    record.key_metric(refused_here=sum(not ok for ok in here.values()))
    refused_all = not any(here.values())
    record.verdict(
        "FP8-CUDA-SCALED-MM-CONTRACT",
        "confirmed" if refused_all and all(cpu.values()) else "partly" if refused_all
        else "refuted",
        f"{amp_device.describe()}: "
        + ", ".join(f"{c} {'accepted' if ok else 'refused'}" for c, ok in here.items())
        + f"; the CPU (torch {torch.__version__}) accepts {sum(cpu.values())} of the "
        f"{len(cpu)}: " + ", ".join(f"{c} {'accepted' if ok else 'refused'}"
                                    for c, ok in cpu.items()),
    )  # fmt: skip
    assert refused_all, f"FP8-CUDA-SCALED-MM-CONTRACT: {amp_device.type} accepted {here}"
    # Negative control: a call within the contract runs on the same device.
    assert accepts(amp_device.type, 32, 32, 32, True, (E4M3, E4M3)), (
        "FP8-CUDA-SCALED-MM-CONTRACT: a call within the contract failed too"
    )


# --- fast accumulation --------------------------------------------------------------------------

FAST_ACCUM_K = (256, 1024, 4096, 16384)
FAST_ACCUM_MN = 64


def accumulation_errors(device, ks=FAST_ACCUM_K) -> dict[bool, list[float]]:
    """Per use_fast_accum, the largest relative error of an e4m3 GEMM of positive values (every
    partial sum grows, the worst case for a short accumulator) against its exact float64
    product, for each K."""
    g = torch.Generator().manual_seed(0)
    unit = torch.ones((), device=device)
    errors = {False: [], True: []}
    for k in ks:
        a = (torch.rand(FAST_ACCUM_MN, k, generator=g) * 0.5 + 0.5).to(E4M3)
        b = (torch.rand(k, FAST_ACCUM_MN, generator=g) * 0.5 + 0.5).to(E4M3)
        exact = a.double() @ b.double()  # products of e4m3 values, summed in float64
        a, b = a.to(device), column_major(b.to(device))
        for fast in errors:
            out = scaled_mm(a, b, unit, unit, out_dtype=F32, use_fast_accum=fast)
            errors[fast].append(((out.double().cpu() - exact).abs() / exact).max().item())
    return errors


@pytest.mark.claim("FP8-FAST-ACCUM")
@pytest.mark.requires("cuda", "fp8_scaled_mm")
def test_fast_accumulation_loses_precision_with_k(amp_device, record):
    errors = accumulation_errors(amp_device.torch_device)
    for fast, values in errors.items():
        record.history(**{f"{'fast' if fast else 'default'}/max_rel_error_by_k": values})
    record.metric(fast_error_at_largest_k=errors[True][-1],
                      default_error_at_largest_k=errors[False][-1])  # fmt: skip
    bound = FAST_ACCUM_K[-1] * torch.finfo(F32).eps
    grows = errors[True][-1] > 4 * errors[True][0] and errors[True][-1] > 10 * bound
    record.verdict(
        "FP8-FAST-ACCUM",
        "confirmed" if grows and errors[False][-1] <= bound else "refuted",
        f"{amp_device.describe()}, e4m3 {FAST_ACCUM_MN}xK @ Kx{FAST_ACCUM_MN} of values in "
        f"[0.5, 1], largest relative error against the exact product at K = "
        f"{', '.join(map(str, FAST_ACCUM_K))}: use_fast_accum "
        + ", ".join(f"{e:.2g}" for e in errors[True])
        + "; default "
        + ", ".join(f"{e:.2g}" for e in errors[False])
        + f" (float32's bound at the largest K: {bound:.2g})",
    )
    assert grows, f"FP8-FAST-ACCUM: fast accumulation's error did not grow with K: {errors}"
    # Negative control: the default accumulation on the same GPU keeps float32's precision.
    assert errors[False][-1] <= bound, f"FP8-FAST-ACCUM: the default erred {errors[False]}"


# --- FP8 against bf16 in training ---------------------------------------------------------------

FP8_TRAINING = recipes.Recipe(
    "fp8-tensorwise",
    "every Linear through e4m3 forward and e5m2 gradients, one scale per tensor, fp32 weights",
    convert=to_float8_linears,
)
# Negative control: the same casts without a scale, on gradients made small (the loss times
# SMALL_GRADIENTS, as late in training): they fall below e5m2's smallest subnormal, 1.5e-5,
# where one scale per tensor would have lifted them. bf16 keeps them (fp32's range).
SMALL_GRADIENTS = 2.0**-12
FP8_UNSCALED = recipes.Recipe(
    "fp8-unscaled",
    "every Linear through e4m3 and e5m2 with no scale: values cast as they are",
    convert=lambda model: to_float8_linears(model, scaled=False),
)
CONVERGENCE_SEEDS = tuple(range(stats.pairs_without_spread()))  # 6 at 95%
CONVERGENCE = {"params": 5_000, "steps": 60, "lr": 3e-3, "batch_size": 64}
PENALTY = 0.01  # a consistent gap of 1% of bf16's loss: what a paired test should not hide


def final_losses(recipe: recipes.Recipe, amp_device, loss_multiplier: float = 1.0) -> list[float]:
    """The validation loss after CONVERGENCE's training, per seed (weights and batches)."""
    losses = []
    for seed in CONVERGENCE_SEEDS:
        task = make_task("mlp", seed=0)
        with recipe.bind(amp_device) as precision:
            model = models.build("mlp", CONVERGENCE["params"], seed=seed, **task.model_options)
            train(model, precision, task, CONVERGENCE["steps"], lr=CONVERGENCE["lr"],
                  batch_size=CONVERGENCE["batch_size"], seed=seed,
                  loss_multiplier=loss_multiplier)  # fmt: skip
            losses.append(evaluate(model, precision, task)["val_loss"])
    return losses


@pytest.mark.claim("FP8-MATCHES-BF16")
@pytest.mark.requires("bf16_autocast")
def test_fp8_training_matches_bf16_within_run_to_run_variation(amp_device, record):
    bf16 = final_losses(recipes.get("amp-bf16"), amp_device)
    fp8 = final_losses(FP8_TRAINING, amp_device)
    small = final_losses(recipes.get("amp-bf16"), amp_device, SMALL_GRADIENTS)
    unscaled = final_losses(FP8_UNSCALED, amp_device, SMALL_GRADIENTS)
    spread = float(torch.tensor(bf16).std())  # bf16's own seed-to-seed variation
    penalty = PENALTY * float(torch.tensor(bf16).mean())
    gap, control = stats.paired_difference(bf16, fp8), stats.paired_difference(small, unscaled)
    record.param(**CONVERGENCE, model="mlp", seeds=len(CONVERGENCE_SEEDS))
    record.param(control_loss_multiplier=SMALL_GRADIENTS)
    record.history(bf16_val_loss=bf16, fp8_val_loss=fp8, bf16_small_grad_val_loss=small,
                   fp8_unscaled_small_grad_val_loss=unscaled)  # fmt: skip
    record.metric(fp8_minus_bf16=gap.mean, unscaled_minus_bf16=control.mean,
                      bf16_seed_spread=spread)  # fmt: skip
    worse = gap.mean > 0
    if gap.beyond(spread) and worse:
        verdict = "refuted"
    elif gap.within(spread):
        verdict = "partly" if gap.beyond(penalty) and worse else "confirmed"
    else:
        verdict = "inconclusive"
    hidden = (
        f"; the paired test finds a consistent penalty beyond {PENALTY:.0%} that the spread hides"
        if verdict == "partly" else ""
    )  # fmt: skip
    record.verdict(
        "FP8-MATCHES-BF16",
        verdict,
        f"an mlp of {CONVERGENCE['params']:,} parameters, {CONVERGENCE['steps']} steps, "
        f"{len(CONVERGENCE_SEEDS)} seeds paired (weights and batches), fp8 emulated (e4m3 "
        f"forward, e5m2 gradients, one scale per tensor, products exact in float32): validation "
        f"loss fp8 minus bf16 {gap.describe(digits=3)} against bf16's own seed-to-seed spread "
        f"{spread:.3g} (its mean {sum(bf16) / len(bf16):.4g}){hidden}. Control, the loss "
        f"times 2**-12 and fp8 casts without a scale, minus bf16 on the same loss: "
        f"{control.describe(digits=3)}",
    )
    assert verdict != "refuted", (
        f"FP8-MATCHES-BF16: fp8 minus bf16 {gap.describe(digits=3)}, beyond the spread {spread:.3g}"
    )
    # Negative control: without a scale, small gradients underflow e5m2 and the paired test
    # sees fp8 fall behind beyond bf16's run-to-run variation.
    assert control.beyond(spread) and control.mean > 0, (
        f"FP8-MATCHES-BF16: the unscaled control was not worse beyond {spread:.3g}: "
        f"{control.describe(digits=3)}"
    )
