"""The test suite's own servers (issue 24, item 3): a `pytest tests/` stopped by `timeout`
(SIGTERM), or killed outright (SIGKILL), leaves no `mlflow server` and no PostgreSQL running.
A pytest session in a process of its own starts them through a fixture, as the suite does, and
is stopped while they serve; whatever it leaves is ended here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.servers import postgres_missing
from test_signals import alive, wait_for

TESTS = Path(__file__).parents[1]

# servers.py's servers, started as the suite's fixtures start them; the test says where they
# run, then waits to be stopped.
SERVING = """
import json, os, time
from pathlib import Path
import pytest
from helpers.servers import MlflowServer, PostgresServer, free_port

@pytest.fixture
def servers(tmp_path):
    database = PostgresServer(free_port()).start() if os.environ["WITH_POSTGRES"] else None
    server = MlflowServer(tmp_path, free_port(), database.uri if database else None)
    try:
        yield server.start(), database
    finally:
        server.stop()
        if database:
            database.stop()

def test_serves(servers):
    server, database = servers
    facts = {"mlflow": server.process.pid,
             "postgres": database and int((database.folder / "data" / "postmaster.pid")
                                          .read_text().split()[0]),
             "postgres_data": database and str(database.folder / "data")}
    Path(os.environ["AMP_TEST_STARTED"]).write_text(json.dumps(facts))
    time.sleep(300)
"""


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return any(alive(int(p.parent.name)) for p in Path("/proc").glob("[0-9]*/stat")
               if _group_of(p) == group)  # fmt: skip


def _group_of(stat: Path) -> int | None:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, ValueError, IndexError):
        return None


def gone_within(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while check() and time.monotonic() < deadline:
        time.sleep(0.2)
    return not check()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stop", "with_postgres"),
    [(signal.SIGTERM, True), (signal.SIGKILL, False)],
    ids=["SIGTERM-mlflow-and-postgres", "SIGKILL-mlflow"],
)
def test_a_stopped_suite_leaves_no_server_running(tmp_path, stop, with_postgres):
    if with_postgres and postgres_missing():
        with_postgres = False  # the MLflow server alone, then
    (tmp_path / "test_serving.py").write_text(SERVING)
    started = tmp_path / "started.json"
    env = {**os.environ, "AMP_TEST_STARTED": str(started), "PYTHONPATH": str(TESTS),
           "WITH_POSTGRES": "1" if with_postgres else ""}  # fmt: skip
    suite = subprocess.Popen(
        [sys.executable, "-m", "pytest", "test_serving.py", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env=env,
    )  # fmt: skip
    facts: dict = {}
    try:
        facts = wait_for(started, suite, timeout_s=240)
        suite.send_signal(stop)
        suite.communicate(timeout=120)
        mlflow_gone = gone_within(lambda: group_alive(facts["mlflow"]), 30)
        postgres_gone = gone_within(
            lambda: bool(facts["postgres"]) and alive(facts["postgres"]), 30
        )
    finally:
        if suite.poll() is None:
            os.killpg(suite.pid, signal.SIGKILL)
            suite.communicate()
        _end_what_is_left(facts)
    assert mlflow_gone, "the mlflow server runs on"
    assert postgres_gone, "PostgreSQL runs on"


def _end_what_is_left(facts: dict) -> None:
    if facts.get("mlflow") and group_alive(facts["mlflow"]):
        os.killpg(facts["mlflow"], signal.SIGKILL)
    if facts.get("postgres") and alive(facts["postgres"]):
        os.kill(facts["postgres"], signal.SIGQUIT)  # PostgreSQL's immediate shutdown
    if facts.get("postgres_data"):
        import shutil

        shutil.rmtree(Path(facts["postgres_data"]).parent, ignore_errors=True)
