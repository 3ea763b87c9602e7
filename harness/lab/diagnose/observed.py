"""What `amp-harness diagnose` observed, as the runs fill it in and the rules read it: a `Run` per
recipe (its ops' ranges, its norm layers' statistics, its scaler's course, the fixes tried on it)
and the `Diagnosis` that holds them, with fp32's run (`REFERENCE`) the one each is held against.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from harness.lab.diagnose.thresholds import (
    BACKOFF,
    CALIBRATED_TAKEN,
    FP16_MAX,
    HEADROOM_FACTOR,
    HORIZON,
    RECURRENT_MIN,
    RECURRENT_SHARE,
    SCALE_FLOOR,
)

REFERENCE = "fp32"  # the run every other recipe's is held against
GRADIENT = "gradient:largest entry"  # the forecast's name for the gradient's growth
# A GradScaler's course in the look (Run.scaler_calibration): its first steps skipped, each a
# back-off, every loss finite, then CALIBRATED_TAKEN steps taken or (SEEKING) fewer so far.
CALIBRATED, SEEKING = "calibrated", "seeking"


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
    code: list[str] = field(default_factory=list)  # what a user adds, and where (Fix.code)
    # False where the quick look cannot say (harness.lab.diagnose.settled): the fixed run's only
    # finding is AdamW's second moments lost to fp16, or a GradScaler still calibrating its
    # initial guess: --verify decides. `unsettled` says which, in words.
    settled: bool = True
    unsettled: str = ""


@dataclass
class Forecast:
    """An op's growth over the quick look's steps, extended to where fp16 overflows: the curve
    value(step) = first + rate * (step - 1) ** power fitted to its per-step values
    (harness.lab.diagnose.curves.forecast)."""

    op: str
    first: float  # the value at the first step
    peak: float  # the value at the last step
    growth: float  # per step, at the last step
    step: int  # where the curve reaches `limit`
    measured: str = "output"  # "input": an exp's largest input (the log of its output)
    limit: float = 65504.0  # fp16's largest value, or the input past which exp overflows it
    power: float = 1.0  # of the fitted curve: 1 a straight line, 2 a square's growth
    slowing: int = 0  # where it reaches `limit` if its gain keeps slowing as it did (>= step)


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
    underflow: float = 0.0  # at the last step: the gradient share fp16 would flush (UNDERFLOW_MAX)
    underflow_steps: list[float] = field(default_factory=list)
    # Per step, the largest |entry| of the gradient (unscaled): fp32's is extended by the
    # forecast (GRADIENT), as an op's peaks are.
    gradient_peaks: list[float] = field(default_factory=list)
    zero_gradients: float = 0.0  # largest fraction of gradient entries exactly 0
    # AdamW, after the last step: of the entries with a first moment, the share whose second
    # moment is exactly 0 (fp16 state: g^2 underflowed; such an entry steps by m/eps).
    moments_lost: float = 0.0
    cosine: float | None = None  # of its first gradient with fp32's
    # The run's own first gradient held inf/NaN (scaled by 65536: step 1 skipped), and `cosine`
    # is of that gradient recomputed without loss scaling from the same weights and batch.
    cosine_unscaled: bool = False
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
    forecasts: list[Forecast] = field(default_factory=list)  # fp32 only: every one, soonest first
    # The recommended fix, as the rules found it: modules to keep in fp32, the loss computed in
    # fp32 outside autocast, AdamW's epsilon.
    keep_fp32: list[str] = field(default_factory=list)
    loss_fp32: bool = False
    adam_eps: float | None = None
    status: str = ""
    findings: list[str] = field(default_factory=list)  # every status whose rule fired
    reasons: list[str] = field(default_factory=list)
    fixes: list[FixCheck] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        return sum(self.skips)

    def computed_fp16(self) -> set[str]:
        """The ops whose output this run computed in fp16."""
        return {k for k, x in self.ops.items() if x.dtype == "float16"}

    def first_nonfinite_loss(self) -> int | None:
        return next((i for i, v in enumerate(self.loss, 1) if not math.isfinite(v)), None)

    def scaler_stalled(self) -> bool:
        """The scaler took at most half the steps (its calibration aside), or its scale fell
        under SCALE_FLOOR."""
        taken = len(self.skips) - self.skipped
        minority = taken * 2 <= len(self.skips) and self.scaler_calibration() != CALIBRATED
        return bool(self.skips) and (minority or self.scale[-1] < SCALE_FLOOR)

    def scaler_calibration(self) -> str:
        """CALIBRATED where the scaler's skips began the look, each a back-off (the next step's
        scale BACKOFF times its own), with every loss and the weights finite, the scale not
        under SCALE_FLOOR, no recurrence after, and at least CALIBRATED_TAKEN steps taken after
        them; SEEKING where all that holds but fewer steps were taken; "" otherwise (no skip, a
        skip after a step taken first, a loss inf in the forward): thresholds.BACKOFF says why."""
        lead = next((i for i, skipped in enumerate(self.skips) if not skipped), len(self.skips))
        finite = all(math.isfinite(v) for v in self.loss) and self.params_finite
        if not lead or not finite or self.scale[-1] < SCALE_FLOOR:
            return ""
        after = range(1, min(lead + 1, len(self.scale)))
        if any(self.scale[i] != self.scale[i - 1] * BACKOFF for i in after):
            return ""
        if self.scaler_course().recurs(len(self.skips)):
            return ""
        taken = len(self.skips) - self.skipped
        return CALIBRATED if taken >= CALIBRATED_TAKEN else SEEKING

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
    had settled on (RECURRENT_MIN)."""

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
