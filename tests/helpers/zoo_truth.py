"""What plain training does under each precision recipe: the truth that `amp-harness diagnose`'s
quick look is judged by (tests/lab/diagnose/test_diagnose_zoo.py, scripts/diagnose-truth).

Independent of diagnose and of its `--verify`: nothing of the harness is used but the factory's
Subject (model, batches, loss). Each recipe is trained by a loop written as a training script
writes it (autocast, GradScaler, model.half(), AdamW at 1e-3 as diagnose's default, or SGD), and
judged against fp32's own seed-to-seed spread:

1. take `steps` training batches and HELD_OUT held-out batches of the factory's data;
2. train fp32 from the factory's weights, then again from SPREAD_SEEDS other init seeds (the
   factory's `seed`; a factory without one: the same batches in another order);
3. train each recipe from fp32's weights on fp32's batches, with the same dropout seed;
4. call each run:
   - **diverges**: a non-finite training loss, parameters inf/NaN, or a GradScaler that skipped
     over half of the steps or whose scale fell under 1;
   - **harmed**: its held-out loss (eval mode, the recipe's own precision) or the end of its
     loss curve (the last tenth of the steps) worse than fp32's by more than fp32's own spread,
     by more than 1% and by more than 1e-3 of fp32's first loss (FLOOR); or it learned under
     half of what fp32 learned, where fp32's learning stands out of its spread;
   - **differs from fp32**: neither diverged nor harmed, but its held-out loss or the end of its
     loss curve *better* than fp32's by the same margins: another run, not fp32's (`half` with
     AdamW eps 1e-4, whose fp16 second moments are 0 on many entries, takes steps up to twice
     fp32's);
   - **trains as fp32**: within the margins both ways.

The paired truth (`paired_reference`, `judge_paired`; `scripts/diagnose-truth --paired K`)
trains each recipe from K seeds beside fp32 from the same seeds, and calls a gap harm (or another
run) only where it is consistent across the seeds and beyond fp32's own seed spread: a model
whose fp32 reruns scatter widely is judged by its recipes' average effect, not by one run.

A prediction is **correct** when "safe" meets "trains as fp32" or a flag meets "diverges",
"harmed" or "differs from fp32"; a "safe" on a run that diverges, is harmed or differs is a
**MISS**; a flag on a run that trains as fp32 is a **FALSE ALARM**.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._pytree import tree_map

from harness.lab.stats import sign_flip_p  # a statistic, no judgement of diagnose's

RECIPES = ("fp32", "amp-fp16", "amp-fp16-noscaler", "amp-bf16", "half")
LR = 1e-3  # diagnose's default, so that the truth is about the setting diagnose judged
ADAM_EPS = 1e-8  # torch's default
HELD_OUT = 8
SPREAD_SEEDS = (1, 2)
MARGIN = 0.01  # a gap under 1% of fp32's loss is never harm, however tight fp32's spread
# ... nor one under 1e-3 of fp32's first loss: where fp32 has learned its task to a loss near 0
# (bert_naive_softmax: 0.0002 to 0.0012 held-out, from 4.9), a relative gap measures nothing.
# The same floor as diagnose's drift rule (LOSS_FLOOR), set apart here: the truth imports none
# of diagnose.
FLOOR = 1e-3
DIVERGES, HARMED, DIFFERS, FINE = "diverges", "harmed", "differs from fp32", "trains as fp32"
CORRECT, MISS, FALSE_ALARM = "correct", "MISS", "FALSE ALARM"
SAFE = "safe"  # diagnose's word for "no flag"
# diagnose's word for a real overflow whose harm its quick look cannot measure: no flag either.
NO_MEASURABLE_HARM = "overflows fp16, harm within noise"


# --- the data, taken once ---------------------------------------------------------------------


@dataclass
class Task:
    """What a factory made, its batches taken once: every recipe sees the same ones."""

    model: nn.Module
    loss: Callable
    training: list
    held_out: list


def take(factory: Callable, steps: int, seed: int = 0) -> Task:
    """The factory's model initialised from `seed` (or, for a factory without a seed, its own
    weights and the training batches in the order `seed` shuffles them)."""
    takes_seed = "seed" in inspect.signature(factory).parameters
    made = factory(seed=seed) if takes_seed else factory()
    batches = list(itertools.islice(iter(made.batches), steps + HELD_OUT))
    training, held_out = batches[:steps], batches[steps:]
    if seed and not takes_seed:
        order = torch.randperm(steps, generator=torch.Generator().manual_seed(seed))
        training = [training[i] for i in order]
    return Task(made.model, made.loss, training, held_out)


# --- one recipe's training --------------------------------------------------------------------


@dataclass
class Trained:
    recipe: str
    losses: list[float] = field(default_factory=list)
    held_out: float = math.nan
    params_finite: bool = True
    skipped: int = 0  # steps GradScaler skipped (its scale fell)
    scale_min: float | None = None

    @property
    def first_nonfinite(self) -> int | None:
        return next((i + 1 for i, v in enumerate(self.losses) if not math.isfinite(v)), None)

    @property
    def end(self) -> float:
        """The mean loss over the last tenth of the steps (at least one)."""
        return statistics.fmean(self.losses[-max(1, len(self.losses) // 10) :])


def train(
    task: Task, recipe: str, seed: int = 0, keep_fp32: Sequence[str] = (),
    adam_eps: float = ADAM_EPS, optimizer: str = "adamw", lr: float = LR, loss_fp32: bool = False,
) -> Trained:  # fmt: skip
    """Train a copy of the task's model under `recipe` over its training batches; `keep_fp32`,
    `adam_eps` and `loss_fp32` (the loss computed outside autocast on the outputs cast to fp32,
    as a user writes it) are the fixes diagnose recommends."""
    model = copy.deepcopy(task.model).float()
    if recipe == "half":
        model.half()
    for name in keep_fp32:
        _keep_in_fp32(model.get_submodule(name), torch.float16 if recipe == "half" else None)
    model.train()
    torch.manual_seed(seed)  # dropout masks: the same in every recipe of one seed
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, eps=adam_eps)
    scaler = torch.amp.GradScaler("cpu") if recipe == "amp-fp16" else None
    run = Trained(recipe)
    for x, y in task.training:
        loss = _loss(task, model, x, y, recipe, loss_fp32)
        opt.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scale = scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(opt)  # skipped when the gradients hold inf/NaN
            scaler.update()  # ... and then the scale is halved
            run.skipped += scaler.get_scale() < scale
            run.scale_min = min(scaler.get_scale(), run.scale_min or math.inf)
        run.losses.append(float(loss.detach()))
        if not _finite(model):
            run.params_finite = False
            break  # NaN parameters stay NaN: the remaining steps would say nothing more
    run.held_out = _held_out_loss(task, model, recipe, loss_fp32)
    return run


def _loss(task: Task, model: nn.Module, x, y, recipe: str, loss_fp32: bool) -> torch.Tensor:
    """The forward under the recipe's autocast and the loss in it, or, with `loss_fp32`, the
    loss after it on the outputs made fp32."""
    with _autocast(recipe):
        out = model(_cast(x, recipe))
        if not loss_fp32:
            return task.loss(out, y)
    return task.loss(_fp32(out), y)


def _fp32(out):
    """The model's outputs in fp32: a tensor, or each floating tensor of a tuple or list."""
    if isinstance(out, tuple | list):
        return type(out)(_fp32(o) for o in out)
    return out.float() if isinstance(out, torch.Tensor) and out.is_floating_point() else out


AUTOCAST = {
    "amp-fp16": torch.float16,
    "amp-fp16-noscaler": torch.float16,
    "amp-bf16": torch.bfloat16,
}


def _autocast(recipe: str) -> torch.autocast:
    dtype = AUTOCAST.get(recipe)
    return torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None)


def _cast(x: torch.Tensor, recipe: str) -> torch.Tensor:
    """A half model takes floating inputs in fp16; token ids stay integers."""
    return x.half() if recipe == "half" and x.is_floating_point() else x


def _finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


@torch.no_grad()
def _held_out_loss(task: Task, model: nn.Module, recipe: str, loss_fp32: bool = False) -> float:
    """The mean loss on batches never trained on, in eval mode (BatchNorm on its running
    statistics, no dropout), under the recipe's own precision, as its eval loop would run."""
    model.eval()
    return statistics.fmean(
        float(_loss(task, model, x, y, recipe, loss_fp32)) for x, y in task.held_out
    )


def _keep_in_fp32(module: nn.Module, model_dtype: torch.dtype | None) -> None:
    """Run `module` in fp32, as one does by hand: its parameters fp32, its floating inputs cast
    up, autocast off inside it; in a half model its outputs go back to fp16 for the next layer."""
    module.float()
    inner = module.forward

    def to(dtype):
        def cast(t):
            return t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

        return cast

    def forward(*args, **kwargs):
        args, kwargs = tree_map(to(torch.float32), (args, kwargs))
        with torch.autocast("cpu", enabled=False):
            out = inner(*args, **kwargs)
        return out if model_dtype is None else tree_map(to(model_dtype), out)

    module.forward = forward


# --- the truth: each run against fp32 and fp32's own spread ------------------------------------


@dataclass
class Truth:
    word: str  # DIVERGES, HARMED, DIFFERS or FINE
    why: str  # the numbers behind it


@dataclass
class Reference:
    """fp32's run and its own spread: the largest gap of the other seeds' runs to it."""

    run: Trained
    held_out_spread: float
    end_spread: float


def reference(
    factory: Callable, steps: int, seeds: Sequence[int] = SPREAD_SEEDS, **setting
) -> tuple[Task, Reference]:
    """fp32 trained from the factory's weights and from `seeds` others (the largest gap of a
    few reruns: more seeds, a wider and truer spread); `setting`: the optimizer and lr."""
    task = take(factory, steps)
    fp32 = train(task, "fp32", **setting)
    others = [train(take(factory, steps, seed), "fp32", seed, **setting) for seed in seeds]
    return task, Reference(
        fp32,
        max(abs(o.held_out - fp32.held_out) for o in others),
        max(abs(o.end - fp32.end) for o in others),
    )


def _diverged(run: Trained) -> str | None:
    """How a run diverged, or None: a non-finite loss, inf/NaN parameters or a GradScaler that
    gave up (over half of the steps skipped, or its scale under 1)."""
    steps = len(run.losses)
    if run.first_nonfinite:
        count = sum(not math.isfinite(v) for v in run.losses)
        state = "finite" if run.params_finite else "inf/NaN"
        return (
            f"loss non-finite from step {run.first_nonfinite} ({count} of {steps} steps run), "
            f"parameters {state}"
        )
    if not run.params_finite:
        return f"parameters inf/NaN after step {steps}"
    if run.recipe == "amp-fp16" and (run.skipped > steps / 2 or (run.scale_min or 1) < 1):
        return f"GradScaler skipped {run.skipped} of {steps} steps, scale {run.scale_min:g}"
    if not math.isfinite(run.held_out):
        return "held-out loss non-finite"
    return None


def judge(run: Trained, ref: Reference) -> Truth:
    """What training did, in one word and the numbers behind it."""
    diverged = _diverged(run)
    if diverged:
        return Truth(DIVERGES, diverged)
    fp32 = ref.run
    gaps = [
        ("held-out", run.held_out - fp32.held_out, fp32.held_out, ref.held_out_spread),
        ("end", run.end - fp32.end, fp32.end, ref.end_spread),
    ]
    words = [
        f"{what} {gap / abs(base):+.1%} (fp32 {base:.4g}, its spread ±{spread / abs(base):.1%})"
        for what, gap, base, spread in gaps
    ]
    why = ", ".join(words)
    # The same margin both ways: worse beyond it is harm, better beyond it is another run.
    floor = FLOOR * abs(fp32.losses[0])
    beyond = [(gap, max(spread, MARGIN * abs(base), floor)) for _, gap, base, spread in gaps]
    if any(gap > margin for gap, margin in beyond):
        return Truth(HARMED, why)
    # Learning little where fp32 learned (gradients flushed to zero stall a model): only where
    # fp32's learning stands out of its own spread, or noise on a flat curve would decide.
    learned, own = fp32.losses[0] - fp32.end, run.losses[0] - run.end
    if learned > max(ref.end_spread, MARGIN * abs(fp32.end)) and own < learned / 2:
        return Truth(HARMED, f"learned {own / learned:.0%} of what fp32 learned; {why}")
    if any(gap < -margin for gap, margin in beyond):
        return Truth(DIFFERS, f"{why}: better beyond the spread, not fp32's run")
    return Truth(FINE, why)


def truths(
    factory: Callable, steps: int, recipes: Sequence[str] = RECIPES[1:],
    seeds: Sequence[int] = SPREAD_SEEDS, **setting,
) -> dict[str, Truth]:  # fmt: skip
    """Each recipe's truth over `steps` steps of training, against fp32's spread over `seeds`;
    `setting`: the optimizer and lr."""
    task, ref = reference(factory, steps, seeds, **setting)
    return {recipe: judge(train(task, recipe, **setting), ref) for recipe in recipes}


# --- the paired truth: each recipe beside fp32 from the same seeds -----------------------------
#
# One run of a recipe against the largest gap of K fp32 reruns misjudges a model whose reruns
# scatter widely: a run as noisy as a rerun lands beyond the largest of K about once in K+1, and
# one wild rerun widens the spread for every recipe (convnext's: one fp32 rerun 862% off). The
# paired truth trains the recipe from each of K seeds beside fp32 from the same seed (weights,
# batches, dropout masks) and calls a gap only where it is consistent across the seeds (an exact
# sign-flip test of its mean, p < ALPHA) and beyond fp32's own seed spread (the standard
# deviation of fp32's runs across the seeds, at least 1% and FLOOR): a consistent effect smaller
# than what a rerun varies by is inside the noise a user's rerun shows.

ALPHA = 0.05
# The smallest two-sided p that K signs can give is 2 / 2**K: under 6 seeds, never under ALPHA.
PAIRED_SEEDS = range(6, 17)  # and the test enumerates all 2**K signs: 65,536 at 16


@dataclass
class Paired:
    """fp32 trained from each seed, with the task (weights and batches) it was trained on."""

    seeds: list[int]
    tasks: list[Task]
    runs: list[Trained]


def paired_reference(
    factory: Callable, steps: int, seeds: Sequence[int], **setting
) -> Paired:  # fmt: skip
    """fp32 from each of `seeds` (0: the factory's own weights); `setting`: optimizer and lr."""
    if len(seeds) not in PAIRED_SEEDS:
        raise ValueError(
            f"a paired truth takes {PAIRED_SEEDS.start} to {PAIRED_SEEDS.stop - 1} seeds, not "
            f"{len(seeds)}: fewer cannot show a gap at p < {ALPHA}"
        )
    tasks = [take(factory, steps, seed) for seed in seeds]
    runs = [train(task, "fp32", seed, **setting) for seed, task in zip(seeds, tasks, strict=True)]
    return Paired(list(seeds), tasks, runs)


def train_paired(ref: Paired, recipe: str, **setting) -> list[Trained]:
    """The recipe (with a fix's `keep_fp32`, `adam_eps` or `loss_fp32`) trained beside each of
    fp32's runs."""
    return [
        train(task, recipe, seed, **setting)
        for seed, task in zip(ref.seeds, ref.tasks, strict=True)
    ]


def judge_paired(runs: Sequence[Trained], ref: Paired) -> Truth:
    """What training did over the seeds, in one word and the numbers behind it: diverges on any
    seed; harmed (or differs from fp32) where the mean gap is consistent and beyond the spread."""
    diverged = [(seed, why) for seed, run in zip(ref.seeds, runs, strict=True)
                if (why := _diverged(run))]  # fmt: skip
    if diverged:
        seed, why = diverged[0]
        return Truth(DIVERGES, f"on {len(diverged)} of {len(runs)} seeds (seed {seed}: {why})")
    parts, beyond = [], []
    for what, value in (("held-out", lambda r: r.held_out), ("end", lambda r: r.end)):
        base = [value(f) for f in ref.runs]
        gaps = [(value(r) - b) / abs(b) for r, b in zip(runs, base, strict=True)]
        mean, p = statistics.fmean(gaps), sign_flip_p(gaps)
        spread = statistics.stdev(base) / abs(statistics.fmean(base))
        floor = FLOOR * statistics.fmean(abs(f.losses[0]) for f in ref.runs)
        floor /= abs(statistics.fmean(base))
        below = (
            f", under 1e-3 of its first loss: ±{floor:.0%}" if floor > max(spread, MARGIN) else ""
        )
        parts.append(
            f"{what} {mean:+.1%} on average over {len(gaps)} seeds (p {p:.2g}; fp32's seed "
            f"spread ±{spread:.1%}{below})"
        )
        if p < ALPHA and abs(mean) > max(spread, MARGIN, floor):
            beyond.append(mean)
    why = ", ".join(parts)
    if any(mean > 0 for mean in beyond):
        return Truth(HARMED, why)
    learned = statistics.fmean(f.losses[0] - f.end for f in ref.runs)
    own = statistics.fmean(r.losses[0] - r.end for r in runs)
    ends = [f.end for f in ref.runs]
    if learned > max(statistics.stdev(ends), MARGIN * abs(statistics.fmean(ends))) and (
        own < learned / 2
    ):
        return Truth(HARMED, f"learned {own / learned:.0%} of what fp32 learned; {why}")
    if beyond:
        return Truth(DIFFERS, f"{why}: better beyond the spread, not fp32's run")
    return Truth(FINE, why)


# --- diagnose's call against the truth --------------------------------------------------------


def call(predicted: str, truth: str) -> str:
    """A status of diagnose's quick look against what training did. "overflows fp16, harm within
    noise" says no harm is measurable (an option, not an alarm): it is held as "safe" is."""
    if predicted in (SAFE, NO_MEASURABLE_HARM):
        return CORRECT if truth == FINE else MISS
    return FALSE_ALARM if truth == FINE else CORRECT
