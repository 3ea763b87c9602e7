"""The embedded SQLite store, where the harness reaches past MLflow: whether a writer can write
it (`check_writable`), `sync`'s commits without SQLite's fsync of each (`commit_without_fsync`),
and its artifact paths moved with a store that moved with its reports folder (`follow_move`)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from urllib.parse import unquote, urlparse

from harness.common.errors import HarnessError
from harness.records.mlflow.bounds import foreign_warnings_ignored
from harness.records.mlflow.uris import ARTIFACTS_NAME


def check_writable(store: Path | None) -> None:
    """A writer's embedded store must be writable, and its folder (SQLite writes its journal
    beside it): else MLflow logs a traceback for each refused write, or, for a store it has to
    make, retries for minutes before it gives up. A HarnessError says which folder."""
    if store is None:
        return
    folder = next(p for p in (store.parent, *store.parents) if p.exists())
    for path in (folder, store) if store.exists() else (folder,):
        if not os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
            raise HarnessError(f"cannot write the store {store}: {path} is read-only")


def commit_without_fsync(mlflow_client) -> None:
    """This process's commits to the embedded SQLite store, without SQLite's fsync of each.

    Every MLflow call is a transaction, and SQLite makes each durable with an fsync: 8 of them a
    record, 70% of the time `sync` took to rebuild a store (8 records a second on a laptop's
    disk; 35 without). What `sync` writes is durable already, in the journal: a crash of the
    process leaves the store whole (SQLite's journal still rolls back), and the rarer loss of
    the machine in the middle of a sync can leave it damaged, which says so and is rebuilt from
    the journal the same way. Sessions, which write each result once, keep the fsync."""
    from sqlalchemy import event

    engine = getattr(mlflow_client._tracking_client.store, "engine", None)
    if engine is not None and not event.contains(engine, "connect", _no_fsync):
        with foreign_warnings_ignored():
            event.listen(engine, "connect", _no_fsync)
            engine.dispose()  # the pooled connections reopen with it


def _no_fsync(connection, _record) -> None:
    connection.execute("PRAGMA synchronous=OFF")


def follow_move(client, experiment, store: Path, notes: list[str]):
    """The experiment, its artifact paths following a store (a reports folder's mlflow.db) that
    moved, or was copied, with its folder: its experiments still name the old folder's
    mlartifacts/, fixed by MLflow when each was created, and every new run would write its
    artifacts there. MLflow has no call to change an experiment's artifact location, so the
    store's paths are rewritten, old runs' included, to the mlartifacts/ beside the store, where
    their files moved with it. What was done, or is left to do, goes to `notes`."""
    reports = store.parent
    old = experiment.artifact_location
    old_path = Path(unquote(urlparse(old).path)) if old.startswith("file:") else None
    new_path = reports / ARTIFACTS_NAME
    if old_path is None or old_path.name != ARTIFACTS_NAME:
        return experiment  # made by hand, elsewhere: not the harness's layout
    if old_path.resolve() == new_path.resolve():
        return experiment
    if old_path.exists() and not new_path.exists():
        # The store was copied without its artifacts: they are still only at the old path.
        notes.append(
            f"the experiment {experiment.name!r} keeps its artifacts in {old_path}, outside "
            f"{reports}: copy that folder to {new_path} for them to move here"
        )
        return experiment
    runs = _rebase(store, old, new_path.as_uri())
    notes.append(
        f"the store moved from {old_path.parent} to {reports}: the artifact paths of "
        f"its experiments and {runs} runs now point into {new_path}"
    )
    return client.get_experiment(experiment.experiment_id)


def _rebase(store: Path, old: str, new: str) -> int:
    """Rewrite the artifact locations under `old` to `new` in the SQLite store; the number of
    runs moved. MLflow's schema: experiments.artifact_location, runs.artifact_uri."""
    cut = len(old) + 1
    with contextlib.closing(sqlite3.connect(store, timeout=20)) as db, db:
        db.execute(
            "UPDATE experiments SET artifact_location = ? || substr(artifact_location, ?) "
            "WHERE artifact_location = ? OR substr(artifact_location, 1, ?) = ?",
            (new, cut, old, cut, old + "/"),
        )
        return db.execute(
            "UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) "
            "WHERE substr(artifact_uri, 1, ?) = ?",
            (new, cut, cut, old + "/"),
        ).rowcount
