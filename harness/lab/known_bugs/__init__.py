"""The known bugs' reproductions: for each entry of the ledger (harness/catalogue/known_bugs.toml),
the code that shows its harm, and the same code where the bug cannot occur (its control).

A reproduction is a function `run(device, control) -> Observed`: with control=False it runs the
code the bug is in and says whether the harm showed (the gradient that goes inf, the step that is
skipped, the loss that drifts); with control=True it runs the same code with the one difference
that keeps the bug out (fp32, eager, the documented workaround), which must show no harm. A
reproduction that can no longer trigger is told apart from a fix by its control: a control that
shows the harm too means the reproduction does not isolate the bug.

scenarios/test_known_bugs.py runs every one of REPRODUCTIONS; the ledger's bounds (the catalogue)
say what each release should show. Each class of bug is a module:

- `optimizers`: fused and foreach optimizers beside GradScaler;
- `scaling`: GradScaler itself;
- `autocasting`: autocast's policy and its weight cache;
- `numerics`: norm layers, reductions and losses in half precision;
- `attention`: scaled dot-product attention;
- `float8`: float8 casts;
- `checkpointing`: activation checkpointing's recomputation under autocast;
- `distributed`: gradient reduction across gloo ranks (DDP, FSDP2) under mixed precision;
- `parity`: torch.compile against eager under mixed precision;
- `reproduction`: what a reproduction is (`Reproduction`, `Observed`) and the registry.
"""

from harness.lab.known_bugs import (  # each module registers its reproductions on import
    attention,
    autocasting,
    checkpointing,
    distributed,
    float8,
    numerics,
    optimizers,
    parity,
    scaling,
)
from harness.lab.known_bugs.reproduction import REPRODUCTIONS, Observed, Reproduction, Unavailable

__all__ = [
    "REPRODUCTIONS",
    "Observed",
    "Reproduction",
    "Unavailable",
    "attention",
    "autocasting",
    "checkpointing",
    "distributed",
    "float8",
    "numerics",
    "optimizers",
    "parity",
    "scaling",
]
