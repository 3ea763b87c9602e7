"""`amp-harness sessions`: the sessions of a journal, each with its id (what `compare` and
`baseline save --session` take), when it started, the commit and hardware class it ran on,
whether it ran the whole suite or part of it, and its tests' outcomes.

Read from the journal's index (harness.records.journal_index), never from its records: a year of
CI history (50,000 entries) lists as fast as `list` reads it, and the index already holds each
session's opening entry (the fingerprint) and its end (what it left out, its counts)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from harness.common import shown
from harness.records import environments
from harness.records.journal_index import Indexed, short_id
from harness.reports import table

# What a session ran: the whole scenario suite, part of it (-k, -m, tests named one by one,
# modules left out), or it never ended. Not "complete": for a baseline, a complete run also
# has no failed test (harness.reports.baseline.lacks); the counts say how its tests went.
WHOLE = "whole suite"
PARTIAL = "partial"
UNFINISHED = "unfinished"
# Outcomes in the order a reader looks for them; any other (a newer version's) after them.
OUTCOMES = ("passed", "failed", "error", "capability-regression", "interrupted", "skipped")


@dataclass(frozen=True)
class SessionRow:
    id: str
    name: str
    started: float  # seconds since the epoch, as the journal holds it
    commit: str
    hardware_class: str
    run: str  # WHOLE, PARTIAL or UNFINISHED
    left_out: list[str]  # what a partial session did not run; why an unfinished one is
    counts: dict[str, int]  # tests by outcome

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def when(self) -> str:
        """When it started, in local time to the minute."""
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(self.started))


def rows(sessions: dict[str, Indexed]) -> list[SessionRow]:
    """A row per session of the index (harness.records.journal.Journal.index), oldest first."""
    return [_row(sid, session) for sid, session in sessions.items()]


def _row(sid: str, session: Indexed) -> SessionRow:
    facts = session.entry["fingerprint"]
    end = session.end
    if end is None:
        run, left_out = UNFINISHED, ["it did not end: killed, or still running"]
        counts = {"recorded": len(session.records)}
    else:
        left_out = [str(what) for what in end.get("left_out", [])]
        run, counts = (PARTIAL if left_out else WHOLE), dict(end["counts"])
    return SessionRow(
        id=sid,
        name=session.entry["name"],
        started=session.entry["started"],
        commit=environments.fact(facts, "git_commit"),
        hardware_class=environments.hardware_class(facts),
        run=run,
        left_out=left_out,
        counts=counts,
    )


def counts_text(counts: dict[str, int]) -> str:
    """`54 passed, 5 skipped`: the outcomes in OUTCOMES' order."""
    order = {outcome: i for i, outcome in enumerate(OUTCOMES)}
    ranked = sorted(counts.items(), key=lambda item: (order.get(item[0], len(order)), item[0]))
    return ", ".join(f"{n} {outcome}" for outcome, n in ranked) or "no test recorded"


def blocks(found: list[SessionRow], width: int) -> list[str]:
    """Two lines a session, wrapped at `width`: its id, start, run and counts; then its commit
    and hardware class, and what a partial or unfinished one left out."""
    lines = []
    for row in found:
        lines += table.indented(
            shown.visible(f"{short_id(row.id)}  {row.when}  {row.run}  {counts_text(row.counts)}"),
            width,
            "",
            whole_words=True,
        )
        detail = f"commit {row.commit}, {row.hardware_class}"
        if row.left_out:
            detail += f"; {'; '.join(row.left_out)}"
        lines += table.indented(shown.visible(detail), width, table.INDENT, whole_words=True)
    return lines


def grid(found: list[SessionRow], title: str):
    """A rich Table of the rows (a wide terminal), every cell shown as data."""
    from rich.table import Table

    drawn = Table(title=shown.text(title))
    for name in ("session", "started", "commit", "hardware class", "run", "tests"):
        drawn.add_column(name, overflow="fold")
    for row in found:
        run = row.run + (f": {'; '.join(row.left_out)}" if row.left_out else "")
        cells = (short_id(row.id), row.when, row.commit, row.hardware_class, run,
                 counts_text(row.counts))  # fmt: skip
        drawn.add_row(*map(shown.text, cells))
    return drawn
