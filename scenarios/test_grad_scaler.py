"""GradScaler: what scale, step and update really do (SCL-SCALE, SCL-STEP-UNSCALES,
SCL-UPDATE-DYNAMIC, SCL-NAN-INCREASES, PIT3-CHECK-BEFORE-STEP).

On a Linear(4, 2) with weights and inputs in multiples of 1/16, so every product is exact:
- `scaler.scale(loss)` multiplies the loss, and so the gradients, by exactly 65536 (the default);
  without it a 2**-28 loss has all-zero gradients under fp16 autocast;
- `scaler.step` divides the gradients back (the update equals plain fp32 SGD), once even after
  `unscale_`; `optimizer.step()` on the scaled gradients moves the weights 65536 times too far;
- `update` halves the scale on inf, doubles it after growth_interval clean steps in a row, an inf
  restarts the count, and nothing stops it below 1;
- a NaN gradient halves the scale (the article says it increases it), skips the step and resets
  the growth counter;
- `scaler.step` already skips `optimizer.step()` on inf/NaN gradients (Adam's state untouched), so
  a manual check before it changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from harness.lab import recipes

LR = 2.0**-4
TINY = 2.0**-28  # loss = TINY * sum(outputs): a gradient below fp16's 2**-25 round-to-zero bound
EXACT = 1e-6  # relative tolerance for results that are exact up to fp32 rounding


def _linear(device: torch.device) -> torch.nn.Linear:
    """Linear(4, 2) with fixed weights in multiples of 1/16 (exact in fp16 and fp32)."""
    layer = torch.nn.Linear(4, 2).to(device)
    with torch.no_grad():
        layer.weight.copy_(((torch.arange(8.0) - 4) / 16).reshape(2, 4))
        layer.bias.fill_(0.25)
    return layer


def _batch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x = ((torch.arange(12.0) - 5.5) / 8).reshape(3, 4)
    y = torch.tensor([[1.0, -1.0], [0.5, 0.0], [-0.5, 2.0]])
    return x.to(device), y.to(device)


def _mse(model: torch.nn.Module, device: torch.device) -> torch.Tensor:
    x, y = _batch(device)
    return F.mse_loss(model(x), y)


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


def _grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().flatten() for p in model.parameters()]).clone()


def _poison(model: torch.nn.Linear, value: float) -> None:
    """Inject one non-finite gradient element after backward."""
    with torch.no_grad():
        model.weight.grad[0, 0] = value


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# --- SCL-SCALE ------------------------------------------------------------------------------


def _tiny_loss_grads(precision: recipes.Precision, device: torch.device, scaled: bool):
    """Gradients of a TINY loss under fp16 autocast; divided back by the scale when scaled."""
    model = _linear(device)
    x, _ = _batch(device)
    with precision.forward():
        out = model(x)
    loss = out.float().sum() * TINY
    if not scaled:
        loss.backward()
        return _grads(model)
    precision.backward(loss)
    return _grads(model) / precision.scaler.get_scale()


@pytest.mark.claim("SCL-SCALE")
@pytest.mark.requires("fp16_autocast", "grad_scaler")
def test_scale_multiplies_the_loss_and_the_gradients(amp_device, record):
    device = amp_device.torch_device
    record.param(recipe="amp-fp16", model="Linear(4, 2)", tiny_loss=TINY)
    with recipes.get("amp-fp16").bind(amp_device) as precision:
        scaler = precision.scaler
        default_scale = scaler.get_scale()
        reference = _linear(device)
        _mse(reference, device).backward()
        model = _linear(device)
        loss = _mse(model, device)
        scaled_loss = scaler.scale(loss)
        scaled_loss.backward()
        loss_ratio = scaled_loss.item() / loss.item()
        ratios = _grads(model) / _grads(reference)
        grad_err = _rel(_grads(model), _grads(reference) * default_scale)

        # Negative control: the same tiny loss under fp16 autocast, without and with scaling.
        x, _ = _batch(device)
        tiny_reference = _linear(device)
        (tiny_reference(x).sum() * TINY).backward()
        plain = _tiny_loss_grads(precision, device, scaled=False)
        rescued = _tiny_loss_grads(precision, device, scaled=True)
        rescued_err = _rel(rescued, _grads(tiny_reference))
    plain_zero, rescued_nonzero = int((plain == 0).sum()), int((rescued != 0).sum())
    record.metric(
        default_scale=default_scale,
        loss_ratio=loss_ratio,
        grad_ratio_min=float(ratios.min()),
        grad_ratio_max=float(ratios.max()),
        grad_rel_err=grad_err,
        tiny_plain_zero_grads=plain_zero,
        tiny_scaled_nonzero_grads=rescued_nonzero,
        tiny_scaled_rel_err=rescued_err,
    )

    multiplies = loss_ratio == default_scale and grad_err <= EXACT
    n = plain.numel()
    record.verdict(
        "SCL-SCALE",
        "confirmed" if multiplies else "refuted",
        f"default scale {default_scale:g}; scaled loss / loss = {loss_ratio:g}; scaled / fp32 "
        f"gradients {float(ratios.min()):g}..{float(ratios.max()):g} (rel err {grad_err:.1e}); "
        f"a loss x 2**{math.log2(TINY):g} under fp16 autocast: {plain_zero}/{n} gradients zero "
        f"unscaled, {rescued_nonzero}/{n} nonzero scaled (rel err {rescued_err:.1e} once "
        f"divided back)",
    )
    assert default_scale == 2.0**16, (
        f"SCL-SCALE: predicted default scale 65536, got {default_scale}"
    )
    assert loss_ratio == default_scale, (
        f"SCL-SCALE: predicted loss x{default_scale:g}, got x{loss_ratio:g}"
    )
    assert grad_err <= EXACT, (
        f"SCL-SCALE: gradients are not x{default_scale:g}: rel err {grad_err:.3g}"
    )
    assert plain_zero == n, f"SCL-SCALE: predicted unscaled tiny gradients all 0, {plain_zero}/{n}"
    assert rescued_nonzero == n and rescued_err <= 1e-3, (
        f"SCL-SCALE: predicted scaled tiny gradients to survive: {rescued_nonzero}/{n} nonzero, "
        f"rel err {rescued_err}"
    )


# --- SCL-STEP-UNSCALES ----------------------------------------------------------------------


def _after_one_sgd_step(device: torch.device, backward_and_step) -> torch.Tensor:
    """The parameters after one SGD step on the fixed batch, done by `backward_and_step`."""
    model = _linear(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    backward_and_step(_mse(model, device), optimizer)
    return _flat(model)


@pytest.mark.claim("SCL-STEP-UNSCALES")
@pytest.mark.requires("fp16_autocast", "grad_scaler")
def test_step_divides_the_gradients_back(amp_device, record):
    device = amp_device.torch_device
    record.param(recipe="amp-fp16", model="Linear(4, 2)", optimizer=f"SGD lr={LR}")
    start = _flat(_linear(device))
    scaler = torch.amp.GradScaler(amp_device.type)

    def fp32(loss, optimizer):
        loss.backward()
        optimizer.step()

    def scaler_step(loss, optimizer):  # step() alone, no unscale_()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    def optimizer_step(loss, optimizer):  # negative control: the scaled gradients, as they are
        torch.amp.GradScaler(amp_device.type).scale(loss).backward()
        optimizer.step()

    with recipes.get("amp-fp16").bind(amp_device) as precision:

        def unscale_then_step(loss, optimizer):  # the recipe: unscale_(), step(), update()
            precision.backward(loss)
            precision.step(optimizer)

        reference = _after_one_sgd_step(device, fp32)
        stepped = _after_one_sgd_step(device, scaler_step)
        unscaled_first = _after_one_sgd_step(device, unscale_then_step)
    naive = _after_one_sgd_step(device, optimizer_step)
    step_err, unscale_err = _rel(stepped, reference), _rel(unscaled_first, reference)
    naive_ratio = float((naive - start).norm() / (reference - start).norm())
    record.metric(
        step_rel_err=step_err, unscale_then_step_rel_err=unscale_err, naive_update_ratio=naive_ratio
    )

    if step_err <= EXACT:
        verdict = "confirmed" if unscale_err <= EXACT else "partly"
    else:
        verdict = "refuted"
    record.verdict(
        "SCL-STEP-UNSCALES",
        verdict,
        f"params after scaler.step vs an fp32 SGD step: rel diff {step_err:.1e}; after unscale_ "
        f"then step: {unscale_err:.1e} (not divided twice); optimizer.step() on the scaled "
        f"gradients moves the weights {naive_ratio:g}x as far",
    )
    assert step_err <= EXACT, (
        f"SCL-STEP-UNSCALES: params after scaler.step off by rel {step_err:.3g}"
    )
    assert unscale_err <= EXACT, (
        f"SCL-STEP-UNSCALES: unscale_ then step off by rel {unscale_err:.3g} (divided twice?)"
    )
    assert abs(naive_ratio / 2.0**16 - 1) < 1e-3, (
        f"SCL-STEP-UNSCALES: predicted optimizer.step() on scaled gradients 65536x too far, "
        f"got {naive_ratio:g}x"
    )


# --- SCL-UPDATE-DYNAMIC ---------------------------------------------------------------------

INTERVAL = 3
# c: a clean step, i: an inf gradient. Grow after 3 clean; back off; 2 clean then an inf (the
# count restarts); 3 clean to grow again; 2 more; then 20 infs in a row.
SCRIPT = "cccicciccccc" + "i" * 20


# The control's scaler: other factors than the defaults' x2 and x0.5, the same rule.
CONTROL_FACTORS = {"growth_factor": 4.0, "backoff_factor": 0.25}


def _predicted_scales(
    script: str,
    scale: float,
    interval: int,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
) -> list[float]:
    """The documented rule: x backoff_factor on inf (count reset), x growth_factor after
    `interval` clean steps in a row (x0.5 and x2 by default)."""
    scales, clean = [], 0
    for kind in script:
        if kind == "i":
            scale, clean = scale * backoff_factor, 0
        else:
            clean += 1
            if clean == interval:
                scale, clean = scale * growth_factor, 0
        scales.append(scale)
    return scales


def _scale_history(scaler: torch.amp.GradScaler, script: str, device: torch.device) -> list[float]:
    model = _linear(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scales = []
    for kind in script:
        optimizer.zero_grad()
        scaler.scale(_mse(model, device)).backward()
        if kind == "i":
            _poison(model, math.inf)
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


@pytest.mark.claim("SCL-UPDATE-DYNAMIC")
@pytest.mark.requires("grad_scaler")
def test_update_backs_off_on_inf_and_grows_after_the_interval(amp_device, record):
    device = amp_device.torch_device
    default_interval = torch.amp.GradScaler(amp_device.type).get_growth_interval()
    scaler = torch.amp.GradScaler(amp_device.type, growth_interval=INTERVAL)
    start = scaler.get_scale()
    measured = _scale_history(scaler, SCRIPT, device)
    predicted = _predicted_scales(SCRIPT, start, INTERVAL)
    # Negative control: a scaler with other factors, through the same steps, follows the rule
    # with its own factors: the scale moves by what update() computes, not by a fixed script.
    other = torch.amp.GradScaler(amp_device.type, growth_interval=INTERVAL, **CONTROL_FACTORS)
    control = _scale_history(other, SCRIPT, device)
    control_predicted = _predicted_scales(SCRIPT, start, INTERVAL, **CONTROL_FACTORS)
    record.param(growth_interval=INTERVAL, script=SCRIPT, control_factors=CONTROL_FACTORS)
    record.history(scale=measured, predicted_scale=predicted, control_scale=control)
    record.history(inf=[float(kind == "i") for kind in SCRIPT])
    record.metric(default_growth_interval=default_interval, final_scale=measured[-1])

    if measured == predicted:
        verdict = "confirmed"
    else:
        verdict = "partly" if len(set(measured)) > 1 else "refuted"
    head = len(SCRIPT.rstrip("i"))  # the scripted part before the run of infs
    record.verdict(
        "SCL-UPDATE-DYNAMIC",
        verdict,
        f"growth_interval {INTERVAL}, steps {SCRIPT[:head]}: scale from {start:g}: "
        f"{' '.join(f'{s:g}' for s in measured[:head])} (rule: "
        f"{' '.join(f'{s:g}' for s in predicted[:head])}); then {len(SCRIPT) - head} infs: "
        f"{measured[-1]:g} (no floor); default growth_interval {default_interval}; with "
        f"growth x{CONTROL_FACTORS['growth_factor']:g} and backoff "
        f"x{CONTROL_FACTORS['backoff_factor']:g} the same steps ended at {control[-1]:g} "
        f"(rule: {control_predicted[-1]:g})",
    )
    assert measured == predicted, (
        f"SCL-UPDATE-DYNAMIC: predicted scales {predicted}, measured {measured}"
    )
    assert measured[-1] == 0.0625, (
        f"SCL-UPDATE-DYNAMIC: predicted 0.0625 (no floor), got {measured[-1]}"
    )
    assert default_interval == 2000, (
        f"SCL-UPDATE-DYNAMIC: predicted default growth_interval 2000, got {default_interval}"
    )
    assert control == control_predicted, (
        f"SCL-UPDATE-DYNAMIC: predicted a scaler with factors {CONTROL_FACTORS} to follow the "
        f"rule with them, {control_predicted}; measured {control}"
    )


# --- SCL-NAN-INCREASES ----------------------------------------------------------------------


@dataclass
class _Observed:
    scale_before: float
    scale_after: float
    growth_tracker: int
    params_changed: bool
    skipped: bool  # as the recipe's StepReport says


@pytest.mark.claim("SCL-NAN-INCREASES")
@pytest.mark.requires("fp16_autocast", "grad_scaler")
def test_nan_gradients_halve_the_scale_and_skip_the_step(amp_device, record):
    device = amp_device.torch_device
    record.param(recipe="amp-fp16", model="Linear(4, 2)", optimizer=f"SGD lr={LR}")
    with recipes.get("amp-fp16").bind(amp_device) as precision:
        model = _linear(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)

        def step(poison: float | None) -> _Observed:
            optimizer.zero_grad()
            precision.backward(_mse(model, device))
            if poison is not None:
                _poison(model, poison)
            before = _flat(model)
            report = precision.step(optimizer)
            return _Observed(
                report.scale,
                precision.scaler.get_scale(),
                precision.scaler._get_growth_tracker(),
                not torch.equal(_flat(model), before),
                report.skipped,
            )

        clean = step(None)  # negative control: a clean step before the NaN
        nan = step(math.nan)
    record.metric(
        scale_before_nan=nan.scale_before,
        scale_after_nan=nan.scale_after,
        growth_tracker_before_nan=clean.growth_tracker,
        growth_tracker_after_nan=nan.growth_tracker,
        nan_step_params_changed=nan.params_changed,
        clean_step_params_changed=clean.params_changed,
    )

    after, before = nan.scale_after, nan.scale_before
    direction = "increased" if after > before else "decreased" if after < before else "unchanged"
    record.verdict(
        "SCL-NAN-INCREASES",
        "confirmed" if after > before else "refuted",
        f"NaN gradient: scale {before:g} -> {after:g} ({direction}), step "
        f"{'skipped' if not nan.params_changed else 'applied'}, growth tracker "
        f"{clean.growth_tracker} -> {nan.growth_tracker}; the clean step before it: scale "
        f"{clean.scale_before:g} -> {clean.scale_after:g}, params "
        f"{'updated' if clean.params_changed else 'unchanged'}",
    )
    assert after == before * 0.5, (
        f"SCL-NAN-INCREASES: predicted {before:g} -> {before / 2:g}, got {after:g}"
    )
    assert not nan.params_changed and nan.skipped, (
        "SCL-NAN-INCREASES: predicted the NaN step to be skipped, params changed"
    )
    assert nan.growth_tracker == 0, (
        f"SCL-NAN-INCREASES: predicted the growth tracker reset to 0, got {nan.growth_tracker}"
    )
    assert clean.scale_after == clean.scale_before and clean.growth_tracker == 1, (
        f"SCL-NAN-INCREASES: a clean step moved the scale {clean.scale_before:g} -> "
        f"{clean.scale_after:g} (tracker {clean.growth_tracker})"
    )
    assert clean.params_changed, "SCL-NAN-INCREASES: the clean step did not update the params"


# --- PIT3-CHECK-BEFORE-STEP -----------------------------------------------------------------


@dataclass
class _BadStep:
    params: torch.Tensor  # after the bad step
    params_unchanged: bool  # bitwise, across the bad step
    adam_state_unchanged: bool  # step count and both moments, bitwise
    adam_steps: float
    optimizer_step_calls: int  # during the bad step
    returned: object  # what the bad step's scaler.step (or optimizer.step) returned
    scale_before: float
    scale: float  # after the bad step's update() (the unused scaler's 65536 for "plain")


def _adam_state(optimizer: torch.optim.Adam) -> tuple[float, torch.Tensor]:
    states = list(optimizer.state.values())
    moments = [s[k].flatten() for s in states for k in ("exp_avg", "exp_avg_sq")]
    return float(states[0]["step"]), torch.cat(moments).clone()


def _bad_step(device: torch.device, bad: float, mode: str) -> _BadStep:
    """A clean Adam step, then one with a `bad` gradient element. mode: "scaler" (scaler.step
    alone), "manual" (unscale_, check, step only if finite) or "plain" (no scaler at all)."""
    model = _linear(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scaler = torch.amp.GradScaler(device.type)
    calls = []
    optimizer.register_step_pre_hook(lambda *_: calls.append(1))

    def step(poison: float | None):
        optimizer.zero_grad()
        loss = _mse(model, device)
        (loss if mode == "plain" else scaler.scale(loss)).backward()
        if poison is not None:
            _poison(model, poison)
        if mode == "plain":
            return optimizer.step()
        if mode == "manual":
            scaler.unscale_(optimizer)
            finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
            returned = scaler.step(optimizer) if finite else None
        else:
            returned = scaler.step(optimizer)
        scaler.update()  # after a skipped step too, so the scale backs off
        return returned

    step(None)
    params, (steps, moments), calls_before = _flat(model), _adam_state(optimizer), len(calls)
    scale_before = scaler.get_scale()
    returned = step(bad)
    steps_after, moments_after = _adam_state(optimizer)
    return _BadStep(
        params=_flat(model),
        params_unchanged=torch.equal(_flat(model), params),
        adam_state_unchanged=steps_after == steps and torch.equal(moments_after, moments),
        adam_steps=steps_after,
        optimizer_step_calls=len(calls) - calls_before,
        returned=returned,
        scale_before=scale_before,
        scale=scaler.get_scale(),
    )


@pytest.mark.claim("PIT3-CHECK-BEFORE-STEP")
@pytest.mark.requires("grad_scaler")
def test_scaler_step_already_skips_non_finite_gradients(amp_device, record):
    device = amp_device.torch_device
    record.param(model="Linear(4, 2)", optimizer=f"Adam lr={LR}")
    bad_values = {"inf": math.inf, "nan": math.nan}
    runs = {
        (name, mode): _bad_step(device, value, mode)
        for name, value in bad_values.items()
        for mode in ("scaler", "manual", "plain")
    }
    scaler_runs = {name: runs[name, "scaler"] for name in bad_values}
    same = {
        name: torch.equal(r.params, runs[name, "manual"].params)
        and r.scale == runs[name, "manual"].scale
        for name, r in scaler_runs.items()
    }
    corrupted = {
        name: int((~torch.isfinite(runs[name, "plain"].params)).sum()) for name in bad_values
    }
    for name, r in scaler_runs.items():
        record.metric(
            **{
                f"{name}_optimizer_step_calls": r.optimizer_step_calls,
                f"{name}_params_unchanged": r.params_unchanged,
                f"{name}_adam_state_unchanged": r.adam_state_unchanged,
                f"{name}_manual_check_same_result": same[name],
                f"{name}_plain_nonfinite_params": corrupted[name],
            }
        )

    untouched = {
        name: r.params_unchanged and r.adam_state_unchanged for name, r in scaler_runs.items()
    }
    self_skipped = all(
        untouched[name] and r.optimizer_step_calls == 0 for name, r in scaler_runs.items()
    )
    n = runs["inf", "plain"].params.numel()
    record.verdict(
        "PIT3-CHECK-BEFORE-STEP",
        # Redundant advice when the scaler skips on its own; needed (the article right) if not.
        "refuted" if self_skipped else "confirmed",
        "; ".join(
            f"{name} gradient: scaler.step called optimizer.step() {r.optimizer_step_calls} "
            f"times and returned {r.returned}, params and Adam state (step count "
            f"{r.adam_steps:g}) {'unchanged' if untouched[name] else 'changed'}, "
            f"scale {r.scale_before:g} -> {r.scale:g}, "
            f"{'the same' if same[name] else 'a different'} result with a manual check first; "
            f"plain Adam without the scaler: {corrupted[name]}/{n} params non-finite"
            for name, r in scaler_runs.items()
        ),
    )
    for name in bad_values:
        scaler_run = runs[name, "scaler"]
        assert scaler_run.optimizer_step_calls == 0 and scaler_run.returned is None, (
            f"PIT3-CHECK-BEFORE-STEP: predicted scaler.step to skip optimizer.step() on {name}, "
            f"it called it {scaler_run.optimizer_step_calls} times"
        )
        assert scaler_run.params_unchanged and scaler_run.adam_state_unchanged, (
            f"PIT3-CHECK-BEFORE-STEP: {name} gradient changed the params or Adam's state"
        )
        assert same[name], (
            f"PIT3-CHECK-BEFORE-STEP: a manual check changed the outcome of a {name} step"
        )
        # Negative control: without the scaler the bad gradient reaches the weights.
        assert corrupted[name] > 0, (
            f"PIT3-CHECK-BEFORE-STEP: predicted plain Adam to corrupt the params on {name}"
        )
