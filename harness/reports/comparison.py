"""The comparison of two runs, as harness.reports.compare makes it: its changes (a changed
verdict, a lost decision, a metric change), each with why it may have happened (a
harness.reports.kinds.Attribution), and what they come to: the regressions --fail-on-regression
fails on, the changes of each other kind, and the lines and JSON that say so.

Apart from compare.py, which matches two runs into it: this model is what its readers hold (the
plugin's gate, the report, `compare --range`, `upgrade`, and harness.reports.comparison_view on
the terminal), and it imports none of them.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from harness.records.record import _jsonable
from harness.reports import kinds
from harness.reports.kinds import Attribution
from harness.reports.significance import percent


class _Attributed:
    """A change that carries its attribution: `describe()` ends with it, so that every line
    printed of a change (`regressions`, the plugin's end of session) says why."""

    attribution: Attribution

    def what(self) -> str:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.what()} -- {self.attribution.why}"

    def claims_changed(self) -> tuple[str, ...]:
        """The claims the change is reported against."""
        raise NotImplementedError


@dataclass(frozen=True)
class VerdictChange(_Attributed):
    claim: str
    test: str
    before: str
    after: str
    evidence_before: str
    evidence_after: str
    attribution: Attribution
    stands: tuple[bool, bool] = (True, True)  # whether A's and B's verdict stand

    def claims_changed(self) -> tuple[str, ...]:
        return (self.claim,)

    def what(self) -> str:
        return (
            f"{self.claim} ({self.test}): verdict {self.before} -> {self.after}: "
            f"{self.evidence_after}"
        )


@dataclass(frozen=True)
class MetricChange(_Attributed):
    test: str
    claims: tuple[str, ...]  # the claims the test decides: a change is reported against them
    metric: str  # repetitions collapsed: `mlp/amp-fp16/seed*/val_accuracy`
    before: tuple[float, ...]
    after: tuple[float, ...]
    relative: float  # (mean after - mean before) / |mean before|
    p_value: float | None  # Welch's t-test; None when it cannot be computed, `note` says why
    flagged: bool
    attribution: Attribution
    note: str = ""

    def claims_changed(self) -> tuple[str, ...]:
        return self.claims

    def what(self) -> str:
        why = (
            f"Welch p={self.p_value:.2g}, n={len(self.before)} vs {len(self.after)}"
            if self.p_value is not None
            else self.note
        )
        return (
            f"{', '.join(self.claims) or '(no claim)'} ({self.test}): metric {self.metric} "
            f"{_mean_text(self.before)} -> {_mean_text(self.after)} "
            f"({percent(self.relative)}, {why})"
        )


@dataclass(frozen=True)
class LostDecision(_Attributed):
    """A claim decided in the first run, and not decided in the second."""

    claim: str
    before: str  # the first run's verdict on the claim, across its tests
    after: str  # the second's: "skipped", "failed", "capability regression" or "missing"
    evidence: str
    attribution: Attribution

    def claims_changed(self) -> tuple[str, ...]:
        return (self.claim,)

    def what(self) -> str:
        return f"{self.claim}: decided ({self.before}) before, {self.after} now: {self.evidence}"


@dataclass
class Comparison:
    a: str  # what the first run is: a file, or a session's name
    b: str
    threshold: float
    alpha: float
    verdicts: list[VerdictChange]
    metrics: list[MetricChange]  # flagged first, then by the size of the change
    only_a: list[str]  # tests, verdicts and metrics one run has and the other lacks
    only_b: list[str]
    environment: dict[str, tuple[str, str]]  # fingerprint facts that differ
    compared: dict[str, int]  # verdicts and metrics present in both runs
    lost: list[LostDecision]  # claims decided in A, not in B
    not_compared: list[str]  # claims decided in A that B, a part of the suite, did not run
    b_lacks: list[str]  # what B says it lacks (a partial run)
    classes: tuple[str, str]  # the runs' hardware classes (harness.records.environments)
    causes: dict[str, list[str]]  # environments.causes: what differs, per cause
    legacy: tuple[str, ...] = ()  # "A", "B": a fingerprint from before hardware classes
    scenarios_changed: tuple[str, ...] = ()  # tests whose scenario file differs between the runs
    accepted_notes: tuple[str, ...] = ()  # accepted entries that expired or covered nothing

    @property
    def overlapped(self) -> bool:
        """Some verdict was in both runs: without one, "nothing changed" would mean nothing."""
        return self.compared["verdicts"] > 0

    @property
    def across_hardware(self) -> bool:
        return self.classes[0] != self.classes[1]

    def _counted(self) -> list[VerdictChange | LostDecision | MetricChange]:
        """The changes that would be regressions: changed verdicts, lost decisions, flagged
        metrics."""
        return [*self.verdicts, *self.lost, *(m for m in self.metrics if m.flagged)]

    @property
    def regressions(self) -> list[str]:
        """What --fail-on-regression fails on: every changed verdict, lost decision and flagged
        metric of no other kind than unexplained (harness.reports.kinds).

        A change either way counts: the harness predicts behaviour, it does not rank it."""
        return self.of_kind(kinds.UNEXPLAINED)

    @property
    def explained(self) -> list[str]:
        """The changes of every other kind: shown, never failing."""
        return [c.describe() for c in self._counted() if c.attribution.explained]

    def changes_of(self, kind: str) -> list[VerdictChange | LostDecision | MetricChange]:
        return [c for c in self._counted() if c.attribution.kind == kind]

    def of_kind(self, kind: str) -> list[str]:
        return [c.describe() for c in self.changes_of(kind)]

    def kind_lines(self) -> list[str]:
        """A line for each kind but the unexplained that has changes: how many, and of which
        claims ("predicted by a known change of the release: 3 (PIT2-NORM-HALF, ...)")."""
        lines = []
        for kind in kinds.ORDER:
            found = self.changes_of(kind)
            if found and kind != kinds.UNEXPLAINED:
                named = dict.fromkeys(claim for c in found for claim in c.claims_changed())
                lines.append(f"{kinds.TITLE[kind]}: {len(found)} ({', '.join(named)})")
        return lines

    def counts(self) -> dict[str, int]:
        """How many changes of each kind, in harness.reports.kinds.ORDER, those with none left
        out but the unexplained."""
        found = {kind: len(self.of_kind(kind)) for kind in kinds.ORDER}
        return {k: n for k, n in found.items() if n or k == kinds.UNEXPLAINED}

    @property
    def fails_the_gate(self) -> bool:
        """--fail-on-regression: a regression fails, and so does a comparison of nothing (a
        gate that compared no verdict has checked nothing, and must not pass)."""
        return bool(self.regressions) or not self.overlapped

    def hardware_notes(self) -> list[str]:
        """What a reader must know first about the hardware of the two runs, in words."""
        notes = []
        if self.across_hardware:
            notes.append(
                f"across hardware classes: {self.classes[0]} (A) vs {self.classes[1]} (B): a "
                f"change the hardware explains is shown, never a regression"
            )
        if self.legacy:
            sides = zip("AB", self.classes, strict=True)
            names = " and ".join(f"{side}'s {cls}" for side, cls in sides if side in self.legacy)
            notes.append(
                f"hardware class only a name: {names} (a fingerprint from before hardware "
                "classes: its CPU's instruction sets were not recorded); classes count as "
                "different only where the names differ"
            )
        return notes

    def summary_line(self) -> str:
        """One line: how much was compared and what came of it."""
        counts = f"{self.compared['verdicts']} verdicts, {self.compared['metrics']} metrics"
        if not self.overlapped:
            return f"no verdict of one run is in the other: nothing compared ({counts})"
        if not self.regressions and not self.explained:
            return f"no verdict changed, no decision lost, no metric flagged ({counts} compared)"
        explained = ""
        for kind, count in self.counts().items():
            if kind == kinds.UNEXPLAINED:
                continue
            explained += f"; {count} difference{'s' if count != 1 else ''} {kinds.TITLE[kind]}"
            if kind == kinds.HARDWARE:
                explained += f" ({self.classes[0]} vs {self.classes[1]})"
        return f"regressions: {len(self.regressions)}{explained} ({counts} compared)"

    def to_json(self) -> dict:
        return {
            "a": self.a,
            "b": self.b,
            "threshold": self.threshold,
            "alpha": self.alpha,
            "hardware_classes": list(self.classes),
            "across_hardware": self.across_hardware,
            "legacy_fingerprints": list(self.legacy),
            "hardware_notes": self.hardware_notes(),
            "environment": {k: list(v) for k, v in self.environment.items()},
            "causes": self.causes,
            "compared": self.compared,
            "regressions": self.regressions,
            "explained": self.explained,
            "kinds": {kind: self.of_kind(kind) for kind in kinds.ORDER},
            "accepted_notes": list(self.accepted_notes),
            "verdict_changes": [asdict(v) for v in self.verdicts],
            "metric_changes": [
                {
                    **asdict(m),
                    "claims": list(m.claims),
                    "before": [_jsonable(x) for x in m.before],
                    "after": [_jsonable(x) for x in m.after],
                    "relative": _jsonable(m.relative),
                }
                for m in self.metrics
            ],
            "only_in_a": self.only_a,
            "only_in_b": self.only_b,
            "lost_decisions": [asdict(d) for d in self.lost],
            "not_compared": self.not_compared,
            "b_lacks": self.b_lacks,
            "scenarios_changed": list(self.scenarios_changed),
            "overlapped": self.overlapped,
        }


def _mean_text(values: tuple[float, ...]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.4g}" if len(values) == 1 else f"{mean:.4g} (mean of {len(values)})"
