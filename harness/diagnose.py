"""`amp-harness diagnose`: the article's four pitfalls checked on the user's own model, before a
long fp16 or bf16 run, by measuring a few training steps under every recipe the device runs.

The protocol. A factory, named `package.module:function` (imported from the current folder
first, as `python -m` would), is called with no arguments and returns a `Subject`, a
`(model, batches, loss)` tuple or a dict with those keys:
- `model`: an `nn.Module` in float32 (diagnose moves it to the device, and copies it per recipe,
  so that every recipe starts from the same weights);
- `batches`: an iterable of `(inputs, targets)`; diagnose takes `steps` of them once and feeds
  the same ones to every recipe;
- `loss`: `loss(outputs, targets)` -> a scalar tensor.

What is measured, per recipe (harness.recipes: fp32 first, the reference, then amp-fp16,
amp-fp16-noscaler, amp-bf16 and half where the device runs them), through harness.train and
harness.probes:
- per leaf module, the largest |output| over the steps and its dtype: in the fp32 run, a layer
  whose peak comes within HEADROOM_FACTOR of fp16's largest value (65504) is one fp16 would
  overflow, before it happens; under each recipe, the inf/NaN its outputs held;
- in the fp32 run, the fraction of non-zero gradient entries that round to zero when held in fp16:
  what fp16 without loss scaling would lose (the article's underflow);
- norm layers whose parameters or running statistics are 16-bit (the half-norm pitfall), and
  the dtype each norm's output has under each recipe;
- the loss of every step against fp32's (the largest relative gap), non-finite losses, the
  GradScaler's scale and skipped steps;
- on CUDA, the median step time against fp32's (on the CPU fp16 is emulated: not a speed).

Each recipe ends with a status (STATUSES, most severe first) and the sentences that justify it.
The same call serves a scenario: `diagnose(make, device)` returns the `Diagnosis` to assert on.
"""

from __future__ import annotations

import copy
import importlib
import math
import os
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from harness import devices, probes, recipes
from harness.errors import HarnessError
from harness.train import History, train

RECIPES = ("fp32", "amp-fp16", "amp-fp16-noscaler", "amp-bf16", "half")
REFERENCE = "fp32"
FP16_MAX = torch.finfo(torch.float16).max  # 65504
# A layer whose fp32 peak is within this factor of 65504 is flagged: activations grow as
# training goes on, and a few steps see only its start.
HEADROOM_FACTOR = 8.0
# Fp16 without loss scaling is flagged when more than this fraction of the non-zero gradient
# entries would round to zero in fp16.
UNDERFLOW_MAX = 0.01
# A recipe whose loss leaves fp32's by more than this (relative, at any step) is flagged.
DRIFT_MAX = 0.05
NORMS = tuple(
    kind
    for kind in (
        nn.modules.batchnorm._NormBase,  # BatchNorm*, InstanceNorm*
        nn.LayerNorm,
        nn.GroupNorm,
        nn.LocalResponseNorm,
        getattr(nn, "RMSNorm", None),  # torch >= 2.4
    )
    if kind is not None
)
HALF_DTYPES = (torch.float16, torch.bfloat16)

# Statuses, the most severe first: a recipe gets the first that applies, and every reason.
FAILS = "fails"
KEEP_IN_FP32 = "keep layers in fp32 or use bf16"
NEEDS_SCALING = "needs loss scaling"
NORMS_IN_FP32 = "keep norm layers in fp32"
UNSTABLE = "unstable"
DRIFTS = "drifts"
SAFE = "safe"
STATUSES = (FAILS, KEEP_IN_FP32, NEEDS_SCALING, NORMS_IN_FP32, UNSTABLE, DRIFTS, SAFE)
NOT_RUN, REFERENCE_STATUS = "not run", "reference"  # a recipe the device lacks; fp32 itself


class DiagnoseError(HarnessError):
    pass


@dataclass
class Subject:
    model: nn.Module
    batches: Iterable
    loss: Callable


@dataclass
class Layer:
    """One leaf module under one recipe."""

    kind: str  # its class name
    dtype: str  # of its output
    peak: float  # largest |output| over the steps (finite entries)
    nonfinite: int  # inf and NaN entries its outputs held, over the steps
    norm: bool
    half_state: bool  # a norm whose parameters or running statistics are 16-bit


@dataclass
class Run:
    """What one recipe did on the subject."""

    recipe: str
    unsupported: str = ""  # why the device does not run it ("" when it ran)
    error: str = ""  # what it raised, if it did not get through its steps
    loss: list[float] = field(default_factory=list)
    scale: list[float] = field(default_factory=list)
    skipped: int = 0
    step_time_s: float | None = None  # median, CUDA only
    layers: dict[str, Layer] = field(default_factory=dict)
    underflow: float = 0.0  # largest fraction of non-zero fp32 gradient entries 0 in fp16
    zero_gradients: float = 0.0  # largest fraction of gradient entries exactly 0
    drift: float = 0.0  # largest |loss - fp32 loss| / |fp32 loss| over the steps
    speedup: float | None = None  # fp32's median step time over this recipe's (CUDA)
    # The first layer, in forward order, whose output held inf/NaN, and the step (from 1): at
    # step 1, or with a scaler that skips every bad step, it overflowed; later, without one, a
    # non-finite update may have caused it.
    first_nonfinite: tuple[int, str] | None = None
    status: str = ""
    reasons: list[str] = field(default_factory=list)


@dataclass
class Diagnosis:
    factory: str
    device: str  # "cpu" or the GPU's name
    torch: str
    steps: int
    runs: dict[str, Run]

    def hot_layers(self) -> list[tuple[str, Layer]]:
        """Layers whose fp32 peak is within HEADROOM_FACTOR of fp16's largest value."""
        reference = self.runs[REFERENCE].layers
        return [(n, x) for n, x in reference.items() if x.peak * HEADROOM_FACTOR >= FP16_MAX]

    def as_dict(self) -> dict:
        return asdict(self)


# --- the factory --------------------------------------------------------------------------


def load(spec: str) -> Callable[[], object]:
    """The factory `spec` names ("package.module:function"), imported from the current folder
    first; each problem is an error naming the factory."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise DiagnoseError(
            f"factory {spec!r}: not of the form MODULE:FUNCTION, e.g. my_pkg.models:make "
            "(a function that returns the model, the batches and the loss)"
        )
    if os.getcwd() not in sys.path:  # as `python -m` finds modules of the current folder
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or anything the module raises at import
        raise DiagnoseError(
            f"factory {spec!r}: importing {module_name} raised {type(exc).__name__}: {exc} "
            "(run from the folder that holds it, or install its package)"
        ) from exc
    factory = getattr(module, attribute, None)
    if not callable(factory):
        public = [n for n in vars(module) if callable(getattr(module, n)) and not n.startswith("_")]
        raise DiagnoseError(
            f"factory {spec!r}: {module_name} has no function {attribute!r} (it has: "
            f"{', '.join(sorted(public)[:10]) or 'none'})"
        )
    return factory


def subject(spec: str, made: object) -> Subject:
    """What the factory returned, checked against the protocol."""
    if isinstance(made, Subject):
        found = made
    elif isinstance(made, dict) and {"model", "batches", "loss"} <= set(made):
        found = Subject(made["model"], made["batches"], made["loss"])
    elif isinstance(made, tuple | list) and len(made) == 3:
        found = Subject(*made)
    else:
        raise DiagnoseError(
            f"factory {spec!r} returned {type(made).__name__}: expected a "
            "harness.diagnose.Subject, a (model, batches, loss) tuple or a dict with those keys"
        )
    problems = []
    if not isinstance(found.model, nn.Module):
        problems.append(f"model is a {type(found.model).__name__}, not a torch.nn.Module")
    if not isinstance(found.batches, Iterable):
        problems.append(f"batches is a {type(found.batches).__name__}, not an iterable")
    if not callable(found.loss):
        problems.append(f"loss is a {type(found.loss).__name__}, not callable")
    if problems:
        raise DiagnoseError(f"factory {spec!r}: " + "; ".join(problems))
    return found


def _take(spec: str, batches: Iterable, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    taken = []
    for batch in batches:
        if not (isinstance(batch, tuple | list) and len(batch) == 2):
            raise DiagnoseError(
                f"factory {spec!r}: batch {len(taken)} is a {type(batch).__name__}, not an "
                "(inputs, targets) pair"
            )
        taken.append(tuple(batch))
        if len(taken) == steps:
            return taken
    raise DiagnoseError(
        f"factory {spec!r}: its batches gave {len(taken)}, diagnose needs {steps} (--steps)"
    )


@dataclass
class _Replay:
    """The subject as harness.train reads a task: the same batches for every recipe."""

    taken: list
    loss: Callable

    def batches(self, _batch_size: int, _seed: int = 0) -> Iterator:
        return iter(self.taken)


# --- the measurement ------------------------------------------------------------------------


class _Watch:
    """A train(on_step=...) callback: after each step, folds the outputs probes.outputs saw in
    that step's forward, and the step's gradients, into the run."""

    def __init__(self, run: Run, seen: dict[str, probes.OutputStats], modules: dict):
        self.run, self.seen, self.modules = run, seen, modules
        self.step = 0

    def __call__(self, model: nn.Module, _report) -> None:
        self.step += 1
        if self.run.first_nonfinite is None:  # `seen` is in forward order: its first call's
            self.run.first_nonfinite = next(
                ((self.step, n) for n, stats in self.seen.items() if stats.inf or stats.nan), None
            )
        for name, stats in self.seen.items():
            module = self.modules[name]
            before = self.run.layers.get(name)
            norm = isinstance(module, NORMS)
            self.run.layers[name] = Layer(
                kind=type(module).__name__,
                dtype=str(stats.dtype).removeprefix("torch."),
                peak=max(stats.max_abs, before.peak if before else 0.0),
                nonfinite=stats.inf + stats.nan + (before.nonfinite if before else 0),
                norm=norm,
                half_state=before.half_state if before else norm and _half_state(module),
            )
        grads = probes.gradients(model)
        nonzero = grads.entries - grads.zero
        if nonzero:
            self.run.underflow = max(self.run.underflow, grads.fp16_flushed / nonzero)
        self.run.zero_gradients = max(self.run.zero_gradients, grads.zero_fraction)


def _half_state(module: nn.Module) -> bool:
    return any(t.dtype in HALF_DTYPES for t in [*module.parameters(), *module.buffers()])


def _leaves(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules() if n and not any(m.children())}


def _run(
    name: str, initial: nn.Module, replay: _Replay, device: devices.DeviceInfo, lr: float,
    optimizer: str,
) -> Run:  # fmt: skip
    run = Run(name)
    recipe = recipes.get(name)
    run.unsupported = recipe.unsupported_reason(device) or ""
    if run.unsupported:
        return run
    model = copy.deepcopy(initial)
    modules = _leaves(model)
    history = History()
    try:
        with recipe.bind(device) as precision, probes.outputs(list(modules.items())) as seen:
            history = train(
                model, precision, replay, steps=len(replay.taken), lr=lr,
                optimizer=optimizer, on_step=_Watch(run, seen, modules),
            )  # fmt: skip
    except Exception as exc:  # an op this recipe's dtype lacks, ...: a finding, not a crash
        if name == REFERENCE:
            raise
        run.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    run.loss, run.scale = history.loss, history.scale
    run.skipped = sum(history.skipped)
    if device.type == "cuda" and history.step_time_s[1:]:  # the first step warms up
        run.step_time_s = statistics.median(history.step_time_s[1:])
    return run


def diagnose(
    make: Callable[[], object] | Subject | str,
    device: devices.DeviceInfo | str = "cpu",
    steps: int = 8,
    lr: float = 1e-3,
    optimizer: str = "adamw",
    names: Iterable[str] = RECIPES,
) -> Diagnosis:
    """Train `steps` steps of the subject under each recipe (fp32 first) and judge each.

    `make`: the factory (or its "module:function" name, or a Subject). Errors of the subject
    (it does not load, break the protocol, or fail its first fp32 step) name the factory."""
    spec = make if isinstance(make, str) else getattr(make, "__qualname__", "subject")
    if steps < 2:
        raise DiagnoseError(f"--steps {steps}: diagnose needs at least 2 steps")
    names = [REFERENCE, *(n for n in names if n != REFERENCE)]
    for name in names:
        recipes.get(name)  # an unknown recipe is an error before anything runs
    factory = load(make) if isinstance(make, str) else make
    if isinstance(factory, Subject):
        found = factory
    else:
        try:
            made = factory()
        except Exception as exc:
            raise DiagnoseError(f"factory {spec!r} raised {type(exc).__name__}: {exc}") from exc
        found = subject(spec, made)
    info = devices.probe(device) if isinstance(device, str) else device
    replay = _Replay(_take(spec, found.batches, steps), found.loss)
    initial = copy.deepcopy(found.model).float()
    try:
        reference = _run(REFERENCE, initial, replay, info, lr, optimizer)
    except Exception as exc:
        raise DiagnoseError(
            f"factory {spec!r}: its first training step failed under fp32: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    runs = {REFERENCE: reference}
    for name in names[1:]:
        runs[name] = _run(name, initial, replay, info, lr, optimizer)
    diagnosis = Diagnosis(spec, info.name, torch.__version__, steps, runs)
    for run in runs.values():
        _judge(run, diagnosis)
    return diagnosis


# --- the judgement --------------------------------------------------------------------------


def _drift(run: Run, reference: Run) -> float:
    gaps = []
    for got, want in zip(run.loss, reference.loss, strict=False):
        if not math.isfinite(got):
            return math.inf
        gaps.append(abs(got - want) / max(abs(want), 1e-12))
    return max(gaps, default=0.0)


def _judge(run: Run, diagnosis: Diagnosis) -> None:
    """The run's status and reasons, from its measurements and the fp32 run's."""
    if run.unsupported:
        run.status, run.reasons = NOT_RUN, [run.unsupported]
        return
    if run.recipe == REFERENCE:
        run.status, run.reasons = REFERENCE_STATUS, [_safe(run, diagnosis)]
        return
    reference = diagnosis.runs[REFERENCE]
    recipe = recipes.get(run.recipe)
    found: dict[str, list[str]] = {}
    if run.error:
        found[FAILS] = [f"raised {run.error}"]
    run.drift = _drift(run, reference)
    if reference.step_time_s and run.step_time_s:
        run.speedup = reference.step_time_s / run.step_time_s
    fp16 = torch.float16 in (recipe.autocast_dtype, recipe.param_dtype)
    # A hot layer matters where this recipe computes it in fp16; the first to output inf/NaN in
    # fp16 at step 1 (finite weights) or under a scaler (bad steps skipped) overflowed.
    computed_fp16 = {n for n, x in run.layers.items() if x.dtype == "float16"}
    hot = [n for n, _x in diagnosis.hot_layers() if n in computed_fp16]
    step, origin = run.first_nonfinite or (0, "")
    overflowed = [origin] if origin in computed_fp16 and (step == 1 or recipe.scaler) else []
    if fp16 and (hot or overflowed):
        names = list(dict.fromkeys(hot + overflowed))
        peaks = ", ".join(
            f"{n} peak |x| {reference.layers[n].peak:.4g} in fp32 "
            f"({_margin(reference.layers[n].peak)})"
            for n in names
            if n in reference.layers
        )
        found[KEEP_IN_FP32] = [
            f"keep {', '.join(names)} in fp32, or use amp-bf16 (fp32's range): {peaks}"
            + (f"; {origin}'s fp16 output overflowed at step {step}" if overflowed else "")
        ]
    if fp16 and not recipe.scaler and reference.underflow > UNDERFLOW_MAX:
        found[NEEDS_SCALING] = [
            f"{reference.underflow:.2%} of the non-zero gradient entries round to zero in fp16 "
            f"(measured in fp32; {run.zero_gradients:.2%} of this run's entries were zero): "
            "use amp-fp16 (GradScaler) or amp-bf16"
        ]
    half_norms = [n for n, x in run.layers.items() if x.half_state]
    if half_norms:
        found[NORMS_IN_FP32] = [
            f"norm layers with 16-bit parameters and statistics: {', '.join(half_norms)} (keep "
            "them in fp32, as autocast does)"
        ]
    nonfinite = sum(not math.isfinite(v) for v in run.loss)
    if nonfinite and recipe.scaler and run.skipped >= len(run.loss) - 1:
        found.setdefault(UNSTABLE, []).append(
            f"the scaler skipped {run.skipped} of {len(run.loss)} steps (scale "
            f"{run.scale[0]:g} -> {run.scale[-1]:g}): every step overflowed"
        )
    elif nonfinite and not recipe.scaler:
        first = next(i for i, v in enumerate(run.loss, 1) if not math.isfinite(v))
        found.setdefault(UNSTABLE, []).append(
            f"{nonfinite} of {len(run.loss)} losses non-finite, from step {first}"
            + (f" (first inf/NaN output: {origin}, step {step})" if origin else "")
        )
    if math.isfinite(run.drift) and run.drift > DRIFT_MAX:
        found[DRIFTS] = [f"the loss left fp32's by {run.drift:.2%} (at most {DRIFT_MAX:.0%})"]
    run.status = next((s for s in STATUSES if s in found), SAFE)
    run.reasons = [r for s in STATUSES for r in found.get(s, [])] or [_safe(run, diagnosis)]


def _safe(run: Run, diagnosis: Diagnosis) -> str:
    peak = max((x.peak for x in diagnosis.runs[REFERENCE].layers.values()), default=0.0)
    words = [
        f"{len(run.loss)} steps, final loss {run.loss[-1]:.4g}"
        if run.recipe == REFERENCE
        else f"loss within {run.drift:.2%} of fp32 over {len(run.loss)} steps",
        f"largest fp32 activation {peak:.4g} ({_margin(peak)})",
    ]
    if recipes.get(run.recipe).scaler:
        words.append(
            f"the scaler skipped {run.skipped} step(s), scale {run.scale[0]:g} -> {run.scale[-1]:g}"
        )
    return "; ".join(words)


def _margin(peak: float) -> str:
    """How far a peak |x| is from fp16's largest value, in words."""
    if peak >= FP16_MAX:
        return f"{peak / FP16_MAX:.2g}x fp16's largest value 65504"
    return f"{FP16_MAX / max(peak, 1e-30):.2g}x below fp16's 65504"
