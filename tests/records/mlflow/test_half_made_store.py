"""A store left half-made by a process stopped while MLflow created its tables (issue 24, item 2):
set aside, never deleted, and rebuilt from the journal."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.tracked import (
    assert_each_record_once_and_whole,
    fresh,
    journal,
    run_session,
    sync_in_a_new_process,
    write_journal,
)

from harness.records import halfmade

# kill -9 right after one statement of MLflow's migrations has run: what a Ctrl-C or a kill in
# the first seconds of a first session (or of a first `sync` on a new store) leaves.
INTERRUPTED_MIGRATION = """
import os, re, signal, sys
from sqlalchemy import event
from sqlalchemy.engine import Engine

statement_wanted = re.compile(sys.argv[2], re.IGNORECASE)

@event.listens_for(Engine, "after_cursor_execute")
def interrupt(conn, cursor, statement, *args):
    if statement_wanted.search(statement):
        os.kill(os.getpid(), signal.SIGKILL)

from mlflow import MlflowClient
MlflowClient(tracking_uri=f"sqlite:///{sys.argv[1]}")
"""


def half_make(store: Path, statement: str) -> str:
    """Make `store` as an interrupted first session leaves it; MLflow's error on opening it."""
    killed = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_MIGRATION, str(store), statement],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    # Opened in this process (a process of its own cost ~3 s of imports): MLflow keeps nothing
    # of a store it failed to open, as the harness's own retry after setting it aside relies on.
    from mlflow import MlflowClient

    with pytest.raises(Exception) as opened:  # noqa: PT011 - whatever MLflow raises
        MlflowClient(tracking_uri=f"sqlite:///{store}")
    return str(opened.value)


def set_aside_files(reports: Path) -> list[Path]:
    return sorted(reports.glob("mlflow.db.half-made-*"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("statement", "error", "opened_by"),
    [
        (r"CREATE TABLE spans", "table spans already exists", "session"),
        (r"ADD COLUMN step", "duplicate column name: step", "sync"),
    ],
)
def test_an_interrupted_first_session_s_store_is_set_aside_and_rebuilt(
    pytester, statement, error, opened_by
):
    reports = pytester.path / "reports"
    reports.mkdir()
    earlier = write_journal(reports, "s0")  # results the journal holds and MLflow never got
    assert error in half_make(reports / "mlflow.db", statement)  # the real failure, first
    if opened_by == "session":
        result, _ = run_session(pytester)
        result.assert_outcomes(passed=3)
        out = result.stdout.str()
        assert "MLflow: off" not in out and "every result is in the journal" not in out, out
        result.stdout.fnmatch_lines([
            f"MLflow: the store {reports / 'mlflow.db'} was half-made (*{error}*: set aside as "
            f"{reports / 'mlflow.db.half-made-'}* (nothing deleted) and made anew; "
            "`amp-harness sync --reports * --tracking-uri *` fills it from the journal"
        ])  # fmt: skip
        synced = sync_in_a_new_process(reports)
        assert synced.returncode == 0, synced.stderr
        assert "2 sessions, 3 results sent, 3 already there" in synced.stdout, synced.stdout
    else:
        synced = sync_in_a_new_process(reports)
        assert synced.returncode == 0, synced.stderr
        assert f"{error}: a session or sync was stopped" in synced.stdout, synced.stdout
        assert "1 sessions, 3 results sent, 0 already there" in synced.stdout, synced.stdout
    (aside,) = set_aside_files(reports)
    assert aside.stat().st_size > 0  # kept as it was, for whoever wants to look
    assert_each_record_once_and_whole(journal(pytester) if opened_by == "session" else earlier,
                                      fresh(reports))  # fmt: skip


def test_a_store_from_a_newer_mlflow_is_never_set_aside(tmp_path):
    """The same error from a store whose schema this MLflow does not know (a newer MLflow, in
    another virtual environment, wrote it) is not a half-made store: it is left where it is."""
    store = tmp_path / "mlflow.db"
    with sqlite3.connect(store) as db:
        db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        db.execute("INSERT INTO alembic_version VALUES ('ffffffffffff')")
    failure = Exception("(sqlite3.OperationalError) table spans already exists")
    assert not halfmade.half_made(store, failure)
    with sqlite3.connect(store) as db:
        db.execute("DELETE FROM alembic_version")
    assert halfmade.half_made(store, failure)  # no revision yet: the first migration stopped
    assert not halfmade.half_made(store, Exception("database is locked"))


@pytest.mark.slow
def test_the_report_on_a_half_made_store_says_it_set_it_aside(tmp_path):
    half_make(tmp_path / "mlflow.db", r"CREATE TABLE spans")
    made = subprocess.run(
        [sys.executable, "-m", "harness.cli", "report", "--reports", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "Traceback" not in made.stderr, made.stderr
    assert f"MLflow: the store {tmp_path / 'mlflow.db'} was half-made" in made.stderr, made.stderr
    assert f"`amp-harness sync --reports {tmp_path}` fills it from the journal" in made.stderr
    assert len(set_aside_files(tmp_path)) == 1
