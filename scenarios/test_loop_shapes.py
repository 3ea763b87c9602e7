"""GradScaler in the loop shapes users have (SCL-STEP-UNSCALES, SCL-UPDATE-DYNAMIC,
SCL-NAN-INCREASES, PIT3-CHECK-BEFORE-STEP, PIT1-GRADNORM).

scenarios/test_grad_scaler.py decides these claims on one model, one optimizer, one param group
and one backward per step, where a scaler checking only part of an optimizer's gradients passed.
Here each test is one shape, tried case by case, and each verdict names the cases where the
claim held and where not (harness.lab.loops.Across). The forward passes are fp32 on weights
and inputs in multiples of 1/16 and 1/8 (harness.lab.loops): the scale is a power of two, so a
scaled step and an fp32 step make the same update, and any gap is the loop's. No autocast:
these claims are the scaler's, and fp16 rounding would blur an exact comparison.

- several param groups (weight decay, none, a head at a quarter of the lr): an inf or NaN in
  any one group skips the whole step, every group untouched, and backs the scale off once;
- two models, two losses and two optimizers sharing one scaler (a GAN's generator and
  discriminator), `scaler.step` for each and one `update()`: as torch documents (the AMP
  examples, "Working with multiple models, losses, and optimizers"; torch/amp/grad_scaler.py
  keeps found_inf per optimizer and update() sums them), each optimizer is checked on its own
  gradients: the one with an inf skips, the other steps, and the scale backs off once however
  many found one. update() between the steps (the docs: once, at the end) unscales the second
  optimizer's gradients by the scale it just halved: twice the true gradients;
- gradient accumulation (3 scaled backwards, one unscale_, clip_grad_norm_, step, update): the
  fp32 accumulated-and-clipped update, the true norm read after unscale_, a step skipped for an
  inf in any one micro-batch; a second unscale_ in one step raises;
- SGD, Adam and AdamW as torch picks them (on the CPU a for-loop, on CUDA foreach),
  foreach=True and fused=True (whose kernels take the scaler's inv_scale and inf check
  themselves: `_step_supports_amp_scaling`): the fp32 update, a warm step skipped on inf and
  NaN. A skipped *first* step (a scaler calibrating) leaves fused SGD a momentum buffer that no
  gradient wrote (torch.optim.sgd._fused_sgd makes it with torch.empty_like, and the kernel
  returns on found_inf): its next step reads uninitialised memory as momentum, where the other
  implementations start afresh. Measured on the CPU on torch 2.4.1, 2.5.1, 2.6.0, 2.9.1, 2.13.0
  and 2.14.1 alike; predicted on CUDA from the same Python code;
- zero_grad(set_to_none=True) and a branch not in this step's forward: unscale_ and step leave
  the parameters without a gradient untouched (AdamW's decay and momentum would move them on a
  zero gradient, as zero_grad(set_to_none=False) shows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from harness.lab.loops import Across, Snapshot, Step, exact_batch, exact_linear

LR = 2.0**-4
MOMENTUM = 0.5
ROWS = 3  # rows of every batch
EXACT = 1e-6  # relative tolerance for updates that are exact up to fp32 rounding
BAD = {"inf": math.inf, "nan": math.nan}


def _scaler(amp_device) -> torch.amp.GradScaler:
    return torch.amp.GradScaler(amp_device.type)


def _scale(scaler: torch.amp.GradScaler | None) -> float:
    return scaler.get_scale() if scaler else 1.0


def _backward(loss: torch.Tensor, scaler: torch.amp.GradScaler | None) -> None:
    (scaler.scale(loss) if scaler else loss).backward()


def _step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> None:
    """scaler.step and update(), or, without a scaler (the fp32 reference), a plain step."""
    if scaler is None:
        optimizer.step()
        return
    scaler.step(optimizer)
    scaler.update()


def _poison(param: torch.Tensor, value: float) -> None:
    """One non-finite gradient element, as an overflow in backward leaves it."""
    with torch.no_grad():
        param.grad.view(-1)[0] = value


def _mse(model: nn.Module, device: torch.device, start: int = 0) -> torch.Tensor:
    x, y = exact_batch(ROWS, 4, 2, device, start)
    return F.mse_loss(model(x), y)


def _observed(model: nn.Module, optimizer, scaler, step) -> Step:
    """What `step()` did to the model's parameters, the optimizer's state and the scale."""
    before, scale = Snapshot.of(model.named_parameters(), optimizer), _scale(scaler)
    step()
    return Step(before, Snapshot.of(model.named_parameters(), optimizer), scale, _scale(scaler))


def _listed(names: list[str]) -> str:
    return ", ".join(names) or "none"


def _scale_move(step: Step) -> str:
    return f"scale {step.scale_before:g} -> {step.scale_after:g}"


def _taken(step: Step) -> str:
    return "step skipped" if step.skipped else f"step taken, changed {_listed(step.changed())}"


def _gap_over(steps: list[Step], references: list[Step]) -> float:
    """The largest gap of these steps' updates from the references', step by step."""
    return max(s.gap(r) for s, r in zip(steps, references, strict=True))


def _check_needed(needed: Across) -> str:
    """PIT3-CHECK-BEFORE-STEP's evidence: the article's check is needed where scaler.step
    alone changed something a skipped step must leave as it was."""
    return (
        f"a check before scaler.step needed where scaler.step alone changed something: "
        f"{needed.evidence()}"
    )


# --- several param groups in one optimizer ------------------------------------------------

# Group -> (the parameter names it holds, by prefix; its options beside the optimizer's).
GROUPS = {
    "decay": (("0.weight",), {"weight_decay": 2.0**-4}),
    "no_decay": (("0.bias",), {"weight_decay": 0.0}),
    "head": (("1.",), {"lr": LR / 4}),
}


def _two_layers(device: torch.device) -> nn.Sequential:
    return nn.Sequential(exact_linear(4, 4, device), exact_linear(4, 2, device, start=3))


def _grouped_sgd(model: nn.Module) -> torch.optim.SGD:
    named = list(model.named_parameters())
    groups = [
        {"params": [p for name, p in named if name.startswith(members)], **options}
        for members, options in GROUPS.values()
    ]
    return torch.optim.SGD(groups, lr=LR, momentum=MOMENTUM)


def _grouped_steps(device, scaler, bad: tuple[str, float] | None = None) -> list[Step]:
    """Two SGD steps over GROUPS: a clean one, then one with `bad` = (group, value) in that
    group's first parameter's gradient (clean again without `bad`)."""
    model = _two_layers(device)
    optimizer = _grouped_sgd(model)
    steps = []
    for poison in (None, bad):
        optimizer.zero_grad()
        _backward(_mse(model, device), scaler)
        if poison:
            group, value = poison
            _poison(optimizer.param_groups[list(GROUPS).index(group)]["params"][0], value)
        steps.append(_observed(model, optimizer, scaler, lambda: _step(optimizer, scaler)))
    return steps


@pytest.mark.claim(
    "SCL-STEP-UNSCALES", "PIT3-CHECK-BEFORE-STEP", "SCL-UPDATE-DYNAMIC", "SCL-NAN-INCREASES"
)
@pytest.mark.requires("grad_scaler")
def test_param_groups_are_unscaled_and_skipped_together(amp_device, record):
    device = amp_device.torch_device
    record.param(
        model="Linear(4, 4) -> Linear(4, 2)",
        optimizer=f"SGD lr={LR} momentum={MOMENTUM}",
        groups={group: options for group, (_, options) in GROUPS.items()},
    )
    clean, fp32 = _grouped_steps(device, _scaler(amp_device)), _grouped_steps(device, None)
    cases = {f"{kind}_in_{group}": (group, kind) for group in GROUPS for kind in BAD}
    bad = {
        case: _grouped_steps(device, _scaler(amp_device), (group, BAD[kind]))[1]
        for case, (group, kind) in cases.items()
    }
    # Negative control: the same bad gradients without the scaler reach the parameters.
    plain = {
        case: _grouped_steps(device, None, (group, BAD[kind]))[1]
        for case, (group, kind) in cases.items()
    }
    corrupted = [case for case, step in plain.items() if not step.after.flat().isfinite().all()]

    # The first step's: in the second, every group's gradients follow what the others did.
    gaps = {group: clean[0].gap(fp32[0], members) for group, (members, _) in GROUPS.items()}
    unscaled, needed, dynamic, nan = Across(), Across(), Across(), Across()
    for group, gap in gaps.items():
        unscaled.add(group, gap <= EXACT, f"update off fp32's by {gap:.1e}")
    dynamic.add("clean", all(s.backoff == 1 for s in clean), _scale_move(clean[-1]))
    for case, (_, kind) in cases.items():
        step = bad[case]
        needed.add(case, not step.skipped, _taken(step))
        if kind == "inf":
            dynamic.add(case, step.backoff == 0.5, _scale_move(step))
        else:
            nan.add(case, step.backoff > 1, _scale_move(step))
        record.key_metric(**{f"skipped/{case}": step.skipped, f"backoff/{case}": step.backoff})
    record.metric(**{f"update_gap/{group}": gap for group, gap in gaps.items()})

    record.verdict("SCL-STEP-UNSCALES", unscaled.verdict(), unscaled.evidence())
    record.verdict(
        "PIT3-CHECK-BEFORE-STEP",
        needed.verdict(),
        f"{_check_needed(needed)}; without the scaler, plain SGD left non-finite parameters in "
        f"{len(corrupted)} of {len(plain)} cases",
    )
    record.verdict("SCL-UPDATE-DYNAMIC", dynamic.verdict(), dynamic.evidence())
    record.verdict("SCL-NAN-INCREASES", nan.verdict(), nan.evidence())
    for group, gap in gaps.items():
        assert gap <= EXACT, (
            f"SCL-STEP-UNSCALES: param group {group}: predicted the fp32 update, off by rel "
            f"{gap:.3g}"
        )
    assert all(step.backoff == 1 for step in clean), (
        f"SCL-UPDATE-DYNAMIC: predicted clean steps to keep the scale, {_scale_move(clean[-1])}"
    )
    for case, (_, kind) in cases.items():
        step = bad[case]
        assert step.skipped, (
            f"PIT3-CHECK-BEFORE-STEP: {case}: predicted the whole step skipped, every group "
            f"untouched; changed {_listed(step.changed())}"
        )
        claim = "SCL-UPDATE-DYNAMIC" if kind == "inf" else "SCL-NAN-INCREASES"
        assert step.backoff == 0.5, (
            f"{claim}: {case}: predicted the scale backed off once (x0.5), {_scale_move(step)}"
        )
    assert len(corrupted) == len(plain), (
        f"PIT3-CHECK-BEFORE-STEP: predicted plain SGD without the scaler to write every bad "
        f"value into the parameters, left {_listed(sorted(set(plain) - set(corrupted)))} finite"
    )


# --- several optimizers sharing one scaler --------------------------------------------------

GAN = ("generator", "discriminator")  # stepped in this order, one update() after both
GAN_CASES = {
    "clean": (),
    "inf_in_generator": ("generator",),
    "inf_in_discriminator": ("discriminator",),
    "inf_in_both": GAN,
}


def _gan(device: torch.device) -> nn.ModuleDict:
    return nn.ModuleDict(
        {
            "generator": exact_linear(4, 4, device, start=1),
            "discriminator": exact_linear(4, 1, device, start=5),
        }
    )


def _gan_losses(gan: nn.ModuleDict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The discriminator's loss (real towards 1, generated towards 0, the generator detached)
    and the generator's (its output towards 1 through the discriminator, whose gradients it
    adds to: both losses reach the discriminator, as in the AMP examples' two-model loop)."""
    real, noise = exact_batch(ROWS, 4, 1, device)[0], exact_batch(ROWS, 4, 1, device, 2)[0]
    judge, fake = gan["discriminator"], gan["generator"](noise)
    d_loss = (judge(real) - 1).pow(2).mean() + judge(fake.detach()).pow(2).mean()
    return d_loss, (judge(fake) - 1).pow(2).mean()


def _gan_setup(device) -> tuple[nn.ModuleDict, dict[str, torch.optim.SGD]]:
    gan = _gan(device)
    return gan, {n: torch.optim.SGD(gan[n].parameters(), lr=LR, momentum=MOMENTUM) for n in GAN}


def _gan_iteration(gan, optimizers, scaler, poisoned=(), update_each=False) -> None:
    """Both backwards, an inf in the `poisoned` models' gradients, a step per optimizer and one
    update() at the end (`update_each`: after each step, the pitfall)."""
    device = next(gan.parameters()).device
    for optimizer in optimizers.values():
        optimizer.zero_grad()
    for loss in _gan_losses(gan, device):
        _backward(loss, scaler)
    for name in poisoned:
        _poison(gan[name].weight, math.inf)
    for optimizer in optimizers.values():
        if scaler is None:
            optimizer.step()
            continue
        scaler.step(optimizer)
        if update_each:
            scaler.update()
    if scaler is not None and not update_each:
        scaler.update()


def _gan_run(device, scaler, poisoned=()) -> dict[str, Step]:
    """A clean iteration, then one with an inf in the `poisoned` models' gradients: per model,
    what its optimizer's step did in the second."""
    gan, optimizers = _gan_setup(device)
    _gan_iteration(gan, optimizers, scaler)

    def snapshots() -> dict[str, Snapshot]:
        return {n: Snapshot.of(gan[n].named_parameters(), optimizers[n]) for n in GAN}

    before, scale = snapshots(), _scale(scaler)
    _gan_iteration(gan, optimizers, scaler, poisoned)
    after = snapshots()
    return {n: Step(before[n], after[n], scale, _scale(scaler)) for n in GAN}


def _gradients_with_update_between(device, scaler) -> float:
    """Negative control: update() after each optimizer's step, an inf in the generator (stepped
    first). The discriminator's gradients as its step saw them, over fp32's."""
    gan, optimizers = _gan_setup(device)
    _gan_iteration(gan, optimizers, scaler, ("generator",), update_each=True)
    reference, _ = _gan_setup(device)
    for loss in _gan_losses(reference, device):
        loss.backward()
    seen, true = (model["discriminator"].weight.grad for model in (gan, reference))
    return float(seen.norm() / true.norm())


def _predicted_backoff(case: str) -> float:
    """x0.5 once for an iteration in which any optimizer found an inf, x1 for a clean one."""
    return 0.5 if GAN_CASES[case] else 1.0


@pytest.mark.claim("SCL-STEP-UNSCALES", "PIT3-CHECK-BEFORE-STEP", "SCL-UPDATE-DYNAMIC")
@pytest.mark.requires("grad_scaler")
def test_several_optimizers_sharing_one_scaler_decide_alone(amp_device, record):
    device = amp_device.torch_device
    record.param(
        models="generator Linear(4, 4), discriminator Linear(4, 1)",
        optimizers=f"SGD lr={LR} momentum={MOMENTUM} each",
        order=" then ".join(GAN),
    )
    fp32 = _gan_run(device, None)
    runs = {case: _gan_run(device, _scaler(amp_device), bad) for case, bad in GAN_CASES.items()}
    # Negative control: update() between the steps unscales the discriminator by the halved scale.
    ratio = _gradients_with_update_between(device, _scaler(amp_device))
    # The optimizers whose own gradients are finite, with their update's gap from fp32's.
    gaps = {
        (case, name): step.gap(fp32[name])
        for case, steps in runs.items()
        for name, step in steps.items()
        if name not in GAN_CASES[case]
    }

    unscaled, needed, dynamic = Across(), Across(), Across()
    for (case, name), gap in gaps.items():
        unscaled.add(f"{case}/{name}", gap <= EXACT, f"update off fp32's by {gap:.1e}")
        record.metric(**{f"update_gap/{case}.{name}": gap})
    for case, steps in runs.items():
        for name in GAN_CASES[case]:
            step = steps[name]
            needed.add(f"{case}/{name}", not step.skipped, _taken(step))
        record.key_metric(**{f"skipped/{case}.{name}": s.skipped for name, s in steps.items()})
        backoff = steps[GAN[0]].backoff  # one scale: the first optimizer's Step has it too
        record.key_metric(**{f"backoff/{case}": backoff})
        dynamic.add(case, backoff == _predicted_backoff(case), _scale_move(steps[GAN[0]]))
    record.metric(update_between_gradient_ratio=ratio)

    record.verdict(
        "SCL-STEP-UNSCALES",
        unscaled.verdict(),
        f"{unscaled.evidence()}; update() between the two steps: the discriminator's gradients "
        f"{ratio:g}x the true ones",
    )
    record.verdict("PIT3-CHECK-BEFORE-STEP", needed.verdict(), _check_needed(needed))
    record.verdict("SCL-UPDATE-DYNAMIC", dynamic.verdict(), dynamic.evidence())
    for (case, name), gap in gaps.items():
        assert gap <= EXACT, (
            f"SCL-STEP-UNSCALES: {case}: predicted the {name} to take fp32's step (its own "
            f"gradients are finite), off by rel {gap:.3g}"
        )
    for case, steps in runs.items():
        for name in GAN_CASES[case]:
            assert steps[name].skipped, (
                f"PIT3-CHECK-BEFORE-STEP: {case}: predicted the {name}'s step skipped (its own "
                f"gradients hold the inf); changed {_listed(steps[name].changed())}"
            )
        assert steps[GAN[0]].backoff == _predicted_backoff(case), (
            f"SCL-UPDATE-DYNAMIC: {case}: predicted the scale x{_predicted_backoff(case):g} "
            f"(once per iteration, whichever optimizers found an inf), "
            f"{_scale_move(steps[GAN[0]])}"
        )
    assert math.isclose(ratio, 2.0, rel_tol=EXACT), (
        f"SCL-STEP-UNSCALES: predicted update() between the steps to leave the discriminator's "
        f"gradients 2x the true ones (unscaled by the halved scale), got {ratio:g}x"
    )


# --- gradient accumulation ------------------------------------------------------------------

MICRO_BATCHES = 3
CLIP = 2.0**-3  # max_norm, below the accumulated gradients' norm: the clip acts


@dataclass(frozen=True)
class _Accumulated:
    step: Step
    norm_before_unscale: float
    norm: float  # what clip_grad_norm_ returned after unscale_


def _norm(model: nn.Module) -> float:
    """The gradients' 2-norm, read without touching them (clip_grad_norm_ with max_norm=inf
    would multiply inf gradients by inf/inf, NaN)."""
    norms = [torch.linalg.vector_norm(p.grad) for p in model.parameters()]
    return float(torch.linalg.vector_norm(torch.stack(norms)))


def _accumulated_step(model, optimizer, scaler, bad_micro_batch=None) -> _Accumulated:
    """MICRO_BATCHES backwards of loss / MICRO_BATCHES (an inf in the gradients after micro-batch
    `bad_micro_batch`, from 0), then unscale_ once, clip_grad_norm_, step, update."""
    device = next(model.parameters()).device
    optimizer.zero_grad()
    for k in range(MICRO_BATCHES):
        _backward(_mse(model, device, start=k) / MICRO_BATCHES, scaler)
        if k == bad_micro_batch:
            _poison(model.weight, math.inf)
    read = _norm(model)
    norms = []

    def unscale_clip_step() -> None:
        if scaler is not None:
            scaler.unscale_(optimizer)
        norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), max_norm=CLIP)))
        _step(optimizer, scaler)

    step = _observed(model, optimizer, scaler, unscale_clip_step)
    return _Accumulated(step, read, norms[0])


def _accumulation_run(device, scaler, bad_micro_batch=None) -> _Accumulated:
    """A clean accumulated step, then one with an inf in micro-batch `bad_micro_batch`."""
    model = exact_linear(4, 2, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    _accumulated_step(model, optimizer, scaler)
    return _accumulated_step(model, optimizer, scaler, bad_micro_batch)


def _unscale_each_micro_batch(device, scaler) -> int | None:
    """Negative control: unscale_ after every micro-batch, the pitfall. The micro-batch (from 1)
    whose unscale_ raised RuntimeError, or None if none did."""
    model = exact_linear(4, 2, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for k in range(MICRO_BATCHES):
        _backward(_mse(model, device, start=k) / MICRO_BATCHES, scaler)
        try:
            scaler.unscale_(optimizer)
        except RuntimeError:
            return k + 1
    return None


@pytest.mark.claim(
    "SCL-STEP-UNSCALES", "PIT1-GRADNORM", "PIT3-CHECK-BEFORE-STEP", "SCL-UPDATE-DYNAMIC"
)
@pytest.mark.requires("grad_scaler")
def test_accumulated_gradients_are_unscaled_once_and_skipped_whole(amp_device, record):
    device = amp_device.torch_device
    record.param(
        model="Linear(4, 2)",
        optimizer=f"SGD lr={LR} momentum={MOMENTUM}",
        micro_batches=MICRO_BATCHES,
        max_norm=CLIP,
    )
    fp32 = _accumulation_run(device, None)
    cases = {"clean": None} | {f"inf_in_micro_batch_{k + 1}": k for k in range(MICRO_BATCHES)}
    runs = {case: _accumulation_run(device, _scaler(amp_device), k) for case, k in cases.items()}
    # Negative control: a loop that unscale_s each micro-batch is stopped, not divided again.
    raised_at = _unscale_each_micro_batch(device, _scaler(amp_device))

    clean = runs.pop("clean")
    gap = clean.step.gap(fp32.step)
    norm_gap = abs(clean.norm - fp32.norm) / fp32.norm
    read_ratio = clean.norm_before_unscale / clean.norm
    unscaled, norms, needed, dynamic = Across(), Across(), Across(), Across()
    unscaled.add(
        "clean",
        gap <= EXACT,
        f"update off fp32's accumulated and clipped one (norm {fp32.norm:.4g} clipped to "
        f"{CLIP:g}) by {gap:.1e}",
    )
    norms.add(
        "clean",
        norm_gap <= EXACT,
        f"norm after unscale_ {clean.norm:.6g}, fp32's {fp32.norm:.6g}; before unscale_ "
        f"{read_ratio:g}x",
    )
    unscaled.add(
        "unscale_ each micro-batch",
        raised_at == 2,
        f"RuntimeError from the unscale_ after micro-batch {raised_at} of {MICRO_BATCHES}: never "
        f"divided twice"
        if raised_at
        else f"unscale_ ran after all {MICRO_BATCHES} micro-batches, dividing the first ones again",
    )
    dynamic.add("clean", clean.step.backoff == 1, _scale_move(clean.step))
    for case, run in runs.items():
        needed.add(case, not run.step.skipped, _taken(run.step))
        norms.add(case, not math.isfinite(run.norm), f"norm after unscale_ {run.norm:g}")
        dynamic.add(case, run.step.backoff == 0.5, _scale_move(run.step))
        record.key_metric(**{f"skipped/{case}": run.step.skipped})
    record.key_metric(**{f"backoff/{case}": run.step.backoff for case, run in runs.items()})
    record.metric(
        update_gap=gap, norm_gap=norm_gap, norm_read_before_unscale_ratio=read_ratio,
        fp32_norm=fp32.norm, second_unscale_raised_at_micro_batch=raised_at or 0,
    )  # fmt: skip

    record.verdict("SCL-STEP-UNSCALES", unscaled.verdict(), unscaled.evidence())
    record.verdict("PIT1-GRADNORM", norms.verdict(), norms.evidence())
    record.verdict("PIT3-CHECK-BEFORE-STEP", needed.verdict(), _check_needed(needed))
    record.verdict("SCL-UPDATE-DYNAMIC", dynamic.verdict(), dynamic.evidence())
    assert fp32.norm > CLIP, (
        f"SCL-STEP-UNSCALES: accumulation: predicted the accumulated norm {fp32.norm:g} above "
        f"max_norm {CLIP:g}, so that the clip acts"
    )
    assert gap <= EXACT, (
        f"SCL-STEP-UNSCALES: accumulation: predicted the fp32 accumulated-and-clipped update, "
        f"off by rel {gap:.3g}"
    )
    assert norm_gap <= EXACT, (
        f"PIT1-GRADNORM: accumulation: predicted the norm read after unscale_ to be fp32's "
        f"{fp32.norm:.6g}, got {clean.norm:.6g}"
    )
    assert math.isclose(read_ratio, clean.step.scale_before, rel_tol=EXACT), (
        f"PIT1-GRADNORM: accumulation: predicted the norm read before unscale_ "
        f"{clean.step.scale_before:g}x the true one, got {read_ratio:g}x"
    )
    assert clean.step.backoff == 1, (
        f"SCL-UPDATE-DYNAMIC: accumulation: predicted a clean step to keep the scale, "
        f"{_scale_move(clean.step)}"
    )
    for case, run in runs.items():
        assert run.step.skipped, (
            f"PIT3-CHECK-BEFORE-STEP: {case}: predicted the step skipped; changed "
            f"{_listed(run.step.changed())}"
        )
        assert not math.isfinite(run.norm), (
            f"PIT1-GRADNORM: {case}: predicted the norm read after unscale_ to be inf, got "
            f"{run.norm:g}"
        )
        assert run.step.backoff == 0.5, (
            f"SCL-UPDATE-DYNAMIC: {case}: predicted the scale x0.5 once per step, "
            f"{_scale_move(run.step)}"
        )
    assert raised_at == 2, (
        f"SCL-STEP-UNSCALES: accumulation: predicted a second unscale_ in one step (micro-batch "
        f"2) to raise RuntimeError, raised at {raised_at}"
    )


# --- the optimizer implementations users pick -----------------------------------------------

IMPLEMENTATIONS = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}
# eps near the gradients' size: at the default 1e-8 Adam's update is nearly blind to their
# scale, and gradients left 65536x too large would pass for the fp32 update.
KINDS = {
    "SGD": (torch.optim.SGD, {"momentum": MOMENTUM, "weight_decay": 2.0**-6}),
    "Adam": (torch.optim.Adam, {"eps": 2.0**-6}),
    "AdamW": (torch.optim.AdamW, {"eps": 2.0**-6, "weight_decay": 2.0**-4}),
}
# (kind, implementation) whose skipped first step leaves the next step a history: fused SGD's
# momentum buffer, made by torch.empty_like and never written when the kernel finds an inf
# (torch.optim.sgd._fused_sgd). Measured on the CPU on torch 2.4.1, 2.5.1, 2.6.0, 2.9.1, 2.13.0
# and 2.14.1; where a release fixes it, harness/lab/releases.py is to say from which.
FIRST_SKIP_LEAVES_HISTORY = {("SGD", "fused")}
CONTROL_GAP = 1e-2  # an update off fp32's by more: the comparison sees a scaling error


def _optimizer(kind: str, implementation: str, params) -> torch.optim.Optimizer:
    make, options = KINDS[kind]
    return make(params, lr=LR, **options, **IMPLEMENTATIONS[implementation])


def _kind_steps(device, kind, implementation, scaler, poisons) -> list[Step]:
    """A Linear(4, 2) trained by `kind` under `implementation`, one step per entry of
    `poisons`: the value put in that step's gradients (None: a clean step)."""
    model = exact_linear(4, 2, device)
    optimizer = _optimizer(kind, implementation, model.parameters())
    steps = []
    for poison in poisons:
        optimizer.zero_grad()
        _backward(_mse(model, device), scaler)
        if poison is not None:
            _poison(model.weight, poison)
        steps.append(_observed(model, optimizer, scaler, lambda: _step(optimizer, scaler)))
    return steps


def _checked_first_step(device, kind, implementation, scaler) -> Step:
    """An inf in the first step, with the article's check: unscale_, then scaler.step only if
    every gradient is finite (update() either way, so the scale backs off)."""
    model = exact_linear(4, 2, device)
    optimizer = _optimizer(kind, implementation, model.parameters())
    _backward(_mse(model, device), scaler)
    _poison(model.weight, math.inf)

    def checked_step() -> None:
        scaler.unscale_(optimizer)
        if all(bool(torch.isfinite(p.grad).all()) for p in model.parameters()):
            scaler.step(optimizer)
        scaler.update()

    return _observed(model, optimizer, scaler, checked_step)


def _step_on_scaled_gradients(device, kind, implementation, scaler) -> Step:
    """Negative control: optimizer.step() on the gradients scaler.scale made, never unscaled."""
    model = exact_linear(4, 2, device)
    optimizer = _optimizer(kind, implementation, model.parameters())
    _backward(_mse(model, device), scaler)
    return _observed(model, optimizer, None, optimizer.step)


def _history(snapshot: Snapshot) -> list[str]:
    """The state entries that tell the next step a step was taken: a step count above 0
    (Adam), a momentum buffer (SGD, whose first step makes it from the gradient: present, it is
    read as momentum, whatever it holds)."""
    return [
        name
        for name, value in snapshot.state.items()
        if name.endswith(".momentum_buffer") or (name.endswith(".step") and float(value) > 0)
    ]


def _takes_the_scaling(implementation: str, device: torch.device) -> int:
    """How many of KINDS, under `implementation`, take the scaler's inv_scale and inf check
    into their own step (scaler.step then calls optimizer.step() whatever the gradients hold)."""
    params = [nn.Parameter(torch.ones(1, device=device))]
    return sum(
        bool(getattr(_optimizer(kind, implementation, params), "_step_supports_amp_scaling", 0))
        for kind in KINDS
    )


@dataclass(frozen=True)
class _KindRun:
    """One optimizer kind under one implementation, measured."""

    gap: float  # the scaled steps' updates off fp32's
    control_gap: float  # optimizer.step() on the scaled gradients, off fp32's
    warm: dict[str, Step]  # a step after a clean one, per BAD value in its gradients
    first: Step  # an inf in the first step, scaler.step alone
    left: list[str]  # the history that first step left
    left_checked: list[str]  # the history it left with the article's check first


def _kind_run(amp_device, kind: str, implementation: str) -> _KindRun:
    device = amp_device.torch_device

    def scaled(*poisons) -> list[Step]:
        return _kind_steps(device, kind, implementation, _scaler(amp_device), poisons)

    fp32 = _kind_steps(device, kind, implementation, None, (None, None))
    # Negative control: optimizer.step() on the scaled gradients misses fp32's update.
    control = _step_on_scaled_gradients(device, kind, implementation, _scaler(amp_device))
    (first,) = scaled(math.inf)
    checked = _checked_first_step(device, kind, implementation, _scaler(amp_device))
    return _KindRun(
        gap=_gap_over(scaled(None, None), fp32),
        control_gap=control.gap(fp32[0]),
        warm={bad: scaled(None, value)[1] for bad, value in BAD.items()},
        first=first,
        left=_history(first.after),
        left_checked=_history(checked.after),
    )


@pytest.mark.claim("SCL-STEP-UNSCALES", "PIT3-CHECK-BEFORE-STEP", "SCL-NAN-INCREASES")
@pytest.mark.requires("grad_scaler")
@pytest.mark.parametrize(
    "implementation",
    [
        pytest.param("default"),
        pytest.param("foreach"),
        pytest.param("fused", marks=pytest.mark.requires("fused_optimizers")),
    ],
)
def test_optimizer_implementations_unscale_and_skip(amp_device, record, implementation):
    record.param(
        model="Linear(4, 2)",
        implementation=f"{implementation} {IMPLEMENTATIONS[implementation]}",
        optimizers={kind: options for kind, (_, options) in KINDS.items()},
    )
    runs = {kind: _kind_run(amp_device, kind, implementation) for kind in KINDS}
    in_kernel = _takes_the_scaling(implementation, amp_device.torch_device)

    unscaled, needed, nan = Across(), Across(), Across()
    for kind, run in runs.items():
        unscaled.add(
            kind,
            run.gap <= EXACT,
            f"update off fp32's by {run.gap:.1e} over 2 steps (optimizer.step() on the scaled "
            f"gradients: off by {run.control_gap:.3g})",
        )
        for bad, step in run.warm.items():
            needed.add(f"{kind}.{bad}", not step.skipped, _taken(step))
            record.key_metric(**{f"skipped/{kind}.{bad}": step.skipped})
        needed.add(
            f"{kind}.first_step",
            bool(run.first.update().any()) or run.left != run.left_checked,
            f"a skipped first step left {len(run.left)} entries that tell the next step a step "
            f"was taken ({_listed(run.left)}), {len(run.left_checked)} with the check",
        )
        warm_nan = run.warm["nan"]
        nan.add(kind, warm_nan.backoff > 1, f"{_scale_move(warm_nan)}, {_taken(warm_nan)}")
        record.key_metric(**{f"first_skip_history/{kind}": len(run.left)})
        record.metric(**{f"update_gap/{kind}": run.gap, f"scaled_step_gap/{kind}": run.control_gap})
    record.metric(amp_scaling_in_kernel=in_kernel)

    record.verdict(
        "SCL-STEP-UNSCALES",
        unscaled.verdict(),
        f"{implementation} ({in_kernel} of {len(KINDS)} take the scaler's inv_scale and inf "
        f"check into their kernels): {unscaled.evidence()}",
    )
    record.verdict(
        "PIT3-CHECK-BEFORE-STEP", needed.verdict(), f"{implementation}: {_check_needed(needed)}"
    )
    record.verdict("SCL-NAN-INCREASES", nan.verdict(), nan.evidence())
    for kind, run in runs.items():
        where = f"{implementation} {kind}"
        assert run.gap <= EXACT, (
            f"SCL-STEP-UNSCALES: {where}: predicted the fp32 update, off by rel {run.gap:.3g}"
        )
        assert run.control_gap > CONTROL_GAP, (
            f"SCL-STEP-UNSCALES: {where}: predicted optimizer.step() on the scaled gradients to "
            f"miss fp32's update, off by only {run.control_gap:.3g}"
        )
        for bad, step in run.warm.items():
            assert step.skipped, (
                f"PIT3-CHECK-BEFORE-STEP: {where}: predicted a step with {bad} gradients "
                f"skipped; changed {_listed(step.changed())}"
            )
        assert run.warm["nan"].backoff == 0.5, (
            f"SCL-NAN-INCREASES: {where}: predicted NaN gradients to halve the scale, "
            f"{_scale_move(run.warm['nan'])}"
        )
        assert not run.first.update().any(), (
            f"PIT3-CHECK-BEFORE-STEP: {where}: predicted a first step with an inf to leave the "
            f"parameters untouched; changed {_listed(run.first.changed())}"
        )
        predicted = (kind, implementation) in FIRST_SKIP_LEAVES_HISTORY
        assert bool(run.left) == predicted, (
            f"PIT3-CHECK-BEFORE-STEP: {where}: predicted a skipped first step to leave "
            f"{'a momentum buffer no gradient wrote' if predicted else 'no history'}, left "
            f"{_listed(run.left)}"
        )
        assert not run.left_checked, (
            f"PIT3-CHECK-BEFORE-STEP: {where}: predicted the check before scaler.step to leave "
            f"no history, left {_listed(run.left_checked)}"
        )


# --- parameters without a gradient ----------------------------------------------------------

BRANCHES = ("head_a", "head_b")  # one per step in turn: the other head has no gradient


def _two_headed(device: torch.device) -> nn.ModuleDict:
    return nn.ModuleDict(
        {
            "trunk": exact_linear(4, 4, device),
            "head_a": exact_linear(4, 2, device, start=3),
            "head_b": exact_linear(4, 2, device, start=6),
        }
    )


def _branch_steps(device, scaler, set_to_none=True, poison_last=False) -> list[Step]:
    """AdamW over the trunk and both heads, one step through each branch in turn (and, with
    `poison_last`, one more through head_a with an inf in the trunk's gradients)."""
    model = _two_headed(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, eps=2.0**-6, weight_decay=2.0**-4)
    plan = [(branch, None) for branch in BRANCHES] + [(BRANCHES[0], math.inf)] * poison_last
    steps = []
    for branch, poison in plan:
        optimizer.zero_grad(set_to_none=set_to_none)
        x, y = exact_batch(ROWS, 4, 2, device)
        _backward(F.mse_loss(model[branch](model["trunk"](x)), y), scaler)
        if poison is not None:
            _poison(model["trunk"].weight, poison)
        steps.append(_observed(model, optimizer, scaler, lambda: _step(optimizer, scaler)))
    return steps


def _idle(branch: str) -> str:
    """The head left out of a step through `branch`."""
    return next(other for other in BRANCHES if other != branch)


@pytest.mark.claim("SCL-STEP-UNSCALES", "PIT3-CHECK-BEFORE-STEP")
@pytest.mark.requires("grad_scaler")
def test_parameters_without_a_gradient_stay_untouched(amp_device, record):
    device = amp_device.torch_device
    record.param(
        model="trunk Linear(4, 4), head_a and head_b Linear(4, 2)",
        optimizer=f"AdamW lr={LR} eps={2.0**-6} weight_decay={2.0**-4}",
        branches=" then ".join(BRANCHES),
    )
    *scaled, bad = _branch_steps(device, _scaler(amp_device), poison_last=True)
    fp32 = _branch_steps(device, None)
    # Negative control: zero gradients instead of None, and AdamW moves the head left out.
    zeroed = _branch_steps(device, None, set_to_none=False)
    moved = zeroed[1].changed((f"{BRANCHES[0]}.",))
    gaps = [
        step.gap(reference, ("trunk.", f"{branch}."))
        for step, reference, branch in zip(scaled, fp32, BRANCHES, strict=True)
    ]
    touched = [step.changed((f"{_idle(b)}.",)) for step, b in zip(scaled, BRANCHES, strict=True)]

    unscaled, needed = Across(), Across()
    for index, branch in enumerate(BRANCHES):
        gap, idle_changed = gaps[index], touched[index]
        unscaled.add(
            f"step {index + 1} through {branch}",
            gap <= EXACT and not idle_changed,
            f"update off fp32's by {gap:.1e}, {_idle(branch)} without a gradient: changed "
            f"{_listed(idle_changed)}",
        )
        record.metric(**{f"update_gap/step_{index + 1}": gap})
        record.key_metric(**{f"idle_untouched/step_{index + 1}": not idle_changed})
    needed.add(
        f"inf in the trunk, {_idle(BRANCHES[0])} without a gradient",
        not bad.skipped,
        f"{_taken(bad)}, {_scale_move(bad)}",
    )
    record.key_metric(skipped=bad.skipped)

    record.verdict(
        "SCL-STEP-UNSCALES",
        unscaled.verdict(),
        f"{unscaled.evidence()}; with zero_grad(set_to_none=False) {BRANCHES[0]}'s zero "
        f"gradient in step 2 changed {len(moved)} tensors",
    )
    record.verdict("PIT3-CHECK-BEFORE-STEP", needed.verdict(), _check_needed(needed))
    for index, branch in enumerate(BRANCHES):
        assert gaps[index] <= EXACT, (
            f"SCL-STEP-UNSCALES: step {index + 1} through {branch}: predicted the fp32 update, "
            f"off by rel {gaps[index]:.3g}"
        )
        assert not touched[index], (
            f"SCL-STEP-UNSCALES: step {index + 1} through {branch}: predicted {_idle(branch)} "
            f"(no gradient) untouched; changed {_listed(touched[index])}"
        )
    assert bad.skipped and bad.backoff == 0.5, (
        f"PIT3-CHECK-BEFORE-STEP: inf in the trunk with {_idle(BRANCHES[0])} without a "
        f"gradient: predicted the step skipped and the scale halved; changed "
        f"{_listed(bad.changed())}, {_scale_move(bad)}"
    )
    assert moved, (
        f"SCL-STEP-UNSCALES: predicted AdamW to move {BRANCHES[0]} on a zero gradient "
        f"(zero_grad(set_to_none=False)), the control that untouched means no gradient"
    )
