"""A request MLflow's client sends again after the server carried it out (issue 24, item 4): a
500 on the way back, or an answer too slow, and runs/create makes two runs. The session's copies
are deleted at its end, `sync` deletes those it finds, and the report never calls a session
that ended "killed". A loopback proxy in front of a real `mlflow server` forwards every request,
then answers 500 to every third POST."""

from __future__ import annotations

import pytest
from servers import FlakyProxy, MlflowServer, free_port
from tracked import (
    assert_each_record_once_and_whole,
    run_session,
    runs,
    store_in,
    write_journal,
)

from harness.records.journal import Journal
from harness.records.tracking import MlflowSink
from harness.reports import report

# The tests on the server run on one xdist worker, which starts it once (the fixture `server`).
ONE_SERVER = pytest.mark.xdist_group("retried-requests-server")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One `mlflow server` for the tests of this module: a start costs ~6 s of CPU and twice that
    in wall time on two shared cores. Each test finds it as a new one (flaky)."""
    server = MlflowServer(tmp_path_factory.mktemp("server"), free_port())
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def flaky(server):
    """(server, proxy): the proxy answers 500 to every third POST, after forwarding it. The
    server has no experiment `amp-harness`, as a new one: an earlier test's is renamed."""
    from mlflow import MlflowClient

    client = MlflowClient(server.uri)
    earlier = client.get_experiment_by_name("amp-harness")
    if earlier:
        client.rename_experiment(earlier.experiment_id, f"earlier-{earlier.experiment_id}")
    proxy = FlakyProxy(server.uri, every=3).start()
    try:
        yield server, proxy
    finally:
        proxy.stop()


def sessions_of(uri: str) -> list:
    return [r for r in runs(uri) if r.data.tags["amp.kind"] == "session"]


@pytest.mark.slow
@ONE_SERVER
def test_a_session_through_retried_requests_leaves_one_run_each(pytester, flaky):
    server, proxy = flaky
    result, _ = run_session(pytester, f"--tracking-uri={proxy.uri}")
    result.assert_outcomes(passed=3)
    assert proxy.failed >= 3, "the proxy failed too few requests to make copies"
    assert "every result is in the journal" not in result.stdout.str()
    (parent,) = sessions_of(server.uri)  # before: two, one RUNNING for ever
    assert parent.info.status == "FINISHED"
    journal = Journal(pytester.path / "reports" / "journal.jsonl")
    assert_each_record_once_and_whole(journal, server.uri)
    summary = (report.build(server.uri, pytester.path / "report").parent / "summary.md").read_text()
    assert "did not end" not in summary and "killed" not in summary, summary


@pytest.mark.slow
@ONE_SERVER
def test_sync_through_retried_requests_deletes_the_copies_it_made(tmp_path, flaky):
    server, proxy = flaky
    journal = write_journal(tmp_path, "s1", records=6)
    write_journal(tmp_path, "s2", records=6, ended=False)
    counts = MlflowSink(proxy.uri, reports=tmp_path).sync(journal)
    assert counts["records_sent"] == 12 and counts["copies_deleted"] >= 1, counts
    assert sorted(r.data.tags["amp.session_id"] for r in sessions_of(server.uri)) == ["s1", "s2"]
    assert_each_record_once_and_whole(journal, server.uri)
    again = MlflowSink(server.uri, reports=tmp_path).sync(journal)
    assert (again["records_present"], again["records_sent"], again["copies_deleted"]) == (12, 0, 0)


@pytest.mark.slow
def test_the_report_takes_the_parent_run_that_ended(tmp_path, empty_store):  # noqa: F811
    """A store with a session's copy left RUNNING (made before `sync` deleted such copies): the
    report reads the session from the run that ended, in whichever order MLflow lists them."""
    uri = store_in(tmp_path, empty_store)
    journal = write_journal(tmp_path, "s1", records=2)
    sink = MlflowSink(uri, reports=tmp_path)
    sink.sync(journal)
    (parent,) = sessions_of(uri)
    for started in (parent.info.start_time - 1000, parent.info.start_time + 1000):
        sink.client.create_run(parent.info.experiment_id, started, {
            **parent.data.tags, "mlflow.runName": "a copy"})  # fmt: skip
    summary = (report.build(uri, tmp_path / "report").parent / "summary.md").read_text()
    assert "did not end" not in summary, summary
