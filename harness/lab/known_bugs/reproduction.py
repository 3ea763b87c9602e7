"""What a known bug's reproduction is, and the registry scenarios/test_known_bugs.py reads.

`@reproduces(ID, devices=..., control=...)` registers a function `run(device, control)`: the
ledger's ID, the device types it can run on (the others skip with the reason), and in words what
the control changes. `slow` puts it in the scenarios' slow tier (a torch.compile per run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Observed:
    """One run of a reproduction: whether the harm showed, the numbers that decided it, and a
    sentence carrying them (the verdict's evidence)."""

    harm: bool
    says: str
    numbers: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Reproduction:
    bug: str  # the ledger's ID, KB-...
    run: Callable[[torch.device, bool], Observed]
    devices: tuple[str, ...]  # device types it runs on
    control: str  # what the control changes, in words
    slow: bool = False


REPRODUCTIONS: dict[str, Reproduction] = {}


def reproduces(
    bug: str, devices: tuple[str, ...], control: str, slow: bool = False
) -> Callable[[Callable[[torch.device, bool], Observed]], Callable[[torch.device, bool], Observed]]:
    """Register the decorated `run(device, control)` as `bug`'s reproduction."""

    def register(run: Callable[[torch.device, bool], Observed]):
        if bug in REPRODUCTIONS:
            raise ValueError(f"{bug}: two reproductions ({REPRODUCTIONS[bug].run.__name__}, "
                             f"{run.__name__}); keep one")  # fmt: skip
        REPRODUCTIONS[bug] = Reproduction(bug, run, devices, control, slow)
        return run

    return register


class Unavailable(Exception):
    """Raised by a reproduction where this build lacks what it needs (a dtype, an API, a
    backend), the message saying what. A skip where the ledger says the bug is absent from this
    release; a failure where it says present (the reproduction cannot show a bug it should)."""
