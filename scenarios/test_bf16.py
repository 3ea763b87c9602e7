"""bfloat16 beyond the article: BF16-NO-SCALER, BF16-MASTER-WEIGHTS, BF16-RANGE-PRECISION.

The built-in bf16 catalogue (harness/catalogue/claims_bf16.toml), each claim measured on the
session's device in seconds:
- small gradients (the loss multiplied by 2**-16, as late in training) survive bf16 autocast
  without any loss scaling, while fp16 autocast without a GradScaler flushes most gradient
  entries to zero; the GradScaler (the fp16 fix) keeps them: the fraction of zeroed gradient
  entries after each step, from `train(..., on_step=probes.StepGradients())`;
- an SGD update below half a bf16 ULP of a bf16 weight is rounded away, step after step, while
  fp32 master weights accumulate it: which weights moved, against |update| / ULP(weight);
- bf16 reaches fp32's largest power of two (the same 8 exponent bits) but its machine epsilon is
  2**-7 (8 bits of precision), so a value keeps log10(2**8) = 2.4 significant decimal digits:
  found by doubling, halving and rounding random decimals, against fp16 as the control.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.lab import models, probes, recipes
from harness.lab.data import make_task
from harness.lab.formats import measure_format
from harness.lab.train import train

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32

# --- BF16-NO-SCALER: small gradients with and without loss scaling ---------------------------

PARAMS = 20_000  # an MLP whose steps take milliseconds on a CPU
STEPS = 3
LOSS_MULTIPLIER = 2.0**-16  # gradients of about 1e-9: fp16's subnormal range ends at 6e-8
NO_SCALER_RECIPES = ("fp32", "amp-bf16", "amp-fp16-noscaler", "amp-fp16")


def zeroed_fractions(recipe: str, amp_device) -> tuple[float, float]:
    """(the largest fraction of gradient entries exactly 0 after a step, the fraction that are
    below fp16's smallest normal) over STEPS steps of the MLP at LOSS_MULTIPLIER."""
    task = make_task("mlp", seed=0)
    grads = probes.StepGradients()
    with recipes.get(recipe).bind(amp_device) as precision:
        model = models.build("mlp", PARAMS, seed=0, **task.model_options)
        train(
            model, precision, task, STEPS, lr=1e-3, loss_multiplier=LOSS_MULTIPLIER, on_step=grads
        )
    return (
        max(s.zero_fraction for s in grads.steps),
        max(s.fp16_underflow_fraction for s in grads.steps),
    )


@pytest.mark.claim("BF16-NO-SCALER")
@pytest.mark.requires("bf16_autocast", "fp16_autocast", "grad_scaler")
def test_bf16_keeps_small_gradients_without_a_scaler(record, amp_device):
    measured = {recipe: zeroed_fractions(recipe, amp_device) for recipe in NO_SCALER_RECIPES}
    zeroed = {recipe: z for recipe, (z, _) in measured.items()}
    tiny = measured["fp32"][1]  # in fp32, the share of entries fp16 could not hold as normal
    record.param(model="mlp", params=PARAMS, steps=STEPS, loss_multiplier=LOSS_MULTIPLIER)
    record.metric(
        **{f"{recipe}/zeroed_grad_fraction": z for recipe, z in zeroed.items()},
        fp32_below_fp16_normal_fraction=tiny,
    )
    bf16_keeps = zeroed["amp-bf16"] <= zeroed["fp32"] + 1e-3
    fp16_loses = zeroed["amp-fp16-noscaler"] >= 0.5
    verdict = (
        "confirmed" if bf16_keeps and fp16_loses else "partly" if bf16_keeps or fp16_loses
        else "refuted"
    )  # fmt: skip
    record.verdict(
        "BF16-NO-SCALER",
        verdict,
        f"loss x 2**-16 on an MLP of {PARAMS} parameters, {STEPS} steps: the largest fraction of "
        f"gradient entries exactly 0 was {zeroed['amp-bf16']:.4f} under bf16 autocast without a "
        f"scaler, {zeroed['amp-fp16-noscaler']:.4f} under fp16 autocast without one, "
        f"{zeroed['amp-fp16']:.4f} with GradScaler and {zeroed['fp32']:.4f} in fp32 (where "
        f"{tiny:.3f} of the entries lie below fp16's smallest normal)",
    )
    assert bf16_keeps, (
        f"BF16-NO-SCALER: predicted bf16 autocast to zero no more gradient entries than fp32 "
        f"({zeroed['fp32']:.4f}), got {zeroed['amp-bf16']:.4f}"
    )
    assert fp16_loses, (
        f"BF16-NO-SCALER: predicted fp16 autocast without a scaler to zero at least half of the "
        f"gradient entries, got {zeroed['amp-fp16-noscaler']:.4f}"
    )
    # Negative control: the prescribed fp16 fix, a GradScaler, keeps the same small gradients,
    # so the zeros above come from fp16's range and not from the model or the measurement.
    assert zeroed["amp-fp16"] <= 0.01, (
        f"BF16-NO-SCALER: predicted GradScaler to keep the fp16 gradients, got "
        f"{zeroed['amp-fp16']:.4f} zeroed"
    )


# --- BF16-MASTER-WEIGHTS: updates below half a ULP ---------------------------------------------

UPDATE = 2.0**-10 * 0.75  # lr x grad: below half a bf16 ULP for weights of 2**-2 and above
WEIGHTS = [2.0**k * 1.1 for k in range(-8, 5)]  # 0.0043 to 17.6: ULPs from 2**-16 to 2**-3
MASTER_STEPS = 20


def bf16_ulp(w: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers at |w| (8 bits of precision: 2**(exponent - 7))."""
    return torch.exp2(torch.floor(torch.log2(w.abs().float())) - 7)


def sgd_steps(weights: torch.Tensor) -> torch.Tensor:
    """MASTER_STEPS steps of torch.optim.SGD with a constant gradient of -1 at lr UPDATE."""
    w = torch.nn.Parameter(weights.clone())
    optimizer = torch.optim.SGD([w], lr=UPDATE)
    for _ in range(MASTER_STEPS):
        w.grad = torch.full_like(w, -1.0)
        optimizer.step()
    return w.detach()


@pytest.mark.claim("BF16-MASTER-WEIGHTS")
def test_updates_below_half_a_bf16_ulp_are_lost(record, amp_device):
    start = torch.tensor(WEIGHTS, device=amp_device.torch_device)
    bf16_start = start.bfloat16()
    bf16_end = sgd_steps(bf16_start)
    # Negative control: fp32 master weights (what autocast keeps), updated the same way, move;
    # so the bf16 weights that stay put are stalled by rounding, not by the optimizer.
    master_end = sgd_steps(bf16_start.float())
    ratio = (UPDATE / bf16_ulp(bf16_start)).cpu()  # |update| in ULPs of each weight
    moved_bf16 = (bf16_end != bf16_start).cpu()
    moved_master = (master_end != bf16_start.float()).cpu()
    below = ratio < 0.5
    stalled_below = int((~moved_bf16 & below).sum())
    moved_above = int((moved_bf16 & ~below).sum())
    record.param(update=UPDATE, steps=MASTER_STEPS, weights=len(WEIGHTS))
    record.metric(
        weights_below_half_ulp=int(below.sum()),
        bf16_stalled_below_half_ulp=stalled_below,
        bf16_moved_above_half_ulp=moved_above,
        fp32_master_moved=int(moved_master.sum()),
    )
    confirmed = stalled_below == int(below.sum()) > 0 and moved_above == int((~below).sum())
    record.verdict(
        "BF16-MASTER-WEIGHTS",
        "confirmed" if confirmed else "refuted",
        f"{MASTER_STEPS} SGD steps of {UPDATE:g} each: of {int(below.sum())} bf16 weights whose "
        f"update is below half a ULP ({', '.join(f'{w:.3g}' for w in start[below].tolist())}), "
        f"{stalled_below} never moved; of {int((~below).sum())} above it, {moved_above} moved; "
        f"with fp32 master weights {int(moved_master.sum())} of {len(WEIGHTS)} moved (by "
        f"{float((master_end - bf16_start.float()).max()):.4g} at most)",
    )
    assert stalled_below == int(below.sum()) > 0, (
        f"BF16-MASTER-WEIGHTS: predicted the {int(below.sum())} bf16 weights whose update is "
        f"below half a ULP to stall, {stalled_below} did: {bf16_end[below].tolist()}"
    )
    assert moved_above == int((~below).sum()), (
        f"BF16-MASTER-WEIGHTS: predicted the bf16 weights above half a ULP to move, "
        f"{moved_above} of {int((~below).sum())} did"
    )
    assert bool(moved_master.all()), (
        f"BF16-MASTER-WEIGHTS: predicted every fp32 master weight to move, got {moved_master}"
    )


# --- BF16-RANGE-PRECISION: fp32's range, 8 bits of precision ----------------------------------


def significant_digits(dtype: torch.dtype, device: torch.device) -> float:
    """-log10 of the largest relative error of 10,000 random decimals in [1, 10) rounded to
    `dtype`: the decimal digits every value keeps."""
    values = 1 + 9 * torch.rand(10_000, generator=torch.Generator().manual_seed(0), dtype=F32)
    values = values.double().to(device)
    error = ((values.to(dtype).double() - values).abs() / values).max()
    return -math.log10(float(error))


@pytest.mark.claim("BF16-RANGE-PRECISION")
@pytest.mark.requires("half_training")  # fp16 arithmetic, for the control
def test_bf16_has_the_range_of_fp32_and_8_bits_of_precision(record, amp_device):
    device = amp_device.torch_device
    measured = {d: measure_format(d, device) for d in (BF16, F32, F16)}
    top = {d: fmt.max_pow2 for d, fmt in measured.items()}  # the largest finite power of two
    bits = {d: fmt.mantissa_bits + 1 for d, fmt in measured.items()}  # and the implicit bit
    digits = {d: significant_digits(d, device) for d in (BF16, F16)}
    record.metric(
        bf16_max_pow2_log2=math.log2(top[BF16]),
        fp32_max_pow2_log2=math.log2(top[F32]),
        bf16_precision_bits=bits[BF16],
        bf16_significant_digits=digits[BF16],
        fp16_precision_bits=bits[F16],
        fp16_significant_digits=digits[F16],
    )
    same_range = top[BF16] == top[F32]
    eight_bits = bits[BF16] == 8 and 2 <= digits[BF16] <= 3
    record.verdict(
        "BF16-RANGE-PRECISION",
        "confirmed"
        if same_range and eight_bits
        else "partly"
        if same_range or eight_bits
        else "refuted",  # fmt: skip
        f"largest power of two 2**{math.log2(top[BF16]):g} in bf16 and 2**{math.log2(top[F32]):g} "
        f"in fp32; {bits[BF16]} bits of precision in bf16 ({bits[F32]} in fp32), and 10000 random "
        f"decimals keep {digits[BF16]:.2f} significant digits in bf16 ({digits[F16]:.2f} in fp16, "
        f"{bits[F16]} bits, largest power 2**{math.log2(top[F16]):g})",
    )
    assert same_range, f"BF16-RANGE-PRECISION: predicted fp32's range, got {top}"
    assert bits[BF16] == 8, f"BF16-RANGE-PRECISION: predicted 8 bits of precision, got {bits}"
    assert 2 <= digits[BF16] <= 3, (
        f"BF16-RANGE-PRECISION: predicted 2 to 3 significant digits, got {digits[BF16]:.2f}"
    )
    # Negative control: fp16, measured the same way, has a far smaller range and 11 bits, so
    # the measurement tells formats apart rather than answering fp32's figures for anything.
    assert top[F16] == 2.0**15 and bits[F16] == 11, (
        f"BF16-RANGE-PRECISION: predicted fp16 to reach 2**15 with 11 bits, got "
        f"{top[F16]:g} and {bits[F16]}"
    )
