"""scenarios/test_convergence.py can fail: when AMP really does train worse, each test of it fails
with an assertion that names its claim.

The break: a GradScaler whose step() drops three updates in four without backing off the scale,
as if they had overflowed. amp-fp16 (the recipe that uses the scaler) then needs about four times
the steps to reach the target loss and ends less accurate, which the scenario must see as AMP
slower beyond its margins (PIT4-SMALL-CONVERGENCE) and as an accuracy loss beyond the parity
margin (HDL-ACCURACY).
"""

from __future__ import annotations

import math

import pytest
from conftest import Toy, assert_failed_on, assert_fails_naming, load_scenario
from torch.amp.grad_scaler import GradScaler, OptState

MODULE = "test_convergence.py"
convergence = load_scenario(MODULE)  # for its statistics, with synthetic runs (below)
_step = GradScaler.step


# For the negative controls only: the scenario's small models narrowed to the MLP, the first of
# SMALL (see MLP_ONLY's users below for why a failure is the same with every model trained).
MLP_ONLY = Toy(SMALL=lambda module: module.SMALL[:1])


def _step_dropping_three_in_four(self, optimizer, *args, **kwargs):
    self._calls = getattr(self, "_calls", 0) + 1
    if self._calls % 4:
        # Skip optimizer.step(), keeping the bookkeeping update() expects after a step.
        self._per_optimizer_states[id(optimizer)]["stage"] = OptState.STEPPED
        return None
    return _step(self, optimizer, *args, **kwargs)


@pytest.mark.slow
def test_scaler_dropping_updates_fails_both_claims(run_scenario, monkeypatch):
    # One run of the whole module (its tests share the control's runs): both tests fail.
    monkeypatch.setattr(GradScaler, "step", _step_dropping_three_in_four)
    result = run_scenario(MODULE, plugins=(MLP_ONLY,))
    for claim in ("PIT4-SMALL-CONVERGENCE", "HDL-ACCURACY"):
        assert_fails_naming(result, claim, failed=2)
    for says in (
        "PIT4-SMALL-CONVERGENCE: predicted no slowdown from AMP (Micikevicius 2018), measured "
        "mlp amp-fp16:",
        "HDL-ACCURACY: predicted parity within 0.5 pts, measured amp-fp16 minus fp32",
    ):
        assert_failed_on(result, f"*{says}*")


@pytest.mark.slow
def test_module_passes_unpatched(run_scenario):
    # On the models the breaks run on: the control is that this very run passes without them.
    # Every model of SMALL is trained by the CPU scenario suite, which CI runs.
    run_scenario(MODULE, plugins=(MLP_ONLY,)).assert_outcomes(passed=2)


# --- the statistic's seeds, with synthetic runs: no training, milliseconds ----------------------

DELAY = 20  # steps: twice the MLP's margin of 10


def _runs(amp_delays: dict[int, int]):
    """A stand-in for the scenario's _run: every seed's fp32 loss falls along its own curve;
    amp-fp16 follows the same curve `amp_delays[seed]` steps late (DELAY where not given);
    amp-bf16 follows it exactly. Accuracy is the same everywhere."""
    from harness.lab.train import History

    def run(device_type, setup, recipe, seed, loss_factor):
        curve = [2.0 * math.exp(-t / (15 + seed)) + 0.1 for t in range(setup.steps)]
        late = amp_delays.get(seed, DELAY) if recipe == "amp-fp16" else 0
        losses = [curve[0]] * late + curve[: setup.steps - late]
        history = History(loss=[x * loss_factor for x in losses])
        return convergence.Run(history, 70.0, loss_factor)

    return run


def test_a_slowdown_every_seed_shows_alike_is_decided_on_more_seeds(monkeypatch):
    # Three seeds each 20 steps late: no spread, too few pairs to decide anything, so a
    # statistic that stopped there would let the prediction "no slowdown" pass silently. The
    # setup trains on more seeds, and the same delay on all six decides the slowdown.
    monkeypatch.setattr(convergence, "_run", _runs({}))
    comparison = convergence._compare("cpu", convergence.SMALL[0], convergence.RECIPES)
    assert comparison.slower("amp-fp16"), comparison.describe("amp-fp16", "mlp")
    steps = comparison.steps("amp-fp16")
    assert steps.no_spread and steps.mean == DELAY and steps.beyond(comparison.step_margin)
    assert comparison.seeds == convergence.SEEDS and len(comparison.seeds) == 6
    assert "amp-fp16 steps" in comparison.spreadless
    assert not comparison.slower("amp-bf16") and comparison.no_gap("amp-bf16")
    assert "6 seeds (3 left no spread in amp-fp16 steps" in comparison.seeds_note()


def test_differences_with_spread_stay_on_three_seeds(monkeypatch):
    monkeypatch.setattr(convergence, "_run", _runs({0: 19, 1: 20, 2: 22}))
    measures = ("steps",)  # bf16's accuracy and steps equal fp32's: leave them out
    comparison = convergence._compare(
        "cpu", convergence.SMALL[0], ("fp32", "amp-fp16"), measures=measures
    )
    assert len(comparison.seeds) == 3 and comparison.spreadless == ()
    assert comparison.steps("amp-fp16").beyond(comparison.step_margin)


def test_no_slowdown_in_three_tiny_models_leaves_can_slow_down_open():
    # "Can slow down" is not refuted by the few models tried; one slowed model shows it.
    verdict = convergence.small_model_verdict
    assert verdict(slower=0, pairs=6) == "inconclusive"  # every gap ruled out, or undecided
    assert verdict(slower=1, pairs=6) == "partly"
    assert verdict(slower=6, pairs=6) == "confirmed"


@pytest.mark.slow
def test_a_control_whose_underflow_is_scaled_away_fails_that_control(run_scenario, monkeypatch):
    # The control's subject: fp16 without loss scaling flushes the gradients of a loss x 2**-16
    # and converges slower. Give that recipe a GradScaler and nothing flushes: the control's own
    # assertion ("predicted the control to be slower"), not another, fails.
    import dataclasses

    from harness.lab import recipes

    scaled = dataclasses.replace(recipes.RECIPES["amp-fp16-noscaler"], scaler=True)
    monkeypatch.setitem(recipes.RECIPES, "amp-fp16-noscaler", scaled)
    result = run_scenario(MODULE, "-k", "test_amp_does_not_slow_small_models", plugins=(MLP_ONLY,))
    assert_fails_naming(result, "PIT4-SMALL-CONVERGENCE")
    assert_failed_on(result, "*predicted the control to be slower*")
