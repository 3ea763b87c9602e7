"""The kind of a difference between two environments, as the upgrade gate sorts it.

Upgrading torch changes things the project knows of; the gate exists to find what it does not.
Every change `compare` counts (a changed verdict, a lost decision, a flagged metric) is one of:

- hardware: the hardware classes differ in what its tests depend on
  (harness.reports.attribution);
- predicted: a known change of the releases between the two covers it, and the later run's test
  passed, so its scenario predicted the new behaviour: a measured change of behaviour
  (harness.lab.releases) of its claim, or, for the autocast atlas, an op the two releases'
  documentation lists otherwise (harness/lab/autocast/lists.toml: the atlas holds each release
  to its own docs, so an op whose docs moved stops or starts holding), or, for a decision
  that became a skip, a capability the other release has and this one lacks (the harness
  expects it only from another release, or it would have recorded a capability regression);
- gained: decided now where the other run had not decided it (skipped: a capability gained);
- accepted: a reviewed entry of the accepted-changes file covers it (harness.reports.accepted);
- unexplained: none of these. Only the unexplained fail a gate; each kind is shown apart.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from harness.catalogue.claims import ledger
from harness.lab import releases
from harness.lab.autocast import docs as autocast_docs
from harness.records import environments
from harness.reports import atlas
from harness.reports.accepted import Entry

HARDWARE, PREDICTED, GAINED, ACCEPTED, UNEXPLAINED = (
    "hardware", "predicted", "gained", "accepted", "unexplained",
)  # fmt: skip
# In the order they are shown, the one that fails first.
ORDER = (UNEXPLAINED, PREDICTED, GAINED, ACCEPTED, HARDWARE)
TITLE = {
    UNEXPLAINED: "unexplained",
    PREDICTED: "predicted by a known change of the release",
    GAINED: "gained (decided now, not decided before)",
    ACCEPTED: "accepted (a reviewed entry)",
    HARDWARE: "explained by the hardware",
}


@dataclass(frozen=True)
class Attribution:
    """Why a change may have happened: its kind, and why, in words."""

    kind: str
    why: str

    @property
    def explained(self) -> bool:
        """Shown, never a regression."""
        return self.kind != UNEXPLAINED


@dataclass
class Sorter:
    """Sorts the changes of one comparison (run A against run B) into kinds, and keeps which
    accepted entries covered what, to say the ones that covered nothing or expired."""

    facts_a: Mapping[str, str]
    facts_b: Mapping[str, str]
    accepted: Iterable[Entry] = ()
    today: datetime.date = field(default_factory=datetime.date.today)
    documented_tests: set[str] = field(default_factory=set)  # atlas tests whose docs moved
    _matched: dict[Entry, list[str]] = field(default_factory=dict, init=False)
    _lost: str = field(
        default="", init=False
    )  # the capabilities A's release has and B's lacks, in words

    def __post_init__(self) -> None:
        torch_a, torch_b = (environments.fact(f, "torch") for f in (self.facts_a, self.facts_b))
        hardware_class = environments.hardware_class(self.facts_b)
        self.accepted = [e for e in self.accepted if e.covers(torch_a, torch_b, hardware_class)]
        lost = _lost_capabilities(self.facts_a, self.facts_b) if torch_a != torch_b else []
        if lost:
            self._lost = (
                f"torch {torch_b} lacks what torch {torch_a} has ({', '.join(lost)}): the "
                "harness expects it only from another release, so its tests skip"
            )

    def sort(
        self,
        found: Attribution,
        claims: Iterable[str],
        metric: str | None = None,
        *,
        test: str = "",
        held: bool,
        gained: bool,
        skipped: bool = False,
    ) -> Attribution:
        """The kind of a change of `claims` in `test` (of `metric`, for a metric's change) whose
        hardware attribution is `found`. `held`: the later run's test passed (or skipped where
        it could not run), so its scenario's prediction for that release held; `gained`: B
        decided what A did not; `skipped`: A decided what B skipped (not as a capability
        regression)."""
        claims = tuple(claims)
        known = self._known(claims, test, metric) if held else []
        if skipped and self._lost:
            known.append(self._lost)
        covering = [e for e in self.accepted if e.matches(claims, metric)]
        current = [e for e in covering if not self._expired(e)]
        expired = [e for e in covering if self._expired(e)]
        sorted_out = self._kind(found, known, gained)
        if sorted_out is None and current:
            entry = current[0]
            sorted_out = Attribution(ACCEPTED, f"accepted in {entry.where} by {entry.terms()}")
        if sorted_out is None:
            sorted_out = Attribution(
                UNEXPLAINED,
                found.why + "".join(f"; {e.where} accepted it until {e.expires}" for e in expired),
            )
        for entry in covering:
            self._matched.setdefault(entry, []).append(sorted_out.kind)
        return sorted_out

    def _known(self, claims: tuple[str, ...], test: str, metric: str | None) -> list[str]:
        """The known changes between the releases that predict this change, in words."""
        found = predicted(claims, self.facts_a, self.facts_b)
        if metric is not None:
            found += [m for m in [documented_move(test, metric, self.facts_a, self.facts_b)] if m]
        elif test in self.documented_tests:
            found.append(
                "the documented autocast lists of the two releases differ for the ops whose "
                "holding changed (each named among the metric changes)"
            )
        return found

    def _kind(self, found: Attribution, known: list[str], gained: bool) -> Attribution | None:
        if found.explained:
            return found
        if known:
            return Attribution(PREDICTED, f"{TITLE[PREDICTED]}: {' '.join(known)}")
        if gained:
            return Attribution(
                GAINED, f"{TITLE[GAINED]}: the other run did not decide it (a capability gained)"
            )
        return None

    def _expired(self, entry: Entry) -> bool:
        return entry.expired(self.today)

    def notes(self) -> list[str]:
        """The accepted entries that cover this comparison and did not accept a change: expired,
        covering nothing (the change no longer occurs), or covering only what another kind
        explains already."""
        found = []
        for entry in self.accepted:
            kinds = self._matched.get(entry, [])
            if self._expired(entry):
                found.append(
                    f"{entry}: expired on {entry.expires}"
                    + (": its change counts as unexplained again" if kinds else "")
                )
            elif not kinds:
                found.append(f"{entry}: no such change here: it no longer occurs; remove it")
            elif ACCEPTED not in kinds:
                named = ", ".join(sorted(set(kinds)))
                found.append(f"{entry}: not needed here: the change it covers is {named} already")
        return found


def _lost_capabilities(facts_a: Mapping[str, str], facts_b: Mapping[str, str]) -> list[str]:
    """The capabilities A's fingerprint saw work and B's did not."""
    return sorted(
        name.removeprefix(environments.CAPABILITY)
        for name, seen in environments.capabilities(facts_a).items()
        if seen == "yes" and environments.fact(facts_b, name) != "yes"
    )


def _sides(facts_a: Mapping[str, str], facts_b: Mapping[str, str]) -> list[tuple[str, str]]:
    """(device, torch) of each environment; "n/a" where a fingerprint lacks one."""
    return [
        (environments.fact(f, "device"), environments.fact(f, "torch")) for f in (facts_a, facts_b)
    ]


def documented_move(
    test: str, metric: str, facts_a: Mapping[str, str], facts_b: Mapping[str, str]
) -> str | None:
    """For the autocast atlas's `holds/<op>` of `test`: that the two releases' documentation
    lists the op otherwise, in words; None where it lists it alike (or this is no such metric)."""
    if atlas.ATLAS_MODULE not in test or not metric.startswith(atlas.HOLDS):
        return None
    sides = _sides(facts_a, facts_b)
    if any("n/a" in side or side[0] not in autocast_docs.DEVICES for side in sides):
        return None
    op = metric.removeprefix(atlas.HOLDS)
    documented = [autocast_docs.documented(device, torch) for device, torch in sides]
    lists = [
        autocast_docs.listed(op, d, device)
        for d, (device, _) in zip(documented, sides, strict=True)
    ]
    if lists[0] == lists[1]:
        return None
    return (
        f"the documented autocast lists moved {op}: {lists[0]} in torch {documented[0].release}'s "
        f"docs, {lists[1]} in {documented[1].release}'s (harness/lab/autocast/lists.toml)"
    )


def predicted(
    claims: Iterable[str], facts_a: Mapping[str, str], facts_b: Mapping[str, str]
) -> list[str]:
    """The known changes of the releases (harness.lab.releases) between the two environments
    that cover any of `claims`, and the known bugs among them that the ledger says one release
    has and the other not (harness.catalogue.known_bugs), in words."""
    sides = _sides(facts_a, facts_b)
    if any("n/a" in side for side in sides):  # a hand-written baseline: no release to place
        return []
    found = [releases.in_words(name) for c in claims for name, _ in releases.between(c, sides)]
    bugs = ledger()
    found += [bugs[c].between_in_words(sides) for c in claims if c in bugs]
    return list(dict.fromkeys(f for f in found if f))
