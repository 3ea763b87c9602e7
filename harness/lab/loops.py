"""Training loops of more than one shape, observed step by step, and a claim decided over them.

GradScaler's claims hold or fail per loop shape (several param groups, several optimizers,
gradient accumulation, fused kernels, parameters without a gradient): a regression confined to
one shape passes every loop of another. scenarios/test_loop_shapes.py tries them with:
- `exact_linear`, `exact_batch`: layers and inputs in multiples of 1/16 and 1/8, so that a
  scaled step (every factor a power of two) and an fp32 step compute the same numbers, and any
  gap between their updates is the loop's, never rounding;
- `Snapshot`, `Step`: a model's parameters and an optimizer's state, cloned and compared bitwise
  ("the step was skipped, every group untouched"), and the update one step made, against a
  reference step's;
- `Across`: one claim decided over the shapes tried, shape by shape, so that one shape's
  exception is named, never averaged away by the others.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn


def _steps_of(n: int, start: int, modulus: int, stride: int) -> torch.Tensor:
    """n integers in [-(modulus // 2), modulus // 2], in a pattern that `start` shifts."""
    return ((torch.arange(n) * stride + start) % modulus - modulus // 2).float()


def exact_linear(n_in: int, n_out: int, device: torch.device, start: int = 0) -> nn.Linear:
    """nn.Linear(n_in, n_out) whose weights and biases are multiples of 1/16 in [-1/4, 1/4],
    exact in fp16 and fp32; another `start` gives other values."""
    layer = nn.Linear(n_in, n_out)
    with torch.no_grad():
        layer.weight.copy_(_steps_of(n_in * n_out, start, 9, 5).reshape(n_out, n_in) / 16)
        layer.bias.copy_(_steps_of(n_out, start + 2, 9, 5) / 16)
    return layer.to(device)


def exact_batch(
    rows: int, n_in: int, n_out: int, device: torch.device, start: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets in multiples of 1/8 in [-3/4, 3/4]; another `start`, another batch."""
    x = _steps_of(rows * n_in, start, 13, 3).reshape(rows, n_in) / 8
    y = _steps_of(rows * n_out, start + 5, 13, 7).reshape(rows, n_out) / 8
    return x.to(device), y.to(device)


@dataclass(frozen=True)
class Snapshot:
    """Named parameters and their optimizer state, cloned: what a step may change."""

    params: dict[str, torch.Tensor]
    state: dict[str, torch.Tensor]  # "<param>.<entry>": "0.weight.momentum_buffer"

    @classmethod
    def of(
        cls, named: Iterable[tuple[str, torch.Tensor]], optimizer: torch.optim.Optimizer
    ) -> Snapshot:
        named = list(named)
        params = {name: p.detach().clone() for name, p in named}
        state = {
            f"{name}.{entry}": torch.as_tensor(value).detach().clone()
            for name, p in named
            for entry, value in optimizer.state.get(p, {}).items()
        }
        return cls(params, state)

    def changed(self, later: Snapshot, prefixes: tuple[str, ...] = ("",)) -> list[str]:
        """The parameters and state entries under `prefixes` that differ bitwise in `later`, or
        appear or vanish there: an optimizer that creates state on a skipped step changed it."""
        found = []
        for mine, theirs in ((self.params, later.params), (self.state, later.state)):
            for name in sorted(mine.keys() | theirs.keys()):
                a, b = mine.get(name), theirs.get(name)
                if name.startswith(prefixes) and (a is None or b is None or not torch.equal(a, b)):
                    found.append(name)
        return found

    def flat(self, prefixes: tuple[str, ...] = ("",)) -> torch.Tensor:
        return torch.cat([p.flatten() for n, p in self.params.items() if n.startswith(prefixes)])


@dataclass(frozen=True)
class Step:
    """One optimizer step of a loop, observed: what it could change, before and after, and the
    loss scale before and after (1 without a scaler)."""

    before: Snapshot
    after: Snapshot
    scale_before: float = 1.0
    scale_after: float = 1.0

    def changed(self, prefixes: tuple[str, ...] = ("",)) -> list[str]:
        return self.before.changed(self.after, prefixes)

    @property
    def skipped(self) -> bool:
        """Nothing changed, bitwise: no parameter, no optimizer state."""
        return not self.changed()

    @property
    def backoff(self) -> float:
        """How the scale moved: 0.5 for one backoff, 1 for none."""
        return self.scale_after / self.scale_before

    def update(self, prefixes: tuple[str, ...] = ("",)) -> torch.Tensor:
        return self.after.flat(prefixes) - self.before.flat(prefixes)

    def gap(self, reference: Step, prefixes: tuple[str, ...] = ("",)) -> float:
        """|this update - the reference's| / |the reference's|, over the parameters under
        `prefixes`: 0 where both made the same update (both none included)."""
        mine, theirs = self.update(prefixes), reference.update(prefixes)
        if not theirs.any():
            return 0.0 if not mine.any() else math.inf
        return float((mine - theirs).norm() / theirs.norm())


@dataclass
class Across:
    """One claim decided over the shapes a test tried: `confirmed` where the claim held in every
    shape, `refuted` where it held in none, `partly` otherwise, the shapes on each side named.
    "Held" is the claim's statement as the article makes it: SCL-NAN-INCREASES holds where a
    NaN raised the scale, PIT3-CHECK-BEFORE-STEP where a check before scaler.step was needed."""

    held: dict[str, bool] = field(default_factory=dict)
    said: dict[str, str] = field(default_factory=dict)

    def add(self, shape: str, held: bool, said: str) -> None:
        self.held[shape], self.said[shape] = bool(held), said

    def verdict(self) -> str:
        if not self.held:  # no shape tried: nothing decided
            return "inconclusive"
        if all(self.held.values()):
            return "confirmed"
        return "partly" if any(self.held.values()) else "refuted"

    def shapes(self, held: bool) -> list[str]:
        return [shape for shape, h in self.held.items() if h is held]

    def evidence(self) -> str:
        """Where the claim held, where not, then what each shape showed."""
        held, not_held = self.shapes(True), self.shapes(False)
        sides = [f"held in {len(held)} of {len(self.held)} shapes"]
        sides += [f"in {', '.join(held)}"] if held and not_held else []
        sides += [f"not in {', '.join(not_held)}"] if not_held else []
        shown = "; ".join(f"{shape}: {said}" for shape, said in self.said.items())
        return f"{', '.join(sides)} ({shown})"
