"""What a result costs a tracking server, in requests (issue 56): MLflow has no call that writes
several runs, so each result sent through a server is its own run, made by MLflow's client in
four requests: runs/create, its files' upload to the folder runs/create named, runs/update (its
end) and one runs/log-batch ending with the completion tag. MLflow's client would read the run
back (runs/get) to find that folder before the upload: a fifth, which the harness leaves out. A
loopback proxy in front of a real `mlflow server` names every request it forwards."""

from __future__ import annotations

from collections import Counter

import pytest
from helpers.servers import FlakyProxy, MlflowServer, free_port
from helpers.tracked import assert_each_record_once_and_whole, write_journal

from harness.records.tracking import MlflowSink, sync

RESULTS = 4


@pytest.fixture
def proxy(tmp_path_factory):
    """(server, proxy): a proxy that fails nothing, in front of a new server."""
    server = MlflowServer(tmp_path_factory.mktemp("server"), free_port()).start()
    try:
        proxy = FlakyProxy(server.uri, every=10**9).start()
        try:
            yield server, proxy
        finally:
            proxy.stop()
    finally:
        server.stop()


def sent_for_results(sent: list[str]) -> Counter:
    """Each kind of request ("POST runs/create", "PUT artifacts"), counted."""
    kinds = Counter()
    for request in sent:
        method, path = request.split(" ", 1)
        path = path.split("?", 1)[0]
        artifacts = "/mlflow-artifacts/artifacts/" in path
        where = "artifacts" if artifacts else path.rsplit("/mlflow/", 1)[-1]
        kinds[f"{method} {where}"] += 1
    return kinds


@pytest.mark.slow
def test_a_result_costs_a_server_four_requests_without_reading_its_run_back(tmp_path, proxy):
    server, proxy = proxy
    journal = write_journal(tmp_path, "s1", records=RESULTS)
    counts = sync(MlflowSink(proxy.uri, reports=tmp_path), journal)
    assert counts["records_sent"] == RESULTS, counts
    assert_each_record_once_and_whole(journal, server.uri)
    kinds = sent_for_results(proxy.sent)
    each = ("POST runs/create", "PUT artifacts", "POST runs/update", "POST runs/log-batch",
            "GET runs/get")  # fmt: skip
    # Beside the results', the session's run: made, read back at its end, ended, its metrics.
    assert {kind: kinds[kind] for kind in each} == {
        "POST runs/create": RESULTS + 1,
        "PUT artifacts": RESULTS,  # one file each: record.json
        "POST runs/update": RESULTS + 1,
        "POST runs/log-batch": RESULTS + 1,
        "GET runs/get": 1,  # before: one for each result too
    }, kinds
