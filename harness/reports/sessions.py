"""`amp-harness sessions`: the sessions of a journal, each with its id (what `compare` and
`baseline save --session` take), when it started, the commit and hardware class it ran on,
whether it ran the whole suite or part of it, and its tests' outcomes.

Read from the journal's index (harness.records.journal_index), never from its records: a year of
CI history (50,000 entries) lists as fast as `list` reads it, and the index already holds each
session's opening entry (the fingerprint) and its end (what it left out, its counts).

`amp-harness sessions mark ID experimental|record` marks a session experimental after the fact,
or of record again (`mark`): a `session_mark` entry appended to the journal, which is never
edited, then the tags on its MLflow runs where the store answers (`amp-harness sync` sets them
later where it does not). Each row says whether its session is experimental, and why."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.catalogue import verdicts
from harness.common import shown
from harness.common.errors import HarnessError
from harness.records import environments, journal_index, tracking
from harness.records.journal import Journal
from harness.records.journal_index import EXPERIMENTAL, RECORD, Indexed, short_id
from harness.reports import baseline, table

# What a session ran: the whole scenario suite, part of it (-k, -m, tests named one by one,
# modules left out), or it never ended. Not "complete": for a baseline, a complete run also
# has no failed test (harness.reports.baseline.lacks); the counts say how its tests went.
WHOLE = "whole suite"
PARTIAL = "partial"
UNFINISHED = "unfinished"
# Outcomes in the order a reader looks for them (verdicts.OUTCOMES); any other (a newer
# version's) after them.
OUTCOMES = verdicts.OUTCOMES


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
    experimental: bool  # kept out of the team's record (journal_index.MARK)
    mark: dict | None  # its mark: {"state", "reason", "marked"}; None where never marked

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
        experimental=journal_index.is_experimental(session.entry),
        mark=journal_index.mark_of(session.entry),
    )


def _marked(row: SessionRow) -> str:
    """`experimental: REASON (marked 2025-06-01 10:00)` for an experimental session, else ""."""
    if not row.experimental:
        return ""
    text = baseline.experimental_text({journal_index.MARK: row.mark})
    if row.mark["marked"] != row.started:  # marked after the fact, not by --amp-experimental
        text += f" (marked {time.strftime('%Y-%m-%d %H:%M', time.localtime(row.mark['marked']))})"
    return text


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
        run = row.run + (f", {EXPERIMENTAL}" if row.experimental else "")
        lines += table.indented(
            shown.visible(f"{short_id(row.id)}  {row.when}  {run}  {counts_text(row.counts)}"),
            width,
            "",
            whole_words=True,
        )
        detail = f"commit {row.commit}, {row.hardware_class}"
        if row.left_out:
            detail += f"; {'; '.join(row.left_out)}"
        if row.experimental:
            detail += f"; {_marked(row)}"
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
        run += f"; {_marked(row)}" if row.experimental else ""
        cells = (short_id(row.id), row.when, row.commit, row.hardware_class, run,
                 counts_text(row.counts))  # fmt: skip
        drawn.add_row(*map(shown.text, cells))
    return drawn


def mark(journal: Journal, session_id: str, state: str, reason: str = "") -> tuple[dict, str]:
    """Mark the session `session_id` names (its id or a unique prefix) `state`, EXPERIMENTAL or
    RECORD, for `reason`: a `session_mark` entry appended to the journal, fsync'ed. Its entry as
    the index now reads it, and what was done, in words; nothing is appended where the session
    is marked so already, for the same reason."""
    if state not in (EXPERIMENTAL, RECORD):
        raise HarnessError(f"mark a session {EXPERIMENTAL} or {RECORD}, not {state!r}")
    sessions = journal.index()
    if not sessions:
        raise HarnessError(f"{journal.path}: no session recorded yet: nothing to mark")
    sid = baseline.find_session(sessions, session_id, journal.path)
    entry = sessions[sid].entry
    named = f"session {short_id(sid)} ({entry['name']})"
    now = journal_index.mark_of(entry) or journal_index.mark(RECORD, "", entry["started"])
    if now["state"] == state and reason in ("", now["reason"]):  # no new reason: nothing new
        what = baseline.experimental_text(entry) if state == EXPERIMENTAL else "of record"
        return entry, f"{named} is marked so already ({what}): the journal is left as it was"
    journal.append(journal_index.mark_entry(sid, state, reason, time.time()))
    entry = journal.index()[sid].entry
    if state == EXPERIMENTAL:
        return entry, (
            f"{named} marked {baseline.experimental_text(entry)}; it is kept out of the "
            "report's ledger, `baseline save` and the comparisons of `last` (`amp-harness "
            f"sessions mark {short_id(sid)} record` undoes it)"
        )
    return entry, f"{named} marked of record: part of the team's record again"


def tag_runs(entry: dict, uri: str, experiment: str, reports: Path) -> str:
    """The session's mark set on its runs in MLflow at `uri` (tracking.MlflowSink.mark_session),
    in words: how many were tagged, or why none could be and what tags them later (`amp-harness
    sync`: it tags a session's runs with the journal's mark)."""
    tags = tracking.mark_tags(entry)
    if not tags:  # marked of record, and never marked before: no run carries a mark to undo
        return "MLflow: nothing to tag (the session was never marked)"
    store = tracking.sqlite_path(uri)
    if store is not None and not store.is_file():
        return (
            f"MLflow: no store at {store} yet: the mark is in the journal, and `amp-harness "
            "sync` logs the session's runs tagged with it"
        )
    sink = tracking.MlflowSink(uri, experiment, reports)
    tagged = sink.mark_session(entry)
    if sink.down:
        return (
            f"MLflow: its runs are not tagged ({sink.down}); the mark is in the journal: "
            f"{sink.recovery()}, which tags them"
        )
    said = (
        f"MLflow: {tagged} runs of the session tagged {tracking.EXPERIMENTAL}="
        f"{tags[tracking.EXPERIMENTAL]} at {sink.label} (experiment {experiment!r})"
    )
    if tracking.is_running(reports, entry["session_id"]):
        said += (
            "; it still runs: the tests it logs from now on are tagged by `amp-harness sync` "
            "once it has ended"
        )
    return said
