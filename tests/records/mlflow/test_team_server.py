"""The team set-up of docs/team-server.md: a session logs over HTTP to a real `mlflow server`,
with a SQLite backend and, where PostgreSQL is installed, a PostgreSQL one; the runs are checked
through MLflow's REST API, as any other client of the team server would see them."""

from __future__ import annotations

import json
import sqlite3
import urllib.request
from contextlib import closing

import pytest
from helpers.servers import MlflowServer, PostgresServer, free_port, postgres_missing

from harness.records.tracking import BY_CLAIM, UI_VIEW, VIEW_TAG

SCENARIO = """
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    record.param(recipe="fp32")
    record.metric(fp16_bytes=2)
    record.history(loss=[3.0, 2.5, 2.0])
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes, fp32 4 bytes")

@pytest.mark.claim("NUM-UNDERFLOW")
def test_underflow(record):
    record.verdict("NUM-UNDERFLOW", "partly", "2**-25 -> 0 but 5e-8 -> 5.96e-08")
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def team_server(request, tmp_path):
    """`mlflow server` on 127.0.0.1 with the backend named by the parameter; stopped after."""
    database = None
    if request.param == "postgresql":
        reason = postgres_missing()
        if reason:
            pytest.skip(reason)
        database = PostgresServer(free_port()).start()
    server = MlflowServer(tmp_path, free_port(), database.uri if database else None)
    try:
        yield server.start()
    finally:
        server.stop()
        if database:
            database.stop()


def rest(uri: str, endpoint: str, body: dict | None = None) -> dict:
    """One call of MLflow's REST API (POST when there is a body), with plain urllib."""
    request = urllib.request.Request(
        f"{uri}/api/2.0/mlflow/{endpoint}",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def runs_in_backend(backend: str) -> int:
    """Rows of MLflow's `runs` table, read from the database itself, not through the server."""
    query = "SELECT count(*) FROM runs"
    if backend.startswith("sqlite:///"):
        with closing(sqlite3.connect(backend.removeprefix("sqlite:///"))) as db:
            return db.execute(query).fetchone()[0]
    import psycopg

    with psycopg.connect(backend.replace("postgresql+psycopg://", "postgresql://")) as db:
        return db.execute(query).fetchone()[0]


@pytest.mark.slow
def test_a_session_logs_to_the_team_server_over_http(pytester, team_server, monkeypatch):
    # The documented override of the harness's 4 s timeout: this machine is shared and slow.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIO})
    result = pytester.runpytest_inprocess(
        "scenarios", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={pytester.path / 'reports'}", f"--tracking-uri={team_server.uri}",
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    # Browsed at the server itself: `amp-harness ui` serves the embedded store only.
    # Its test runs by claim, in the view the session saved in the experiment (tracking.views).
    result.stdout.fnmatch_lines([f"MLflow: {team_server.uri} (experiment 'amp-harness'); browse "
                                 f"at {team_server.uri}/#/experiments/*/runs[?]{UI_VIEW}"
                                 f"&viewStateShareKey={BY_CLAIM}"])  # fmt: skip

    found = rest(team_server.uri, "experiments/get-by-name?experiment_name=amp-harness")
    experiment_id = found["experiment"]["experiment_id"]
    assert VIEW_TAG + BY_CLAIM in {t["key"] for t in found["experiment"]["tags"]}
    runs = rest(team_server.uri, "runs/search", {"experiment_ids": [experiment_id]})["runs"]
    tags = {
        run["info"]["run_id"]: {t["key"]: t["value"] for t in run["data"]["tags"]} for run in runs
    }
    (parent,) = [r for r in runs if tags[r["info"]["run_id"]]["amp.kind"] == "session"]
    children = {
        tags[r["info"]["run_id"]]["amp.test"].split("::")[-1]: r for r in runs if r is not parent
    }
    assert sorted(children) == ["test_bytes", "test_underflow"]
    assert parent["info"]["status"] == "FINISHED"
    for child in children.values():
        child_tags = tags[child["info"]["run_id"]]
        assert child_tags["mlflow.parentRunId"] == parent["info"]["run_id"]
        assert child_tags["outcome"] == "passed" and child["info"]["status"] == "FINISHED"
    bytes_run = children["test_bytes"]
    assert tags[bytes_run["info"]["run_id"]]["verdict.FMT-BYTES"] == "confirmed"
    assert tags[children["test_underflow"]["info"]["run_id"]]["verdict.NUM-UNDERFLOW"] == "partly"
    params = {p["key"]: p["value"] for p in bytes_run["data"]["params"]}
    metrics = {m["key"]: m["value"] for m in bytes_run["data"]["metrics"]}
    assert params["recipe"] == "fp32" and metrics["fp16_bytes"] == 2.0
    assert metrics["loss"] == 2.0  # a history's last step

    # Artifacts went through the server (--serve-artifacts) into its destination folder.
    listed = rest(team_server.uri, f"artifacts/list?run_id={bytes_run['info']['run_id']}")
    assert "record.json" in {f["path"] for f in listed["files"]}
    assert len(list(team_server.artifacts.rglob("record.json"))) == 2
    assert runs_in_backend(team_server.backend) == 3  # in the database the server was given
