"""`amp-harness sync`: the journal replayed into MLflow through a sink (MlflowSink), each session
given what MLflow lacks of it; idempotent, since a run is found by its `amp.session_id` and
`amp.record_id` tags.

A test's run left half-made (a process killed in the middle, a call MLflow refused) is deleted
and its record logged afresh; the parent run of a session that never ended (its process killed)
is ended as KILLED, saying why; runs a retried request made twice are deleted (`runs`). `sync`
holds a lock beside the journal, and leaves alone the sessions that still run (each holds a lock
of its own while it runs, `locks`), so neither another sync nor a live session logs a record
twice. Its commits to the embedded store skip SQLite's fsync (`sqlite_store`): the journal holds
what it writes."""

from __future__ import annotations

from collections.abc import Callable

from harness.common.errors import HarnessError
from harness.records.journal import Journal, Session
from harness.records.mlflow import rows
from harness.records.mlflow.bounds import COMMAND
from harness.records.mlflow.locks import SYNC_LOCK, _locked, is_running
from harness.records.mlflow.naming import END_REASON
from harness.records.mlflow.runs import _complete, _has_copies, main_parent
from harness.records.mlflow.sink import MlflowSink
from harness.records.mlflow.sqlite_store import commit_without_fsync


def sync(
    sink: MlflowSink, journal: Journal, on_wait: Callable[[], None] | None = None
) -> dict[str, int]:
    """Send the MLflow of `sink` what the journal has and MLflow lacks; idempotent. One sync at
    a time per journal (`on_wait` is called when it has to wait for another one). The counts of
    what was found and done; a HarnessError where MLflow failed (the sink's `down`)."""
    counts = dict.fromkeys(
        ("sessions", "records_sent", "records_present", "records_replaced",
         "records_refused", "sessions_killed", "sessions_running", "copies_deleted",
         "runs_marked"), 0,
    )  # fmt: skip
    folder = journal.path.parent
    if sink.client is not None:  # a command: waiting for a busy server is what it is for
        sink.client.bounds = COMMAND
    if sink.client is not None and sink.store is not None:
        commit_without_fsync(sink.client)
    with _locked(folder / SYNC_LOCK, on_wait):
        for sid, session in journal.sessions().items():
            if is_running(folder, sid):  # its own process logs it; its end is to come
                counts["sessions_running"] += 1
                continue
            present = sink._guard("reading the runs already logged", sink._session_runs, sid)
            if present is None:
                break
            counts["sessions"] += 1
            _sync_session(sink, session, present, counts)
            if sink.down:
                break
    if sink.down:
        raise HarnessError(
            f"sync stopped: MLflow at {sink.label}: {sink.down}. Fix: {sink.recovery()}"
        )
    return counts


def _sync_session(
    sink: MlflowSink, session: Session, present: list, counts: dict[str, int]
) -> None:
    main = main_parent(present)
    if main:
        sink.adopt_parent(session.entry, main.info.run_id)
    journalled = {r.record_id for r in session.records}
    complete: set[str] = set()
    half: list = []
    for run in present:
        if run.data.tags.get("amp.kind") != "test":
            continue
        record_id = run.data.tags.get("amp.record_id")
        if _complete(run):
            complete.add(record_id)
        elif record_id in journalled:  # the journal holds all of it: log it afresh
            half.append(run)
    sent = False
    for run in half:
        sink._guard("deleting a half-logged run", sink.client.delete_run, run.info.run_id)
        if sink.down:
            return
    # Marked since these runs were logged (`amp-harness sessions mark`, MLflow unreachable)
    counts["runs_marked"] += sink.mark_session(session.entry, [
        r for r in present if r not in half]) or 0  # fmt: skip
    if sink.down:
        return
    counts["records_replaced"] += len({r.data.tags["amp.record_id"] for r in half} - complete)
    missing = [r for r in session.records if r.record_id not in complete]
    counts["records_present"] += len(session.records) - len(missing)
    for start in range(0, len(missing), rows.BATCH):  # one transaction each on an SQL store
        batch, before, sent = missing[start : start + rows.BATCH], len(sink.refused), True
        sink.log_records(session.entry, batch)
        if sink.down:
            return
        refused = len(sink.refused) - before
        counts["records_refused"] += refused
        counts["records_sent"] += len(batch) - refused
    if session.end:
        sink._guard("ending the session run", sink._end_session, session.entry, session.end)
    elif sink._guard("ending an unfinished session run", _end_unfinished, sink, session):
        counts["sessions_killed"] += 1
    sid = session.entry["session_id"]
    if (sent and sink.may_copy) or _has_copies(present):  # what it sent may be there twice
        counts["copies_deleted"] += sink._guard("deleting runs made twice",
                                                sink._drop_copies, sid) or 0  # fmt: skip


def _end_unfinished(sink: MlflowSink, session: Session) -> bool:
    """A session whose journal has no end, and which no longer runs: its process was killed
    or crashed. Its parent run is ended as KILLED, with the reason as a tag."""
    parent = sink._parent(session.entry)
    if sink.client.get_run(parent).info.status != "RUNNING":
        return False
    last = max([r.ended for r in session.records] + [session.entry["started"]])
    reason = (
        "ended by `amp-harness sync`: the journal has no end for this session (its process "
        f"was killed or crashed) after {len(session.records)} results"
    )
    sink.client.set_tag(parent, END_REASON, reason)
    sink.client.set_terminated(parent, "KILLED", int(last * 1000))
    return True
