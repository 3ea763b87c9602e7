"""The A/A control of a timing comparison decides what the comparison may decide: with synthetic
ratios, a tight control lets a verdict stand, one too wide for the threshold it guards makes the
verdict inconclusive, and one that tells identical arms apart is a failure of the scenario. The
GPU scenarios' decision functions follow it; they run on the CPU here."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from conftest import load_scenario

from harness.lab import devices, models, recipes, speedups
from harness.lab.measure import Ratio

speed = load_scenario("test_speed.py")
memory_speed = load_scenario("test_memory_speed.py")

M, B = 10**6, 10**9
SIZES = [M, 10 * M, 100 * M, B]


def ratio(low: float, high: float) -> Ratio:
    return Ratio((low * high) ** 0.5, low, high, 0.95, 10)


TIGHT = ratio(0.98, 1.03)  # identical arms, not told apart, well within 1/1.1-1.1x
WIDE = ratio(0.85, 1.2)  # contains 1, but reaches past 1.1x: noise as large as the gain
APART = ratio(1.06, 1.12)  # excludes 1, outside 0.97-1.03: identical arms told apart
BELOW, ABOVE = ratio(0.9, 1.0), ratio(1.3, 1.5)  # against 1.1


@pytest.mark.parametrize(
    ("control", "state"),
    [
        (TIGHT, "holds"),
        (ratio(1.005, 1.02), "holds"),  # excludes 1 by a hair a tight interval resolves
        (WIDE, "too wide"),
        (ratio(0.95, 1.1), "too wide"),  # reaches the threshold itself
        (ratio(0.9, 1.05), "too wide"),  # 0.9 < 1/1.1: as wide on the slow side
        (APART, "differs"),
        (ratio(0.8, 0.95), "differs"),
        (ratio(1.06, 1.3), "differs"),  # told apart beats too wide
    ],
)
def test_the_control_state_reads_location_then_width(control, state):
    assert speedups.control_state(control, 1.1) == state


def test_a_wider_threshold_tolerates_a_wider_control():
    assert speedups.control_state(WIDE, 1.25) == "holds"
    with pytest.raises(ValueError, match="gains above 1.03x"):
        speedups.control_state(TIGHT, 1.02)


def test_a_guarded_verdict_stands_only_where_the_control_holds():
    decision = ("confirmed", "fp16 over fp32 is inside the band")
    verdict, reason = speedups.guarded(decision, speedups.CONTROL, TIGHT, 1.1)
    assert verdict == "confirmed" and "within 0.909-1.1x" in reason
    verdict, reason = speedups.guarded(decision, speedups.CONTROL, WIDE, 1.1)
    assert verdict == "inconclusive"
    assert "although the intervals say confirmed" in reason
    assert "fp32-again over fp32" in reason and WIDE.describe() in reason
    assert "reaches past 0.909-1.1x" in reason
    verdict, reason = speedups.guarded(decision, speedups.CONTROL, APART, 1.1)
    assert verdict == "inconclusive" and "tells identical arms apart" in reason


# --- HDL-SPEED: against 1.1x and the article's 1.35-2.25x band, over fp32 and over TF32 ------


@pytest.mark.parametrize(
    ("control", "verdict"),
    [(None, "confirmed"), (TIGHT, "confirmed"), (WIDE, "inconclusive"), (APART, "inconclusive")],
)
def test_hdl_speed_is_decided_only_under_a_holding_control(control, verdict):
    decided, reason = memory_speed.speed_verdict(ratio(1.7, 1.9), ratio(1.1, 1.3), control)
    assert decided == verdict
    assert control is None or "A/A control fp32-again over fp32" in reason


def test_hdl_speed_refuted_needs_a_holding_control_too():
    no_gain = ratio(0.98, 1.02)
    assert memory_speed.speed_verdict(no_gain, no_gain, TIGHT)[0] == "refuted"
    assert memory_speed.speed_verdict(no_gain, no_gain, WIDE)[0] == "inconclusive"


@pytest.mark.parametrize(
    ("vs_fp32", "vs_tf32", "verdict", "words"),
    [
        # The article's setting, fp32 with TF32 off, decides; TF32's decision is evidence.
        (ratio(1.7, 1.9), ratio(0.9, 1.0), "confirmed", "over tf32"),
        (ratio(4.0, 5.0), ratio(1.6, 1.9), "partly", "the article's +80% is what AMP gains over"),
        (ratio(1.15, 1.3), ratio(1.0, 1.05), "partly", "outside band"),
        (ratio(0.98, 1.02), ratio(0.8, 0.9), "refuted", "no gain"),
        (ratio(1.05, 1.2), ratio(1.7, 1.9), "inconclusive", "undecided"),  # straddles 1.1
        (ratio(2.1, 2.4), ratio(1.7, 1.9), "inconclusive", "undecided"),  # straddles 2.25
    ],
)
def test_hdl_speed_decides_against_both_baselines(vs_fp32, vs_tf32, verdict, words):
    decided, reason = memory_speed.speed_verdict(vs_fp32, vs_tf32)
    assert decided == verdict
    assert words in reason
    assert "TF32 off: the article's setting" in reason and vs_tf32.describe() in reason


@pytest.mark.parametrize(
    ("speedup", "where"),
    [
        (ratio(1.35, 2.25), "in band"),  # both edges of 1.8x +- 25%, touching
        (ratio(1.34, 2.0), "undecided"),
        (ratio(1.5, 2.26), "undecided"),
        (ratio(2.26, 3.0), "outside band"),
        (ratio(1.11, 1.34), "outside band"),
        (ratio(1.0, 1.099), "no gain"),
        (ratio(1.05, 1.15), "undecided"),  # straddles 1.1
        (Ratio(1.8, 1.75, 1.85, 0.95, 8), "undecided"),  # 8 rounds: too few to decide
    ],
)
def test_hdl_speed_band_edges(speedup, where):
    assert memory_speed._speed_decision(speedup) == where


# --- FMT-SPEED: the matmul's own A/A control, the fp16 arm timed twice ------------------------


@pytest.mark.parametrize(
    ("control", "verdict", "words"),
    [
        (TIGHT, "confirmed", "A/A control fp16-again over fp16"),
        (WIDE, "inconclusive", "reaches past 0.909-1.1x"),
        (APART, "inconclusive", "tells identical arms apart"),
    ],
)
def test_fmt_speed_is_decided_only_under_a_holding_control(control, verdict, words):
    decided, reason = speed.verdict_fmt_speed(ratio(3, 5), ratio(1.0, 1.2), control=control)
    assert decided == verdict
    assert words in reason and "inside the 1.6-10x band" in reason


# --- PIT4: one control per model size --------------------------------------------------------


def test_small_no_gain_is_undecided_where_a_small_size_control_is_too_wide():
    ratios = [BELOW, BELOW, ABOVE, ABOVE]
    assert speed.verdict_small_no_gain(SIZES, ratios, controls=[TIGHT] * 4)[0] == "confirmed"
    verdict, reason = speed.verdict_small_no_gain(SIZES, ratios, controls=[WIDE, *[TIGHT] * 3])
    assert verdict == "inconclusive"
    assert "undecided at 1M" in reason and "too wide at 1M (0.85-1.2x)" in reason
    # A control too wide at a size the claim does not read changes nothing.
    controls = [TIGHT, TIGHT, WIDE, APART]
    assert speed.verdict_small_no_gain(SIZES, ratios, controls=controls)[0] == "confirmed"


def test_only_above_1b_and_the_crossover_need_the_control_at_each_size():
    ratios = [BELOW, BELOW, BELOW, ABOVE]
    verdict, _ = speed.verdict_only_above_1b(SIZES, ratios, controls=[TIGHT] * 4)
    assert verdict == "confirmed"
    assert speed.crossover(SIZES, ratios, controls=[TIGHT] * 4) == B
    assert speed.crossover(SIZES, ratios, controls=[TIGHT, TIGHT, TIGHT, WIDE]) is None
    verdict, reason = speed.verdict_only_above_1b(
        SIZES, ratios, controls=[TIGHT, TIGHT, TIGHT, APART]
    )
    assert verdict == "inconclusive" and "differs at 1B (1.06-1.12x)" in reason
    verdict, reason = speed.verdict_only_above_1b(SIZES, ratios, controls=[WIDE, *[TIGHT] * 3])
    assert verdict == "inconclusive" and "too wide at 1M" in reason
    with pytest.raises(ValueError, match="4 sizes but 3 controls"):
        speed.verdict_only_above_1b(SIZES, ratios, controls=[TIGHT] * 3)


# --- the bare timed step, its warm-up and the skipped-step check (on the CPU) ----------------


def test_a_control_from_too_few_rounds_decides_nothing():
    few = Ratio(1.0, 0.99, 1.01, 0.95, 8)  # tight, but 8 rounds (measure.min_rounds: 9)
    assert speedups.control_state(few, 1.1) == "too wide"
    assert speedups.control_state(Ratio(1.0, 0.99, 1.01, 0.95, 9), 1.1) == "holds"


def _tiny(recipe: str):
    cpu = devices.resolve("cpu")
    precision = recipes.get(recipe).bind(cpu)
    model = precision.prepare(models.build("transformer", 5_000, vocab=16, seq_len=8, layers=1))
    # Fused, as the scenarios: GradScaler then leaves its inf check on the device, where the
    # default AdamW would read it back with .item().
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    tokens = torch.randint(16, (2, 8), generator=torch.Generator().manual_seed(0))
    step = partial(speedups.training_step, precision, model, optimizer, tokens, tokens)
    return precision, model, optimizer, step


def test_the_bare_step_reads_nothing_back(monkeypatch):
    precision, model, optimizer, step = _tiny("amp-fp16")
    tokens = torch.randint(16, (2, 8), generator=torch.Generator().manual_seed(1))
    read = []

    def watched(name, fn):
        return lambda *args: (read.append(name), fn(*args))[1]

    monkeypatch.setattr(torch.Tensor, "item", watched("item", torch.Tensor.item))
    monkeypatch.setattr(recipes, "total_grad_norm", watched("norm", recipes.total_grad_norm))
    monkeypatch.setattr(precision.scaler, "get_scale", watched("scale", precision.scaler.get_scale))
    before = [p.detach().clone() for p in model.parameters()]
    step()
    assert read == [], f"the bare step read {read} back to the host"
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())  # freed: arms fit side by side
    # Negative control: the monitored step (harness.lab.train's) reads the norm and the scale.
    with precision.forward():
        loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    precision.backward(loss)
    precision.step(optimizer)
    assert {"norm", "scale"} <= set(read), read


def test_warm_up_runs_until_the_optimizer_holds_its_state():
    precision, _, optimizer, step = _tiny("fp32")
    assert speedups.unstepped(optimizer) == len(list(optimizer.param_groups[0]["params"]))
    assert speedups.warm_up(step, optimizer, precision.scaler) == 1
    assert speedups.unstepped(optimizer) == 0


def test_warm_up_goes_on_while_the_scaler_skips_and_says_when_it_never_stops():
    precision, _, optimizer, step = _tiny("amp-fp16")
    skips = iter([True, True])

    def skipping_step():
        step()
        if next(skips, False):  # the scaler found inf: the scale halves, as update() does
            precision.scaler.update(precision.scaler.get_scale() / 2)

    assert speedups.warm_up(skipping_step, optimizer, precision.scaler) == 3
    # Negative control: a scaler that skips every step exhausts the warm-up.
    precision, _, optimizer, step = _tiny("amp-fp16")
    calls = []

    def always_skipped():
        calls.append(1)
        precision.scaler.scale(torch.ones(()))  # the scale exists, as after a backward
        precision.scaler.update(precision.scaler.get_scale() / 2)

    assert speedups.warm_up(always_skipped, optimizer, precision.scaler) == len(calls)
    assert len(calls) == speedups.WARMUP_STEPS_MAX and speedups.unstepped(optimizer) > 0


def test_a_scale_that_fell_while_timed_names_its_arm():
    precisions = {"amp-fp16": _tiny("amp-fp16")[0], "fp32": _tiny("fp32")[0]}
    scales = speedups.scales(precisions)
    assert scales == {"amp-fp16": 65536.0}
    assert speedups.skipped_while_timed(scales, precisions) == {}
    precisions["amp-fp16"].scaler.scale(torch.ones(()))
    precisions["amp-fp16"].scaler.update(32768.0)
    assert speedups.skipped_while_timed(scales, precisions) == {"amp-fp16": (65536.0, 32768.0)}
