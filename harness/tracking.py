"""MLflow, downstream of the journal: one parent run per session, one child run per test.

Every call is bounded (MLflow's defaults block for minutes on a dead server) and the first
failure turns the sink off for the rest of the session: results keep going to the journal, and
`amp-harness sync` replays what MLflow lacks. Live logging and sync share one code path, keyed by
the `amp.session_id` and `amp.record_id` tags, so replaying twice never duplicates a run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from urllib.parse import urlparse

from harness import verdicts
from harness.errors import HarnessError
from harness.journal import Journal
from harness.record import Record

log = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "amp-harness"
DB_NAME = "mlflow.db"
ARTIFACTS_NAME = "mlartifacts"
SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")

# Bounded calls: a 4 s timeout and one retry (under 10 s in all), instead of MLflow's 120 s and
# 7 retries with backoff. Telemetry off. A user's own setting of any of these wins.
MLFLOW_ENV = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "4",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.2",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "GIT_PYTHON_REFRESH": "quiet",
}
_STATUS = {
    "passed": "FINISHED",
    "skipped": "FINISHED",
    "failed": "FAILED",
    "error": "FAILED",
    "interrupted": "KILLED",  # Ctrl-C
    verdicts.CAPABILITY_REGRESSION: "FAILED",
}
_TAG_LIMIT = 5000  # MLflow accepts 8000 characters; evidence longer than this is cut
_PASSWORD = re.compile(r"(://[^:/@\s]+):[^@\s]*@")  # the ":pw" of scheme://user:pw@host


def default_uri(reports: Path) -> str:
    return f"sqlite:///{(Path(reports) / DB_NAME).resolve()}"


def resolve_uri(option: str | None, reports: Path) -> str:
    """--tracking-uri, else $MLFLOW_TRACKING_URI, else the embedded SQLite store in reports/.

    Always explicit: MLflow's own default depends on the working directory (an old ./mlruns
    there selects the file store, which MLflow 3 refuses)."""
    if option:
        uri, origin = option, "--tracking-uri"
    elif os.environ.get("MLFLOW_TRACKING_URI"):
        uri, origin = os.environ["MLFLOW_TRACKING_URI"], "MLFLOW_TRACKING_URI"
    else:
        return default_uri(reports)
    scheme = urlparse(uri).scheme.split("+")[0]  # postgresql+psycopg -> postgresql
    if scheme not in SCHEMES:
        raise HarnessError(
            f"{origin}={uri!r}: unsupported tracking URI scheme {scheme or '(none)'!r}. Use one of "
            f"{', '.join(s + '://' for s in SCHEMES)}, e.g. sqlite:///reports/mlflow.db or "
            "http://127.0.0.1:5000 (the file store ./mlruns is refused by MLflow 3)."
        )
    return uri


def client(uri: str):
    """An MlflowClient whose calls are bounded (MLFLOW_ENV), for every reader and writer."""
    for key, value in MLFLOW_ENV.items():
        os.environ.setdefault(key, value)
    try:
        from mlflow import MlflowClient  # imported here: it takes seconds
    except ImportError as exc:  # e.g. an offline GPU runner's wheelhouse missing a requirement
        raise HarnessError(
            f"MLflow cannot be imported ({exc}): install it with its requirements "
            "(`pip install -e .` does), or pass --no-mlflow to record to the journal only"
        ) from exc
    return MlflowClient(tracking_uri=uri)


def redact(text: str) -> str:
    """`text` with the password of every URI in it removed (scheme://user:pw@host ->
    scheme://user@host): command lines and links are recorded and shared."""
    return _PASSWORD.sub(r"\1@", text)


class MlflowSink:
    """Writes journal entries to MLflow; after the first failure it stays off (`down` says why)."""

    def __init__(self, uri: str, experiment: str = DEFAULT_EXPERIMENT, reports: Path | None = None):
        self.uri = uri
        self.experiment = experiment
        # Artifacts of the embedded store live beside it; a server decides its own.
        self._artifact_root = (
            (Path(reports) / ARTIFACTS_NAME).resolve().as_uri()
            if reports and uri.startswith("sqlite:")
            else None
        )
        self.down: str | None = None
        try:
            self.client = client(uri)
        except HarnessError as exc:  # the session goes on, on the journal alone
            self.client, self.down = None, str(exc)
            log.warning("MLflow at %s: %s", uri, self.down)
        self._experiment_id: str | None = None
        self._parents: dict[str, str] = {}  # session id -> parent run id

    def _guard(self, what: str, call, *args, **kwargs):
        if self.down:
            return None
        started = time.monotonic()
        try:
            return call(*args, **kwargs)
        except Exception as exc:  # any failure: keep going on the journal alone
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            self.down = (
                f"{what} failed after {time.monotonic() - started:.1f} s ({first_line[:200]})"
            )
            log.warning("MLflow at %s: %s", self.uri, self.down)
            return None

    def _experiment(self) -> str:
        if self._experiment_id is None:
            found = self.client.get_experiment_by_name(self.experiment)
            self._experiment_id = (
                found.experiment_id
                if found
                else self.client.create_experiment(self.experiment, self._artifact_root)
            )
        return self._experiment_id

    def _runs(self, session_id: str, kind: str):
        return self.client.search_runs(
            [self._experiment()],
            f"tags.`amp.session_id` = '{session_id}' and tags.`amp.kind` = '{kind}'",
            max_results=50000,
        )

    def _parent(self, session: dict) -> str:
        sid = session["session_id"]
        if sid not in self._parents:
            found = self._runs(sid, "session")
            self._parents[sid] = found[0].info.run_id if found else self._create_parent(session)
        return self._parents[sid]

    def _create_parent(self, session: dict) -> str:
        tags = {
            "mlflow.runName": session["name"],
            "amp.kind": "session",
            "amp.session_id": session["session_id"],
            "amp.args": " ".join(session["args"])[:_TAG_LIMIT],
            **_env_tags(session),
        }
        run = self.client.create_run(self._experiment(), int(session["started"] * 1000), tags)
        return run.info.run_id

    def parent_run_id(self, session: dict) -> str | None:
        """The session's parent run, once created (pytest-xdist workers log under it)."""
        return self._parents.get(session["session_id"])

    def adopt_parent(self, session: dict, run_id: str) -> None:
        self._parents[session["session_id"]] = run_id

    def start_session(self, session: dict) -> None:
        self._guard("creating the session run", self._parent, session)

    def log_record(self, session: dict, record: Record) -> None:
        self._guard(f"logging {record.test}", self._log_record, session, record)

    def end_session(self, session: dict, end: dict) -> None:
        self._guard("ending the session run", self._end_session, session, end)

    def _log_record(self, session: dict, record: Record) -> None:
        from mlflow.entities import Metric, Param

        parent = self._parent(session)
        tags = {
            "mlflow.parentRunId": parent,
            "mlflow.runName": record.test.split("::")[-1],
            "amp.kind": "test",
            "amp.session_id": session["session_id"],
            "amp.record_id": record.record_id,
            "amp.test": record.test,
            "claims": ",".join(record.claims),
            "outcome": record.outcome,
            "outcome.message": record.message[:_TAG_LIMIT],
            **_env_tags(session),
        }
        for v in record.verdicts.values():
            tags[f"verdict.{v.claim}"] = v.verdict  # as recorded, before the outcome was known
            tags[f"evidence.{v.claim}"] = v.evidence[:_TAG_LIMIT]
        for claim, found in verdicts.of_record(record).items():
            tags[f"status.{claim}"] = found.label  # what counts: "failed (was: partly)", ...
        run_id = self.client.create_run(
            self._experiment(), int(record.started * 1000), tags
        ).info.run_id
        stamp = int(record.ended * 1000)
        metrics = [Metric(k, v, stamp, 0) for k, v in record.metrics.items()]
        metrics += [
            Metric(k, v, stamp, step)
            for k, values in record.histories.items()
            for step, v in enumerate(values)
        ]
        params = [Param(k, v) for k, v in {**record.params, "device": record.device}.items()]
        # One call for every metric and history of the test: per-step calls cost ~40x more.
        self.client.log_batch(run_id, metrics=metrics, params=params)
        self.client.log_text(run_id, json.dumps(record.to_dict(), indent=1), "record.json")
        for name in record.figures:
            path = record.artifact_dir / name
            if path.exists():
                self.client.log_artifact(run_id, str(path), "figures")
            else:
                log.warning("%s: figure %s is gone; not logged", record.test, path)
        self.client.set_terminated(run_id, _STATUS[record.outcome], stamp)

    def _end_session(self, session: dict, end: dict) -> None:
        from mlflow.entities import Metric

        parent = self._parent(session)
        if self.client.get_run(parent).info.status != "RUNNING":
            return  # already ended, by the live session or an earlier sync
        stamp = int(end["ended"] * 1000)
        counts = [Metric(f"tests.{k}", v, stamp, 0) for k, v in end["counts"].items()]
        self.client.log_batch(parent, metrics=counts)
        self.client.set_terminated(parent, _session_status(end["exitstatus"]), stamp)

    def sync(self, journal: Journal) -> dict[str, int]:
        """Send MLflow what the journal has and MLflow lacks; idempotent."""
        counts = {"sessions": 0, "records_sent": 0, "records_present": 0}
        for sid, session in journal.sessions().items():
            present = self._guard("reading the runs already logged", self._runs, sid, "test")
            if present is None:
                break
            counts["sessions"] += 1
            logged = {run.data.tags.get("amp.record_id") for run in present}
            for record in session.records:
                if record.record_id in logged:
                    counts["records_present"] += 1
                    continue
                self.log_record(session.entry, record)
                if self.down:
                    break
                counts["records_sent"] += 1
            if session.end and not self.down:
                self.end_session(session.entry, session.end)
        if self.down:
            raise HarnessError(f"sync stopped: MLflow at {self.uri}: {self.down}")
        return counts


def _session_status(exitstatus: int) -> str:
    """pytest's exit status as an MLflow run status: 2 is an interrupted session (Ctrl-C)."""
    return {0: "FINISHED", 2: "KILLED"}.get(exitstatus, "FAILED")


def _env_tags(session: dict) -> dict[str, str]:
    return {f"env.{k}": v for k, v in session["fingerprint"].items()}
