"""`amp-harness diagnose`: each recipe's short run on a user's model, what its numbers mean, the
remedies re-run, and (with --verify) the long runs that check the prediction.

A factory returns a `Subject` (the model, endless batches, the loss); `diagnose()` returns a
`Diagnosis`. This face re-exports them, the statuses and the names tests assert on; its modules:

- `order`: the run order, top to bottom (the factory checked, fp32 first, each recipe, the fixes);
- `runs`: one recipe's run, observed;
- `rules`: the statuses, and what sets them;
- `fixes`: each remedy, applied to a run;
- `kernels`: the convolution kernels' probe;
- `compiled`: each recipe compiled (--compile), against eager;
- `verify`: the long runs of --verify, and their truth;
- `examples`: the factories docs/diagnose.md runs.
"""

from harness.lab.diagnose.order import (
    RECIPES,
    DiagnoseError,
    Subject,
    diagnose,
    factory_seeds,
    fix_reference,
)
from harness.lab.diagnose.rules import (  # the names a scenario asserts on
    BROKEN,
    DRIFT_MAX,
    DRIFTS,
    FAILS,
    HORIZON,
    KEEP_IN_FP32,
    LOSES_PRECISION,
    NEEDS_SCALING,
    NORMS_IN_FP32,
    NOT_JUDGED,
    NOT_RUN,
    OPTIMIZER_IN_FP16,
    REFERENCE,
    REFERENCE_STATUS,
    REGRESSION,
    SAFE,
    STATUSES,
    UNDERFLOW_MAX,
    UNSTABLE,
    Diagnosis,
    FixCheck,
    Run,
    end_gap,
    forecast,
    judge,
)
from harness.lab.diagnose.runs import Replay, Setting

__all__ = [
    "BROKEN", "DRIFTS", "DRIFT_MAX", "FAILS", "HORIZON", "KEEP_IN_FP32", "LOSES_PRECISION",
    "NEEDS_SCALING", "NORMS_IN_FP32", "NOT_JUDGED", "NOT_RUN", "OPTIMIZER_IN_FP16", "RECIPES",
    "REFERENCE", "REFERENCE_STATUS", "REGRESSION", "SAFE", "STATUSES", "UNDERFLOW_MAX",
    "UNSTABLE", "DiagnoseError", "Diagnosis", "FixCheck", "Replay", "Run", "Setting", "Subject",
    "diagnose", "end_gap", "factory_seeds", "fix_reference", "forecast", "judge",
]  # fmt: skip
