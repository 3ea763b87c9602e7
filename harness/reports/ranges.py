"""`amp-harness compare --range A..B`: what changed when, over every session of record from A to
B (inclusive) of A's hardware class, read from the journal as `compare` reads two sessions.

Each session of the range is compared (harness.reports.compare.compare, the one comparison) with
what stood before it: the session before it, where that one ran the whole suite; where it ran
part of it (-k, killed part-way), the tests it did not run stand as the sessions before it left
them, as a ledger column's do. Compared pair by pair alone, a `-k` run between two full sessions
would hide a change of the tests it left out: both of its comparisons leave them out.

What a step changed is what `compare` counts: a changed verdict, a lost decision, a metric it
flags (a key metric that moved beyond 4 significant digits, or a significant change over
repetitions), each of its kind and with why. The range's answer is per claim the sessions at
which one of them happened, oldest first; a claim that held says nothing.

Sessions marked experimental are no part of the range: those between A and B are passed over,
and A or B marked so is an error (as `baseline save` refuses one). Sessions of other classes
between them are not of the range: a range is one class's history.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from harness.common.errors import HarnessError
from harness.records import environments, journal_index
from harness.records.journal import Journal
from harness.records.journal_index import short_id
from harness.reports import baseline, compare, kinds
from harness.reports.accepted import Entry
from harness.reports.comparison import Comparison

SEPARATOR = ".."
FIX = "`amp-harness sessions` lists each session's id and class, oldest first"


@dataclass(frozen=True)
class Step:
    """One session of the range compared with what stood before it."""

    session: str  # its id
    name: str
    started: float
    torch: str
    comparison: Comparison | None  # None for A: nothing before it is of the range

    @property
    def label(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.started))
        return f"{when} {short_id(self.session)} ({self.name}, torch {self.torch})"

    def changes(self) -> list:
        """What the comparison counts as a change, by kind (harness.reports.kinds.ORDER)."""
        found = self.comparison
        return [c for kind in kinds.ORDER for c in found.changes_of(kind)] if found else []


@dataclass(frozen=True)
class Range:
    spec: str  # as given: A..B
    hardware_class: str
    first: Step  # A, compared with nothing
    steps: list[Step]  # every later session of the range, oldest first

    def by_claim(self) -> dict[str, list[tuple[Step, object]]]:
        """Per claim, (the step, the change) at each session that changed it, oldest first;
        claims in the order they first changed."""
        found: dict[str, list[tuple[Step, object]]] = {}
        for step in self.steps:
            for change in step.changes():
                for claim in change.claims_changed() or ("(no claim)",):
                    found.setdefault(claim, []).append((step, change))
        return found

    def lines(self) -> list[str]:
        """The range in words: what it holds, per claim each change at its session, then what
        was compared."""
        sessions = len(self.steps) + 1
        releases = ", ".join(dict.fromkeys(s.torch for s in [self.first, *self.steps]))
        lines = [
            f"range {self.spec}: {sessions} sessions of record of class {self.hardware_class}, "
            f"torch {releases}, each compared with what stood before it",
            f"from {self.first.label}",
            f"to   {self.steps[-1].label}",
        ]
        changed = self.by_claim()
        for claim, found in changed.items():
            lines.append(claim)
            lines += [f"  {step.label}: {change.describe()}" for step, change in found]
        lines += [
            f"nothing compared at {step.label}: {step.comparison.summary_line()}"
            for step in self.steps
            if step.comparison and not step.comparison.overlapped
        ]
        verdicts = sum(s.comparison.compared["verdicts"] for s in self.steps if s.comparison)
        compared = f"{len(self.steps)} steps, {verdicts} verdicts compared"
        if not changed:
            lines.append(f"no verdict, decision or key metric changed over the range ({compared})")
        else:
            at = len({step.session for found in changed.values() for step, _change in found})
            lines.append(f"{len(changed)} claims changed, at {at} of the sessions ({compared})")
        return lines

    def to_json(self) -> dict:
        return {
            "range": self.spec,
            "hardware_class": self.hardware_class,
            "sessions": [_session_json(step) for step in [self.first, *self.steps]],
            "changes": {
                claim: [
                    {
                        **_session_json(step),
                        "kind": change.attribution.kind,
                        "change": change.describe(),
                    }
                    for step, change in found
                ]
                for claim, found in self.by_claim().items()
            },
            "steps": [
                {
                    **_session_json(step),
                    "summary": step.comparison.summary_line(),
                    "overlapped": step.comparison.overlapped,
                }
                for step in self.steps
            ],
        }


def _session_json(step: Step) -> dict:
    return {"session": step.session, "name": step.name, "started": step.started,
            "torch": step.torch}  # fmt: skip


def over(
    journal: Journal,
    spec: str,
    threshold: float = compare.THRESHOLD,
    accepted: Iterable[Entry] = (),
) -> Range:
    """The range `spec` (A..B) of the journal: each of its sessions compared with what stood
    before it."""
    chosen, hardware_class = sessions(journal, spec)
    summaries = [baseline.summarize(journal, sid) for sid in chosen]
    accepted = list(accepted)
    first = _step(None, summaries[0], threshold, accepted)
    steps, standing = [], summaries[0]
    for summary in summaries[1:]:
        steps.append(_step(standing, summary, threshold, accepted))
        standing = _standing(standing, summary)
    return Range(spec, hardware_class, first, steps)


def sessions(journal: Journal, spec: str) -> tuple[list[str], str]:
    """The ids of the range's sessions, oldest first, and its class; a HarnessError naming the
    fix for a range that is not one."""
    a, b = _ends(spec)
    found = journal.index()
    if not found:
        raise baseline.nothing_recorded(journal.path)
    try:
        first, last = (baseline.find_session(found, end, journal.path) for end in (a, b))
    except HarnessError as exc:  # it names the latest sessions, and where all are listed
        raise HarnessError(f"--range {spec}: {exc}") from None
    order = list(found)
    entries = [found[first].entry, found[last].entry]
    for end, entry in zip((a, b), entries, strict=True):
        if journal_index.is_experimental(entry):
            raise HarnessError(
                f"--range {spec}: session {_named(entry)} is marked "
                f"{baseline.experimental_text(entry)}: a range is of the team's record. Give "
                f"another session for {end!r}, or mark it of record (`amp-harness sessions mark "
                f"{short_id(entry['session_id'])} record`); {FIX}"
            )
    if first == last:
        raise HarnessError(
            f"--range {spec}: A and B are one session, {_named(entries[0])}: give two, the older "
            f"first; {FIX}"
        )
    if order.index(first) > order.index(last):
        raise HarnessError(
            f"--range {spec}: B, {_named(entries[1])}, began before A, {_named(entries[0])}: give "
            f"the older first, --range {b}{SEPARATOR}{a}"
        )
    classes = [environments.hardware_class(e["fingerprint"]) for e in entries]
    if classes[0] != classes[1]:
        raise HarnessError(
            f"--range {spec}: A ran on class {classes[0]} and B on {classes[1]}: a range is one "
            f"class's history; give two sessions of one class ({FIX}), or compare the two with "
            "`amp-harness compare A B`"
        )
    between = order[order.index(first) : order.index(last) + 1]
    chosen = [
        sid
        for sid in between
        if environments.hardware_class(found[sid].entry["fingerprint"]) == classes[0]
        and not journal_index.is_experimental(found[sid].entry)
    ]
    return chosen, classes[0]


def _ends(spec: str) -> tuple[str, str]:
    a, separator, b = spec.partition(SEPARATOR)
    if not separator or not a or not b or SEPARATOR in b:
        raise HarnessError(
            f"--range {spec}: give two sessions as A..B, the older first (ids or unique "
            f"prefixes, e.g. --range 0123abcd..4567cdef); {FIX}"
        )
    return a, b


def _named(entry: dict) -> str:
    return f"{short_id(entry['session_id'])} ({entry['name']})"


def _step(before: dict | None, summary: dict, threshold: float, accepted: list[Entry]) -> Step:
    """`summary` compared with what stood `before` it (None: nothing, the range's first)."""
    labels = (f"what stood before {short_id(summary['session_id'])}", summary["name"])
    return Step(
        session=summary["session_id"],
        name=summary["name"],
        started=summary["started"],
        torch=environments.fact(summary["fingerprint"], "torch"),
        comparison=None
        if before is None
        else compare.compare(before, summary, threshold, labels=labels, accepted=accepted),
    )


def _standing(before: dict, after: dict) -> dict:
    """What stands after the session `after`: itself, where it is a complete run of the suite;
    where it lacks something (part of the suite, killed), the tests it did not run as `before`
    left them."""
    if not after["lacks"]:
        return after
    ran = after["tests"].keys()
    carried = [v for v in before["verdicts"] if v["test"] not in ran]
    return {
        **after,
        "tests": {**before["tests"], **after["tests"]},
        "verdicts": carried + after["verdicts"],
    }
