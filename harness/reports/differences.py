"""What differs between environments: a claim's verdict, or a key metric of one of its tests.

The ledger's point is to show where behaviour differs: torch 2.5 against 2.13, the CPU against
a GPU. One rule serves the report (columns read from MLflow) and `amp-harness baseline changes`
(columns read from committed baselines): a claim differs when its verdicts, as they count, are
not all the same across the columns that decided it, or when a key metric (Record.key_metric:
a threshold, a step, a count) of one of its tests takes different values. Key metrics are
compared to 4 significant digits: they say which way the behaviour went, and a last-digit
wobble of a floating-point sum between releases is not a change of behaviour. Where
harness.lab.releases knows a change between the columns' torch releases, the difference carries it.

Where two columns that disagree ran on other hardware classes, the difference also carries why the
hardware explains it (harness.records.environments.hardware_explains: the classes differ in a
capability the claim's tests depend on, or a test depends on the class as a whole), if it does.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from harness.lab import releases
from harness.records import environments


@dataclass
class Column:
    """One environment as compared here."""

    label: str
    device: str  # the device type: cpu, cuda
    torch: str  # its torch version
    verdicts: dict[str, str]  # claim -> the verdict label that counts (decided claims only)
    tests: dict[str, tuple[list[str], dict[str, float]]] = field(default_factory=dict)
    # test node id -> (its claims, its key metrics)
    facts: dict[str, str] = field(default_factory=dict)  # its fingerprint: class, capabilities
    depends_on: dict[str, set[str]] = field(default_factory=dict)
    # test node id -> its hardware dependencies (Record.depends_on_hardware)

    @property
    def hardware_class(self) -> str:
        return environments.hardware_class(self.facts)


@dataclass
class Difference:
    claim: str
    verdicts: list[tuple[str, str]]  # (column label, verdict) for every column, when they differ
    metrics: list[tuple[str, list[tuple[str, str]]]]  # ("test: metric", [(label, value), ...])
    known: list[str]  # the harness.lab.releases changes between the columns' releases, in words
    hardware: list[str] = field(default_factory=list)  # why the hardware explains it, in words
    hardware_columns: list[str] = field(default_factory=list)  # the labels of the columns it does

    def what(self) -> str:
        """What differs, per column."""
        parts = []
        if self.verdicts:
            parts.append("verdict " + " vs ".join(f"{v} ({label})" for label, v in self.verdicts))
        for name, values in self.metrics:
            parts.append(
                f"{metric_label(name)} " + " vs ".join(f"{v} ({label})" for label, v in values)
            )
        return "; ".join(parts)

    def summary(self) -> str:
        """One line: what differs, and the known change or the hardware that explains it, if
        any."""
        notes = [*self.known, *(f"Differs with the hardware: {why}." for why in self.hardware)]
        return f"{self.what()}. {' '.join(notes)}" if notes else self.what()


def value(number: float) -> str:
    """A key metric as compared and shown: 4 significant digits, inf and nan spelled out."""
    return f"{number:.4g}" if math.isfinite(number) else str(number)


# What a claim's verdict or key metric is in each column that has it: [(column, value), ...].
Values = list[tuple[Column, str]]


def find(claims: Iterable[str], columns: list[Column]) -> dict[str, Difference]:
    """The claims that differ across `columns`, each with what differs."""
    found = {}
    for claim in claims:
        decided = [(c, c.verdicts[claim]) for c in columns if claim in c.verdicts]
        verdicts = decided if _differ(decided) else []
        metrics = [(name, v) for name, v in _metrics(claim, columns).items() if _differ(v)]
        if not verdicts and not metrics:
            continue
        # The verdict comes from every test of the claim; a metric from its own test.
        differing = [(verdicts, _claim_tests(claim, columns))] if verdicts else []
        differing += [(values, {name.rsplit(": ", 1)[0]}) for name, values in metrics]
        hardware, explained = _hardware(differing)
        found[claim] = Difference(
            claim,
            _labelled(verdicts),
            [(name, _labelled(values)) for name, values in metrics],
            known(claim, columns),
            hardware,
            [c.label for c in columns if c.label in explained],
        )
    return found


def _differ(values: Values) -> bool:
    return len({v for _column, v in values}) > 1


def _labelled(values: Values) -> list[tuple[str, str]]:
    return [(column.label, v) for column, v in values]


def metric_label(name: str) -> str:
    """ "scenarios/f.py::test[bfloat16]: holds/mm" -> "holds/mm [bfloat16]": the metric, with
    its test's parameters where it has some, so that two tests of one claim (one per autocast
    dtype) tell their metrics apart."""
    test, _, metric = name.rpartition(": ")
    params = test.rsplit("[", 1)[-1].removesuffix("]") if test.endswith("]") else ""
    return f"{metric} [{params}]" if params else metric


def _metrics(claim: str, columns: list[Column]) -> dict[str, Values]:
    """Each key metric of the claim's tests ("test: metric"), in every column that has it."""
    seen: dict[str, Values] = {}
    for column in columns:
        for test, (claims, metrics) in column.tests.items():
            if claim in claims:
                for name, number in metrics.items():
                    seen.setdefault(f"{test}: {name}", []).append((column, value(number)))
    return seen


def _claim_tests(claim: str, columns: list[Column]) -> set[str]:
    return {test for c in columns for test, (claims, _m) in c.tests.items() if claim in claims}


def _hardware(differing: list[tuple[Values, set[str]]]) -> tuple[list[str], set[str]]:
    """Why the hardware explains the difference, for each pair of columns that disagree (on a
    value that comes from `tests`), and the labels of the columns it explains."""
    reasons: list[str] = []
    explained: set[str] = set()
    for values, tests in differing:
        for (a, value_a), (b, value_b) in itertools.combinations(values, 2):
            if value_a == value_b:
                continue
            depends = set().union(*(c.depends_on.get(t, ()) for c in (a, b) for t in tests))
            # By class, so that the reason reads the same for every pair of those classes.
            first, second = sorted((a, b), key=lambda c: c.hardware_class)
            reason = environments.hardware_explains(first.facts, second.facts, depends)
            if reason:
                reasons += [] if reason in reasons else [reason]  # once, in the order found
                explained |= {a.label, b.label}
    return reasons, explained


def known(claim: str, columns: list[Column]) -> list[str]:
    """The known changes of `claim` between the columns' torch releases, in words."""
    found = releases.between(claim, [(c.device, c.torch) for c in columns])
    return [releases.in_words(name) for name, _change in found]
