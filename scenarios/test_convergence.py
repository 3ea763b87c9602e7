"""Does AMP slow the convergence of small models, or cost accuracy? (PIT4-SMALL-CONVERGENCE,
HDL-ACCURACY)

The same model, seed and batches are trained in fp32, amp-fp16 and amp-bf16, so each seed gives
a paired sample (harness.lab.stats.paired_difference) of AMP minus fp32. Three seeds, or six where
three show a difference without spread (harness.lab.stats: three equal pairs decide nothing):
- PIT4-SMALL-CONVERGENCE: a tiny MLP, CNN and transformer on their synthetic tasks; the steps
  to reach a target training loss and the final validation accuracy. Known (Micikevicius 2018):
  no slowdown. The article says precision loss *can* slow small models: no slowdown in the three
  models tried leaves that "can" inconclusive (the sweep cannot speak for other models); a
  slowdown confirms it. Negative control: amp-fp16 without loss scaling on a loss multiplied by
  2**-16, whose gradients fall into fp16's subnormal range, never reaches the target, and the
  statistic sees it; GradScaler (amp-fp16) on the same loss removes the gap.
- HDL-ACCURACY: the validation accuracy difference and its interval for the largest MLP this
  device trains within the budget (the article: 72.3% -> 72.1%).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from harness.lab import devices, models, recipes
from harness.lab.data import Task, make_task
from harness.lab.figures import training_curves
from harness.lab.stats import Difference, paired_difference, pairs_without_spread
from harness.lab.train import History, evaluate, train
from harness.records.record import Record

# Three small models and a larger one trained to convergence over 3 to 6 seeds per recipe: tens
# of seconds on a 2-core CPU, so `amp-harness run` leaves them out unless --all.
pytestmark = pytest.mark.slow

# Each seed fixes the initial weights and the batches, in every recipe. A setup trains on the
# first FIRST_SEEDS. Where a difference it is judged by shows no spread over them (each seed took
# the same steps in both recipes, or reached the same accuracy: integers, and multiples of
# 100/val_size points), three pairs cannot decide it, and the setup trains on all SEEDS, as many
# as the distribution-free interval of the median needs (harness.lab.stats). Only the spread adds
# seeds, never the side of a margin the mean lies on, so the verdict does not choose its sample.
FIRST_SEEDS = 3
SEEDS = tuple(range(pairs_without_spread()))  # 6 at 95%
AMP = ("amp-fp16", "amp-bf16")
RECIPES = ("fp32", *AMP)

# Steps-to-target: the step (interpolated) at which the trailing mean of the last SMOOTH losses
# falls to TARGET_FRACTION of the way from the fp32 runs' initial loss (the mean of their first
# SMOOTH losses) to their final loss (the mean of their last SMOOTH). Never: the budget + 1.
SMOOTH = 5
TARGET_FRACTION = 0.8
# A gap that matters: 10% of the step budget, or 2 points of validation accuracy.
STEP_MARGIN = 0.10
ACCURACY_MARGIN = 2.0
# HDL-ACCURACY: the article's gap is 0.2 points and AMP papers report parity within ~0.3; 0.5
# points accepts the article's number with room for the interval of a few seeds, and is still a
# quarter of the convergence margin (it is ~10 samples of the MLP task's 2048 validation ones).
PARITY_MARGIN = 0.5
# The control's loss factor: the gradient of the mean cross-entropy with respect to a logit, at
# most 1/64 with a batch of 64, becomes at most 2.4e-7, a few units of fp16's smallest subnormal
# (6e-8), so it is mostly rounding; GradScaler's 65536 lifts it back into fp16's normal range.
TINY_LOSS = 2.0**-16


@dataclass(frozen=True)
class Setup:
    kind: str
    params: int
    steps: int
    batch_size: int
    lr: float
    task_options: tuple[tuple[str, int | float], ...] = ()


# Tiny models, sized so that the whole module trains in seconds on one CPU core. fp16
# convolutions are slow on the CPU: the CNN sees its task's 4x4 class patterns at their own
# resolution, with less noise than the default so it converges within its steps (accuracies
# still rising are too noisy to compare); the transformer reads 16 tokens of 32.
SMALL = (
    Setup("mlp", 15_000, 100, 64, 3e-3),
    Setup("cnn", 5_000, 60, 32, 1e-2, (("image_size", 4), ("noise", 0.7), ("val_size", 2048))),
    Setup("transformer", 10_000, 40, 16, 1e-2, (("seq_len", 16), ("vocab", 32))),
)
# HDL-ACCURACY's model, per device: the largest MLP the CPU trains within the module's budget
# (fp16 matmuls are emulated there, ~6 ms a step at this size); a GPU trains a 70x larger one.
LARGE = {
    "cpu": Setup("mlp", 30_000, 100, 128, 3e-3),
    "cuda": Setup("mlp", 2_000_000, 400, 256, 1e-3),
}


@dataclass(frozen=True)
class _ScaledLossTask(Task):
    """The same task, its training loss multiplied by `factor` (the negative control)."""

    factor: float = 1.0

    def loss(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return Task.loss(output, y) * self.factor


@dataclass
class Run:
    history: History
    val_accuracy: float  # in points (percent)
    loss_factor: float

    @property
    def losses(self) -> np.ndarray:
        """The training losses, divided back by the loss factor."""
        return np.asarray(self.history.loss) / self.loss_factor


def _task(setup: Setup) -> Task:
    return make_task(setup.kind, 0, **dict(setup.task_options))


def _size(setup: Setup) -> int:
    """The exact parameter count of the setup's model."""
    return models.plan(setup.kind, setup.params).params


# Cached: the control's runs serve both tests. Keyed by the device type (a DeviceInfo is not
# hashable); devices.probe returns the session's own DeviceInfo for it.
@functools.cache
def _run(device_type: str, setup: Setup, recipe: str, seed: int, loss_factor: float) -> Run:
    task = _task(setup)
    trained = task
    if loss_factor != 1.0:
        fields = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
        trained = _ScaledLossTask(**fields, factor=loss_factor)
    model = models.build(setup.kind, setup.params, seed, **task.model_options)
    with recipes.get(recipe).bind(devices.probe(device_type)) as precision:
        history = train(
            model, precision, trained, setup.steps, setup.lr, setup.batch_size, seed=seed
        )
        accuracy = evaluate(model, precision, task)["val_accuracy"]
    return Run(history, 100.0 * accuracy, loss_factor)


def _smoothed(losses: np.ndarray) -> np.ndarray:
    """Trailing mean over the last SMOOTH steps (fewer at the start); NaN stays NaN."""
    return np.array([losses[max(0, t - SMOOTH + 1) : t + 1].mean() for t in range(len(losses))])


def _steps_to_target(run: Run, target: float) -> float:
    """Where the smoothed loss crosses the target, interpolated between the two steps around
    the crossing: whole steps would make two recipes that cross within the same step equal on
    every seed, a difference without spread that three seeds cannot decide (harness.lab.stats)."""
    smoothed = _smoothed(run.losses)
    reached = np.flatnonzero(smoothed <= target)
    if not reached.size:
        return float(len(run.losses) + 1)
    at = int(reached[0])  # 0-based: step at + 1 is the first at or below the target
    before = smoothed[at - 1] if at else np.nan
    if not np.isfinite(before) or before == smoothed[at]:
        return float(at + 1)
    return at + float((before - target) / (before - smoothed[at]))


@dataclass
class Arm:
    """One recipe over all seeds."""

    recipe: str
    runs: list[Run]
    steps: list[float]  # to the target loss, interpolated within a step
    accuracy: list[float]  # validation, in points


@dataclass
class Comparison:
    """The arms of one setup, each compared with the first (the fp32 reference)."""

    setup: Setup
    seeds: tuple[int, ...]
    target: float  # the training loss that counts as converged
    arms: dict[str, Arm]
    # "<recipe> <measure>" of the differences without spread over FIRST_SEEDS that made the
    # setup train on every seed; empty when it did not.
    spreadless: tuple[str, ...] = ()

    @property
    def reference(self) -> Arm:
        return next(iter(self.arms.values()))

    @property
    def step_margin(self) -> float:
        return STEP_MARGIN * self.setup.steps

    def steps(self, recipe: str) -> Difference:
        """recipe minus reference: positive means slower."""
        return paired_difference(self.reference.steps, self.arms[recipe].steps)

    def accuracy(self, recipe: str) -> Difference:
        """recipe minus reference, in points: negative means less accurate."""
        return paired_difference(self.reference.accuracy, self.arms[recipe].accuracy)

    def slower(self, recipe: str) -> bool:
        """The interval shows the recipe slower, or less accurate, beyond the margin."""
        steps, accuracy = self.steps(recipe), self.accuracy(recipe)
        return (steps.beyond(self.step_margin) and steps.mean > 0) or (
            accuracy.beyond(ACCURACY_MARGIN) and accuracy.mean < 0
        )

    def no_gap(self, recipe: str) -> bool:
        return self.steps(recipe).within(self.step_margin) and self.accuracy(recipe).within(
            ACCURACY_MARGIN
        )

    def never_reached(self, recipe: str) -> int:
        return sum(s > self.setup.steps for s in self.arms[recipe].steps)

    def undecidable(self, measures: tuple[str, ...]) -> tuple[str, ...]:
        """The differences of `measures` (as "<recipe> <measure>") too few pairs without spread
        leave undecided."""
        return tuple(
            f"{recipe} {measure}"
            for recipe in list(self.arms)[1:]
            for measure in measures
            if not getattr(self, measure)(recipe).decidable
        )

    def seeds_note(self) -> str:
        """How many seeds, and why more than FIRST_SEEDS."""
        if not self.spreadless:
            return f"{len(self.seeds)} seeds"
        return (
            f"{len(self.seeds)} seeds ({FIRST_SEEDS} left no spread in "
            f"{', '.join(self.spreadless)})"
        )

    def describe(self, recipe: str, label: str) -> str:
        never = self.never_reached(recipe)
        return (
            f"{label} {recipe}: steps {self.steps(recipe).describe(digits=2)}"
            f"{f' ({never}/{len(self.seeds)} never reached)' if never else ''}, accuracy "
            f"{self.accuracy(recipe).describe(' pts', digits=2)}"
        )

    def log(self, record: Record, label: str) -> None:
        """Per-seed numbers as metrics, seed 0's curves as histories and a figure."""
        record.param(**{f"{label}/seeds": self.seeds})
        record.metric(**{f"{label}/target_loss": self.target})
        curves = {}
        for recipe, arm in self.arms.items():
            for seed, run, steps in zip(self.seeds, arm.runs, arm.steps, strict=True):
                record.metric(
                    **{
                        f"{label}/{recipe}/seed{seed}/steps_to_target": steps,
                        f"{label}/{recipe}/seed{seed}/val_accuracy": run.val_accuracy,
                        f"{label}/{recipe}/seed{seed}/skipped_steps": sum(run.history.skipped),
                    }
                )
            curves[recipe] = {**arm.runs[0].history.as_dict(), "loss": arm.runs[0].losses}
            record.history(f"{label}/{recipe}/", **curves[recipe])
        title = (
            f"{label}: {self.setup.kind} of {_size(self.setup):,} parameters, seed 0, target "
            f"loss {self.target:.3g} (dotted)"
        )
        fig = training_curves(curves, title)
        fig.axes[0].axhline(self.target, color="black", linestyle=":", linewidth=1)
        record.figure(f"training_curves_{label}", fig)


MEASURES = ("steps", "accuracy")  # what a comparison is judged by


def _compare(
    device_type: str,
    setup: Setup,
    names: tuple[str, ...],
    loss_factor: float = 1.0,
    measures: tuple[str, ...] = MEASURES,
) -> Comparison:
    """Train every recipe of `names` on the first seeds, on every seed where a difference of
    `measures` shows no spread over those; the first recipe is the reference."""
    first = _compare_on(device_type, setup, names, loss_factor, SEEDS[:FIRST_SEEDS])
    spreadless = first.undecidable(measures)
    if not spreadless:
        return first
    every = _compare_on(device_type, setup, names, loss_factor, SEEDS)
    return dataclasses.replace(every, spreadless=spreadless)


def _compare_on(
    device_type: str,
    setup: Setup,
    names: tuple[str, ...],
    loss_factor: float,
    seeds: tuple[int, ...],
) -> Comparison:
    runs = {r: [_run(device_type, setup, r, s, loss_factor) for s in seeds] for r in names}
    reference = [_smoothed(run.losses) for run in runs[names[0]]]
    start = np.mean([curve[SMOOTH - 1] for curve in reference])
    end = np.mean([curve[-1] for curve in reference])
    target = float(start - TARGET_FRACTION * (start - end))
    arms = {
        r: Arm(r, rs, [_steps_to_target(run, target) for run in rs], [x.val_accuracy for x in rs])
        for r, rs in runs.items()
    }
    return Comparison(setup, seeds, target, arms)


def _control(device_type: str) -> Comparison:
    """Negative control: fp32, amp-fp16 without and with GradScaler, on a loss x 2**-16."""
    return _compare(device_type, SMALL[0], ("fp32", "amp-fp16-noscaler", "amp-fp16"), TINY_LOSS)


def _record_setup(record: Record, label: str, setup: Setup) -> None:
    record.param(
        **{
            f"{label}/model": f"{setup.kind} {_size(setup)}",
            f"{label}/steps": setup.steps,
            f"{label}/batch_size": setup.batch_size,
            f"{label}/lr": setup.lr,
            f"{label}/task_options": dict(setup.task_options),
        }
    )


def small_model_verdict(slower: int, pairs: int) -> str:
    """The article claims precision loss *can* slow small models: one model slowed beyond the
    margin shows it (all of them: confirmed outright). None slowed among the few tiny synthetic
    models tried does not refute a "can": the sweep cannot speak for other models, so it is
    inconclusive, whether every gap was ruled out or some stayed undecided."""
    if slower:
        return "confirmed" if slower == pairs else "partly"
    return "inconclusive"


@pytest.mark.claim("PIT4-SMALL-CONVERGENCE")
@pytest.mark.requires("fp16_autocast", "grad_scaler", "bf16_autocast")
def test_amp_does_not_slow_small_models(amp_device, record):
    record.param(
        first_seeds=FIRST_SEEDS,
        seeds_without_spread=len(SEEDS),
        optimizer="adamw",
        smooth=SMOOTH,
        target_fraction=TARGET_FRACTION,
        step_margin=STEP_MARGIN,
        accuracy_margin_pts=ACCURACY_MARGIN,
        control_loss_factor=TINY_LOSS,
    )
    comparisons = {s.kind: _compare(amp_device.type, s, RECIPES) for s in SMALL}
    control = _control(amp_device.type)
    for label, comparison in (*comparisons.items(), ("control", control)):
        _record_setup(record, label, comparison.setup)
        comparison.log(record, label)

    pairs = [(kind, recipe) for kind in comparisons for recipe in AMP]
    slower = [(kind, recipe) for kind, recipe in pairs if comparisons[kind].slower(recipe)]
    no_gap = [(kind, recipe) for kind, recipe in pairs if comparisons[kind].no_gap(recipe)]
    verdict = small_model_verdict(len(slower), len(pairs))
    tried = ", ".join(f"{kind} {_size(c.setup)} params" for kind, c in comparisons.items())
    fp16_runs = [run for c in comparisons.values() for run in c.arms["amp-fp16"].runs]
    skipped = sum(sum(run.history.skipped) for run in fp16_runs)
    margins = ", ".join(
        f"{kind} {c.step_margin:g} of {c.setup.steps}" for kind, c in comparisons.items()
    )
    seeds = ", ".join(f"{kind} {c.seeds_note()}" for kind, c in comparisons.items())
    record.verdict(
        "PIT4-SMALL-CONVERGENCE",
        verdict,
        f"tried: {len(comparisons)} small models on synthetic tasks ({tried}), "
        f"{len(no_gap)} of {len(pairs)} AMP arms with no gap beyond the margins: the sweep "
        f"cannot speak for other models. "
        f"AMP minus fp32 over paired seeds ({seeds}; margins: steps {margins}; accuracy "
        f"{ACCURACY_MARGIN:g} pts): "
        + "; ".join(comparisons[kind].describe(recipe, kind) for kind, recipe in pairs)
        + f"; slower beyond the margin: {', '.join(map(' '.join, slower)) or 'none'}; amp-fp16 "
        f"skipped {skipped} of {sum(len(run.losses) for run in fp16_runs)} steps (GradScaler "
        f"calibrating its scale). Control, loss x 2**-16, {control.seeds_note()}: "
        f"{control.describe('amp-fp16-noscaler', 'mlp')}; with GradScaler: "
        f"{control.describe('amp-fp16', 'mlp')}",
    )

    for kind, comparison in comparisons.items():
        assert comparison.never_reached("fp32") == 0, (
            f"PIT4-SMALL-CONVERGENCE: fp32 {kind} did not reach its own target loss "
            f"{comparison.target:.3g}: {comparison.reference.steps}"
        )
    for kind, recipe in pairs:
        assert not comparisons[kind].slower(recipe), (
            f"PIT4-SMALL-CONVERGENCE: predicted no slowdown from AMP (Micikevicius 2018), "
            f"measured {comparisons[kind].describe(recipe, kind)}"
        )
    # Negative control: gradient underflow does slow convergence, and the statistic sees it...
    assert control.slower("amp-fp16-noscaler"), (
        f"PIT4-SMALL-CONVERGENCE: predicted the control to be slower beyond the margin, measured "
        f"{control.describe('amp-fp16-noscaler', 'mlp')}"
    )
    # ...and loss scaling, the prescribed fix, removes the gap.
    assert not control.slower("amp-fp16"), (
        f"PIT4-SMALL-CONVERGENCE: predicted GradScaler to remove the control's gap, measured "
        f"{control.describe('amp-fp16', 'mlp')}"
    )


@pytest.mark.claim("HDL-ACCURACY")
@pytest.mark.requires("fp16_autocast", "grad_scaler", "bf16_autocast")
def test_amp_keeps_validation_accuracy(amp_device, record):
    setup = LARGE[amp_device.type]
    record.param(
        first_seeds=FIRST_SEEDS,
        seeds_without_spread=len(SEEDS),
        optimizer="adamw",
        parity_margin_pts=PARITY_MARGIN,
    )
    _record_setup(record, "large", setup)
    # Judged by its accuracy alone: steps without spread here add no seeds.
    comparison = _compare(amp_device.type, setup, RECIPES, measures=("accuracy",))
    comparison.log(record, "large")
    # Negative control: the same statistic on the underflowing run of the convergence test.
    control = _control(amp_device.type)
    control_gap = control.accuracy("amp-fp16-noscaler")

    differences = {recipe: comparison.accuracy(recipe) for recipe in AMP}
    worse = [r for r, d in differences.items() if d.beyond(PARITY_MARGIN) and d.mean < 0]
    if worse:
        verdict = "refuted"
    elif all(d.within(PARITY_MARGIN) for d in differences.values()):
        verdict = "confirmed"
    else:
        verdict = "inconclusive"
    accuracy = {r: np.mean(arm.accuracy) for r, arm in comparison.arms.items()}
    record.metric(**{f"large/{r}/mean_val_accuracy": a for r, a in accuracy.items()})
    record.metric(
        **{f"large/{r}/accuracy_ci_width_pts": d.high - d.low for r, d in differences.items()}
    )
    record.verdict(
        "HDL-ACCURACY",
        verdict,
        f"{setup.kind} of {_size(setup):,} parameters, {setup.steps} steps, "
        f"{comparison.seeds_note()}: validation accuracy fp32 {accuracy['fp32']:.2f}%, "
        + ", ".join(
            f"{r} {accuracy[r]:.2f}% (minus fp32 {d.describe(' pts', digits=2)}, CI width "
            f"{d.high - d.low:.2f} pts)"
            for r, d in differences.items()
        )
        + f"; parity margin +-{PARITY_MARGIN:g} pts (the article: 72.3% -> 72.1%). Control, the "
        f"convergence test's {_size(control.setup):,}-parameter mlp with amp-fp16 without "
        f"GradScaler on a loss x 2**-16, {control.seeds_note()}: "
        f"{control_gap.describe(' pts', digits=2)}",
    )

    chance = 100.0 * _task(setup).chance
    assert accuracy["fp32"] > chance + 20, (
        f"HDL-ACCURACY: fp32 reached {accuracy['fp32']:.1f}%, chance is {chance:.1f}%: no task "
        "was learned, nothing to compare"
    )
    for recipe, difference in differences.items():
        assert not (difference.beyond(PARITY_MARGIN) and difference.mean < 0), (
            f"HDL-ACCURACY: predicted parity within {PARITY_MARGIN:g} pts, measured {recipe} "
            f"minus fp32 {difference.describe(' pts', digits=2)}"
        )
    assert control_gap.beyond(PARITY_MARGIN) and control_gap.mean < 0, (
        f"HDL-ACCURACY: predicted the underflowing control to lose accuracy beyond the margin, "
        f"measured {control_gap.describe(' pts', digits=2)}"
    )
