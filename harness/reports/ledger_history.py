"""Each hardware class's history, as the ledger reads it: what every session of record said of
each claim it ran, and the key metrics it measured, from the runs the ledger read (no query of
its own). Apart from harness.reports.history, which sees only what each session said (a `Point`)
and never an MLflow run, and from harness.reports.ledger_columns: a column keeps each test's
latest run, a history every session's.
"""

from __future__ import annotations

from collections import defaultdict

from harness.catalogue import verdicts
from harness.catalogue.claims import catalogue
from harness.records import environments as envs
from harness.records import record
from harness.reports import atlas, history, ledger_sessions
from harness.reports.ledger import COLOURS, MIXED, Session, kind


def per_class(runs: list, link) -> list[history.ClassHistory]:
    """Per hardware class, what each session of record said of each claim it ran
    (harness.reports.history), from the runs the ledger read: no query of its own.

    A session of part of the suite (-k, killed part-way) says nothing of the tests it did not
    run: where it ran some of a claim's tests, the claim's verdict takes the others' from the
    class's sessions since its latest complete one, as a ledger column does, so that a `-k` run
    of one test never reads as a change of a claim of several."""
    by_class: dict[str, list[history.Point]] = defaultdict(list)
    standing: dict[str, dict] = {}  # class -> test -> its latest run
    for facts, session in sorted(
        ledger_sessions.sessions(runs, link), key=lambda found: found[1].started
    ):
        ordered = sorted(session.runs, key=lambda r: r.info.start_time)
        ran = {
            ledger_sessions.test_of(r): r
            for r in ordered
            if not ledger_sessions.partly_logged(r) and not ledger_sessions.interrupted(r)
        }
        if not ran:
            continue  # it decided nothing: no point, and the class's standing is unchanged
        name = envs.hardware_class(facts)
        standing[name] = {**standing.get(name, {}), **ran} if session.incomplete else ran
        by_class[name].append(_point(session, ran, standing[name]))
    return history.build(by_class)


def _point(session: Session, ran: dict, standing: dict) -> history.Point:
    """What `session` said of each claim of the tests it `ran`: the claim's verdict across its
    tests as they stand after it (`standing`), and the key metrics it measured."""
    tests_of: dict[str, list] = defaultdict(list)
    for run in standing.values():
        for claim in ledger_sessions.claims(run):
            tests_of[claim].append(run)
    metrics: dict[str, dict[str, float]] = defaultdict(dict)
    for test, run in ran.items():
        key = atlas.per_claim(test, record.key_metrics(run.data.params, run.data.metrics))
        for claim in ledger_sessions.claims(run):
            metrics[claim].update({f"{test}: {name}": number for name, number in key.items()})
    claims = dict.fromkeys(claim for run in ran.values() for claim in ledger_sessions.claims(run))
    said = {
        c: _drawn(verdicts.aggregate(ledger_sessions.status(r, c) for r in tests_of[c]))
        for c in claims
    }
    return history.Point(
        session=session.id,
        name=session.name,
        when=session.when,
        started=session.started,
        torch=envs.fact(session.facts, "torch"),
        url=session.url,
        verdicts=said,
        metrics=dict(metrics),
    )


def _drawn(verdict: verdicts.ClaimVerdict) -> tuple[str, str]:
    """A claim's verdict as the history draws it: (its label, its COLOURS key, or MIXED)."""
    found = kind(verdict)  # a ClaimVerdict has the stands, label and kind a Status has
    return verdict.label, found if found in COLOURS else MIXED


def rows(timeline: list[history.ClassHistory]) -> list[tuple]:
    """(claim, its track in each class: None where the class never ran it) for each claim of
    the catalogue that some class has a history of, in the ledger's order."""
    rows = []
    for claim in catalogue().values():
        tracks = [found.tracks.get(claim.id) for found in timeline]
        if any(tracks):
            rows.append((claim, tracks))
    return rows
