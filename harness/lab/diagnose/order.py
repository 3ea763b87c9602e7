"""The run order of `amp-harness diagnose`, top to bottom: `diagnose()` loads the factory and
checks what it returned, keeps the batches every recipe sees, runs fp32 first (the reference,
and its seed spread), then each recipe, judged (harness.lab.diagnose.rules); re-runs each
remedy the rules recommend; then, asked for, each recipe compiled against eager (`compiled`)
and the long runs of --verify (`verify`). harness.lab.diagnose re-exports its public names.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import math
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._pytree import tree_map

from harness.common.errors import HarnessError
from harness.lab import recipes
from harness.lab.diagnose import compiled as compiled_runs  # --compile's runs
from harness.lab.diagnose import settled
from harness.lab.diagnose import verify as truth  # the long runs of --verify
from harness.lab.diagnose.curves import end_gap, forecasts
from harness.lab.diagnose.fixes import Fix
from harness.lab.diagnose.observed import REFERENCE, Diagnosis, FixCheck, Run
from harness.lab.diagnose.rules import (
    KEEP_IN_FP32,
    LOSES_PRECISION,
    NEEDS_SCALING,
    OPTIMIZER_IN_FP16,
    OVERFLOWS_AHEAD,
    OVERFLOWS_WITHIN_NOISE,
    REFERENCE_STATUS,
    SAFE,
    judge,
)
from harness.lab.diagnose.runs import Redraw, Replay, Setting, StepTimeout, run_recipe, seed_spread
from harness.lab.diagnose.thresholds import HORIZON
from harness.lab.machine.device import DeviceInfo, probe

RECIPES = ("fp32", "amp-fp16", "amp-fp16-noscaler", "amp-bf16", "half")
# The batches diagnose keeps (the same ones feed every recipe) may take this much memory.
MAX_KEPT_BYTES = 2 * 1024**3
# The model's copy and the model itself, run once on the first batch in fp32 (eval mode), must
# give the same loss within this relative gap: the same computation differs by rounding alone
# (1e-7), a hook or closure that still feeds the original model by far more.
COPY_TOLERANCE = 1e-4
# What a recipe's status is fixed by, when the fix is another recipe the diagnosis ran.
ALTERNATIVES = {
    KEEP_IN_FP32: "amp-bf16",
    NEEDS_SCALING: "amp-fp16",
    OPTIMIZER_IN_FP16: "amp-fp16",
    LOSES_PRECISION: "amp-fp16",
    OVERFLOWS_AHEAD: "amp-bf16",
    OVERFLOWS_WITHIN_NOISE: "amp-bf16",
}
# The code that switches a training loop to a recipe named as a fix, and where it goes.
RECIPE_CODE = {
    "amp-bf16": [
        "# in the training step: the forward and the loss under bf16 autocast, no scaler",
        "with torch.autocast({device!r}, dtype=torch.bfloat16):",
        "    loss = loss_fn(model(x), y)",
        "loss.backward(); optimizer.step()",
    ],
    "amp-fp16": [
        "# beside the optimizer: scaler = torch.amp.GradScaler({device!r}); in the training step:",
        "with torch.autocast({device!r}, dtype=torch.float16):",
        "    loss = loss_fn(model(x), y)",
        "scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()",
    ],
}


class DiagnoseError(HarnessError):
    pass


@dataclass
class Subject:
    model: nn.Module
    batches: Iterable
    loss: Callable


# --- the run order --------------------------------------------------------------------------------


def diagnose(
    make: Callable[[], object] | Subject | str,
    device: DeviceInfo | str = "cpu",
    steps: int = 8,
    lr: float = 1e-3,
    optimizer: str = "adamw",
    names: Iterable[str] = RECIPES,
    horizon: int = HORIZON,
    verify: int = 0,
    seeds: int = 1,
    step_limit_s: float | None = None,
    compile_backend=None,
) -> Diagnosis:
    """Train `steps` steps of the subject under each recipe (fp32 first) and judge each; with
    `verify`, train that many steps more under each recipe and each fix, and say whether the
    judgement held (each recipe from `seeds` initialisations, judged paired, where `seeds` > 1);
    with `compile_backend` (a torch.compile backend: "inductor", "aot_eager",
    or a callable), run each recipe again compiled and hold it against its eager run.

    `make`: the factory (or its "module:function" name, or a Subject). Errors of the subject
    (it does not load, breaks the protocol, holds no data to train, or fails its first fp32
    step) name the factory."""
    spec = make if isinstance(make, str) else getattr(make, "__qualname__", "subject")
    if steps < 2:
        raise DiagnoseError(f"--steps {steps}: diagnose needs at least 2 steps")
    if verify and verify < steps:
        raise DiagnoseError(f"--verify {verify}: at least --steps ({steps}) steps")
    if seeds != 1 and not verify:
        raise DiagnoseError(f"--seeds {seeds}: the seeds are --verify's; give --verify N too")
    if seeds != 1 and not truth.PAIRED_MIN_SEEDS <= seeds <= truth.PAIRED_MAX_SEEDS:
        why = (
            f"a paired test over fewer than {truth.PAIRED_MIN_SEEDS} seeds can never reach p < "
            f"{truth.ALPHA} (all {truth.PAIRED_MIN_SEEDS - 1} gaps on one side is p = "
            f"2/{2 ** (truth.PAIRED_MIN_SEEDS - 1)})"
            if seeds < truth.PAIRED_MIN_SEEDS
            else f"its exact test would weigh 2**{seeds} sign patterns for each gap it judges"
        )
        raise DiagnoseError(
            f"--seeds {seeds}: {why}; give {truth.PAIRED_MIN_SEEDS} to {truth.PAIRED_MAX_SEEDS}, "
            "or leave --seeds out for one run per recipe against fp32's seed spread"
        )
    names = [REFERENCE, *(n for n in names if n != REFERENCE)]
    for name in names:
        recipes.get(name)  # an unknown recipe is an error before anything runs
    factory = load(make) if isinstance(make, str) else make
    found = _subject(spec, factory)
    _check_trainable(spec, found.model)
    info = probe(device) if isinstance(device, str) else device
    if compile_backend == "inductor":
        lack = info.missing("inductor_compile")
        if lack:
            raise DiagnoseError(f"--compile inductor: {lack.reason} (--compile aot_eager needs "
                                "no compiler)")  # fmt: skip
    count = max(steps, verify) + (truth.HELD_OUT if verify else 0)
    taken = _take(spec, found.batches, count)
    quick = Replay(taken[:steps], found.loss)
    setting = Setting(info, lr, optimizer, step_limit_s)
    initial = _fp32_copy(spec, found.model)
    redraw = factory_seeds(spec, factory, initial)
    try:
        diagnosis = _quick_look(spec, found.model, initial, quick, setting, names, horizon, redraw)
        if compile_backend is not None:
            diagnosis.compiled = compiled_runs.compare(
                diagnosis, initial, quick, setting, compile_backend
            )
        if verify:
            diagnosis.verify = truth.verify(
                diagnosis, initial, Replay(taken[:verify], found.loss), taken[verify:], setting,
                {name: _fix(run) for name, run in diagnosis.runs.items() if _fix(run)}, redraw,
                seeds,
            )  # fmt: skip
    except StepTimeout as exc:
        raise DiagnoseError(f"factory {spec!r}: {exc}") from exc
    return diagnosis


# --- 1. the factory and what it returned ----------------------------------------------------------


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


def _subject(spec: str, factory, **arguments) -> Subject:
    if isinstance(factory, Subject):
        return factory
    try:
        made = factory(**arguments)
    except (Exception, SystemExit) as exc:  # a factory's sys.exit() is its error, not ours
        called = f" with {arguments}" if arguments else ""
        raise DiagnoseError(f"factory {spec!r} raised {type(exc).__name__}{called}: {exc}") from exc
    return subject(spec, made)


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
            "harness.lab.diagnose.Subject, a (model, batches, loss) tuple or a dict with those keys"
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


def _check_trainable(spec: str, model: nn.Module) -> None:
    """A model diagnose can train: parameters that hold data (none on the meta device, none a
    Lazy module's yet to be shaped), some of them to train. Each problem is one line naming the
    factory and the fix (a meta or lazy model was a traceback from inside the first step)."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    lazy = [name for name, tensor in tensors if nn.parameter.is_lazy(tensor)]
    if lazy:
        raise DiagnoseError(
            f"factory {spec!r}: its model's parameters are not initialised yet ({_some(lazy)}: "
            "a Lazy module's, shaped by its first forward): they hold no data. Fix: run one "
            "forward on a batch before returning the model, or build the layers with their "
            "sizes (nn.Linear for nn.LazyLinear)"
        )
    meta = [name for name, tensor in tensors if tensor.is_meta]
    if meta:
        raise DiagnoseError(
            f"factory {spec!r}: its model has tensors on the meta device ({_some(meta)}: "
            f"{len(meta)} of its {len(tensors)} parameters and buffers): shapes without data, "
            "nothing to train. Fix: materialise the model before returning it, model.to_empty("
            'device="cpu") then initialise it (each module\'s reset_parameters(), or '
            "load_state_dict with real weights), or build it on the CPU"
        )
    parameters = list(model.parameters())
    if not parameters:
        raise DiagnoseError(
            f"factory {spec!r}: its model ({type(model).__name__}) has no parameters: nothing to "
            "train, so no recipe can be judged. Fix: return the model whose parameters you train"
        )
    if not any(parameter.requires_grad for parameter in parameters):
        raise DiagnoseError(
            f"factory {spec!r}: none of its model's {len(parameters)} parameters requires a "
            "gradient (requires_grad=False): nothing would train. Fix: unfreeze what you train, "
            "model.requires_grad_(True) or the layers you fine-tune"
        )


def _some(names: list[str], shown: int = 4) -> str:
    """The first `shown` names, and how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _take(spec: str, batches: Iterable, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`count` batches, kept (every recipe sees the same ones); more than MAX_KEPT_BYTES of them
    is an error before they are taken."""
    taken = []
    for batch in batches:
        if not (isinstance(batch, tuple | list) and len(batch) == 2):
            raise DiagnoseError(
                f"factory {spec!r}: batch {len(taken)} is a {type(batch).__name__}, not an "
                "(inputs, targets) pair"
            )
        if any(isinstance(t, torch.Tensor) and t.is_meta for t in batch):
            raise DiagnoseError(
                f"factory {spec!r}: batch {len(taken)} holds tensors on the meta device: shapes "
                "without data. Fix: give batches of real tensors, on the CPU or the device "
                "diagnosed"
            )
        taken.append(tuple(batch))
        if len(taken) == 1:
            size = sum(t.nbytes for t in batch if isinstance(t, torch.Tensor))
            if size * count > MAX_KEPT_BYTES:
                raise DiagnoseError(
                    f"factory {spec!r}: {count} batches of {size:,} bytes would keep "
                    f"{size * count / 1024**3:.1f} GiB in memory (at most "
                    f"{MAX_KEPT_BYTES / 1024**3:g} GiB): lower --steps / --verify"
                )
        if len(taken) == count:
            return taken
    raise DiagnoseError(
        f"factory {spec!r}: its batches gave {len(taken)}, diagnose needs {count} "
        "(--steps, or --verify and its held-out batches)"
    )


def _fp32_copy(spec: str, model: nn.Module) -> nn.Module:
    try:
        return copy.deepcopy(model).float()
    except Exception as exc:
        raise DiagnoseError(f"factory {spec!r}: its model cannot be copied: {exc}") from exc


def factory_seeds(spec: str, factory, initial: nn.Module) -> Redraw | None:
    """fp32's seed spread drawn by the factory itself, where it takes `seed`: its own
    initialisation under another seed is what a user's rerun varies, structure and all (weights
    re-drawn by the harness lose what the factory did to them: attention columns scaled by 300
    came out shuffled among the others, and fp32's spread was ten times its reruns'). Only the
    model is taken: every run sees the batches kept from the first call. None where the factory
    has no `seed`."""
    try:
        takes_seed = "seed" in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a Subject, or a callable whose signature is hidden
        takes_seed = False
    if not takes_seed:
        return None
    shapes = [p.shape for p in initial.parameters()]

    def redraw(seed: int) -> tuple[nn.Module, str]:
        with torch.random.fork_rng():  # the factory's torch.manual_seed is its own
            model = _fp32_copy(spec, _subject(spec, factory, seed=seed).model)
        if [p.shape for p in model.parameters()] != shapes:
            raise DiagnoseError(
                f"factory {spec!r}: called with seed={seed}, it returned a model of other "
                "parameter shapes than its first; diagnose re-calls it for fp32's seed spread. "
                "Fix: let `seed` change the initial weights only"
            )
        return model, "fp32's seed spread: the factory's own initialisation under other seeds"

    return redraw


# --- 2. the quick look: fp32, then each recipe, judged --------------------------------------------


def _quick_look(
    spec: str, model: nn.Module, initial: nn.Module, quick: Replay, setting: Setting,
    names: list[str], horizon: int, redraw: Redraw | None,
) -> Diagnosis:  # fmt: skip
    reference, gradient = run_recipe(REFERENCE, initial, quick, setting)
    if reference.error:
        raise DiagnoseError(
            f"factory {spec!r}: its first training step failed under fp32: {reference.error}"
        )
    _check_copy(spec, model, initial, quick.taken[0], quick.loss)
    reference.forecasts = forecasts(reference, horizon)
    reference.forecast = next(iter(reference.forecasts), None)
    spread, noise_note = seed_spread(initial, quick, setting, redraw=redraw)
    noise = max(end_gap(run.loss, reference.loss) for run in spread)
    runs = {REFERENCE: reference}
    for name in names[1:]:
        runs[name] = run_recipe(name, initial, quick, setting, reference_gradient=gradient)[0]
    diagnosis = Diagnosis(
        spec, setting.device.name, torch.__version__, len(quick.taken), runs,
        optimizer=setting.optimizer, lr=setting.lr, horizon=horizon, noise=noise,
        noise_note=noise_note, device_type=setting.device.type,
    )  # fmt: skip
    for run in runs.values():
        judge(run, diagnosis)
    for run in runs.values():
        run.fixes = _try_fixes(run, diagnosis, initial, quick, setting, gradient)
    return diagnosis


def _check_copy(
    spec: str, model: nn.Module, copied: nn.Module, batch: tuple, loss: Callable
) -> None:
    """diagnose trains deep copies of the model: a forward hook or closure that refers to the
    original keeps acting on the original, and the copies silently train another model (an
    activation penalty gathered by such a hook vanished from every recipe). Both run once on the
    first batch in fp32; a different loss is an error naming the cause."""
    if any(p.dtype != torch.float32 for p in model.parameters()):
        return  # the copy is cast to fp32: rounding would differ, the check says nothing
    device = next(model.parameters()).device
    x, y = tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, batch)
    losses = []
    for candidate in (copied, model):
        mode = candidate.training
        candidate.eval()  # no dropout draw, no running statistics moved
        try:
            with torch.no_grad():
                losses.append(float(loss(candidate(x), y)))
        finally:
            candidate.train(mode)
    ours, theirs = losses
    if not math.isfinite(ours - theirs):  # a loss fp32 cannot compute: the rules say so
        return
    if abs(ours - theirs) <= COPY_TOLERANCE * max(abs(theirs), 1e-12):
        return
    hooked = [
        name or type(model).__name__
        for name, m in model.named_modules()
        if m._forward_hooks or m._forward_pre_hooks
    ]
    raise DiagnoseError(
        f"factory {spec!r}: a deep copy of its model gives another loss than the model itself on "
        f"the first batch ({ours:.6g} against {theirs:.6g}, fp32, eval mode): diagnose trains "
        "deep copies, and a forward hook or closure that refers to the original model keeps "
        "acting on the original"
        + (f" (forward hooks on: {_some(hooked)})" if hooked else "")
        + ". Fix: let hooks keep what they gather on the module they are called with "
        "(hook(module, inputs, output): module.acts = output), or compute it in forward()"
    )


# --- 3. the fixes, re-run -------------------------------------------------------------------------


def _try_fixes(
    run: Run, diagnosis: Diagnosis, initial: nn.Module, quick: Replay, setting: Setting,
    gradient: torch.Tensor | None,
) -> list[FixCheck]:  # fmt: skip
    """Each recommendation, tried over the same steps: the fix applied to this recipe, judged
    against fp32 with the same optimizer change (the fix's own effect is not fp16's), and the
    other recipe it names, whose own run says whether it would do."""
    checks = []
    fix = _fix(run)
    if fix is not None:
        fixed, _ = run_recipe(
            run.recipe, initial, quick, setting, fix=fix, reference_gradient=gradient
        )
        against = fix_reference(fix, diagnosis, initial, quick, setting)
        judge(fixed, against)
        # What the few steps cannot tell from harm (docs/diagnose.md, "not settled").
        why = settled.unsettled(fixed, against.runs[REFERENCE])
        checks.append(
            FixCheck(
                fix.describe(), fixed.status, fixed.reasons, fixed.status == SAFE,
                against.runs[REFERENCE].fix or REFERENCE, fix.code(setting.device.type),
                settled=not why, unsettled=why,
            )
        )  # fmt: skip
    for status, other in ALTERNATIVES.items():
        if run.status == status and other in diagnosis.runs and other != run.recipe:
            alternative = diagnosis.runs[other]
            code = [line.format(device=setting.device.type) for line in RECIPE_CODE[other]]
            checks.append(
                FixCheck(
                    f"use {other}", alternative.status, alternative.reasons,
                    alternative.status == SAFE, code=code,
                )
            )  # fmt: skip
    return checks


def _fix(run: Run) -> Fix | None:
    """The fix the rules recommend for the run, when it changes the run itself."""
    if not (run.keep_fp32 or run.adam_eps or run.loss_fp32):
        return None
    named = list(dict.fromkeys(run.keep_fp32))
    # A module inside another kept in fp32 is in fp32 already (and wrapping both would cast
    # the inner one's output back to a half model's dtype in the middle of the outer one).
    outermost = [m for m in named if not any(m.startswith(f"{o}.") for o in named)]
    return Fix(run.recipe, tuple(outermost), run.adam_eps, run.loss_fp32)


def fix_reference(
    fix: Fix, diagnosis: Diagnosis, initial: nn.Module, replay: Replay, setting: Setting
) -> Diagnosis:
    """The diagnosis a fixed run is judged in: as it is, or, for a fix that changes the optimizer
    (AdamW's eps), with fp32's losses those of fp32 under the same change."""
    if fix.adam_eps is None:
        return diagnosis
    changed, _ = run_recipe(
        REFERENCE, initial, replay, setting, fix=Fix(REFERENCE, adam_eps=fix.adam_eps), watch=False
    )
    reference = dataclasses.replace(
        diagnosis.runs[REFERENCE], loss=changed.loss, fix=changed.fix, status=REFERENCE_STATUS
    )
    return dataclasses.replace(diagnosis, runs={**diagnosis.runs, REFERENCE: reference})
