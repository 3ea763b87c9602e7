"""The sessions MLflow holds, as the ledger reads them: the runs grouped by session, whether
each is complete or marked experimental, and what a test run says.

When a session is complete. Its parent run ended: status
FINISHED or FAILED (FAILED: a test failed, the session still ran to its end), an end time, the
`tests.*` counts `MlflowSink._end_session` logs at the end, MLflow holds every test those counts
name, and none of them is only partly logged (`amp.complete=false`). Any other session is
incomplete: still RUNNING (killed, crashed, or running now: nothing ended it), KILLED (Ctrl-C,
or ended by `amp-harness sync` as killed, with its `amp.end_reason`), one that ran part of the
suite (`amp.left_out`: -k, a module not run) or ended on pytest's internal or usage error
(`amp.exitstatus` 3 or 4), or lacking tests the tracking server never fully received
(`amp-harness sync` sends them).

A session marked experimental (its runs tagged `amp.experimental=true`: pytest's
--amp-experimental, `amp-harness sessions mark`) is no part of the team's record: none of its runs
is a column's latest, nor counts for the claims covered; its sessions are listed apart, with why,
above the ledger and in summary.md, never left out silently.

Apart from harness.reports.ledger_columns and ledger_history, which both build on these sessions
(a column per environment, a history per class): the rules for a session and a run are read once.
"""

from __future__ import annotations

from harness.catalogue import verdicts
from harness.records import environments as envs
from harness.records import tracking

# Tags harness.records.tracking writes; runs logged by older versions have none of them.
from harness.records.tracking import (
    COMPLETE,
    END_REASON,
    EXIT_STATUS,
    EXPERIMENTAL,
    EXPERIMENTAL_REASON,
    LEFT_OUT,
)
from harness.reports.ledger import Session, ago, plural

ENDED = ("FINISHED", "FAILED")  # parent run statuses of a session that ran to its end


def sessions(runs: list, link) -> list[tuple[dict[str, str], Session]]:
    """Every harness session in `runs`, with its env.* facts: its parent run's, or its tests'
    where MLflow has no parent run."""
    groups: dict[str, list] = {}
    for run in runs:
        tags = run.data.tags
        sid = tags.get("amp.session_id")
        if tags.get("amp.kind") in ("session", "test") and sid:
            groups.setdefault(sid, []).append(run)  # else: not a harness run
    found: dict[str, dict] = {}
    for sid, group in groups.items():
        # Where a retried runs/create made two parent runs (issue 24), the session's is the one
        # tracking.main_parent names; the other is neither the session nor one of its tests.
        parent = tracking.main_parent(group)
        tests = [r for r in group if r.data.tags.get("amp.kind") == "test"]
        found[sid] = {
            "env": _env(parent or group[0]),
            "started": min(r.info.start_time for r in [parent, *tests] if r),
            "parent": parent,
            "tests": tests,
        }
    return [
        (
            s["env"],
            Session(
                name=s["parent"].info.run_name if s["parent"] else sid,
                url=link(s["parent"].info.run_id) if s["parent"] else None,
                started=s["started"] / 1000,
                commit=s["env"].get("git_commit", "unknown"),
                incomplete=_incomplete(s["parent"], s["tests"]),
                runs=s["tests"],
                facts=s["env"],
                experimental=_experimental(s["parent"], s["tests"]),
                id=sid,
            ),
        )
        for sid, s in found.items()
    ]


def _env(run) -> dict[str, str]:
    return {k[4:]: v for k, v in run.data.tags.items() if k.startswith("env.")}


def _incomplete(parent, tests: list) -> str:
    """Why a session is incomplete, with what it recorded; "" for a complete one (the module
    docstring's rule). `parent`: its session run, None where MLflow has none."""
    recorded = f"{plural(len(tests), 'test')} recorded"
    if parent is None:
        return f"no session run in MLflow; {recorded}"
    status = parent.info.status
    if status == "KILLED":
        why = parent.data.tags.get(END_REASON) or "killed or interrupted (MLflow status KILLED)"
        return f"{why}; {recorded}"
    if status not in ENDED or not parent.info.end_time:
        return f"did not end (MLflow status {status}): killed, crashed or still running; {recorded}"
    if parent.data.tags.get(LEFT_OUT):  # -k, a module not run: its other claims say nothing
        return f"ran part of the suite ({parent.data.tags[LEFT_OUT]}); {recorded}"
    if parent.data.tags.get(EXIT_STATUS) in ("3", "4"):  # pytest: internal error, usage error
        return f"ended on pytest exit status {parent.data.tags[EXIT_STATUS]}; {recorded}"
    counted = sum(int(v) for k, v in parent.data.metrics.items() if k.startswith("tests."))
    if tests and not counted:  # _end_session logs the counts before the status: not its end
        return f"ended without its tests.* counts; {recorded}"
    if counted > len(tests):  # the server went down during the session
        return (
            f"MLflow has {len(tests)} of the {counted} tests it ran: `amp-harness sync` sends "
            "the rest from the journal"
        )
    half = sum(run.data.tags.get(COMPLETE) == "false" for run in tests)
    if half:  # a process killed while it logged them: their metrics or files may be missing
        return (
            f"{half} of its {len(tests)} test runs only partly logged: `amp-harness sync` logs "
            "them again from the journal"
        )
    return ""


def _experimental(parent, tests: list) -> str | None:
    """Why the session of these runs is marked experimental ("" where no reason was given), as
    its parent run says (its tests where MLflow has none); None where it is of record."""
    for run in [parent] if parent else tests:
        if run.data.tags.get(EXPERIMENTAL) == "true":
            return run.data.tags.get(EXPERIMENTAL_REASON, "")
    return None


def apart(runs: list, link, now: float) -> tuple[list, list[tuple[str, Session]]]:
    """The runs of the team's record, and the sessions marked experimental, kept apart from it:
    (its environment's label, the session), newest first."""
    grouped = sessions(runs, link)
    marked = sorted(
        ((envs.label(facts), session) for facts, session in grouped if session.experimental
         is not None), key=lambda found: found[1].started, reverse=True,
    )  # fmt: skip
    for _label, session in marked:
        session.age = ago(now - session.started)
    left_out = {session.id for _label, session in marked}
    return [r for r in runs if r.data.tags.get("amp.session_id") not in left_out], marked


def partly_logged(run) -> bool:
    """A process killed while it logged the run: its metrics or files may be missing."""
    return run.data.tags.get(COMPLETE) == "false"


def interrupted(run) -> bool:
    """Ctrl-C ended the test: it decided nothing."""
    return run.data.tags.get("outcome") == "interrupted"


def claims(run) -> list[str]:
    return [claim for claim in run.data.tags.get("claims", "").split(",") if claim]


def test_of(run) -> str:
    return run.data.tags.get("amp.test", run.info.run_name)


def status(run, claim: str) -> verdicts.Status:
    """The test run's verdict on `claim` as it counts: what it recorded, voided by a failure."""
    tags = run.data.tags
    return verdicts.status(
        tags.get(f"verdict.{claim}"),
        tags.get(f"evidence.{claim}", ""),
        tags.get("outcome", "?"),
        tags.get("outcome.message", ""),
        tags.get("amp.test", run.info.run_name),
    )
