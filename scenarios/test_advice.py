"""The article's advice, checked as users follow it (PIT1-GRADNORM, PIT3-CHECK-BEFORE-STEP).

PIT1-GRADNORM (and PRACTICE-SMOKE) tell users to watch the gradient norm: they read it from
`clip_grad_norm_`'s return value and check it with `isfinite`. PIT3-CHECK-BEFORE-STEP tells them
to check the gradients before `scaler.step`, and the article's hazard there is gradients that
underflow to zero, not only inf/NaN. Measured here:
- the norm `clip_grad_norm_` returns for inf, NaN, all-zero, huge (finite, 1e18 each: their
  squares overflow fp32) and ordinary gradients, and what `isfinite` then says of it;
- the same norm read before and after `scaler.unscale_`: the scale times the true one before;
- what `scaler.step` does with all-zero gradients (it steps: only a check catches them) and with
  an inf (it skips: there the check is redundant).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

WIDTH = 64  # a Linear(64, 64): 4160 gradient entries
# Per-entry gradient values, as a user's check meets them.
FILLS = {"inf": math.inf, "nan": math.nan, "zero": 0.0, "huge": 1e18, "ordinary": 1e-3}
SEED = 0


def _linear(device: torch.device) -> nn.Linear:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return nn.Linear(WIDTH, WIDTH).to(device)


def _read_norm(model: nn.Module, max_norm: float = 1.0) -> float:
    """The norm as users read it: clip_grad_norm_'s return value (its defaults otherwise)."""
    return float(nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm))


def norms_read(device: torch.device) -> dict[str, float]:
    """The norm clip_grad_norm_ returns with every gradient entry set to each of FILLS."""
    model = _linear(device)
    read = {}
    for name, fill in FILLS.items():
        for param in model.parameters():
            param.grad = torch.full_like(param, fill)
        read[name] = _read_norm(model)
    return read


def _entries(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _scaled_backward(device: torch.device, scaler: torch.amp.GradScaler, loss_factor: float):
    """One forward and scaled backward under fp16 autocast; `loss_factor` 0 gives all-zero
    gradients, inf an inf in every gradient."""
    model = _linear(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(SEED)).to(device)
    with torch.autocast(device.type, dtype=torch.float16):
        loss = model(x).float().pow(2).mean()
    scaler.scale(loss * loss_factor).backward()
    return model, optimizer


def norm_before_and_after_unscale(device: torch.device) -> tuple[float, float, float]:
    """(the norm read before unscale_, after it, the scale) for one scaled backward."""
    scaler = torch.amp.GradScaler(device.type)
    model, optimizer = _scaled_backward(device, scaler, 1.0)
    before = _read_norm(model, max_norm=math.inf)  # reading only: nothing clipped
    scaler.unscale_(optimizer)
    return before, _read_norm(model, max_norm=math.inf), scaler.get_scale()


def scaler_step_on(device: torch.device, loss_factor: float) -> dict:
    """What scaler.step does with the gradients of `loss_factor`: optimizer.step() calls, whether
    the parameters moved, and the norm a user's check reads after unscale_."""
    scaler = torch.amp.GradScaler(device.type)
    model, optimizer = _scaled_backward(device, scaler, loss_factor)
    steps: list[int] = []
    optimizer.register_step_pre_hook(lambda *_: steps.append(1))
    before = [p.detach().clone() for p in model.parameters()]
    scaler.unscale_(optimizer)
    norm = _read_norm(model, max_norm=math.inf)
    scaler.step(optimizer)
    scaler.update()
    moved = any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    return {"steps": len(steps), "moved": moved, "norm": norm, "scale": scaler.get_scale()}


def _isfinite_says(norm: float) -> str:
    return "passes" if math.isfinite(norm) else "flags"


@pytest.mark.claim("PIT1-GRADNORM")
@pytest.mark.requires("fp16_autocast", "grad_scaler")
def test_the_norm_users_read_from_clip_grad_norm(amp_device, record):
    device = amp_device.torch_device
    read = norms_read(device)
    before, after, scale = norm_before_and_after_unscale(device)
    entries = _entries(_linear(device))
    exact = math.sqrt(entries) * FILLS["ordinary"]
    record.param(width=WIDTH, entries=entries, fills=FILLS)
    record.metric(
        **{f"norm_read/{name}": value for name, value in read.items()},
        norm_before_unscale=before,
        norm_after_unscale=after,
        scale=scale,
    )
    ratio = before / after
    true_after_unscale = math.isclose(ratio, scale, rel_tol=1e-6)
    misleads = read["zero"] == 0.0 or not math.isfinite(read["huge"])
    verdict = ("partly" if misleads else "confirmed") if true_after_unscale else "refuted"
    record.verdict(
        "PIT1-GRADNORM",
        verdict,
        f"clip_grad_norm_ over {entries} entries returned {read['inf']:g} for inf gradients, "
        f"{read['nan']:g} for NaN, {read['zero']:g} for all-zero (isfinite "
        f"{_isfinite_says(read['zero'])}: underflow goes unseen), {read['huge']:g} for finite "
        f"entries of {FILLS['huge']:g} (isfinite {_isfinite_says(read['huge'])}), "
        f"{read['ordinary']:.6g} for {FILLS['ordinary']:g} (exact {exact:.6g}); read before "
        f"unscale_ {before:.4g}, after {after:.4g}: {ratio:g}x, the scale {scale:g}",
    )
    assert math.isinf(read["inf"]) and math.isnan(read["nan"]), (
        f"PIT1-GRADNORM: predicted clip_grad_norm_ to return inf and NaN for inf and NaN "
        f"gradients, got {read}"
    )
    assert read["zero"] == 0.0, (
        f"PIT1-GRADNORM: predicted a norm of 0 (finite: isfinite passes it) for all-zero "
        f"gradients, got {read['zero']}"
    )
    assert math.isinf(read["huge"]), (
        f"PIT1-GRADNORM: predicted an inf norm for finite gradients of {FILLS['huge']:g} (their "
        f"squares overflow fp32: isfinite flags a step the scaler would take), got {read['huge']}"
    )
    assert true_after_unscale, (
        f"PIT1-GRADNORM: predicted the norm read before unscale_ to be the scale ({scale:g}) "
        f"times the one after, got {before} and {after}"
    )
    # Negative control: ordinary gradients read as their exact norm.
    assert math.isclose(read["ordinary"], exact, rel_tol=1e-5), (
        f"PIT1-GRADNORM: predicted the exact norm {exact} for gradients of "
        f"{FILLS['ordinary']:g}, got {read['ordinary']}"
    )


@pytest.mark.claim("PIT3-CHECK-BEFORE-STEP")
@pytest.mark.requires("fp16_autocast", "grad_scaler")
def test_scaler_step_takes_a_step_on_zero_gradients(amp_device, record):
    device = amp_device.torch_device
    zero = scaler_step_on(device, 0.0)
    # Negative control: an inf in the gradients, which the scaler itself skips.
    inf = scaler_step_on(device, math.inf)
    record.metric(
        zero_steps=zero["steps"], zero_norm=zero["norm"], inf_steps=inf["steps"],
        zero_scale=zero["scale"], inf_scale=inf["scale"],
    )  # fmt: skip
    catches = {
        name: not (math.isfinite(run["norm"]) and run["norm"] > 0)
        for name, run in (("zero", zero), ("inf", inf))
    }
    # The advice is redundant where the scaler skips on its own, needed where it steps.
    scaler_alone = {"zero": zero["steps"] == 0, "inf": inf["steps"] == 0}
    needed = [name for name in scaler_alone if not scaler_alone[name] and catches[name]]
    verdict = "partly" if needed and scaler_alone["inf"] else "refuted"
    verdict = verdict if scaler_alone["inf"] or needed else "confirmed"
    record.verdict(
        "PIT3-CHECK-BEFORE-STEP",
        verdict,
        f"all-zero gradients (loss x 0): scaler.step called optimizer.step() {zero['steps']} "
        f"time(s), parameters {'moved' if zero['moved'] else 'unchanged'} (weight decay, "
        f"momentum), scale {zero['scale']:g}; an inf: {inf['steps']} call(s), scale "
        f"{inf['scale']:g}. A check of the norm after unscale_ (finite and > 0) catches "
        f"{', '.join(n for n, c in catches.items() if c) or 'nothing'}: needed for "
        f"{', '.join(needed) or 'nothing'}, redundant for the inf the scaler skips",
    )
    assert zero["steps"] == 1 and zero["moved"] and zero["scale"] == 65536.0, (
        f"PIT3-CHECK-BEFORE-STEP: predicted scaler.step to step on all-zero gradients (no "
        f"inf to find) and keep the scale, got {zero}"
    )
    assert catches["zero"], (
        f"PIT3-CHECK-BEFORE-STEP: predicted the check (norm finite and > 0) to catch all-zero "
        f"gradients, norm {zero['norm']}"
    )
    assert inf["steps"] == 0 and not inf["moved"] and inf["scale"] == 32768.0, (
        f"PIT3-CHECK-BEFORE-STEP: predicted scaler.step to skip an inf and halve the scale, "
        f"got {inf}"
    )
