"""harness.lab.memory_model on the CPU: the arithmetic, the static part against a real transformer's
parameters, gradients and AdamW state after one step, and the verdict logic of
scenarios/test_memory_speed.py on synthetic numbers, at the edges of its tolerances."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import load_scenario

from harness.common.errors import HarnessError
from harness.lab import measure, memory_model, models

FP32_RECIPES = ("fp32", "tf32", "amp-fp16", "amp-bf16")
SMALL = {"layers": 2, "vocab": 32, "seq_len": 16}  # a 64-wide model: ~100k parameters


@pytest.fixture(scope="module")
def scenario():
    """The scenario module, imported for its pure verdict functions."""
    return load_scenario("test_memory_speed.py")


def _tensors(spec: models.Plan) -> int:
    return 12 * spec.options["layers"] + 5


@pytest.mark.parametrize(("recipe", "per_param"), [*((r, 16) for r in FP32_RECIPES), ("half", 8)])
def test_static_bytes_per_parameter(recipe, per_param):
    spec = memory_model.transformer_plan(64, **SMALL)
    estimate = memory_model.estimate(spec, recipe, batch=2)
    # Weights, gradients and two AdamW moments in the parameter dtype; one fp32 step per tensor.
    assert estimate.static == per_param * spec.params + 4 * _tensors(spec)
    assert estimate.params == estimate.grads == per_param // 4 * spec.params


def test_the_7b_extrapolation():
    spec = memory_model.seven_b()
    assert (spec.width, spec.options["layers"], spec.options["vocab"]) == (4096, 32, 32000)
    assert 6.5e9 < spec.params < 7e9
    fp32, amp, half = (memory_model.extrapolate_7b(r) for r in ("fp32", "amp-fp16", "half"))
    # ~112 GB = 7e9 x 16 bytes before a single activation, with or without autocast.
    assert fp32.static == amp.static == 16 * spec.params + 4 * _tensors(spec)
    assert abs(fp32.static / (7e9 * 16) - 1) < 0.05
    assert half.static == 8 * spec.params + 4 * _tensors(spec)
    # fp32 weights alone are ~28 GB (the article's AMP figure, 14 GB, is 7e9 x 2 bytes).
    assert fp32.params == 4 * spec.params and abs(fp32.params / 28e9 - 1) < 0.05
    # Autocast caches a 2-byte copy of every matmul weight: all but embeddings and norms.
    matmul = 12 * 4096**2 * 32 + 4096 * 32000
    assert amp.weight_cache == 2 * matmul and fp32.weight_cache == half.weight_cache == 0
    assert fp32.rest == fp32.activations + fp32.logits
    assert min(fp32.total, amp.total) > 4 * 24 * memory_model.GB  # far above the article's


@pytest.mark.parametrize("recipe", ["fp32", "amp-fp16", "half"])
def test_activations_scale_linearly_in_batch_and_seq(recipe):
    spec = memory_model.transformer_plan(256, **{**SMALL, "seq_len": 64})
    base = memory_model.estimate(spec, recipe, batch=2, seq_len=32)
    for batch, seq_len in ((4, 32), (2, 64)):  # twice the tokens, either way
        double = memory_model.estimate(spec, recipe, batch, seq_len)
        assert double.activations == 2 * base.activations
        assert double.logits == 2 * base.logits
        assert double.static == base.static and double.weight_cache == base.weight_cache


@pytest.mark.parametrize(("recipe", "per_channel"), [("fp32", 64), ("amp-fp16", 36), ("half", 32)])
def test_bytes_saved_per_block(recipe, per_channel):
    # One block more saves, per token: per_channel x width (the Korthikanti et al. estimate
    # adapted, see harness.lab.memory_model), LayerNorm statistics 16 and a logsumexp per head 4.
    one, two = (memory_model.transformer_plan(128, **{**SMALL, "layers": n}) for n in (1, 2))
    batch, tokens = 3, 3 * SMALL["seq_len"]
    block = (
        memory_model.estimate(two, recipe, batch).activations
        - memory_model.estimate(one, recipe, batch).activations
    )
    assert block == tokens * (per_channel * 128 + 16 + 4 * two.options["heads"])


def test_foreach_adamw_adds_a_parameter_sized_buffer_at_the_step():
    spec = memory_model.transformer_plan(512, **SMALL)  # big weights, few activations
    fused = memory_model.estimate(spec, "fp32", batch=1)
    foreach = memory_model.estimate(spec, "fp32", batch=1, adamw="foreach")
    assert fused.step_transient == 0 and foreach.step_transient == 4 * spec.params
    assert foreach.total == foreach.static + foreach.step_transient > fused.total


def test_a_fitted_activation_factor_reproduces_the_measurement():
    spec = memory_model.transformer_plan(128, **SMALL)
    raw = memory_model.estimate(spec, "amp-bf16", batch=4)
    measured = raw.total + raw.activations // 5  # activations 20% above the formula
    factor = memory_model.fit_activation_factor(raw, measured)
    assert factor == pytest.approx(1.2, rel=1e-6)
    fitted = memory_model.estimate(spec, "amp-bf16", batch=4, activation_factor=factor)
    assert abs(fitted.total - measured) <= 1


def test_bad_inputs_are_named():
    with pytest.raises(HarnessError, match="covers the transformer"):
        memory_model.estimate(models.plan("mlp", 10_000), "fp32", batch=1)
    with pytest.raises(HarnessError, match="adamw='sgd'"):
        memory_model.estimate(memory_model.transformer_plan(64, **SMALL), "fp32", 1, adamw="sgd")
    with pytest.raises(HarnessError, match="multiple of the number of heads"):
        memory_model.transformer_plan(100, heads=3, **SMALL)
    with pytest.raises(HarnessError, match="unknown recipe"):
        memory_model.estimate(memory_model.transformer_plan(64, **SMALL), "fp64", batch=1)


@pytest.mark.parametrize(("dtype", "recipe"), [(torch.float32, "fp32"), (torch.float16, "half")])
def test_state_bytes_after_one_adamw_step_match_the_model(dtype, recipe):
    # Measured on a real model: what training holds between steps is exactly the static part.
    spec = memory_model.transformer_plan(64, **SMALL)
    model = models.build("transformer", spec.params, **spec.options).to(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(SMALL["vocab"], (2, SMALL["seq_len"]))
    F.cross_entropy(model(tokens).flatten(0, 1).float(), tokens.flatten()).backward()
    optimizer.step()
    counted = measure.state_bytes(model, optimizer)
    predicted = memory_model.estimate(spec, recipe, batch=2)
    assert counted == {
        "params": predicted.params,
        "grads": predicted.grads,
        "optimizer": predicted.optimizer,
    }


# --- the scenario's verdicts, on synthetic numbers ----------------------------------------------

GB = memory_model.GB


def breakdown(static_gb: float, total_gb: float) -> memory_model.Breakdown:
    """fp32 training's split of `static_gb` (weights 4, gradients 4, AdamW 8 bytes/param) and
    the rest up to `total_gb` as activations."""
    static = round(static_gb * GB)
    return memory_model.Breakdown(
        params=static // 4,
        grads=static // 4,
        optimizer=static - 2 * (static // 4),
        weight_cache=0,
        activations=round(total_gb * GB) - static,
        logits=0,
    )


def test_the_7b_static_bytes_refute_the_claim_without_a_validated_activation_model(scenario):
    fp32, amp = (memory_model.extrapolate_7b(r) for r in ("fp32", "amp-fp16"))
    for validated in (False, True):
        verdict, reason = scenario.memory_verdict(fp32, amp, True, validated)
        assert verdict == "refuted"
        assert f"fp32 {fp32.static / GB:.1f} GB (16.00 B/param)" in reason
        assert "refuted by the exact static bytes" in reason
    # Static bytes that do not match the model's decide nothing.
    assert scenario.memory_verdict(fp32, amp, False, True)[0] == "inconclusive"


LIMIT_FP32, LIMIT_AMP = 24 * 1.25, 14 * 1.25  # the article's figures and their 25% tolerance
BYTE = 1 / GB


@pytest.mark.parametrize(
    ("fp32", "amp", "validated", "verdict"),
    [
        # The static part alone: past both limits, refuted, however the activations were fitted.
        ((LIMIT_FP32 + BYTE,) * 2, (LIMIT_AMP + BYTE,) * 2, False, "refuted"),
        ((107, 125), (107, 131), False, "refuted"),
        # At a limit, or past only one, the static part leaves room: the totals decide.
        ((LIMIT_FP32,) * 2, (100, 100), False, "inconclusive"),
        ((100, 100), (LIMIT_AMP,) * 2, False, "inconclusive"),
        ((LIMIT_FP32, LIMIT_FP32), (LIMIT_AMP + BYTE,) * 2, True, "partly"),  # totals within 25%
        # Totals, with the activation model validated.
        ((10, 24), (10, 14), True, "confirmed"),  # the article's numbers
        ((10, 26), (10, 16), True, "confirmed"),  # within 25% and 10 points
        ((10, 125), (10, 75), True, "partly"),  # a 40% saving, totals far off
        ((10, 20), (10, 17), True, "partly"),  # the totals, not the saving (15%)
        ((10, 40), (10, 35), True, "refuted"),  # neither
        ((10, 24), (10, 14), False, "inconclusive"),  # the model missed the measured peaks
    ],
)
def test_memory_verdict(scenario, fp32, amp, validated, verdict):
    decided, reason = scenario.memory_verdict(breakdown(*fp32), breakdown(*amp), True, validated)
    assert decided == verdict, reason
