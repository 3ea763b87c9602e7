"""`amp-harness diagnose`: each recipe's short run on a user's model, what its numbers mean, the
remedies re-run, and (with --verify) the long runs that check the prediction.

A factory returns a `Subject` (the model, endless batches, the loss); `diagnose()` returns a
`Diagnosis`. This face re-exports them, the statuses and the names tests assert on; its modules:

- `order`: the run order, top to bottom (the factory checked, fp32 first, each recipe, the fixes);
- `runs`: one recipe's run, observed;
- `observed`: what a run observed, and the `Diagnosis` that holds the runs;
- `thresholds`: the numbers the rules judge by, each with the measurement it was set from;
- `curves`: a loss curve's end against fp32's beyond its noise (the drift's yardstick), and an
  op's growth forecast (where it overflows fp16, extended from the steps seen);
- `rules`: the statuses, and what sets them;
- `growth`: the growth forecast that concerns a recipe, in words, with its fix;
- `scaler_words`: a GradScaler's course in words (how it failed, or how it calibrated);
- `wording`: how the rules' reasons name an op's module, a peak's margin, autocast's lists;
- `fixes`: each remedy, applied to a run;
- `settled`: whether a fix check's few steps can say if the fix held ("not settled" and why);
- `kernels`: the convolution kernels' probe;
- `compiled`: each recipe compiled (--compile), against eager;
- `verify`: the long runs of --verify, and their truth;
- `examples`: the factories docs/diagnose.md runs.
"""

from harness.lab.diagnose.curves import end_gap, forecast, forecasts
from harness.lab.diagnose.observed import REFERENCE, Diagnosis, FixCheck, Run
from harness.lab.diagnose.order import (
    RECIPES,
    DiagnoseError,
    Subject,
    diagnose,
    factory_seeds,
    fix_reference,
)
from harness.lab.diagnose.rules import (
    BROKEN,
    DRIFTS,
    FAILS,
    KEEP_IN_FP32,
    LOSES_PRECISION,
    NEEDS_SCALING,
    NORMS_IN_FP32,
    NOT_JUDGED,
    NOT_RUN,
    OPTIMIZER_IN_FP16,
    OVERFLOWS_AHEAD,
    OVERFLOWS_WITHIN_NOISE,
    REFERENCE_STATUS,
    REGRESSION,
    SAFE,
    STATUSES,
    UNSTABLE,
    judge,
)
from harness.lab.diagnose.runs import Replay, Setting
from harness.lab.diagnose.thresholds import DRIFT_MAX, HORIZON, UNDERFLOW_MAX

__all__ = [
    "BROKEN", "DRIFTS", "DRIFT_MAX", "FAILS", "HORIZON", "KEEP_IN_FP32", "LOSES_PRECISION",
    "NEEDS_SCALING", "NORMS_IN_FP32", "NOT_JUDGED", "NOT_RUN", "OPTIMIZER_IN_FP16",
    "OVERFLOWS_AHEAD", "OVERFLOWS_WITHIN_NOISE", "RECIPES",
    "REFERENCE", "REFERENCE_STATUS", "REGRESSION", "SAFE", "STATUSES", "UNDERFLOW_MAX",
    "UNSTABLE", "DiagnoseError", "Diagnosis", "FixCheck", "Replay", "Run", "Setting", "Subject",
    "diagnose", "end_gap", "factory_seeds", "fix_reference", "forecast", "forecasts", "judge",
]  # fmt: skip
