"""The runs MLflow holds, read back: every run a query selects (`search_runs`, page by page), a
session's runs, which of its parent runs is the one its tests were logged under (`main_parent`),
whether a test's run holds its whole record (`_complete`), and the copies a retried request made
of a run, found and deleted (`drop_copies`)."""

from __future__ import annotations

from harness.records.mlflow.naming import COMPLETE, END_REASON
from harness.records.mlflow.uris import _PLAIN_ID

_PAGE = 5000  # runs per search call


def search_runs(client, experiment_id: str, query: str = "") -> list:
    """Every run of the experiment that `query` selects, page by page."""
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], query, max_results=_PAGE, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def session_runs(client, experiment_id: str, session_id: str) -> list:
    """Every active run of the session, parent and children."""
    query = f"tags.`amp.session_id` = '{session_id}'" if _PLAIN_ID.fullmatch(session_id) else ""
    found = search_runs(client, experiment_id, query)
    return [r for r in found if r.data.tags.get("amp.session_id") == session_id]


def main_parent(runs: list):
    """The session's parent run among `runs`, or None: where a retried runs/create made two,
    the one its tests were logged under (then one that ended, then the first made)."""
    parents = [r for r in runs if r.data.tags.get("amp.kind") == "session"]
    under = [r.data.tags.get("mlflow.parentRunId") for r in runs]
    return min(parents, default=None, key=lambda r: (
        -under.count(r.info.run_id), r.info.status == "RUNNING", r.info.start_time))  # fmt: skip


def _complete(run) -> bool:
    """Whether a child run holds its whole record. Runs logged before the completion tag
    existed count when they ended: their end was their last call."""
    tag = run.data.tags.get(COMPLETE)
    return tag == "true" if tag is not None else run.info.status != "RUNNING"


def _has_copies(runs: list) -> bool:
    """Whether `runs`, one session's, hold two parent runs or two runs of one record."""
    keys = [r.data.tags.get("amp.record_id") or r.data.tags.get("amp.kind") for r in runs]
    return len(keys) != len(set(keys))


def drop_copies(client, runs: list, parent: str | None) -> int:
    """Delete the runs of one session (`runs`, as read) made twice: MLflow's client sends a
    request again when the answer was a 500 or did not come in time, also a request the server
    has already carried out (runs/create: a second parent run, left RUNNING for ever, or a
    second child run, left half-logged). The copy kept of each: the parent run the session
    logged under (`parent`, where the session knows it; else main_parent); for a test, its
    complete run (under that parent where there are several). What is deleted says why (the
    tag amp.end_reason), and MLflow can restore it. The number of runs deleted."""
    main = main_parent(runs)
    parent = parent or (main.info.run_id if main else None)
    copies = [
        r for r in runs
        if r.data.tags.get("amp.kind") == "session" and r.info.run_id != parent
    ]  # fmt: skip
    by_record: dict[str, list] = {}
    for run in runs:
        if run.data.tags.get("amp.kind") == "test":
            by_record.setdefault(run.data.tags.get("amp.record_id"), []).append(run)
    for same in by_record.values():
        if len(same) > 1 and any(_complete(r) for r in same):
            under = [r.data.tags.get("mlflow.parentRunId") == parent for r in same]
            kept = max(range(len(same)), key=lambda i: (_complete(same[i]), under[i]))
            copies += same[:kept] + same[kept + 1 :]
    for run in copies:
        kept_id = parent if run.data.tags.get("amp.kind") == "session" else "another run"
        client.set_tag(run.info.run_id, END_REASON, (
            f"deleted by amp-harness: a copy of {kept_id}, made when MLflow's client sent "
            "its request again after the server had carried it out"))  # fmt: skip
        client.delete_run(run.info.run_id)
    return len(copies)
