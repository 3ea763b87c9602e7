"""What the known-bug ledger's reproductions showed, per environment, read back: the last
session of the journal and every committed baseline (`amp-harness known-bugs`, the report's
table), and what an upgrade from one release to another fixes, brings and keeps.

Each environment is a column: its hardware class, its torch, where it was read from, and for
each entry of the ledger what its test recorded (harness.catalogue.known_bugs: a `confirmed`
verdict is the bug present, `refuted` absent, in the ledger's words for that release). A verdict
whose test failed stays what it was, marked: the ledger did not predict it.

The baselines are read from the folder of committed baselines and its `known-bugs/` folder,
where a session of the reproductions alone is kept for each release (`amp-harness baseline save
--partial --baselines reports/baselines/known-bugs`): the full suite's baseline of a release and
its known-bug session are one environment, the newer of two verdicts taken.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.catalogue import known_bugs, verdicts
from harness.catalogue.claims import ledger
from harness.common.errors import HarnessError
from harness.common.versions import version_key
from harness.records.journal import Journal
from harness.reports import baseline

FOLDER = "known-bugs"  # beside the baselines: the sessions of the reproductions alone
NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class Cell:
    state: str  # the ledger's words: present, absent (fixed), ..., skipped, NOT_MEASURED
    evidence: str = ""
    stands: bool = True  # False: its test failed (the ledger did not predict it)


@dataclass
class Column:
    hardware_class: str
    torch: str
    source: str  # the baseline file or the session it was read from
    cells: dict[str, Cell] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.hardware_class} / torch {self.torch}"

    def state(self, bug: str) -> str:
        return self.cells.get(bug, Cell(NOT_MEASURED)).state


def column(summary: dict, source: str) -> Column:
    """The known-bug verdicts of one run (a baseline's or a session's summary)."""
    facts = summary.get("fingerprint", {})
    found = Column(facts.get("hardware_class", "?"), facts.get("torch", "?"), source)
    bugs = ledger()
    for verdict in summary.get("verdicts", []):
        entry = bugs.get(verdict.get("claim"))
        if entry is None:
            continue
        label = verdict.get("verdict", "")
        recorded = verdicts.recorded_in(label)
        state, stands = entry.state(recorded, found.torch), recorded == label
        found.cells[entry.id] = Cell(state, verdict.get("evidence", ""), stands)
    return found


def from_baselines(folder: Path) -> list[Column]:
    """Every committed environment holding a known-bug verdict, oldest torch first within each
    hardware class; a release's full baseline and its known-bug session merged into one."""
    merged: dict[tuple[str, str], Column] = {}
    paths = sorted(Path(folder).glob("*.json")) + sorted((Path(folder) / FOLDER).glob("*.json"))
    for path in paths:  # the known-bug sessions last: their verdicts are the newer
        read = column(baseline.read_baseline(path), str(path))
        if not read.cells:
            continue
        key = (read.hardware_class, read.torch)
        if key in merged:
            merged[key].cells.update(read.cells)
            merged[key].source += f" + {path.name}"
        else:
            merged[key] = read
    return sorted(merged.values(), key=lambda c: (c.hardware_class, version_key(c.torch)))


def from_journal(journal: Journal) -> Column | None:
    """The last session of record in the journal, or None where it ran no reproduction."""
    label, summary = baseline.load("last", journal)
    found = column(summary, label)
    return found if found.cells else None


def pick(columns: list[Column], release: str, hardware_class: str | None) -> list[Column]:
    """The columns of `release` ("2.13" or "2.13.0"), of one class where given."""
    wanted = version_key(release)
    chosen = [
        c
        for c in columns
        if version_key(c.torch)[: len(wanted)] == wanted
        and hardware_class in (None, c.hardware_class)
    ]
    if not chosen:
        have = sorted({f"{c.hardware_class} {c.torch}" for c in columns})
        raise HarnessError(
            f"no committed baseline holds known-bug verdicts for torch {release}"
            + (f" on {hardware_class}" if hardware_class else "")
            + f": the ones that do are {', '.join(have) or 'none'}"
        )
    return chosen


@dataclass(frozen=True)
class Upgrade:
    """What moving from one environment to another does to the known bugs."""

    before: Column
    after: Column
    fixes: list[str]
    introduces: list[str]
    keeps: list[str]
    unknown: list[str]  # not measured on one side: nothing said

    def sentence(self) -> str:
        def named(ids: list[str]) -> str:
            return ", ".join(ids) if ids else "none"

        return (
            f"Upgrading from {self.before.torch} to {self.after.torch} on "
            f"{self.after.hardware_class} fixes {named(self.fixes)}, introduces "
            f"{named(self.introduces)}, keeps {named(self.keeps)}"
            + (f"; not measured on both: {named(self.unknown)}" if self.unknown else "")
        )


def upgrade(before: Column, after: Column) -> Upgrade:
    fixes, introduces, keeps, unknown = [], [], [], []
    for bug in sorted(ledger()):
        a, b = before.state(bug), after.state(bug)
        present_a, present_b = a == known_bugs.PRESENT, b == known_bugs.PRESENT
        if not _measured(a) or not _measured(b):
            unknown.append(bug)
        elif present_a and present_b:
            keeps.append(bug)
        elif present_a:
            fixes.append(bug)
        elif present_b:
            introduces.append(bug)
    return Upgrade(before, after, fixes, introduces, keeps, unknown)


def _measured(state: str) -> bool:
    return state not in (NOT_MEASURED, "skipped")


def upgrades(columns: list[Column], release_a: str, release_b: str, cls: str | None) -> list:
    """One Upgrade per hardware class that holds both releases (of `cls` where given)."""
    older, newer = pick(columns, release_a, cls), pick(columns, release_b, cls)
    found = []
    for a in older:
        for b in newer:
            if b.hardware_class == a.hardware_class:
                found.append(upgrade(a, b))
    if not found:
        raise HarnessError(
            f"no hardware class holds known-bug verdicts of both torch {release_a} "
            f"({', '.join(c.hardware_class for c in older)}) and {release_b} "
            f"({', '.join(c.hardware_class for c in newer)})"
        )
    return found


@dataclass(frozen=True)
class Row:
    """A known bug in the report: its entry and its state in each ledger column."""

    bug: known_bugs.KnownBug
    states: list[str]

    def present(self, index: int) -> bool:
        return self.states[index] == known_bugs.PRESENT


def report_rows(rows: list, environments: list) -> list[Row]:
    """The report ledger's rows (claim, cells) of the known bugs, each cell in the ledger's
    words for its column's torch: the report's table of bugs x environments."""
    bugs = ledger()
    found = []
    for claim, cells in rows:
        entry = bugs.get(claim.id)
        if entry is None:
            continue
        states = []
        for cell, env in zip(cells, environments, strict=True):
            if cell.verdict is None:
                states.append(NOT_MEASURED)
                continue
            recorded = verdicts.recorded_in(cell.verdict.label)
            state = entry.state(recorded, env.facts.get("torch", ""))
            failed = recorded != cell.verdict.label
            states.append(f"{state} (its test failed)" if failed else state)
        found.append(Row(entry, states))
    if all(state == NOT_MEASURED for row in found for state in row.states):
        return []  # no column ran a reproduction: the report says so instead of a blank table
    return found
