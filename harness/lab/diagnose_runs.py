"""One recipe trained on the subject's batches and measured, for `amp-harness diagnose`.

Every run starts from the same weights, sees the same batches and draws the same random numbers
(the RNG is seeded before each: dropout masks are then the same in every recipe, so a recipe's
gap to fp32 is precision, not a different mask). The quick look's runs carry the probes: every
op's output range, named by the module running it (harness.lab.probes.op_ranges), the norm layers'
running statistics, the gradients; --verify's long runs measure the loss alone.
"""

from __future__ import annotations

import contextlib
import copy
import math
import signal
import statistics
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from harness.common.errors import HarnessError
from harness.lab import devices, probes, recipes
from harness.lab.diagnose_fixes import Fix, Fixed
from harness.lab.diagnose_rules import PERTURBATION, NormState, OpRange, Run
from harness.lab.train import History, train

SEED = 0
NOISE_RUNS = 2  # perturbed fp32 runs that measure fp32's own spread
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


class StepTimeout(HarnessError):
    pass


@dataclass
class Replay:
    """The subject as harness.lab.train reads a task: the same batches for every recipe."""

    taken: list
    loss: Callable

    def batches(self, _batch_size: int, _seed: int = 0) -> Iterator:
        return iter(self.taken)


@dataclass(frozen=True)
class Setting:
    """What every run of one diagnosis shares."""

    device: devices.DeviceInfo
    lr: float
    optimizer: str
    step_limit_s: float | None  # a step that takes longer is stopped (None: no limit)


def norm_modules(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if n and isinstance(m, NORMS)]


class _Watch:
    """A train(on_step=...) callback: after each step, folds what the probes saw in that step
    into the run; keeps the first step's gradient (the same weights and batch in every run)."""

    def __init__(self, run: Run, log: probes.OpRanges | None, optimizer: str, limit: _Limit):
        self.run, self.log, self.optimizer, self.limit = run, log, optimizer, limit
        self.step = 0
        self.first_gradient: torch.Tensor | None = None
        self.norms: dict[str, nn.Module] | None = None

    def __call__(self, model: nn.Module, _report) -> None:
        self.step += 1
        self.limit.rearm()
        if self.log is None:
            return
        self._ops(self.log.read())
        self._norms(model)
        self._gradients(model)

    def _ops(self, calls: list[probes.OpCall]) -> None:
        this_step: dict[str, float] = {}
        for call in calls:
            if call.fill or call.peak == torch.finfo(call.dtype).max:
                continue  # a mask's constant (-inf, finfo.min), written on purpose
            if call.created and self.run.first_nonfinite is None:
                self.run.first_nonfinite = (self.step, call.key)
            op = self.run.ops.setdefault(call.key, OpRange(str(call.dtype).removeprefix("torch.")))
            peak = math.inf if math.isnan(call.peak) else call.peak  # NaN: as far out as inf
            op.peak, op.input_peak = max(op.peak, peak), max(op.input_peak, call.input_peak or 0.0)
            op.nonfinite += call.nonfinite
            this_step[call.key] = max(this_step.get(call.key, 0.0), peak)
        for key, peak in this_step.items():
            self.run.ops[key].peaks.append(peak)

    def _norms(self, model: nn.Module) -> None:
        if self.norms is None:
            named = dict(model.named_modules())
            self.norms = {n: named[n] for n in norm_modules(model)}
        for name, module in self.norms.items():
            stats = [b.detach() for n, b in module.named_buffers() if n.startswith("running_")]
            state = self.run.norms.setdefault(
                name,
                NormState(
                    type(module).__name__,
                    any(t.dtype in HALF_DTYPES for t in [*module.parameters(), *module.buffers()]),
                ),
            )
            for stat in stats:
                finite = torch.isfinite(stat)
                peak = float(torch.where(finite, stat.abs(), 0).amax()) if stat.numel() else 0.0
                state.stat_peak = max(state.stat_peak, peak)
            state.stat_nonfinite = sum(int((~torch.isfinite(s)).sum()) for s in stats)

    def _gradients(self, model: nn.Module) -> None:
        grads = [p.grad.detach().float().flatten()
                 for p in model.parameters() if p.grad is not None]  # fmt: skip
        if not grads:
            return
        # One vector, one read back: a reduction per parameter would synchronise a GPU for each.
        flat = torch.cat(grads)
        if self.step == 1:
            self.first_gradient = flat
        nonzero = flat != 0
        flushed = nonzero & (flat.half() == 0)
        squares = flat * flat
        counts = torch.stack(
            [nonzero.sum().double(), flushed.sum().double(), squares.sum().double(),
             squares[flushed].sum().double()]
        )  # fmt: skip
        nonzero_count, flushed_count, whole, lost = counts.tolist()
        if self.optimizer == "sgd":  # the share of the update fp16 would lose
            share = lost / whole if whole > 0 else 0.0
        else:
            share = flushed_count / nonzero_count if nonzero_count else 0.0
        self.run.underflow_steps.append(share)
        self.run.underflow = share
        self.run.zero_gradients = max(self.run.zero_gradients, 1 - nonzero_count / flat.numel())


class _Limit:
    """A step that runs past `seconds` raises StepTimeout (SIGALRM; the main thread only:
    elsewhere no limit is set)."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.on = bool(seconds) and threading.current_thread() is threading.main_thread()

    def rearm(self) -> None:
        if self.on:
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        if not self.on:
            yield
            return

        def expired(_signum, _frame):
            raise StepTimeout(
                f"a training step ran past {self.seconds:g} s (--step-timeout): stopped"
            )

        previous = signal.signal(signal.SIGALRM, expired)
        self.rearm()
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def run_recipe(
    name: str,
    initial: nn.Module,
    replay: Replay,
    setting: Setting,
    *,
    fix: Fix | None = None,
    watch: bool = True,
    perturb: float = 0.0,
    reference_gradient: torch.Tensor | None = None,
    held_out: list | None = None,
) -> tuple[Run, torch.Tensor | None]:
    """Train a copy of `initial` on `replay` under the recipe (with `fix` applied, its weights
    perturbed by `perturb`); the run, and its first step's gradient. Errors of the recipe are
    the run's (`run.error`); a step past the time limit is StepTimeout."""
    recipe = recipes.get(name)
    run = Run(name, fix=fix.describe() if fix else "")
    lack = setting.device.missing(*recipe.needs)
    if lack:
        run.unsupported, run.regression = f"recipe {name} {lack}", lack.regression
        return run, None
    torch.manual_seed(SEED)  # the same dropout masks and random draws in every run
    model = copy.deepcopy(initial)
    if perturb:
        _perturb(model, perturb)
    precision = Fixed(recipe, setting.device, fix.modules) if fix else recipe.bind(setting.device)
    limit = _Limit(setting.step_limit_s)
    history = History()
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(probes.op_ranges(model)) if watch else None
        watcher = _Watch(run, log, setting.optimizer, limit)
        try:
            with precision, limit.active():
                history = train(
                    model, precision, replay, steps=len(replay.taken), lr=setting.lr,
                    optimizer=setting.optimizer, on_step=watcher, watch_forward=log,
                    adam_eps=fix.adam_eps if fix else None,
                )  # fmt: skip
                if held_out:
                    run.held_out_loss = evaluate(model, precision, held_out, replay.loss)
        except StepTimeout:
            raise
        except (Exception, SystemExit) as exc:  # an op this dtype lacks, ...: a finding
            run.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    run.loss, run.scale, run.skips = history.loss, history.scale, history.skipped
    run.params_finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    if setting.device.type == "cuda" and history.step_time_s[1:]:  # the first step warms up
        run.step_time_s = statistics.median(history.step_time_s[1:])
    gradient = watcher.first_gradient
    if reference_gradient is not None and gradient is not None:
        run.cosine = _cosine(gradient, reference_gradient)
    return run, gradient


def perturbed(initial: nn.Module, replay: Replay, setting: Setting, **options) -> list[Run]:
    """fp32 again, NOISE_RUNS times, its weights multiplied by 1 + k * PERTURBATION * N(0, 1)
    (k = 1, 2, ...): how far fp32 moves from itself, the spread a precision gap must beat."""
    return [
        run_recipe("fp32", initial, replay, setting, watch=False, perturb=PERTURBATION * k,
                   **options)[0]
        for k in range(1, NOISE_RUNS + 1)
    ]  # fmt: skip


def evaluate(model: nn.Module, precision: recipes.Precision, batches: list, loss) -> float:
    """The mean loss over held-out batches in eval mode (BatchNorm on its running statistics),
    as the recipe runs the forward."""
    model.eval()
    try:
        with torch.no_grad(), precision.forward():
            values = [
                float(loss(model(precision.cast_input(x)), y.to(precision.device.torch_device)))
                for x, y in batches
            ]
    finally:
        model.train()
    return statistics.fmean(values)


def _perturb(model: nn.Module, eps: float) -> None:
    generator = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=generator).to(p.device, p.dtype)
            p.mul_(1 + eps * noise)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float | None:
    if a.shape != b.shape or not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return None if a.shape != b.shape else math.nan
    denominator = float(a.norm() * b.norm())
    return float(a @ b) / denominator if denominator > 0 else 0.0
