"""A request MLflow's client sends again after the server carried it out (issue 24, item 4): a
500 on the way back, or an answer too slow, and runs/create makes two runs. The session's copies
are deleted at its end, `sync` deletes those it finds, and the report never calls a session
that ended "killed". A loopback proxy in front of a real `mlflow server` forwards every request,
then answers 500 to every third POST.

An answer cut in the middle of its body (issue "Nothing lost, round 3", item 5) is sent again
the same way, by the harness (MLflow's client retries only an answer that never started): a
proxy sends the headers and half the body of one runs/create, then closes the connection."""

from __future__ import annotations

import socket

import pytest
from helpers.servers import FlakyProxy, MlflowServer, free_port
from helpers.tracked import (
    assert_each_record_once_and_whole,
    run_session,
    runs,
    store_in,
    write_journal,
)

from harness.records.journal import Journal
from harness.records.tracking import BoundedClient, MlflowSink, sync
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
    server has no experiment `amp-harness`, as a new one (fresh_experiment)."""
    fresh_experiment(server)
    proxy = FlakyProxy(server.uri, every=3).start()
    try:
        yield server, proxy
    finally:
        proxy.stop()


class CuttingProxy(FlakyProxy):
    """FlakyProxy's forwarding without its 500s: the answer to the `nth` POST to runs/create is
    cut once the server has done the work, after its headers and half its body (an
    http.client.IncompleteRead to the client, a ChunkedEncodingError to requests)."""

    def __init__(self, target: str, nth: int = 1):
        super().__init__(target, every=10**9)  # no 500s
        self.nth, self.creates, self.cut = nth, 0, 0
        proxy, forward = self, self._server.RequestHandlerClass

        class Cutting(forward):
            def end_headers(self) -> None:
                super().end_headers()
                if self.path.endswith("/runs/create") and proxy._cut_this_one():
                    self.wfile = HalfThenClosed(self.connection)

        self._server.RequestHandlerClass = Cutting

    def _cut_this_one(self) -> bool:
        with self._lock:
            self.creates += 1
            cut = self.creates == self.nth
            self.cut += cut
            return cut


class HalfThenClosed:
    """The writer of one answer's body: half of it, then the connection shut."""

    closed = False

    def __init__(self, connection: socket.socket):
        self.connection = connection

    def write(self, body: bytes) -> None:
        self.connection.sendall(body[: len(body) // 2])
        self.connection.shutdown(socket.SHUT_RDWR)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def cutting(server, request):
    """(server, proxy): the proxy cuts the answer to the `request.param`-th runs/create."""
    fresh_experiment(server)
    proxy = CuttingProxy(server.uri, nth=request.param).start()
    try:
        yield server, proxy
    finally:
        proxy.stop()


def fresh_experiment(server) -> None:
    """The server has no experiment `amp-harness`, as a new one: an earlier test's is renamed."""
    from mlflow import MlflowClient

    client = MlflowClient(server.uri)
    earlier = client.get_experiment_by_name("amp-harness")
    if earlier:
        client.rename_experiment(earlier.experiment_id, f"earlier-{earlier.experiment_id}")


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
    counts = sync(MlflowSink(proxy.uri, reports=tmp_path), journal)
    assert counts["records_sent"] == 12 and counts["copies_deleted"] >= 1, counts
    assert sorted(r.data.tags["amp.session_id"] for r in sessions_of(server.uri)) == ["s1", "s2"]
    assert_each_record_once_and_whole(journal, server.uri)
    again = sync(MlflowSink(server.uri, reports=tmp_path), journal)
    assert (again["records_present"], again["records_sent"], again["copies_deleted"]) == (12, 0, 0)


@pytest.mark.slow
def test_the_report_takes_the_parent_run_that_ended(tmp_path, empty_store):  # noqa: F811
    """A store with a session's copy left RUNNING (made before `sync` deleted such copies): the
    report reads the session from the run that ended, in whichever order MLflow lists them."""
    uri = store_in(tmp_path, empty_store)
    journal = write_journal(tmp_path, "s1", records=2)
    sink = MlflowSink(uri, reports=tmp_path)
    sync(sink, journal)
    (parent,) = sessions_of(uri)
    for started in (parent.info.start_time - 1000, parent.info.start_time + 1000):
        sink.client.create_run(parent.info.experiment_id, started, {
            **parent.data.tags, "mlflow.runName": "a copy"})  # fmt: skip
    summary = (report.build(uri, tmp_path / "report").parent / "summary.md").read_text()
    assert "did not end" not in summary, summary


@pytest.mark.slow
@ONE_SERVER
@pytest.mark.parametrize("cutting", [2], indirect=True)  # the first test's run
def test_a_session_through_an_answer_cut_once_logs_each_run_once(pytester, cutting):
    server, proxy = cutting
    result, _ = run_session(pytester, f"--tracking-uri={proxy.uri}")
    result.assert_outcomes(passed=3)
    assert proxy.cut == 1, "the proxy cut no answer"
    assert "every result is in the journal" not in result.stdout.str()  # before: MLflow off
    (parent,) = sessions_of(server.uri)  # before: RUNNING, and a half-logged child
    assert parent.info.status == "FINISHED"
    assert_each_record_once_and_whole(Journal(pytester.path / "reports" / "journal.jsonl"),
                                      server.uri)  # fmt: skip


@pytest.mark.slow
@ONE_SERVER
@pytest.mark.parametrize("cutting", [1], indirect=True)  # the first session's run
def test_sync_through_an_answer_cut_once_completes(tmp_path, cutting):
    server, proxy = cutting
    journal = write_journal(tmp_path, "s1", records=3)
    write_journal(tmp_path, "s2", records=3, ended=False)
    counts = sync(MlflowSink(proxy.uri, reports=tmp_path), journal)  # before: "sync stopped"
    assert proxy.cut == 1, "the proxy cut no answer"
    assert (counts["records_sent"], counts["copies_deleted"]) == (6, 1), counts
    parents = sessions_of(server.uri)
    assert sorted(r.data.tags["amp.session_id"] for r in parents) == ["s1", "s2"]
    assert {r.info.status for r in parents} == {"FINISHED", "KILLED"}  # nothing left RUNNING
    assert_each_record_once_and_whole(journal, server.uri)


def raised_as_mlflow_does(*chain: Exception) -> Exception:
    """The last of `chain`, each raised from the one before it, as MLflow raises its
    MlflowException over requests' error over urllib3's; with its traceback."""
    raised: Exception | None = None
    for exc in chain:
        try:
            raise exc from raised
        except Exception as caught:  # noqa: BLE001 - the next one is raised over it
            raised = caught
    return raised


def cut_answer(reset: bool = False) -> Exception:
    """What MLflow raises for an answer whose body broke off: the connection closed (an
    IncompleteRead) or reset after the headers."""
    import http.client

    from mlflow.exceptions import MlflowException
    from requests.exceptions import ChunkedEncodingError
    from urllib3.exceptions import ProtocolError

    cut = ConnectionResetError(104, "Connection reset by peer") if reset else (
        http.client.IncompleteRead(b"{", 10))  # fmt: skip
    return raised_as_mlflow_does(
        cut, ProtocolError("Connection broken", cut), ChunkedEncodingError("Connection broken"),
        MlflowException("API request to http://h/api/2.0/mlflow/runs/create failed"),
    )  # fmt: skip


def reset_retried_by_mlflow() -> Exception:
    """A connection reset before any answer: urllib3 retried it already, as MLflow asks it to."""
    from requests.exceptions import ConnectionError as RequestsConnectionError
    from urllib3.exceptions import MaxRetryError, ProtocolError

    reset = ConnectionResetError(104, "Connection reset by peer")
    return raised_as_mlflow_does(
        reset, ProtocolError("Connection aborted.", reset), MaxRetryError(None, "/runs/create"),
        RequestsConnectionError("Max retries exceeded"),
    )  # fmt: skip


class FailsFirst:
    """A client whose create_run raises each of `failures` in turn, then answers."""

    def __init__(self, *failures: Exception):
        self.failures, self.calls = list(failures), 0

    def create_run(self, experiment_id: str) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return f"run of {experiment_id}"


@pytest.mark.parametrize("reset", [False, True], ids=["incomplete-read", "reset-in-the-body"])
def test_an_answer_cut_once_is_sent_again(reset):
    client = FailsFirst(cut_answer(reset))
    assert BoundedClient(client).create_run("1") == "run of 1"
    assert client.calls == 2


@pytest.mark.parametrize(
    "failures",
    [
        pytest.param([cut_answer, cut_answer], id="cut-twice"),  # one retry: the harness's
        pytest.param([reset_retried_by_mlflow], id="reset-before-the-answer"),
        pytest.param([lambda: ValueError("a bug")], id="no-cut"),
    ],
)
def test_what_is_not_sent_again(monkeypatch, failures):
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)  # the harness's 1
    client = FailsFirst(*[failure() for failure in failures])
    with pytest.raises(Exception) as raised:
        BoundedClient(client).create_run("1")
    assert type(raised.value) is type(failures[-1]())
    assert client.calls == len(failures)


def test_a_users_retry_setting_counts_for_cut_answers(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    client = FailsFirst(cut_answer(), cut_answer(), cut_answer())
    assert BoundedClient(client).create_run("1") == "run of 1"
    assert client.calls == 4
