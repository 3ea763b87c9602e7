"""One recipe trained on the subject's batches and measured, for `amp-harness diagnose`.

Every run starts from the same weights, sees the same batches and draws the same random numbers
(the RNG is seeded before each: dropout masks are then the same in every recipe, so a recipe's
gap to fp32 is precision, not a different mask). The quick look's runs carry the observers: every
op's output range, named by the module running it (harness.lab.probes.op_ranges), the norm layers'
running statistics, the gradients; --verify's long runs measure the loss alone.

fp32's own spread, the noise a gap must beat, is measured as a user's rerun varies: fp32 again
from weights initialised under other seeds (by the factory itself where it takes `seed`, else
`reinitialised`), and, for --verify's held-out loss, on the kept batches in another order
(`reordered`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import signal
import statistics
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from harness.common.errors import HarnessError
from harness.lab import probes, recipes
from harness.lab.autocast import torch_compile
from harness.lab.diagnose import kernels
from harness.lab.diagnose.fixes import Fix, Fixed, loss_in_fp32
from harness.lab.diagnose.observed import REFERENCE, NormState, OpRange, Run
from harness.lab.diagnose.thresholds import COSINE_MIN
from harness.lab.machine.device import DeviceInfo
from harness.lab.train import History, named_optimizer, train

SEED = 0
# fp32's seed spread: one fp32 run per seed (and, in --verify, one per seed on reordered batches).
# Each costs an fp32 run, cheap beside the fp16 recipes' on the CPU (an fp16 step there is 5-13x
# slower than an fp32 one: docs/diagnose.md).
NOISE_SEEDS = (1, 2)
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

    device: DeviceInfo
    lr: float
    optimizer: str
    step_limit_s: float | None  # a step that takes longer is stopped (None: no limit)


def norm_modules(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if n and isinstance(m, NORMS)]


class _Watch:
    """A train(on_step=...) callback: after each step, folds what the observers saw in that step
    into the run; keeps the first step's gradient (the same weights and batch in every run)."""

    def __init__(
        self, run: Run, log: probes.OpRanges | None, optimizer: str, limit: _Limit,
        hooks: list = (),
    ):  # fmt: skip
        self.run, self.log, self.optimizer, self.limit = run, log, optimizer, limit
        self.hooks = list(hooks)  # kernels.record_inputs's: the first step's inputs are enough
        self.step = 0
        self.first_gradient: torch.Tensor | None = None
        self.norms: dict[str, nn.Module] | None = None

    def __call__(self, model: nn.Module, _report) -> None:
        self.step += 1
        self.limit.rearm()
        while self.hooks:
            self.hooks.pop().remove()
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
        # One vector, one read back: a reduction per parameter would synchronise a GPU for each.
        flat = _flat_gradient(model)
        if flat is None:
            return
        if self.step == 1:
            self.first_gradient = flat
        nonzero = flat != 0
        flushed = nonzero & (flat.half() == 0)
        squares = flat * flat
        counts = torch.stack(
            [nonzero.sum().double(), flushed.sum().double(), squares.sum().double(),
             squares[flushed].sum().double(), flat.abs().max().double()]
        )  # fmt: skip
        nonzero_count, flushed_count, whole, lost, largest = counts.tolist()
        self.run.gradient_peaks.append(largest)
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
    reference_gradient: torch.Tensor | None = None,
    held_out: list | None = None,
    backend=None,
    seed: int = SEED,
) -> tuple[Run, torch.Tensor | None]:
    """Train a copy of `initial` on `replay` under the recipe (with `fix` applied; compiled with
    `backend`, a torch.compile backend, where given: `watch` must be off, the observers would
    break the graph), the RNG seeded with `seed` (dropout masks); the run, and its first
    step's gradient. Errors of the recipe are the run's (`run.error`); a step past the time
    limit is StepTimeout."""
    recipe = recipes.get(name)
    run = Run(name, fix=fix.describe() if fix else "")
    lack = setting.device.missing(*recipe.needs)
    if lack:
        run.unsupported, run.regression = f"recipe {name} {lack}", lack.regression
        return run, None
    torch.manual_seed(seed)  # the same dropout masks and random draws in every run of a seed
    if fix is not None and fix.loss_fp32:
        replay = Replay(replay.taken, loss_in_fp32(replay.loss, setting.device.type))
    model = copy.deepcopy(initial)
    if backend is not None:
        model = torch_compile.fresh(model, backend, fullgraph=False)
    precision = Fixed(recipe, setting.device, fix.modules) if fix else recipe.bind(setting.device)
    limit = _Limit(setting.step_limit_s)
    kept = _Kept(setting.optimizer, fix.adam_eps if fix else None)
    history = History()
    dtype = recipe.reduced_dtype
    conv_inputs, hooks = kernels.record_inputs(model) if watch and dtype else ({}, [])
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(probes.op_ranges(model)) if watch else None
        watcher = _Watch(run, log, setting.optimizer, limit, hooks)
        try:
            with precision, limit.active():
                history = train(
                    model, precision, replay, steps=len(replay.taken), lr=setting.lr,
                    optimizer=kept.build, on_step=watcher, watch_forward=log,
                )  # fmt: skip
                if held_out:
                    run.held_out_loss = evaluate(model, precision, held_out, replay.loss)
        except StepTimeout:
            raise
        except (Exception, SystemExit) as exc:  # an op this dtype lacks, ...: a finding
            run.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    for hook in hooks:  # an error in the first step leaves them
        hook.remove()
    if conv_inputs and not run.error:
        skip = fix.modules if fix else ()
        with limit.active():
            run.kernel_faults = kernels.probe(initial, conv_inputs, dtype, skip)
    run.loss, run.scale, run.skips = history.loss, history.scale, history.skipped
    run.params_finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    run.moments_lost = kept.moments_lost()
    if run.params_finite and run.first_nonfinite_loss() and not run.error:
        run.fp32_loss = _fp32_loss(model, setting, held_out or replay.taken[-1:], replay.loss)
    if setting.device.type == "cuda" and history.step_time_s[1:]:  # the first step warms up
        run.step_time_s = statistics.median(history.step_time_s[1:])
    gradient = watcher.first_gradient
    if reference_gradient is not None and gradient is not None:
        run.cosine = _cosine(gradient, reference_gradient)
    if dtype is not None and run.cosine is not None and not math.isfinite(run.cosine):
        # The run's first gradient held inf/NaN (a scaler's 65536 overflowed it: step 1 skipped):
        # its direction is measured again, unscaled, from the same weights, batch and masks.
        with limit.active():
            unscaled = _first_gradient(initial, replay, precision, None)
        if unscaled is not None:
            run.cosine, run.cosine_unscaled = _cosine(unscaled, reference_gradient), True
    if dtype is not None and run.cosine is not None and run.cosine < COSINE_MIN:
        with limit.active():
            run.rounding_cosine = rounding_cosine(initial, replay, setting, dtype)
    return run, gradient


def rounding_cosine(
    initial: nn.Module, replay: Replay, setting: Setting, dtype: torch.dtype
) -> float | None:
    """The cosine of fp32's first gradient with fp32's first gradient from the same weights
    rounded to `dtype` (both computed here alike, on the first batch, the same dropout masks):
    near 1 on most models; near 0 where the direction at these weights is chaotic, so that any
    rounding, and any training step, turns it."""
    fp32 = recipes.get(REFERENCE).bind(setting.device)
    own, rounded = (_first_gradient(initial, replay, fp32, to) for to in (None, dtype))
    return None if own is None or rounded is None else _cosine(own, rounded)


def _first_gradient(
    initial: nn.Module, replay: Replay, fp32: recipes.Precision, rounded_to: torch.dtype | None
) -> torch.Tensor | None:
    """The first batch's gradient from `initial` (its weights rounded to `rounded_to` where
    given) under the precision `fp32` (fp32's, or a recipe's, without its loss scale)."""
    torch.manual_seed(SEED)
    model = fp32.prepare(copy.deepcopy(initial))
    model.train()
    if rounded_to is not None:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(rounded_to).to(p.dtype))
    x, y = replay.taken[0]
    with fp32, fp32.forward():
        replay.loss(model(fp32.cast_input(x)), y.to(fp32.device.torch_device)).backward()
    return _flat_gradient(model)


def _flat_gradient(model: nn.Module) -> torch.Tensor | None:
    """Every parameter's gradient in one float32 vector; None where none has one."""
    grads = [p.grad.detach().float().flatten() for p in model.parameters() if p.grad is not None]
    return torch.cat(grads) if grads else None


class _Kept:
    """The named optimizer, built as train() builds it and kept for a look at its state."""

    def __init__(self, name: str, adam_eps: float | None):
        self.name, self.adam_eps = name, adam_eps
        self.optimizer: torch.optim.Optimizer | None = None

    def build(self, model: nn.Module, lr: float) -> torch.optim.Optimizer:
        self.optimizer = named_optimizer(self.name, model, lr, self.adam_eps)
        return self.optimizer

    def moments_lost(self) -> float:
        """Of AdamW's entries with a first moment, the share whose second moment is exactly 0:
        in fp32 a gradient that reached the first moment reaches the second too (g^2 > 0); in
        fp16 it underflows, and the entry steps by m/eps instead of AdamW's m/sqrt(v)."""
        if not isinstance(self.optimizer, torch.optim.AdamW):
            return 0.0
        counts = []
        for state in self.optimizer.state.values():
            if "exp_avg_sq" in state:
                moving = state["exp_avg"] != 0
                counts.append(
                    torch.stack([moving.sum(), (moving & (state["exp_avg_sq"] == 0)).sum()])
                )
        if not counts:
            return 0.0
        # One read back: a count per parameter would synchronise a GPU for each.
        live, lost = torch.stack(counts).sum(0).tolist()
        return lost / live if live else 0.0


# Weights drawn afresh under a seed, and a note on how (harness.lab.diagnose's factory_seeds,
# or `reinitialised`).
Redraw = Callable[[int], tuple[nn.Module, str]]


def redrawer(initial: nn.Module, redraw: Redraw | None) -> Redraw:
    """`redraw`, or where it is None, `initial` re-initialised under each seed."""
    return redraw or functools.partial(reinitialised, initial)


def seed_spread(
    initial: nn.Module, replay: Replay, setting: Setting, *, redraw: Redraw | None = None,
    reorder: bool = False, **options,
) -> tuple[list[Run], str]:  # fmt: skip
    """fp32 again from weights drawn under each of NOISE_SEEDS by `redraw` (`initial`
    re-initialised where it is None) and, with `reorder`, on the batches in another order: how
    far a rerun of fp32 lands from fp32, the spread a precision gap must beat; and the note of
    how the weights were drawn, where it has one."""
    draw, runs, notes = redrawer(initial, redraw), [], set()
    for seed in NOISE_SEEDS:
        model, note = draw(seed)
        notes.add(note)
        runs.append(run_recipe("fp32", model, replay, setting, watch=False, **options)[0])
        if reorder:
            runs.append(
                run_recipe("fp32", initial, reordered(replay, seed), setting, watch=False,
                           **options)[0]
            )  # fmt: skip
    return runs, next(iter(notes - {""}), "")


def reinitialised(initial: nn.Module, seed: int) -> tuple[nn.Module, str]:
    """A copy of `initial` whose weights are re-drawn under `seed`: each module's
    reset_parameters(), then each tensor brought to the factory's own mean and standard deviation
    (a factory's init, std 0.02 for a transformer, is not torch's default); the tensors no
    reset_parameters() covers have their entries shuffled instead, and the note names them."""
    model = copy.deepcopy(initial)
    generator = torch.Generator().manual_seed(seed)
    covered: set[int] = set()
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        for module in model.modules():
            if callable(getattr(module, "reset_parameters", None)):
                module.reset_parameters()
                covered.update(id(p) for p in module.parameters(recurse=False))
        uncovered = []
        for (name, new), old in zip(model.named_parameters(), initial.parameters(), strict=True):
            if id(new) in covered:
                _match(new, old)
            else:
                uncovered.append(name)
                flat = old.detach().flatten()
                new.copy_(flat[torch.randperm(flat.numel(), generator=generator)].view_as(new))
    if not uncovered:
        return model, ""
    return model, (
        f"fp32's seed spread: {len(uncovered)} parameter tensor(s) no reset_parameters() covers "
        f"({', '.join(uncovered[:4])}{' ...' if len(uncovered) > 4 else ''}) were re-drawn by "
        "shuffling their entries, which loses any structure the factory gave them (a factory "
        "that takes `seed` is called again instead)"
    )


def _match(new: torch.Tensor, old: torch.Tensor) -> None:
    """`new` moved to `old`'s mean and standard deviation (a constant `old`, a bias of zeros or a
    norm's ones, is kept as it is: there is nothing to re-draw)."""
    if old.numel() < 2 or float(old.std()) == 0.0:
        new.copy_(old)
        return
    spread = new.std()
    centred = new - new.mean()
    new.copy_(centred / spread * old.std() + old.mean() if float(spread) > 0 else old)


def reordered(replay: Replay, seed: int) -> Replay:
    """The kept batches in another order, drawn from `seed`."""
    order = torch.randperm(len(replay.taken), generator=torch.Generator().manual_seed(seed))
    return Replay([replay.taken[i] for i in order.tolist()], replay.loss)


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


def _fp32_loss(model: nn.Module, setting: Setting, batches: list, loss) -> float | None:
    """The loss of the trained weights recomputed in fp32 (the model is done with: cast in place);
    None where it cannot be (a `half` fix's module casts its output back to fp16 for the next)."""
    fp32 = recipes.get("fp32").bind(setting.device)
    try:
        return evaluate(model.float(), fp32, batches, loss)
    except RuntimeError:  # a dtype mismatch: the weights' fp32 loss stays unknown
        return None


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float | None:
    if a.shape != b.shape or not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return None if a.shape != b.shape else math.nan
    denominator = float(a.norm() * b.norm())
    return float(a @ b) / denominator if denominator > 0 else 0.0
