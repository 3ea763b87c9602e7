"""What differs between environments: a claim's verdict, or a key metric of one of its tests.

The ledger's point is to show where behaviour differs: torch 2.5 against 2.13, the CPU against
a GPU. One rule serves the report (columns read from MLflow) and `amp-harness baseline changes`
(columns read from committed baselines): a claim differs when its verdicts, as they count, are
not all the same across the columns that decided it, or when a key metric (Record.key_metric:
a threshold, a step, a count) of one of its tests takes different values. Key metrics are
compared to 4 significant digits: they say which way the behaviour went, and a last-digit
wobble of a floating-point sum between releases is not a change of behaviour. Where
harness.lab.releases knows a change between the columns' torch releases, the difference carries it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from harness.lab import releases


@dataclass
class Column:
    """One environment as compared here."""

    label: str
    device: str  # the device type: cpu, cuda
    torch: str  # its torch version
    verdicts: dict[str, str]  # claim -> the verdict label that counts (decided claims only)
    tests: dict[str, tuple[list[str], dict[str, float]]] = field(default_factory=dict)
    # test node id -> (its claims, its key metrics)


@dataclass
class Difference:
    claim: str
    verdicts: list[tuple[str, str]]  # (column label, verdict) for every column, when they differ
    metrics: list[tuple[str, list[tuple[str, str]]]]  # ("test: metric", [(label, value), ...])
    known: list[str]  # the harness.lab.releases changes between the columns' releases, in words

    def summary(self) -> str:
        """One line: what differs, and the known change that explains it, if any."""
        parts = []
        if self.verdicts:
            parts.append("verdict " + " vs ".join(f"{v} ({label})" for label, v in self.verdicts))
        for name, values in self.metrics:
            metric = name.rsplit(": ", 1)[-1]
            parts.append(f"{metric} " + " vs ".join(f"{v} ({label})" for label, v in values))
        text = "; ".join(parts)
        return f"{text}. {' '.join(self.known)}" if self.known else text


def value(number: float) -> str:
    """A key metric as compared and shown: 4 significant digits, inf and nan spelled out."""
    return f"{number:.4g}" if math.isfinite(number) else str(number)


def find(claims: Iterable[str], columns: list[Column]) -> dict[str, Difference]:
    """The claims that differ across `columns`, each with what differs."""
    found = {}
    for claim in claims:
        decided = [(c.label, c.verdicts[claim]) for c in columns if claim in c.verdicts]
        verdicts = decided if len({v for _label, v in decided}) > 1 else []
        metrics = _metrics(claim, columns)
        if verdicts or metrics:
            found[claim] = Difference(claim, verdicts, metrics, known(claim, columns))
    return found


def _metrics(claim: str, columns: list[Column]) -> list[tuple[str, list[tuple[str, str]]]]:
    seen: dict[str, list[tuple[str, str]]] = {}
    for column in columns:
        for test, (claims, metrics) in column.tests.items():
            if claim in claims:
                for name, number in metrics.items():
                    seen.setdefault(f"{test}: {name}", []).append((column.label, value(number)))
    return [
        (name, values)
        for name, values in seen.items()
        if len(values) > 1 and len({v for _label, v in values}) > 1
    ]


def known(claim: str, columns: list[Column]) -> list[str]:
    """The known changes of `claim` between the columns' torch releases, in words."""
    found = []
    for name, change in releases.CHANGES.items():
        if change.claim != claim:
            continue
        on_device = [c for c in columns if c.device == change.device]
        sides = {releases.behaviour(name, c.device, c.torch) for c in on_device}
        if len(sides) > 1:
            found.append(
                f"Known change in torch {change.first} on {change.device} (harness.lab.releases "
                f"{name!r}): before, {change.before}; since, {change.current}."
            )
    return found
