"""What a recorded verdict is worth once its test's outcome is known, and one claim's verdict
across several tests: one written rule, used alike by the verdict table, `amp-harness list`, the
report, baselines and comparisons.

One test, one claim. A verdict stands only when its test passed. Otherwise the outcome is shown
with it and voids it:
- the test skipped: `skipped`, its reason as the evidence;
- a capability this build and hardware should have was missing: `capability regression`;
- the test failed, errored or was interrupted: `failed (was: partly)` where it had recorded
  `partly` before failing, `failed (no verdict)` where it had recorded nothing.

A compiled claim's test whose every compiled arm failed to compile records `cannot compile`: an
outcome of its own, about the compiler and not the claim, shown apart (a kind of its own, never
standing as a verdict); an arm that cannot compile beside arms that did is left out of their
verdict and named in the evidence (`over_arms`).

One claim, several tests (the rule, in order):
1. A failure is never hidden: any test failed -> `failed (1 of 3 tests)`; else any capability
   regression -> `capability regression (1 of 3 tests)`. With one test, its own status:
   `failed (was: partly)`.
2. Decided beats skipped: the verdicts that stand, if they all agree -> that verdict.
3. Disagreement is shown: verdicts that stand but differ -> `mixed (partly, refuted)`.
4. Else any `cannot compile` -> `cannot compile`; only skips -> `skipped`. No test at all -> no
   verdict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

DECIDED = ("confirmed", "refuted", "partly", "inconclusive")
CANNOT_COMPILE = "cannot compile"  # recorded where no compiled arm compiled: not a verdict
CAPABILITY_REGRESSION = "capability-regression"  # a record's outcome, beside pytest's
# Each kind of status, in the order rule 1 ranks them.
FAILED, REGRESSION, DECIDED_KIND, SKIPPED = "failed", "capability regression", "decided", "skipped"
UNCOMPILED = CANNOT_COMPILE  # the kind of a `cannot compile` status: its label, shown apart
RECORDABLE = (*DECIDED, SKIPPED, CANNOT_COMPILE)  # what a test may record for a claim
# Every outcome a record may end with: pytest's, and the harness's own (in the order
# `amp-harness sessions` counts them).
OUTCOMES = ("passed", "failed", "error", CAPABILITY_REGRESSION, "interrupted", SKIPPED)
# Every word a test may record on a claim: a decision, a skip, or that nothing compiled.
RECORDABLE = (*DECIDED, SKIPPED, CANNOT_COMPILE)


@dataclass(frozen=True)
class Status:
    """One test's verdict on one claim, as it counts."""

    kind: str  # FAILED, REGRESSION, DECIDED_KIND or SKIPPED
    label: str  # what is shown: "partly", "skipped", "failed (was: partly)", ...
    recorded: str | None  # the verdict the test recorded, whatever its outcome
    evidence: str  # the recorded evidence, or why there is none that counts
    test: str = ""
    device: str = ""  # the device the test ran on, where known

    @property
    def stands(self) -> bool:
        return self.kind == DECIDED_KIND


def status(
    recorded: str | None, evidence: str, outcome: str, message: str = "", test: str = ""
) -> Status:
    """How the verdict `recorded` (None: none) of a test that ended `outcome` counts."""
    if outcome == "passed" and recorded in DECIDED:
        return Status(DECIDED_KIND, recorded, recorded, evidence, test)
    if outcome == "passed" and recorded == CANNOT_COMPILE:
        return Status(UNCOMPILED, CANNOT_COMPILE, recorded, evidence, test)
    if outcome == "skipped" or (outcome == "passed" and recorded == "skipped"):
        return Status(SKIPPED, "skipped", recorded, evidence or message, test)
    if outcome == CAPABILITY_REGRESSION:
        return Status(REGRESSION, REGRESSION, recorded, message, test)
    word = "interrupted" if outcome == "interrupted" else "failed"
    if recorded is None or outcome == "passed":  # passed without deciding: the plugin fails it
        return Status(FAILED, f"{word} (no verdict)", recorded, f"test {outcome}: {message}", test)
    return Status(
        FAILED,
        f"{word} (was: {recorded})",
        recorded,
        f"test {outcome}: {message}; recorded before that: {evidence}",
        test,
    )


def labels() -> dict[str, bool]:
    """Every label `status` gives, and whether it stands: the closed vocabulary of a summary's
    verdicts (harness.reports.baseline_format checks a baseline file against it). Made by
    `status` itself, from every verdict a test may record and every outcome, so that a new
    outcome or verdict word is in it once `status` knows it."""
    recorded = (*RECORDABLE, None)
    found = (status(verdict, "", outcome) for verdict in recorded for outcome in OUTCOMES)
    return {s.label: s.stands for s in found}


def recorded_in(label: str) -> str:
    """The verdict a status's label holds as recorded: "failed (was: partly)" and "interrupted
    (was: partly)" -> "partly"; any other label is itself ("confirmed", "skipped", ...)."""
    for word in ("failed", "interrupted"):
        prefix = f"{word} (was: "
        if label.startswith(prefix) and label.endswith(")"):
            return label[len(prefix) : -1]
    return label


def from_label(label: str, stands: bool, evidence: str, test: str = "") -> Status:
    """A status as a summary (harness.reports.baseline) keeps it: its label and whether it
    stands."""
    if stands:
        kind = DECIDED_KIND
    elif label.startswith(("failed", "interrupted")):
        kind = FAILED
    elif label == CANNOT_COMPILE:
        kind = UNCOMPILED
    else:
        kind = REGRESSION if label == REGRESSION else SKIPPED
    return Status(kind, label, label if stands else None, evidence, test)


def of_record(record) -> dict[str, Status]:
    """Each declared claim's status in one harness.records.record.Record."""
    out = {}
    for claim in record.claims:
        verdict = record.verdicts.get(claim)
        found = status(
            verdict.verdict if verdict else None,
            verdict.evidence if verdict else "",
            record.outcome,
            record.message,
            record.test,
        )
        out[claim] = dataclasses.replace(found, device=record.device)
    return out


@dataclass(frozen=True)
class ClaimVerdict:
    """One claim's verdict across the tests that check it, by the rule above."""

    label: str  # "refuted", "mixed (partly, refuted)", "failed", "skipped", ...
    kind: str  # the kind of status that decided the label ("decided" also for mixed)
    statuses: tuple[Status, ...]

    @property
    def stands(self) -> bool:
        """Decided by tests that all passed: a verdict a baseline may hold as valid."""
        return self.kind == DECIDED_KIND

    @property
    def device(self) -> str:
        """The devices its tests ran on."""
        return "; ".join(dict.fromkeys(s.device for s in self.statuses))

    @property
    def evidence(self) -> str:
        """One test's evidence; with several, a line per test naming it and its status."""
        if len(self.statuses) == 1:
            return self.statuses[0].evidence
        return "\n".join(
            f"[{s.label}] {s.test.split('::')[-1]}: {s.evidence}" for s in self.statuses
        )


def aggregate(statuses: Iterable[Status]) -> ClaimVerdict | None:
    statuses = tuple(statuses)
    if not statuses:
        return None
    for kind in (FAILED, REGRESSION):  # rule 1
        hit = [s for s in statuses if s.kind == kind]
        if len(statuses) == 1 and hit:
            return ClaimVerdict(hit[0].label, kind, statuses)
        if hit:
            return ClaimVerdict(f"{kind} ({len(hit)} of {len(statuses)} tests)", kind, statuses)
    standing = sorted({s.label for s in statuses if s.stands}, key=DECIDED.index)
    if len(standing) == 1:  # rule 2
        return ClaimVerdict(standing[0], DECIDED_KIND, statuses)
    if standing:  # rule 3
        return ClaimVerdict(f"mixed ({', '.join(standing)})", DECIDED_KIND, statuses)
    if any(s.kind == UNCOMPILED for s in statuses):  # rule 4
        return ClaimVerdict(CANNOT_COMPILE, UNCOMPILED, statuses)
    return ClaimVerdict(SKIPPED, SKIPPED, statuses)


def over_arms(failed: dict[str, bool | None]) -> str:
    """A compiled claim's verdict from its arms (backends): per arm whether the claim failed
    there, None where the arm could not compile. Over the arms that compiled: failed in none,
    confirmed; in all, refuted; else partly. No arm compiled: `cannot compile`."""
    compiled = [bad for bad in failed.values() if bad is not None]
    if not compiled:
        return CANNOT_COMPILE
    bad = sum(compiled)
    return "confirmed" if bad == 0 else "refuted" if bad == len(compiled) else "partly"


def by_claim(records) -> dict[str, ClaimVerdict]:
    """Each claim's verdict across `records` (Record objects), in the order first seen."""
    grouped: dict[str, list[Status]] = {}
    for record in records:
        for claim, found in of_record(record).items():
            grouped.setdefault(claim, []).append(found)
    return {claim: aggregate(found) for claim, found in grouped.items()}
