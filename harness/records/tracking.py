"""MLflow, downstream of the journal: the face of `harness/records/mlflow/`.

The plumbing lives in that package, a module a concern: `uris` (where the store is, passwords
taken out, command lines, the UI's links and saved views), `bounds` (how long MLflow is waited
for, the bounded client, Unavailable and `reason`, MLflow's sender held to the bounds), `locks`
(the file locks: a new store's opening, `sync`, a session that still runs), `naming` (a run's
name, description and tags, the points of a long history MLflow gets), `sink` (MlflowSink: a
session logged live), `replay` (`sync`: the journal replayed into MLflow), `runs` (the runs
MLflow holds, read back: searched, a session's main parent, copies deleted), `sqlite_store`
(the embedded store's writability, fsync and moved artifact paths) and `writer` (Writer: a
session's sink in a process of its own, off the tests' path). This module re-exports
what the rest of the harness and its tests import from it, so that `from harness.records.tracking
import ...` holds as it did. A test that replaces one of these names must replace it in the
module that holds it (`bounds.client`, `uris.views`): replacing it here replaces nothing the sink
calls.
"""

from __future__ import annotations

from harness.records.mlflow.bounds import (
    COMMAND,
    MLFLOW_ENV,
    SESSION,
    BoundedClient,
    Bounds,
    Unavailable,
    _bounded_by,
    _bounded_requests,
    _condition,
    client,
    foreign_warnings_ignored,
    progress_bars_off,
    reason,
)
from harness.records.mlflow.locks import Running, _locked, is_running
from harness.records.mlflow.naming import (
    COMPLETE,
    DOWNSAMPLED,
    END_REASON,
    EXIT_STATUS,
    EXPERIMENTAL,
    EXPERIMENTAL_REASON,
    HISTORY_POINTS,
    LEFT_OUT,
    downsampled,
    mark_tags,
)
from harness.records.mlflow.replay import sync
from harness.records.mlflow.runs import main_parent, search_runs
from harness.records.mlflow.sink import MlflowSink
from harness.records.mlflow.uris import (
    ARTIFACTS_NAME,
    BY_CLAIM,
    BY_ENVIRONMENT,
    DB_NAME,
    DEFAULT_EXPERIMENT,
    UI_VIEW,
    VIEW_TAG,
    command_line,
    default_uri,
    redact,
    resolve_uri,
    sqlite_path,
    ui_url,
    views,
)
from harness.records.mlflow.writer import Writer

__all__ = [
    "ARTIFACTS_NAME",
    "BY_CLAIM",
    "BY_ENVIRONMENT",
    "COMMAND",
    "COMPLETE",
    "DB_NAME",
    "DEFAULT_EXPERIMENT",
    "DOWNSAMPLED",
    "END_REASON",
    "EXIT_STATUS",
    "EXPERIMENTAL",
    "EXPERIMENTAL_REASON",
    "HISTORY_POINTS",
    "LEFT_OUT",
    "MLFLOW_ENV",
    "SESSION",
    "UI_VIEW",
    "VIEW_TAG",
    "BoundedClient",
    "Bounds",
    "MlflowSink",
    "Running",
    "Unavailable",
    "Writer",
    "_bounded_by",
    "_bounded_requests",
    "_condition",
    "_locked",
    "client",
    "command_line",
    "default_uri",
    "downsampled",
    "foreign_warnings_ignored",
    "is_running",
    "main_parent",
    "mark_tags",
    "progress_bars_off",
    "reason",
    "redact",
    "resolve_uri",
    "search_runs",
    "sqlite_path",
    "sync",
    "ui_url",
    "views",
]
