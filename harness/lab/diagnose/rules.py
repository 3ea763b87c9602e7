"""What `amp-harness diagnose` measured, and the rules that judge it (docs/diagnose.md lists
each rule with the measurement behind it).

A recipe is called **safe** only when every rule had evidence to check and none fired: every
loss finite, no skip recurring at a scale the scaler had settled on (its back-offs from its
initial scale are calibration, wherever they fall), the scale not collapsed, no op that
fp16 computes within reach of 65504 (now, or at the measured growth within the horizon), a first
gradient that points where fp32's does, and a loss within fp32's own spread. Each other status
names what breaks and the fix, and the fix is tried (harness.lab.diagnose.fixes) before it is shown.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

import torch

from harness.lab import recipes
from harness.lab.autocast import docs as autocast_docs
from harness.lab.diagnose.fixes import FP16_SAFE_EPS

REFERENCE = "fp32"
FP16_MAX = torch.finfo(torch.float16).max  # 65504
# An op whose fp32 peak comes within this factor of 65504 is flagged: activations grow as
# training goes on, and a few steps see only its start (t5 with its feed-forward 3x below
# 65504 overflowed at step 426 of 1000: docs/diagnose.md).
HEADROOM_FACTOR = 8.0
# The forecast looks this many steps ahead (--horizon).
HORIZON = 1000
# Fp16 without loss scaling is flagged when, at the last step, more than this share of the
# gradient would be lost to fp16's underflow: of the non-zero entries under AdamW (its update
# is scale-free per entry), of the squared norm under SGD (a tiny gradient is a tiny update).
UNDERFLOW_MAX = 0.01
# ...unless the share stays under UNDERFLOW_SEVERE and the recipe's first gradient keeps fp32's
# direction (cosine at least COSINE_KEPT): a BatchNorm CNN flushes 6% of its entries, all tiny,
# and trains as fp32 does over 300 steps; a loss x1e-6 flushes 100% and learns nothing.
UNDERFLOW_SEVERE = 0.25
COSINE_KEPT = 0.99
# A recipe whose first gradient (same weights, same batch as fp32's) has a cosine under this
# with fp32's has lost the gradient's direction to precision (attention logits of 1e5 in bf16:
# cosine 0.01, and the model never learns).
COSINE_MIN = 0.5
# Drift, at the end of the window (its last quarter, at least 2 steps), either way (better or
# worse): a finding only beyond each of: DRIFT_MAX of fp32's loss, NOISE_FACTOR times fp32's own
# seed spread (fp32 re-run from weights initialised under other seeds: what a user's rerun
# varies, harness.lab.diagnose.runs.seed_spread), and LOSS_FLOOR times fp32's first loss (a
# floor in the loss's own units: a relative gap to a loss near zero means nothing).
DRIFT_MAX = 0.05
NOISE_FACTOR = 2.0
LOSS_FLOOR = 1e-3
# A half model's AdamW whose fp16 second moments are 0 on more than this share of the entries
# that have a first moment is flagged (those entries step by m/eps). Set between the zoo's
# largest share that trained as fp32 over 150 steps (bn_raw with eps 1e-4: 10.6% at step 8;
# healthy 0.2%, mlp_mse 5.0%) and its smallest that did not (attn_hot: 29.2%; gpt2, llama,
# bert, t5: 69-84%): docs/diagnose-zoo-table.md. 13 models: a calibration, not a law.
MOMENTS_LOST_MAX = 0.2
# The GradScaler's scale falling under 1 means fp16's gradients overflow before any scaling.
SCALE_FLOOR = 1.0
# GradScaler starts at 65536, a guess, and halves on each overflow until the gradients fit: those
# back-offs are calibration wherever they fall (an 8-16-1 MLP backs off at steps 4 and 5 and
# trains as fp32). Once it has taken a step at a backed-off scale it has settled; a skip at or
# below a settled scale recurs. One recurrence is one more halving, as calibration does (its
# growth_interval, 2000, keeps the scale from growing back in a short window), so recurrences are
# a finding from RECURRENT_MIN of them, on more than RECURRENT_SHARE of the steps since it
# settled: at one in 8 the scale halves every 8 steps and leaves 65536 for under 1 (16
# halvings) within about 128 steps.
RECURRENT_MIN = 2
RECURRENT_SHARE = 1 / 8

# Statuses, the most severe first: a recipe gets the first that applies, and every reason.
REGRESSION = "capability regression"
FAILS = "fails"
NOT_JUDGED = "not judged"
KEEP_IN_FP32 = "keep layers in fp32 or use bf16"
OPTIMIZER_IN_FP16 = "keep the optimizer state in fp32"
NEEDS_SCALING = "needs loss scaling"
NORMS_IN_FP32 = "keep norm layers in fp32"
LOSES_PRECISION = "loses precision"
UNSTABLE = "unstable"
DRIFTS = "drifts"
SAFE = "safe"
STATUSES = (
    REGRESSION, FAILS, NOT_JUDGED, KEEP_IN_FP32, OPTIMIZER_IN_FP16, NEEDS_SCALING, NORMS_IN_FP32,
    LOSES_PRECISION, UNSTABLE, DRIFTS, SAFE,
)  # fmt: skip
NOT_RUN, REFERENCE_STATUS = "not run", "reference"  # a recipe the device lacks; fp32 itself
# The statuses a diagnosis can end with that are no judgement of the model: the command exits 1.
BROKEN = (REGRESSION, NOT_JUDGED)


@dataclass
class OpRange:
    """One op, named `module:op`, under one recipe, over the steps."""

    dtype: str  # of its output
    peak: float = 0.0  # largest |output| (inf when an output held inf or NaN)
    input_peak: float = 0.0  # largest |input| it was given (measured in fp32's run)
    nonfinite: int = 0  # calls whose output held inf or NaN
    peaks: list[float] = field(default_factory=list)  # per step


@dataclass
class NormState:
    """A norm layer's running statistics (BatchNorm's mean and variance) under one recipe."""

    kind: str
    half: bool  # its parameters or running statistics are 16-bit
    stat_peak: float = 0.0  # largest finite |running statistic|
    stat_nonfinite: int = 0  # inf/NaN entries in its running statistics at the last step


@dataclass
class FixCheck:
    """A recommended fix, tried over the quick look's steps."""

    fix: str  # as harness.lab.diagnose.fixes.Fix.describe() says it
    status: str  # what the rules say of the fixed run
    reasons: list[str]
    held: bool  # the fixed run is safe: nothing the rules look for is left
    reference: str = REFERENCE  # what it was judged against: fp32 with the fix's optimizer change


@dataclass
class Forecast:
    """A straight line through an op's per-step peaks, extended to fp16's 65504."""

    op: str
    peak: float  # at the last step
    growth: float  # per step
    step: int  # where the line reaches 65504


@dataclass
class Run:
    """What one recipe did on the subject."""

    recipe: str
    unsupported: str = ""  # why the device does not run it ("" when it ran)
    regression: bool = False  # ...and this build and hardware should run it
    error: str = ""  # what it raised, if it did not get through its steps
    fix: str = ""  # the fix this run tried ("" for a recipe's own run)
    loss: list[float] = field(default_factory=list)
    scale: list[float] = field(default_factory=list)
    skips: list[bool] = field(default_factory=list)
    step_time_s: float | None = None  # median, CUDA only
    ops: dict[str, OpRange] = field(default_factory=dict)  # in the order they first ran
    norms: dict[str, NormState] = field(default_factory=dict)
    underflow: float = 0.0  # at the last step: the gradient share fp16 would flush (see above)
    underflow_steps: list[float] = field(default_factory=list)
    zero_gradients: float = 0.0  # largest fraction of gradient entries exactly 0
    # AdamW, after the last step: of the entries with a first moment, the share whose second
    # moment is exactly 0 (fp16 state: g^2 underflowed; such an entry steps by m/eps).
    moments_lost: float = 0.0
    cosine: float | None = None  # of its first gradient with fp32's
    # Where `cosine` is under COSINE_MIN: fp32's own first gradient against itself with the
    # weights rounded to this run's 16-bit dtype. Low too, the direction is chaotic at these
    # weights (softmax saturated by logits of 1e5) and the cosine says nothing of precision.
    rounding_cosine: float | None = None
    drift: float = 0.0  # end-window |loss - fp32 loss| / |fp32 loss|
    drift_abs: float = 0.0  # the same gap in the loss's units
    speedup: float | None = None  # fp32's median step time over this recipe's (CUDA)
    params_finite: bool = True  # after the last step
    # Convolutions whose backward in the recipe's dtype returned inf/NaN from finite inputs
    # where fp32's is finite (harness.lab.diagnose.kernels): "module (its shape): k of n passes".
    kernel_faults: list[str] = field(default_factory=list)
    held_out_loss: float | None = None  # --verify: in eval mode, on batches never trained on
    # The loss recomputed in fp32 on the final weights (held-out batches with --verify, else the
    # last batch trained on), when a logged loss was non-finite: did the training or the value go?
    fp32_loss: float | None = None
    # The first op, in the order ops ran, whose output held inf/NaN, and the step (from 1).
    first_nonfinite: tuple[int, str] | None = None
    forecast: Forecast | None = None  # fp32 only: the first op the growth takes to 65504
    # The recommended fix, as the rules found it: modules to keep in fp32, AdamW's epsilon.
    keep_fp32: list[str] = field(default_factory=list)
    adam_eps: float | None = None
    status: str = ""
    findings: list[str] = field(default_factory=list)  # every status whose rule fired
    reasons: list[str] = field(default_factory=list)
    fixes: list[FixCheck] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        return sum(self.skips)

    def first_nonfinite_loss(self) -> int | None:
        return next((i for i, v in enumerate(self.loss, 1) if not math.isfinite(v)), None)

    def scaler_stalled(self) -> bool:
        """The scaler took at most half the steps, or its scale fell under SCALE_FLOOR."""
        taken = len(self.skips) - self.skipped
        return bool(self.skips) and (taken * 2 <= len(self.skips) or self.scale[-1] < SCALE_FLOOR)

    def scaler_course(self) -> ScalerCourse:
        return scaler_course(self.skips, self.scale)

    def logged_loss_overflow(self) -> bool:
        """Logged losses non-finite while the weights trained (a scaler that skips the steps
        leaves them finite and untrained), stayed finite, and give a finite loss recomputed in
        fp32: the value reported overflowed fp16, not the training."""
        return (
            self.first_nonfinite_loss() is not None
            and not self.scaler_stalled()
            and self.params_finite
            and self.fp32_loss is not None
            and math.isfinite(self.fp32_loss)
        )


@dataclass
class ScalerCourse:
    """What a GradScaler's skips were (steps from 1): calibration, or recurrences at a scale it
    had settled on (RECURRENT_MIN above)."""

    calibration: list[int] = field(default_factory=list)
    recurrent: list[int] = field(default_factory=list)
    settled: float | None = None  # the first backed-off scale it took a step at
    settled_at: int | None = None  # ...and that step

    def recurs(self, steps: int) -> bool:
        """Recurrences beyond what one more halving of calibration explains."""
        since = steps - (self.settled_at or steps) + 1
        return (
            len(self.recurrent) >= RECURRENT_MIN and len(self.recurrent) > RECURRENT_SHARE * since
        )


def scaler_course(skips: list[bool], scale: list[float]) -> ScalerCourse:
    """Each skip, as calibration (a back-off from a scale not yet shown to hold: the initial
    guess, or one it never stepped at) or a recurrence (at or below a scale it had settled on)."""
    course = ScalerCourse()
    for step, (skipped, used) in enumerate(zip(skips, scale, strict=True), 1):
        if skipped:
            settled = course.settled is not None and used <= course.settled
            (course.recurrent if settled else course.calibration).append(step)
        elif used < scale[0] and course.settled is None:
            course.settled, course.settled_at = used, step
    return course


@dataclass
class Diagnosis:
    factory: str
    device: str  # "cpu" or the GPU's name
    torch: str
    steps: int
    runs: dict[str, Run]
    optimizer: str = "adamw"
    lr: float = 1e-3
    horizon: int = HORIZON
    noise: float = 0.0  # fp32's own seed spread: its largest end-window gap, in the loss's units
    noise_note: str = ""  # how the seed spread was measured, when not every weight was re-drawn
    device_type: str = "cpu"
    verify: dict | None = None  # harness.lab.diagnose.verify's result, with --verify N
    compiled: dict | None = None  # harness.lab.diagnose.compiled's result, with --compile

    def hot_ops(self) -> list[str]:
        """Ops whose fp32 peak is within HEADROOM_FACTOR of fp16's largest value."""
        return [
            k for k, x in self.runs[REFERENCE].ops.items() if x.peak * HEADROOM_FACTOR >= FP16_MAX
        ]

    def sources(self, keys: list[str]) -> list[str]:
        """Of these hot ops, those that make the large values (an input under the threshold):
        the ops after them (a residual add, a dropout) only carry them on."""
        ops = self.runs[REFERENCE].ops
        made = [k for k in keys if ops[k].input_peak * HEADROOM_FACTOR < FP16_MAX]
        return made or keys[:1]

    def as_dict(self) -> dict:
        return asdict(self)


def module_of(op: str) -> str:
    return op.rpartition(":")[0]


# --- the autocast policy a judgement was measured under -----------------------------------------


def autocast_policy(device_type: str, version: str) -> str:
    """Whose autocast op lists the runs followed, as the documentation of the release says."""
    documented = autocast_docs.documented(device_type, version)
    note = f"; {documented.note}" if documented.note else ""
    return (
        f"measured under {device_type.upper()} autocast's op lists (torch {documented.release}'s "
        f"documentation){note}"
    )


def other_device_note(op: str, device_type: str, version: str) -> str:
    """Where the other device's autocast documents `op` in float32: its hazard is this device's."""
    other = "cuda" if device_type == "cpu" else "cpu"
    name = op.rpartition(":")[2]
    documented = autocast_docs.documented(other, version)
    spellings = {name, name.lstrip("_"), name.removeprefix("native_")}  # aten's _softmax, ...
    if not any(autocast_docs.listed(n, documented, other) == "float32" for n in spellings):
        return ""
    return (
        f"on {other.upper()}, autocast runs {name.lstrip('_')} in float32 (torch "
        f"{documented.release}'s documented lists): this hazard is the {device_type.upper()}'s"
    )


# --- the measurements the rules read ----------------------------------------------------------


def window(values: list[float]) -> list[float]:
    """The end of a loss curve the drift is judged on: its last quarter, at least 2 steps."""
    return values[-max(2, len(values) // 4) :]


def end_gap(run: list[float], reference: list[float]) -> float:
    """Mean |loss - reference loss| over the end window (inf when a loss there is not finite)."""
    pairs = window(list(zip(run, reference, strict=False)))
    if not all(math.isfinite(a) for a, _b in pairs):
        return math.inf
    return statistics.fmean(abs(a - b) for a, b in pairs) if pairs else 0.0


def beyond_noise(gap: float, base: float, spread: float, floor: float) -> bool:
    """The drift rule, for the quick look and --verify alike: a gap in the loss's units that is
    over DRIFT_MAX of `base`, over NOISE_FACTOR times fp32's own `spread`, and over `floor`."""
    return gap / max(abs(base), floor) > DRIFT_MAX and gap > max(NOISE_FACTOR * spread, floor)


def loss_floor(reference: Run) -> float:
    return LOSS_FLOOR * abs(reference.loss[0]) if reference.loss else LOSS_FLOOR


def forecast(run: Run, horizon: int) -> Forecast | None:
    """The op whose straight-line growth reaches fp16's 65504 first within the horizon."""
    best = None
    for key, op in run.ops.items():
        ys = op.peaks
        if len(ys) < 3 or not all(math.isfinite(y) for y in ys) or ys[-1] <= ys[0]:
            continue
        slope = _slope(ys)
        if slope <= 0 or op.peak >= FP16_MAX:
            continue
        step = len(ys) + math.ceil((FP16_MAX - ys[-1]) / slope)
        if step <= horizon and (best is None or step < best.step):
            best = Forecast(key, ys[-1], slope, step)
    return best


def _slope(ys: list[float]) -> float:
    xs = range(1, len(ys) + 1)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


# --- the rules -----------------------------------------------------------------------------------


def judge(run: Run, diagnosis: Diagnosis) -> None:
    """Sets the run's status, the most severe that applies, and every reason."""
    reference = diagnosis.runs[REFERENCE]
    if run.unsupported:
        run.status = REGRESSION if run.regression else NOT_RUN
        run.reasons = [run.unsupported]
    elif run is reference:
        broken = reference.first_nonfinite_loss() or not reference.params_finite
        run.status = NOT_JUDGED if broken else REFERENCE_STATUS
        run.reasons = [_reference_broken(reference) if broken else _safe(run, diagnosis)]
    elif reference.status == NOT_JUDGED:
        run.status, run.reasons = NOT_JUDGED, ["fp32 itself diverged: no recipe is judged"]
    else:
        found = _findings(run, diagnosis)
        run.findings = [s for s in STATUSES if s in found]
        run.status = next((s for s in STATUSES if s in found), SAFE)
        run.reasons = [r for s in STATUSES for r in found.get(s, [])] or [_safe(run, diagnosis)]


def _findings(run: Run, diagnosis: Diagnosis) -> dict[str, list[str]]:
    reference = diagnosis.runs[REFERENCE]
    found: dict[str, list[str]] = {}
    if run.error:
        found[FAILS] = [f"raised {run.error}"]
    recipe = recipes.get(run.recipe)
    fp16 = torch.float16 in (recipe.autocast_dtype, recipe.param_dtype)
    run.drift_abs = end_gap(run.loss, reference.loss)
    ref_end = statistics.fmean(window(reference.loss)) if reference.loss else 0.0
    run.drift = run.drift_abs / max(abs(ref_end), loss_floor(reference))
    if fp16:
        _overflow(run, diagnosis, found)
        _optimizer_state(run, diagnosis, found)
        _underflow(run, recipe, diagnosis, found)
    _norms(run, diagnosis, found)
    _precision(run, diagnosis, found)
    _stability(run, recipe, found)
    _drift(run, diagnosis, found)
    return found


def _computed_fp16(run: Run) -> set[str]:
    return {k for k, x in run.ops.items() if x.dtype == "float16"}


def _overflow(run: Run, diagnosis: Diagnosis, found: dict) -> None:
    """fp16 computes an op within reach of 65504, or its output overflowed (at step 1, from
    the initial weights, or under a scaler, which skips the bad steps), or the fp32 growth
    takes it there within the horizon."""
    fp16 = _computed_fp16(run)
    hot = [k for k in diagnosis.hot_ops() if k in fp16]
    step, origin = run.first_nonfinite or (0, "")
    overflowed = origin in fp16 and (step == 1 or recipes.get(run.recipe).scaler)
    ahead = diagnosis.runs[REFERENCE].forecast
    ahead = ahead if ahead and ahead.op in fp16 else None
    if not (hot or overflowed or ahead):
        return
    reference = diagnosis.runs[REFERENCE].ops
    named = diagnosis.sources(hot) if hot else []
    if overflowed and origin not in named:
        named.append(origin)
    if ahead and ahead.op not in named:
        named.append(ahead.op)
    words = [
        f"{k} peak |x| {reference[k].peak:.4g} in fp32 ({margin(reference[k].peak)})"
        for k in named
        if k in reference
    ]
    if overflowed:
        words.append(f"{origin}'s fp16 output overflowed at step {step}")
    if recipes.get(run.recipe).param_dtype == torch.float32:  # autocast's lists chose fp16
        words.extend(
            note
            for k in named
            if (note := other_device_note(k, diagnosis.device_type, diagnosis.torch))
        )
    if ahead:
        words.append(
            f"forecast: {ahead.op} grew {ahead.growth:.3g} per step to {ahead.peak:.4g}; at this "
            f"growth fp16's 65504 is reached near step {ahead.step} (a straight line through "
            f"{diagnosis.steps} steps, not a measurement: --verify N trains that far)"
        )
    run.keep_fp32.extend(fix_modules(named))
    found[KEEP_IN_FP32] = [
        f"keep {', '.join(_modules_named(named))} in fp32, or use amp-bf16 (fp32's range): "
        + "; ".join(words)
    ]


def _modules_named(ops: list[str]) -> list[str]:
    """The modules to keep in fp32 for these ops; an op in the model's own forward is named."""
    named = []
    for op in ops:
        module, name = module_of(op), op.rpartition(":")[2]
        if module == "model":
            named.append(
                f"the {name} in the model's own forward (wrap it in "
                "torch.autocast(device_type, enabled=False) with fp32 inputs)"
            )
        elif module == "loss":
            named.append(f"the loss's {name} (compute the loss on fp32 outputs)")
        else:
            named.append(module)
    return list(dict.fromkeys(named))


def fix_modules(ops: list[str]) -> tuple[str, ...]:
    """The submodules a fix keeps in fp32 for these ops (the root cannot be: that is fp32)."""
    return tuple(dict.fromkeys(module_of(k) for k in ops if module_of(k) not in ("model", "loss")))


def _optimizer_state(run: Run, diagnosis: Diagnosis, found: dict) -> None:
    """A half model's AdamW holds its state in fp16: eps 1e-8 is 0 there and second moments
    underflow, so an update divides by zero once a gradient entry is small. Seen as losses that
    are finite at step 1 (the weights are the initial ones) and not after. With an eps fp16
    holds, the same underflow is quieter: the entries whose second moment is 0 step by m/eps,
    not AdamW's step, and the run leaves fp32's, either way, after the quick look's window."""
    recipe = recipes.get(run.recipe)
    bad = run.first_nonfinite_loss()
    if recipe.param_dtype != torch.float16 or diagnosis.optimizer != "adamw":
        return
    reasons = []
    if bad is not None and bad >= 2 and _eps_vanishes():
        run.adam_eps = FP16_SAFE_EPS
        reasons.append(
            f"losses finite at step 1, non-finite from step {bad}: AdamW's eps 1e-8 is 0 in "
            "fp16 and its second moments underflow there, so its update divides by zero; train "
            "with autocast (amp-fp16 or amp-bf16: fp32 parameters and optimizer state), or AdamW "
            "eps >= 1e-4, or SGD"
        )
    if run.moments_lost > MOMENTS_LOST_MAX:
        reasons.append(
            f"{run.moments_lost:.1%} of AdamW's entries that have a first moment have a second "
            "moment of exactly 0 in fp16 (g^2 underflowed; in fp32 none would): they step by "
            "m/eps, not AdamW's m/sqrt(v), and over longer training such a run leaves fp32's, "
            "worse or better; train with autocast (amp-fp16 or amp-bf16: fp32 optimizer state)"
        )
    if reasons:
        found[OPTIMIZER_IN_FP16] = reasons


def _eps_vanishes() -> bool:
    return float(torch.tensor(1e-8, dtype=torch.float16)) == 0.0


def _underflow(run: Run, recipe: recipes.Recipe, diagnosis: Diagnosis, found: dict) -> None:
    if recipe.scaler:
        return
    lost = diagnosis.runs[REFERENCE].underflow
    if lost <= UNDERFLOW_MAX or (lost <= UNDERFLOW_SEVERE and _direction_kept(run)):
        return
    share = "non-zero entries" if diagnosis.optimizer == "adamw" else "squared norm"
    found[NEEDS_SCALING] = [
        f"at the last step {lost:.2%} of the gradient's {share} would round to zero in fp16 "
        f"(measured in fp32; {run.zero_gradients:.2%} of this run's entries were zero): use "
        "amp-fp16 (GradScaler) or amp-bf16"
    ]


def _direction_kept(run: Run) -> bool:
    return run.cosine is not None and math.isfinite(run.cosine) and run.cosine >= COSINE_KEPT


def _norms(run: Run, diagnosis: Diagnosis, found: dict) -> None:
    """A norm layer whose statistics are 16-bit here and reach fp16's range in fp32, or held
    inf/NaN here, or whose op is the first to output inf/NaN at step 1."""
    reference = diagnosis.runs[REFERENCE].norms
    step, origin = run.first_nonfinite or (0, "")
    flagged = []
    for name, norm in run.norms.items():
        if not norm.half:
            continue
        peak = reference[name].stat_peak if name in reference else 0.0
        if norm.stat_nonfinite:
            flagged.append(f"{name} ({norm.stat_nonfinite} running statistics inf/NaN)")
        elif peak * HEADROOM_FACTOR >= FP16_MAX:
            flagged.append(f"{name} (running statistics up to {peak:.4g} in fp32, {margin(peak)})")
        elif step == 1 and module_of(origin) == name:
            flagged.append(f"{name} (its fp16 output overflowed at step 1)")
    if flagged:
        run.keep_fp32.extend(n for n in run.norms if any(f.startswith(f"{n} (") for f in flagged))
        found[NORMS_IN_FP32] = [
            "norm layers whose 16-bit statistics leave fp16's range: "
            + ", ".join(flagged)
            + " (keep them in fp32, as autocast does)"
        ]


def _precision(run: Run, diagnosis: Diagnosis, found: dict) -> None:
    if run.cosine is None or not math.isfinite(run.cosine) or run.cosine >= COSINE_MIN:
        return
    if NEEDS_SCALING in found:  # gradients flushed to zero: the underflow explains it
        return
    if run.kernel_faults:  # a kernel's unwritten entries (garbage, 6e20) explain it: not rounding
        return  # _stability names the kernel and keeps its module, not every large op's, in fp32
    largest = _largest(diagnosis)
    lost = "the direction is lost to rounding"
    if chaotic(run):
        # fp32's own direction turns as far under a rounding of its weights: the cosine cannot
        # tell this run's precision from the model's sensitivity. What is left as evidence is
        # where the rounding falls: on the ops that hold the largest values, or not (a fix that
        # keeps them in fp32 trains as fp32 does; _safe says why the cosine decided nothing).
        largest = [op for op in largest if op in run.ops and run.ops[op].dtype != "float32"]
        if not largest:
            return
        lost = (
            f"fp32's own turns as far (cosine {run.rounding_cosine:.3f}) when its weights are "
            f"rounded to {_dtype_name(run)}, so the cosine alone proves nothing, but the ops with "
            f"the largest values compute in {_dtype_name(run)} here"
        )
    suspects = diagnosis.sources(largest)
    run.keep_fp32.extend(fix_modules(suspects))
    found[LOSES_PRECISION] = [
        f"its first gradient, from fp32's weights and batch, has a cosine of {run.cosine:.3f} "
        f"with fp32's (at least {COSINE_MIN}): {lost}; the largest values are in "
        f"{', '.join(suspects)} (keep {', '.join(_modules_named(suspects))} in fp32)"
    ]


def chaotic(run: Run) -> bool:
    """fp32's own first gradient loses its direction when its weights are rounded to the run's
    dtype (measured only where the run's cosine is low)."""
    return run.rounding_cosine is not None and not run.rounding_cosine >= COSINE_MIN


def _dtype_name(run: Run) -> str:
    return str(recipes.get(run.recipe).reduced_dtype).removeprefix("torch.")


def _largest(diagnosis: Diagnosis) -> list[str]:
    """The ops within HEADROOM_FACTOR of the largest fp32 value: where rounding costs most
    (the same attention logits in every layer, not the one layer that peaked highest)."""
    ops = diagnosis.runs[REFERENCE].ops
    top = max((x.peak for x in ops.values()), default=0.0)
    return [k for k, x in ops.items() if x.peak * HEADROOM_FACTOR >= top > 0]


def _stability(run: Run, recipe: recipes.Recipe, found: dict) -> None:
    """Never safe: a non-finite loss (said as the logged value's overflow when the weights and
    the loss recomputed in fp32 are fine), a minority of steps taken, a collapsed scale, skips
    recurring at a scale the scaler had settled on, parameters no longer finite."""
    reasons = []
    if run.first_nonfinite_loss():
        reasons.append(_nonfinite_losses(run))
    if recipe.scaler and run.skips:
        reasons.extend(_scaler_failures(run))
    if not run.params_finite:
        reasons.append("parameters inf/NaN after the last step")
    if run.kernel_faults:
        dtype = str(recipe.autocast_dtype or recipe.param_dtype).removeprefix("torch.")
        modules = [fault.split(" (", 1)[0] for fault in run.kernel_faults]
        run.keep_fp32.extend(modules)
        reasons.append(
            f"this device's {dtype} convolution kernel returned an inf/NaN gradient from finite "
            f"inputs whose fp32 gradient is finite, run again at the shape the model gave it: "
            f"{'; '.join(run.kernel_faults)}. A fault of the kernel (torch {torch.__version__}), "
            f"not of {dtype}'s range: its parameters go inf/NaN once it strikes, which "
            f"{len(run.loss)} steps may not show (keep {', '.join(modules)} in fp32)"
        )
    if reasons:
        found.setdefault(UNSTABLE, []).extend(reasons)


def _nonfinite_losses(run: Run) -> str:
    nonfinite = sum(not math.isfinite(v) for v in run.loss)
    where = run.first_nonfinite
    counted = (
        f"{nonfinite} of {len(run.loss)} losses non-finite, from step {run.first_nonfinite_loss()}"
        + (f" (first inf/NaN op: {where[1]}, step {where[0]})" if where else "")
    )
    if not run.logged_loss_overflow():
        return counted
    return (
        f"the logged loss overflows fp16 (the value reported, not the training): {counted}; the "
        f"parameters stayed finite and the loss recomputed in fp32 on the final weights is "
        f"{run.fp32_loss:.4g} (a trainer that stops or early-stops on a non-finite loss is hurt)"
    )


def _scaler_failures(run: Run) -> list[str]:
    taken = len(run.skips) - run.skipped
    course = run.scaler_course()
    scale = f"scale {run.scale[0]:g} -> {run.scale[-1]:g}"
    if taken * 2 <= len(run.skips):
        seeking = not course.recurrent and run.scale[-1] >= SCALE_FLOOR
        return [
            f"the scaler took {taken} of {len(run.skips)} steps ({scale})"
            + (
                ": it was still seeking its scale, so more --steps may see it settle "
                "(or fall under 1: fp16's gradients overflowing unscaled)"
                if seeking
                else ""
            )
        ]
    if run.scale[-1] < SCALE_FLOOR:
        return [f"the scale collapsed below {SCALE_FLOOR:g} ({scale})"]
    if course.recurs(len(run.skips)):
        return [
            f"{len(course.recurrent)} step(s) skipped at or below the scale {course.settled:g} "
            f"the scaler had settled on at step {course.settled_at} (steps "
            f"{_steps(course.recurrent)}; {scale}): fp16's gradients keep overflowing a scale "
            "that had held, beyond its calibration"
        ]
    return []


def _steps(steps: list[int]) -> str:
    return ", ".join(str(s) for s in steps)


def _drift(run: Run, diagnosis: Diagnosis, found: dict) -> None:
    if not math.isfinite(run.drift_abs):
        return  # non-finite losses: _stability has it
    reference = diagnosis.runs[REFERENCE]
    base = statistics.fmean(window(reference.loss))
    if beyond_noise(run.drift_abs, base, diagnosis.noise, loss_floor(reference)):
        ends = statistics.fmean(window(run.loss)) - base
        found[DRIFTS] = [
            f"over the last {len(window(run.loss))} steps the loss left fp32's by "
            f"{run.drift:.2%} ({run.drift_abs:.3g}, {'below' if ends < 0 else 'above'} it), beyond "
            f"{DRIFT_MAX:.0%} and beyond {NOISE_FACTOR:g}x fp32's own seed spread "
            f"({diagnosis.noise:.3g}): not fp32's run, whichever way"
        ]


def _reference_broken(reference: Run) -> str:
    bad = reference.first_nonfinite_loss()
    where = (
        f" (first inf/NaN op: {reference.first_nonfinite[1]})" if reference.first_nonfinite else ""
    )
    if bad:
        return (
            f"the fp32 reference's loss is non-finite from step {bad}{where}: the model diverges "
            "without any reduced precision (lower --lr, check the data); no recipe is judged"
        )
    return "the fp32 reference's parameters are inf/NaN after the last step; no recipe is judged"


def _safe(run: Run, diagnosis: Diagnosis) -> str:
    reference = diagnosis.runs[REFERENCE]
    ops = reference.ops
    peak = max((x.peak for x in ops.values()), default=0.0)
    words = [
        f"{len(run.loss)} steps, final loss {run.loss[-1]:.4g}"
        if run is reference
        else f"every loss finite, within {run.drift:.2%} of fp32 at the end (fp32's own seed "
        f"spread {diagnosis.noise:.3g}) over {len(run.loss)} steps",
        f"largest fp32 value of any op {peak:.4g} ({margin(peak)})",
    ]
    if run is reference and diagnosis.noise_note:
        words.append(diagnosis.noise_note)
    if run.cosine is not None:
        words.append(f"first gradient's cosine with fp32's {run.cosine:.3f}")
    if chaotic(run):
        words.append(
            f"the cosine decides nothing here: fp32's own first gradient turns to a cosine of "
            f"{run.rounding_cosine:.3f} when its weights are rounded to {_dtype_name(run)}, and "
            "the ops with the largest values compute in float32 in this run"
        )
    recipe = recipes.get(run.recipe)
    unscaled_fp16 = (
        torch.float16 in (recipe.autocast_dtype, recipe.param_dtype) and not recipe.scaler
    )
    if unscaled_fp16 and reference.underflow > UNDERFLOW_MAX:
        words.append(
            f"note: {reference.underflow:.2%} of the gradient's entries are under fp16's "
            f"smallest value, all tiny: its first gradient keeps fp32's direction, so it trains"
        )
    if run.skips and recipe.scaler:
        words.append(_calibration(run))
    if recipe.autocast_dtype is not None and recipe.param_dtype == torch.float32:
        words.append(autocast_policy(diagnosis.device_type, diagnosis.torch))
    if run is not reference:
        words.append(f"only {len(run.loss)} steps seen: --verify N trains longer")
    return "; ".join(words)


def _calibration(run: Run) -> str:
    """A safe scaler's course, in words: its back-offs and where it settled."""
    course = run.scaler_course()
    if not run.skipped:
        return f"the scaler skipped no step (scale {run.scale[0]:g} held)"
    words = (
        f"the scaler calibrated: {len(course.calibration)} back-off(s) from {run.scale[0]:g} "
        f"(step {_steps(course.calibration)}) to {run.scale[-1]:g}"
    )
    if course.recurrent:
        words += (
            f", and {len(course.recurrent)} skip(s) at a scale it had held (step "
            f"{_steps(course.recurrent)}), one more halving, as calibration does"
        )
    if run.skips[-1]:
        words += ", its last at the last step: more --steps show where it settles"
    return words


def margin(peak: float) -> str:
    """How far a peak |x| is from fp16's largest value, in words."""
    if peak >= FP16_MAX:
        return f"{peak / FP16_MAX:.2g}x fp16's largest value 65504"
    return f"{FP16_MAX / max(peak, 1e-30):.2g}x below fp16's 65504"
