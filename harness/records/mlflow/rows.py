"""Complete runs written into an SQL store in one transaction (issue 56), past MLflow's client.

Through MLflow's client a test's run costs four calls (create, files, end, one batch), and its
SQL store makes each of them several ORM transactions, each reading the run back: about 20 ms
of CPU a run, which a session paid beside its tests and `sync` paid 5,000 times. Here a run is
written as MLflow's store would have left it after those calls, in MLflow's own tables through
its own ORM models (mlflow.store.tracking.dbmodels), its values checked and sanitised by MLflow's
own rules (mlflow.utils.validation, SqlAlchemyStore.sanitize_metric_value), its files copied into
its artifact folder first; and every run of a batch in one transaction. A run so written is
complete or absent: a process killed in the middle leaves files no run names, never a half run.

Only for a store that is an SQL database (the embedded SQLite store, a database URI) whose
experiment keeps its artifacts in a local folder (`Table.of` says None otherwise: a tracking
server, artifacts in a bucket); there the sink keeps MLflow's client. A run MLflow's rules refuse
is left out of the batch (`Refused`), for the client to log or refuse in its own words.
tests/records/mlflow/test_rows.py holds a run written here against the same record logged
through the client, as MLflow reads them back.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

# Runs written in one transaction at most: a session's records in `sync`, those queued behind
# the writer's last batch in a session (a transaction that large still takes a fraction of a
# second; a larger one only holds the store locked longer).
BATCH = 500


@dataclass
class NewRun:
    """A run as MLflow's client would have been asked to make it: its tags (the run's name
    among them), params, metrics as (key, value, timestamp ms, step), start and end in ms, the
    final status, and `files(folder)` writing its artifacts into `folder`."""

    tags: dict[str, str]
    params: dict[str, str]
    metrics: list[tuple[str, float, int, int]]
    started: int
    ended: int
    status: str
    files: object = field(repr=False)  # callable(folder: Path) -> None
    cut: dict[str, int] = field(default_factory=dict)  # histories sent downsampled: their steps
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)


class Refused(Exception):
    """A run MLflow's own checks refuse: the client is to log it and say why."""


class Table:
    """An experiment of an SQL store, written a batch of complete runs at a time."""

    def __init__(self, store, experiment_id: str, location: str, artifacts: Path):
        self.store, self.experiment_id = store, experiment_id
        self.location, self.artifacts = location, artifacts  # as MLflow names it; the folder

    @classmethod
    def of(cls, mlflow_client, experiment_id: str) -> Table | None:
        """The experiment's table where its store is SQL and its artifacts a local folder."""
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
        from mlflow.utils.file_utils import local_file_uri_to_path
        from mlflow.utils.uri import is_local_uri

        store = getattr(getattr(mlflow_client, "_tracking_client", None), "store", None)
        if not isinstance(store, SqlAlchemyStore):  # a tracking server (or a test's stand-in)
            return None
        location = mlflow_client.get_experiment(experiment_id).artifact_location
        if not is_local_uri(location, is_tracking_or_registry_uri=False):
            return None
        return cls(store, experiment_id, location, Path(local_file_uri_to_path(location)))

    def check(self, run: NewRun) -> None:
        """MLflow's own checks of a batch's values (keys, lengths, metric values); its tags
        truncated where MLflow's log_batch truncates them. Refused where they refuse."""
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.exceptions import MlflowException
        from mlflow.utils.validation import _validate_batch_log_data, _validate_param_keys_unique

        metrics = [Metric(k, v, stamp, step) for k, v, stamp, step in run.metrics]
        params = [Param(k, v) for k, v in run.params.items()]
        tags = [RunTag(k, v) for k, v in run.tags.items()]
        try:
            _validate_param_keys_unique(params)
            _, _, tags = _validate_batch_log_data(metrics, params, tags)
        except MlflowException as exc:
            raise Refused(str(exc)) from exc
        run.tags = {t.key: t.value for t in tags}

    def write(self, runs: list[NewRun]) -> None:
        """Every run of `runs` (checked) complete, in one transaction: its files first."""
        from mlflow.entities import RunStatus
        from mlflow.entities.lifecycle_stage import LifecycleStage
        from mlflow.entities.source_type import SourceType
        from mlflow.store.tracking.dbmodels.models import (
            SqlLatestMetric,
            SqlMetric,
            SqlParam,
            SqlRun,
            SqlTag,
        )
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME, MLFLOW_USER
        from mlflow.utils.uri import append_to_uri_path
        from sqlalchemy import insert

        if not runs:
            return
        table = {"runs": [], "tags": [], "params": [], "metrics": [], "latest": []}
        for run in runs:
            folder = self.artifacts / run.run_id / "artifacts"
            folder.mkdir(parents=True, exist_ok=True)
            run.files(folder)
            table["runs"].append({
                "run_uuid": run.run_id,
                "name": run.tags.get(MLFLOW_RUN_NAME, ""),
                "source_type": SourceType.to_string(SourceType.UNKNOWN),
                "source_name": "",
                "entry_point_name": "",
                "user_id": run.tags.get(MLFLOW_USER, "unknown"),
                "status": RunStatus.to_string(RunStatus.from_string(run.status)),
                "start_time": run.started,
                "end_time": run.ended,
                "deleted_time": None,
                "source_version": "",
                "lifecycle_stage": LifecycleStage.ACTIVE,
                "artifact_uri": append_to_uri_path(self.location, run.run_id, "artifacts"),
                "experiment_id": int(self.experiment_id),
            })  # fmt: skip
            table["tags"] += [{"run_uuid": run.run_id, "key": k, "value": v}
                              for k, v in run.tags.items()]  # fmt: skip
            table["params"] += [{"run_uuid": run.run_id, "key": k, "value": v}
                                for k, v in run.params.items()]  # fmt: skip
            metrics, latest = self._metrics(run)
            table["metrics"] += metrics
            table["latest"] += latest
        with self.store.ManagedSessionMaker() as session:  # one transaction, committed at exit
            for model, rows in ((SqlRun, table["runs"]), (SqlTag, table["tags"]),
                                (SqlParam, table["params"]), (SqlMetric, table["metrics"]),
                                (SqlLatestMetric, table["latest"])):  # fmt: skip
                if rows:
                    session.execute(insert(model.__table__), rows)

    def _metrics(self, run: NewRun) -> tuple[list[dict], list[dict]]:
        """Its metric rows, MLflow's way: one per distinct point, NaN as is_nan with 0, an
        infinity as the largest float; and each key's latest (by step, time, value)."""
        rows: dict[tuple, dict] = {}
        latest: dict[str, dict] = {}
        for key, value, stamp, step in run.metrics:
            is_nan, stored = self.store.sanitize_metric_value(float(value))
            row = {"run_uuid": run.run_id, "key": key, "value": stored, "timestamp": stamp,
                   "step": step, "is_nan": is_nan}  # fmt: skip
            rows.setdefault((key, stored, stamp, step, is_nan), row)
            held = latest.get(key)
            if held is None or (step, stamp, stored) > (held["step"], held["timestamp"],
                                                        held["value"]):  # fmt: skip
                latest[key] = row
        return list(rows.values()), list(latest.values())
