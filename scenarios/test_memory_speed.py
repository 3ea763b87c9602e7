"""The headline gains on a GPT-style transformer: memory (HDL-MEMORY) and speed (HDL-SPEED).

CUDA only. One full training step (forward, backward, fused AdamW) of harness.models'
transformer, 4 blocks, vocabulary 8192, 4 x 512 tokens, through the recipes' Precision verbs.
- HDL-MEMORY (article: a 7B model needs 24 GB in FP32 and 14 GB with AMP, -40%): the peak
  allocated bytes of one step, in a pass of its own, per recipe (fp32, amp-fp16, amp-bf16, half)
  at widths 1024, 2048 and 4096 (68M, 236M, 875M parameters), against harness.memory_model:
  its static part (weights, gradients, AdamW state) must match measure.state_bytes exactly, its
  peak the measured one within 10% once its activation factor is fitted at the smallest size
  (validated at the two others). The validated model then predicts the 7B configuration, and
  the verdict compares its totals and saving with 24 -> 14 GB. Predicted: 16 bytes/param of
  static memory with or without autocast, and a peak that autocast changes only by what it
  saves on activations and adds in cached fp16 weight copies. Negative control: the `half`
  recipe (fp16 weights, gradients and AdamW moments) does halve the static part: 8 bytes/param.
- HDL-SPEED (article: 3.2 -> 5.8 it/s, +80%): the step-time ratios at 875M parameters of
  amp-fp16 and amp-bf16 over fp32 (TF32 off) and over tf32, interleaved, with 95% intervals.
  Predicted: AMP significantly faster than fp32. Negative control: fp32 timed against itself
  comes out at 1x, or the test fails; and within 1/1.1-1.1x, or the verdict is inconclusive and
  the prediction not asserted (identical arms that vary by the 10% a gain is decided at leave
  the comparison undecided).
"""

from __future__ import annotations

import functools
import gc
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness import measure, memory_model, models, recipes, speedups
from harness.measure import Ratio
from harness.memory_model import GB, Breakdown

# Timings and peaks: they refuse to share the GPU with other pytest-xdist workers.
pytestmark = pytest.mark.timing

# Heads 64 wide (memory_model.transformer_plan); 2048 tokens a step at every width, so that the
# activations weigh as much as the weights at the smallest size and a tenth of them at the
# largest: the measurements test both parts of the model. vocab / width = 8 at 1024, as at 7B.
OPTIONS = {"layers": 4, "vocab": 8192, "seq_len": 512}
WIDTHS = (1024, 2048, 4096)
BATCH = 4
LR = 1e-4
# Fused attention kernels only, as the memory model assumes: SDPA's math fallback would save a
# batch x heads x seq x seq attention matrix. fp32 gets the memory-efficient kernel, fp16 and
# bf16 flash attention; both save the output and a logsumexp.
FUSED_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


def _plan(width: int) -> models.Plan:
    return memory_model.transformer_plan(width, **OPTIONS)


def _label(spec: models.Plan) -> str:
    return f"{spec.params / 1e6:.0f}M"


def _batch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and targets (random, not zeros: zeros run faster on this hardware)."""
    generator = torch.Generator(device=device).manual_seed(0)
    shape = (BATCH, OPTIONS["seq_len"])
    inputs, targets = (
        torch.randint(OPTIONS["vocab"], shape, generator=generator, device=device) for _ in range(2)
    )
    return inputs, targets


def _setup(
    spec: models.Plan, precision: recipes.Precision
) -> tuple[nn.Module, torch.optim.Optimizer]:
    with precision.device.torch_device:  # initialise on the GPU: 875M draws on the CPU take s
        model = models.build("transformer", spec.params, **spec.options)
    model = precision.prepare(model)
    return model, torch.optim.AdamW(model.parameters(), lr=LR, fused=True)


def _train_step(
    model: nn.Module,
    precision: recipes.Precision,
    optimizer: torch.optim.Optimizer,
    tokens: torch.Tensor,
    targets: torch.Tensor,
) -> None:
    """One full training step through the recipe's verbs. The gradients stay allocated between
    steps (zeroed, not freed), as the memory model counts them; the loss is taken on fp32
    logits in every recipe (autocast would cast them for cross_entropy anyway)."""
    optimizer.zero_grad(set_to_none=False)
    with precision.forward(), sdpa_kernel(FUSED_ATTENTION):
        loss = F.cross_entropy(model(tokens).flatten(0, 1).float(), targets.flatten())
    precision.backward(loss)
    precision.step(optimizer)


# --- HDL-MEMORY --------------------------------------------------------------------------------

MEMORY_RECIPES = ("fp32", "amp-fp16", "amp-bf16", "half")
TOLERANCE = 0.10  # the issue: the memory model within 10% of the measured peaks
# A fitted activation factor outside this range means the formula is wrong, not merely off.
FACTOR_RANGE = (0.5, 2.0)
ARTICLE_FP32, ARTICLE_AMP, ARTICLE_SAVING = 24 * GB, 14 * GB, 0.40
TOTAL_MATCH = 0.25  # a predicted 7B total within 25% of the article's counts as its number
SAVING_MATCH = 0.10  # a predicted saving within 10 points of 40% counts as the article's


def memory_verdict(fp32_total: float, amp_total: float, validated: bool) -> str:
    """HDL-MEMORY from the memory model's 7B totals (bytes): the article's 24 GB and 14 GB, and
    its 40% saving; inconclusive when the model did not match the measured peaks."""
    if not validated:
        return "inconclusive"
    totals = (
        abs(fp32_total / ARTICLE_FP32 - 1) <= TOTAL_MATCH
        and abs(amp_total / ARTICLE_AMP - 1) <= TOTAL_MATCH
    )
    saving = abs((1 - amp_total / fp32_total) - ARTICLE_SAVING) <= SAVING_MATCH
    if totals and saving:
        return "confirmed"
    return "partly" if totals or saving else "refuted"


@dataclass(frozen=True)
class Measured:
    static: int  # parameters, gradients and AdamW state between steps (measure.state_bytes)
    peak: int  # the static part plus the most allocated above it during one step


def _measure_memory(amp_device, recipe: str, spec: models.Plan) -> Measured:
    device = amp_device.torch_device
    with recipes.get(recipe).bind(amp_device) as precision:
        model, optimizer = _setup(spec, precision)
        tokens, targets = _batch(device)
        step = functools.partial(_train_step, model, precision, optimizer, tokens, targets)
        step()  # warm-up: gradients, AdamW state and cuBLAS workspaces exist from here on
        # Above what was allocated before: the state, the batch and the workspaces.
        above = measure.peak_memory(step, device)
        static = sum(measure.state_bytes(model, optimizer).values())
    del step, model, optimizer, tokens, targets
    gc.collect()
    torch.cuda.empty_cache()
    return Measured(static, static + above)


def _memory_figure(
    counts: list[int],
    measured: dict[tuple[str, int], Measured],
    model: dict[tuple[str, int], Breakdown],
    seven: dict[str, Breakdown],
) -> Figure:
    """Left: measured peaks against the calibrated model. Right: the model's 7B breakdown."""
    fig = Figure(figsize=(11, 4.4), layout="constrained")
    sizes, bars = fig.subplots(1, 2)
    for recipe in MEMORY_RECIPES:
        (line,) = sizes.plot(counts, [model[recipe, w].total / GB for w in WIDTHS], label=recipe)
        peaks = [measured[recipe, w].peak / GB for w in WIDTHS]
        sizes.plot(counts, peaks, "o", color=line.get_color())
    sizes.set(
        xscale="log",
        yscale="log",
        xlabel="parameters",
        ylabel="peak GB",
        title=f"one AdamW step, {BATCH}x{OPTIONS['seq_len']} tokens: measured (o), model (-)",
    )
    sizes.legend(fontsize="x-small")
    parts = {
        "weights + grads + AdamW": [seven[r].static / GB for r in MEMORY_RECIPES],
        "autocast weight copies": [seven[r].weight_cache / GB for r in MEMORY_RECIPES],
        "activations + logits": [
            (seven[r].activations + seven[r].logits) / GB for r in MEMORY_RECIPES
        ],
    }
    bottom = np.zeros(len(MEMORY_RECIPES))
    for name, values in parts.items():
        bars.bar(MEMORY_RECIPES, values, bottom=bottom, label=name)
        bottom += values
    for gb, said in ((ARTICLE_FP32 / GB, "fp32"), (ARTICLE_AMP / GB, "AMP")):
        bars.axhline(gb, color="black", linestyle=":", linewidth=1)
        bars.annotate(
            f"article {said}: {gb:.0f} GB",
            (len(MEMORY_RECIPES) - 0.5, gb),
            fontsize="x-small",
            ha="right",
            va="bottom",
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
        )
    bars.set(ylabel="GB", title="model: 7B, batch 1 x 2048 tokens")
    bars.legend(fontsize="x-small")
    return fig


@pytest.mark.claim("HDL-MEMORY")
@pytest.mark.requires("cuda", "fp16_autocast", "grad_scaler", "bf16_autocast", "half_training")
def test_memory_of_a_training_step(record, amp_device):
    plans = {width: _plan(width) for width in WIDTHS}
    measured = {}
    for recipe in MEMORY_RECIPES:
        for width in WIDTHS:
            measured[recipe, width] = _measure_memory(amp_device, recipe, plans[width])

    # The model as written, then with one activation factor per recipe fitted at the smallest
    # width and validated at the others.
    raw = {(r, w): memory_model.estimate(plans[w], r, BATCH) for r, w in measured}
    smallest, validation = WIDTHS[0], WIDTHS[1:]
    factors = {
        r: memory_model.fit_activation_factor(raw[r, smallest], measured[r, smallest].peak)
        for r in MEMORY_RECIPES
    }
    model = {
        (r, w): memory_model.estimate(plans[w], r, BATCH, activation_factor=factors[r])
        for r, w in measured
    }
    error = {key: model[key].total / measured[key].peak - 1 for key in measured}
    raw_error = {key: raw[key].total / measured[key].peak - 1 for key in measured}
    worst = max(((r, w) for r in MEMORY_RECIPES for w in validation), key=lambda k: abs(error[k]))
    static_exact = all(measured[key].static == model[key].static for key in measured)
    factors_sane = all(FACTOR_RANGE[0] <= f <= FACTOR_RANGE[1] for f in factors.values())
    validated = static_exact and factors_sane and abs(error[worst]) <= TOLERANCE

    seven = {r: memory_model.extrapolate_7b(r, factors[r]) for r in MEMORY_RECIPES}
    fp32_7b, amp_7b, half_7b = seven["fp32"], seven["amp-fp16"], seven["half"]
    n7 = memory_model.seven_b().params
    labels = {w: _label(plans[w]) for w in WIDTHS}
    per_param = {key: measured[key].static / plans[key[1]].params for key in measured}

    record.param(
        model="transformer",
        **OPTIONS,
        batch=BATCH,
        optimizer="AdamW (fused), zero_grad(set_to_none=False)",
        attention="flash / memory-efficient SDPA only",
        **{f"size.{labels[w]}.width": w for w in WIDTHS},
        **{f"size.{labels[w]}.params": plans[w].params for w in WIDTHS},
        calibrated_at=labels[smallest],
        seven_b=f"{memory_model.SEVEN_B}, batch {memory_model.SEVEN_B_BATCH}, {n7:,} params",
    )
    record.metric(
        **{f"{r}/{labels[w]}/measured_peak_GB": m.peak / GB for (r, w), m in measured.items()},
        **{f"{r}/{labels[w]}/measured_static_GB": m.static / GB for (r, w), m in measured.items()},
        **{f"{r}/{labels[w]}/static_bytes_per_param": v for (r, w), v in per_param.items()},
        **{f"{r}/{labels[w]}/model_peak_GB": b.total / GB for (r, w), b in model.items()},
        **{f"{r}/{labels[w]}/model_error": e for (r, w), e in error.items()},
        **{f"{r}/{labels[w]}/uncalibrated_error": e for (r, w), e in raw_error.items()},
        **{f"{r}/activation_factor": f for r, f in factors.items()},
        **{f"7b/{r}/total_GB": b.total / GB for r, b in seven.items()},
        **{f"7b/{r}/static_GB": b.static / GB for r, b in seven.items()},
        **{f"7b/{r}/rest_GB": b.rest / GB for r, b in seven.items()},
    )
    record.figure(
        "memory", _memory_figure([plans[w].params for w in WIDTHS], measured, model, seven)
    )

    peaks = "; ".join(
        f"{r} " + "/".join(f"{measured[r, w].peak / GB:.2f}" for w in WIDTHS)
        for r in MEMORY_RECIPES
    )
    record.verdict(
        "HDL-MEMORY",
        memory_verdict(fp32_7b.total, amp_7b.total, validated),
        f"peak GB of one AdamW step at {'/'.join(labels.values())} params: {peaks}; static "
        f"bytes/param measured fp32 {per_param['fp32', smallest]:.2f}, amp-fp16 "
        f"{per_param['amp-fp16', smallest]:.2f}, half {per_param['half', smallest]:.2f} "
        f"({'exactly' if static_exact else 'NOT'} as modelled); model within "
        f"{max(abs(e) for e in raw_error.values()):.1%} uncalibrated, "
        f"{abs(error[worst]):.1%} at {'/'.join(labels[w] for w in validation)} with activation "
        f"factors fitted at {labels[smallest]} ("
        + ", ".join(f"{r} {f:.2f}" for r, f in factors.items())
        + f"). Predicted for 7B ({n7 / 1e9:.2f}e9 params, batch 1 x 2048 tokens): fp32 "
        f"{fp32_7b.total / GB:.0f} GB, amp-fp16 {amp_7b.total / GB:.0f} GB "
        f"({amp_7b.total / fp32_7b.total - 1:+.0%}; article 24 -> 14 GB, -40%): both hold "
        f"{fp32_7b.static / GB:.0f} GB of weights, gradients and AdamW state "
        f"({fp32_7b.static / n7:.0f} B/param); "
        f"autocast cuts activations {fp32_7b.activations / GB:.1f} -> "
        f"{amp_7b.activations / GB:.1f} GB and adds {amp_7b.weight_cache / GB:.1f} GB of fp16 "
        f"weight copies. The article's 14 GB is 7e9 x 2 bytes, fp16 weights alone (inference), "
        f"below even fp32 weights alone ({fp32_7b.params / GB:.0f} GB); pure fp16 training "
        f"(half, 8 B/param) would need {half_7b.total / GB:.0f} GB",
    )

    for (r, w), m in measured.items():
        assert m.static == model[r, w].static, (
            f"HDL-MEMORY: predicted {model[r, w].static:,} bytes of parameters, gradients and "
            f"AdamW state for {r} at {labels[w]} ({model[r, w].static / plans[w].params:.2f} "
            f"B/param), measured {m.static:,} ({per_param[r, w]:.2f} B/param)"
        )
    for w in WIDTHS:
        assert measured["amp-fp16", w].static == measured["fp32", w].static, (
            f"HDL-MEMORY: predicted autocast to leave the static memory at fp32's (16 B/param) "
            f"at {labels[w]}, got {per_param['amp-fp16', w]:.2f} vs {per_param['fp32', w]:.2f}"
        )
    for r, f in factors.items():
        assert FACTOR_RANGE[0] <= f <= FACTOR_RANGE[1], (
            f"HDL-MEMORY: predicted the activation formula within {FACTOR_RANGE} of {r}'s "
            f"measured activations at {labels[smallest]}, fitted factor {f:.2f}"
        )
    for r in MEMORY_RECIPES:
        for w in validation:
            assert abs(error[r, w]) <= TOLERANCE, (
                f"HDL-MEMORY: predicted the {r} peak at {labels[w]} within {TOLERANCE:.0%}: "
                f"model {model[r, w].total / GB:.2f} GB, measured {measured[r, w].peak / GB:.2f} "
                f"GB ({error[r, w]:+.1%}, activation factor {factors[r]:.2f})"
            )
    for w in WIDTHS:
        # AMP's peak differs from fp32's by the activations it saves minus the weight copies it
        # caches, within the model's tolerance of the fp32 peak.
        predicted = model["fp32", w].total - model["amp-fp16", w].total
        seen = measured["fp32", w].peak - measured["amp-fp16", w].peak
        assert abs(seen - predicted) <= TOLERANCE * measured["fp32", w].peak, (
            f"HDL-MEMORY: predicted fp32 - amp-fp16 peak = {predicted / GB:+.2f} GB at "
            f"{labels[w]} (activations minus autocast's weight copies), measured {seen / GB:+.2f}"
        )
    # Negative control: fp16 parameters, gradients and AdamW moments do halve the static part.
    for w in WIDTHS:
        ratio = measured["half", w].static / measured["fp32", w].static
        assert abs(ratio - 0.5) < 1e-3, (
            f"HDL-MEMORY: negative control: predicted `half` to halve the static memory at "
            f"{labels[w]} (8 vs 16 B/param), measured {per_param['half', w]:.2f} vs "
            f"{per_param['fp32', w]:.2f} B/param"
        )


# --- HDL-SPEED ---------------------------------------------------------------------------------

CLAIMED_SPEEDUP = 1.8  # 3.2 -> 5.8 it/s, "+80%"
SPEED_BAND = 0.25  # the claim holds if the whole interval lies within 1.8x +- 25%
NO_GAIN = 1.1  # an interval wholly below it: no gain worth the name
# An fp32 step at 875M takes ~0.2 s with TF32 off, an AMP one ~0.03 s: 12 rounds of 5 arms ~6 s.
ROUNDS, WARMUP = 10, 2


def speed_verdict(speedup: Ratio, control: Ratio | None = None) -> str:
    """HDL-SPEED from AMP's speed-up over fp32 and its interval, against the article's 1.8x;
    inconclusive where the comparison's A/A `control` does not hold against NO_GAIN (the
    finest of the decisions: the band is +-25%, NO_GAIN 10%)."""
    if control is not None and speedups.control_state(control, NO_GAIN) != "holds":
        return "inconclusive"
    low, high = CLAIMED_SPEEDUP * (1 - SPEED_BAND), CLAIMED_SPEEDUP * (1 + SPEED_BAND)
    if low <= speedup.low and speedup.high <= high:
        return "confirmed"
    if speedup.high < NO_GAIN:
        return "refuted"
    if speedup.low > NO_GAIN and (speedup.high < low or speedup.low > high):
        return "partly"
    return "inconclusive"


@pytest.mark.claim("HDL-SPEED")
@pytest.mark.requires("cuda", "tf32", "fp16_autocast", "grad_scaler", "bf16_autocast")
def test_amp_speedup_of_a_training_step(record, amp_device, benchmark):
    spec = _plan(WIDTHS[-1])
    precisions = {arm: recipes.get(name).bind(amp_device) for arm, name in speedups.ARMS.items()}
    # One model and one AdamW for every arm: each recipe here trains fp32 parameters, and a
    # step takes as long whatever the weights' values.
    model, optimizer = _setup(spec, precisions["fp32"])
    tokens, targets = _batch(amp_device.torch_device)
    arms = {
        arm: precision.wrap(
            functools.partial(_train_step, model, precision, optimizer, tokens, targets)
        )
        for arm, precision in precisions.items()
    }
    comparison = measure.compare(arms, amp_device.type, ROUNDS, WARMUP)
    ratios = speedups.speedups(comparison)
    record.param(
        model="transformer",
        width=spec.width,
        params=spec.params,
        **OPTIONS,
        batch=BATCH,
        optimizer="AdamW (fused)",
        lr=LR,
        rounds=ROUNDS,
        warmup=WARMUP,
        aa_control_threshold=NO_GAIN,
        **speedups.tf32_flags(amp_device),
    )
    record.metric(
        **{f"{arm}.it_per_s": 1 / comparison.median(arm) for arm in speedups.ARMS},
        **{
            f"{name}{part}": value
            for name, r in ratios.items()
            for part, value in ((".value", r.value), (".low", r.low), (".high", r.high))
        },
    )
    deciding, control = ratios["amp-fp16_over_fp32"], ratios[speedups.CONTROL]
    it_s = {arm: 1 / comparison.median(arm) for arm in speedups.ARMS}
    record.verdict(
        "HDL-SPEED",
        speed_verdict(deciding, control),
        f"one AdamW step of the {_label(spec)}-parameter transformer, {BATCH}x"
        f"{OPTIONS['seq_len']} tokens: fp32 (TF32 off) {it_s['fp32']:.2f} -> amp-fp16 "
        f"{it_s['amp-fp16']:.2f} it/s, {deciding.describe()}, against the article's "
        f"{CLAIMED_SPEEDUP}x (3.2 -> 5.8 it/s; band {CLAIMED_SPEEDUP * (1 - SPEED_BAND):.2f}-"
        f"{CLAIMED_SPEEDUP * (1 + SPEED_BAND):.2f}x); amp-bf16 over fp32 "
        f"{ratios['amp-bf16_over_fp32'].describe()}; over tf32: amp-fp16 "
        f"{ratios['amp-fp16_over_tf32'].describe()}, amp-bf16 "
        f"{ratios['amp-bf16_over_tf32'].describe()}; tf32 over fp32 "
        f"{ratios['tf32_over_fp32'].describe()}; "
        f"{speedups.describe_control(speedups.CONTROL, control, NO_GAIN)}",
    )
    measure.benchmark_extra_info(benchmark, **ratios)
    measure.pedantic(benchmark, arms["amp-fp16"], amp_device.type, rounds=5, warmup=1)

    # Negative control: the same arm twice is not told apart.
    state = speedups.control_state(control, NO_GAIN)
    assert state != "differs", (
        f"HDL-SPEED: negative control: predicted fp32 over fp32 at 1x, got "
        f"{speedups.describe_control(speedups.CONTROL, control, NO_GAIN)}"
    )
    # Where the control is too wide, the comparison decides nothing (the verdict says
    # inconclusive): only a comparison whose control holds can contradict the prediction.
    if state == "holds":
        for arm in ("amp-fp16", "amp-bf16"):
            ratio = ratios[f"{arm}_over_fp32"]
            assert ratio.decide(1.0) == "above", (
                f"HDL-SPEED: predicted {arm} significantly faster than fp32 (TF32 off) at "
                f"{_label(spec)} parameters, got {ratio.describe()}"
            )
