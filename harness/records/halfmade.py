"""A half-made embedded store: one whose first opening was stopped while MLflow created its
tables (Ctrl-C or kill -9 in the first seconds of a first session or `sync`).

MLflow makes a new SQLite store in two steps: the initial tables, then every migration since,
each recorded in `alembic_version` once done. SQLite does not roll back DDL with the rest, so a
process stopped inside a migration leaves its first statements applied and its revision not
recorded. Every later opening replays that migration and fails on what it already did ("table
spans already exists", "duplicate column name: step"), for ever. Such a store holds nothing a
session wrote (no session gets that far): it is set aside under a new name, never deleted, and a
new one is made, which `amp-harness sync` fills from the journal.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import time
from pathlib import Path

# What replaying a migration already partly applied says, in SQLite's words.
_REPLAYED = re.compile(r"table \S+ already exists|duplicate column name", re.IGNORECASE)
SUFFIX = "half-made"
_SIDE_FILES = ("", "-journal", "-wal", "-shm")  # SQLite's files of one database


def half_made(store: Path, failure: Exception) -> bool:
    """Whether `failure`, from opening the SQLite store `store`, says the store is half-made.

    Only a schema this MLflow knows: a store written by a newer MLflow (another virtual
    environment on the same reports folder) names a revision this one lacks, and is left alone.
    """
    if not _REPLAYED.search(str(failure)):
        return False
    revision = _revision(store)
    return revision is None or _known(revision)


def set_aside(store: Path, uri: str) -> Path:
    """Rename `store` (and SQLite's files beside it) to `mlflow.db.half-made-TIME`, and close
    the connections this process's MLflow keeps to it by `uri`; the new name."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    aside, n = store.with_name(f"{store.name}.{SUFFIX}-{stamp}"), 1
    while aside.exists():
        n += 1
        aside = store.with_name(f"{store.name}.{SUFFIX}-{stamp}-{n}")
    forget_engine(uri)
    for side in _SIDE_FILES:
        source = store.with_name(store.name + side)
        if source.exists():
            source.rename(aside.with_name(aside.name + side))
    return aside


def _revision(store: Path) -> str | None:
    """The last migration the store records as done, or None (none, or no such table)."""
    try:
        with contextlib.closing(sqlite3.connect(f"{store.as_uri()}?mode=ro", uri=True)) as db:
            row = db.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def _known(revision: str) -> bool:
    """Whether this MLflow's migrations include `revision`."""
    import mlflow.store.db_migrations as migrations
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory(str(Path(migrations.__file__).parent))
    try:
        return scripts.get_revision(revision) is not None
    except Exception:  # noqa: BLE001 - alembic's "Can't locate revision", by several names
        return False


def forget_engine(uri: str) -> None:
    """MLflow keeps one SQLAlchemy engine per store URI for the life of the process, its pooled
    connections open on the file: after a rename they would go on reading the old one."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    engine = SqlAlchemyStore._engine_map.pop(uri, None)
    if engine is not None:
        engine.dispose()
