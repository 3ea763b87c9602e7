"""MLflow, downstream of the journal: MlflowSink logs a session live (in the process of its
Writer, `writer_process`, off the tests' path), one parent run per session and one child run
per test.

Every call is bounded (`bounds`) and the first failure turns the sink off for the rest of the
session: results keep going to the journal, and `amp-harness sync` (`replay`) replays what MLflow
lacks. Live logging and sync share one code path, keyed by the `amp.session_id` and
`amp.record_id` tags, so replaying twice never duplicates a run.

A child run counts as logged only once it is complete. Into an SQL store (the embedded SQLite
store, a database URI) the session's results go as rows (`rows`): each run whole, a batch of
them in one transaction, complete or absent. Through a tracking server MLflow's client makes a
run before its metrics and files can be sent: it is created with `amp.complete=false` and the
tag turns `true` as the last call, after its metrics, artifacts and end; at a session's end the
runs a retried request made twice are deleted (`runs.drop_copies`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

from harness.catalogue import claims, verdicts
from harness.common.errors import HarnessError
from harness.records import journal_index
from harness.records.mlflow import bounds, rows, uris
from harness.records.mlflow.bounds import (
    COMMAND,
    SESSION,
    Unavailable,
    _fix,
    _refused,
    _unreachable,
    advice,
    reason,
)
from harness.records.mlflow.naming import (
    _STATUS,
    COMPLETE,
    DOWNSAMPLED,
    END_REASON,
    EXIT_STATUS,
    HISTORY_POINTS,
    LEFT_OUT,
    _clean,
    _env_tags,
    _session_status,
    description,
    downsampled,
    mark_tags,
    run_name,
)
from harness.records.mlflow.runs import drop_copies, main_parent, session_runs
from harness.records.mlflow.sqlite_store import check_writable, follow_move
from harness.records.mlflow.uris import (
    ARTIFACTS_NAME,
    BY_CLAIM,
    DB_NAME,
    DEFAULT_EXPERIMENT,
    EXPERIMENT_TAGS,
    PASSWORD_LEFT_OUT,
    command_line,
    redact,
    sqlite_path,
    ui_url,
)
from harness.records.record import Record

log = logging.getLogger(__name__)


class MlflowSink:
    """Writes journal entries to MLflow; after the first failure it stays off (`down` says why,
    `recovery()` what to run). A single result MLflow refuses is listed in `refused` instead."""

    def __init__(self, uri: str, experiment: str = DEFAULT_EXPERIMENT, reports: Path | None = None):
        self.uri = uri
        self.label = redact(uri)  # what is printed: never the password
        self.experiment = experiment
        self.reports = Path(reports).resolve() if reports else None
        self.store = sqlite_path(uri)
        # Artifacts of the embedded store live beside it; a server decides its own.
        self._artifact_root = (
            (self.reports / ARTIFACTS_NAME).as_uri() if self.reports and self.store else None
        )
        self.down: str | None = None
        self.unreachable = False  # whether `down` is what waiting for the server fixes
        self.unavailable: Unavailable | None = None  # a server that gave no answer: down, slow
        self.fix = ""  # what to fix (_fix), where `down` is neither a HarnessError nor waiting
        self.refused: list[str] = []  # "<test>: <why>" for each result MLflow refused
        self.notes: list[str] = []  # what was done to the store on the way (a moved store)
        self._downsampled: list[str] = []  # "<test> (<history>: <steps> steps, ...)"
        self._downsampled_note: int | None = None  # where in `notes` they are said
        set_aside: list[str] = []
        self.client = None
        try:
            check_writable(self.store)
            self.client = bounds.client(uri, set_aside)
            self.client.bounds = SESSION  # the tests wait on a session's calls; `sync`: COMMAND
            self.notes += [f"{text}; {self._sync_command()} fills it from the journal"
                           for text in set_aside]  # fmt: skip
        except HarnessError as exc:  # the session goes on, on the journal alone
            self._stop(str(exc))
        except Exception as exc:  # noqa: BLE001 - a damaged, locked or full store, a bad server
            # Opening the store is the first MLflow call of a session: it must not stop it.
            where = f"the store {self.store}" if self.store else f"MLflow at {self.label}"
            self._stop(f"cannot open {where} ({reason(exc)})", exc)
        self._experiment_id: str | None = None
        self._views_saved = False  # the experiment holds views(): links open BY_CLAIM
        self._parents: dict[str, str] = {}  # session id -> parent run id
        self._rows: rows.Table | bool | None = None  # the experiment's SQL table; False: none

    def _stop(self, down: str, exc: Exception | None = None) -> None:
        """MLflow off for the rest of the session, for `down` (caused by `exc`)."""
        self.down = down
        if exc is not None:
            self.unreachable = _unreachable(exc)
            self.unavailable = exc if isinstance(exc, Unavailable) else None
            self.fix = _fix(exc)
        log.info("MLflow at %s: %s", self.label, down)

    def _sync_command(self) -> str:
        """`amp-harness sync ...` for this store and journal, quoted, without the password."""
        command = ["amp-harness", "sync"]
        if self.reports:
            command += ["--reports", str(self.reports)]
        return f"`{shlex.join([*command, '--tracking-uri', self.label])}`"

    def recovery(self) -> str:
        """What to do, for the reason in `down`, so that MLflow gets what the journal holds."""
        sync = self._sync_command()
        why = (self.down or "").lower()
        if self.store and any(s in why for s in ("not a database", "malformed", "encrypted")):
            aside = shlex.join(["mv", str(self.store), f"{self.store}.broken"])
            return (
                f"move the damaged store aside (`{aside}`), then {sync} rebuilds it from the "
                "journal"
            )
        if self.store and "read-only" in why:
            return (
                "make it writable (or copy the reports folder to one you can write in and pass "
                f"--reports there), then run {sync}"
            )
        if self.store and "locked" in why:
            return f"another process holds the store locked: once it lets go, run {sync}"
        if self.store and any(s in why for s in ("full", "no space")):
            return f"free space on the disk of {self.store.parent}, then run {sync}"
        if self.unavailable:
            fix = advice(self.unavailable.condition, self.unavailable.read)
            text = f"{fix}; then {sync} sends MLflow what it lacks"
            if self.unavailable.condition == "slow":  # sync waits longer than a session
                text += f", waiting up to {COMMAND.in_force().read:g} s an answer"
        elif self.unreachable:
            text = f"once MLflow is reachable, run {sync}"
        elif self.fix:
            text = f"it is no connection problem: {self.fix}, then run {sync}"
        else:  # a HarnessError of ours (MLflow not installed): `down` says what to do
            text = f"once that is done, run {sync}"
        if self.label != self.uri:
            text += f" ({PASSWORD_LEFT_OUT})"
        return text

    def browse(self) -> str:
        """Where a person browses the runs: the server's page of the experiment (its test runs
        by claim, BY_CLAIM, where the experiment holds the view), `amp-harness ui` for a store it
        serves (a folder's mlflow.db), else `mlflow ui` on the store."""
        if urlparse(self.uri).scheme in ("http", "https"):
            view = BY_CLAIM if self._views_saved else None
            page = (
                ui_url(self.label, self._experiment_id, view=view)
                if self._experiment_id
                else self.label
            )
            return f"browse at {page}"
        if self.store is not None and self.store.name == DB_NAME:
            return f"browse with {command_line('ui', reports=self.store.parent)}"
        return f"browse with `{shlex.join(['mlflow', 'ui', '--backend-store-uri', self.label])}`"

    def _guard(self, what: str, call, *args, refusable: bool = False, **kwargs):
        if self.down:
            return None
        started = time.monotonic()
        try:
            return call(*args, **kwargs)
        except Exception as exc:  # any failure: keep going on the journal alone
            if refusable and _refused(exc):  # MLflow answered: the next result may be fine
                self.refused.append(f"{what}: {reason(exc)}")
                return None
            self._stop(f"{what} failed after {time.monotonic() - started:.1f} s ({reason(exc)})",
                       exc)  # fmt: skip
            return None

    def experiment_id(self) -> str:
        """The experiment's id, created on first use: its artifacts beside the embedded store
        (reports/mlartifacts, not MLflow's ./mlruns), tagged EXPERIMENT_TAGS, following a moved
        store."""
        if self._experiment_id is None:
            found = self.client.get_experiment_by_name(self.experiment)
            if found is None:
                try:
                    self._experiment_id = self.client.create_experiment(
                        self.experiment, self._artifact_root, tags=EXPERIMENT_TAGS
                    )
                    self._save_views({})
                    return self._experiment_id
                except Exception:
                    # Another session created it meanwhile (two first sessions on one store).
                    found = self.client.get_experiment_by_name(self.experiment)
                    if found is None:
                        raise
            if self._artifact_root and self.store == self.reports / DB_NAME:
                # a reports folder's store (not a server, nor one named with --tracking-uri)
                found = follow_move(self.client, found, self.store, self.notes)
            for key, value in EXPERIMENT_TAGS.items():  # stores made before the tag existed
                if found.tags.get(key) != value:
                    self.client.set_experiment_tag(found.experiment_id, key, value)
            self._experiment_id = found.experiment_id
            self._save_views(found.tags)
        return self._experiment_id

    def _save_views(self, present: dict[str, str]) -> None:
        """Save the harness's views (views()) in the experiment where it lacks them or holds
        older ones. A server that refuses one (an older MLflow's shorter tags) keeps the session
        going: its links open the runs list without the view, and a note says so."""
        try:
            for key, value in uris.views().items():
                if present.get(key) != value:
                    self.client.set_experiment_tag(self._experiment_id, key, value)
        except Exception as exc:
            if not _refused(exc):
                raise
            self.notes.append(f"MLflow refused the saved views of the runs ({reason(exc)}): "
                              "its links open the runs list as MLflow shows it")  # fmt: skip
            return
        self._views_saved = True

    def _session_runs(self, session_id: str) -> list:
        """Every active run of the session, parent and children."""
        return session_runs(self.client, self.experiment_id(), session_id)

    def _parent(self, session: dict) -> str:
        sid = session["session_id"]
        if sid not in self._parents:
            found = main_parent(self._session_runs(sid))
            self._parents[sid] = found.info.run_id if found else self._create_parent(session)
        return self._parents[sid]

    def _create_parent(self, session: dict) -> str:
        tags = {
            "mlflow.runName": session["name"],
            "amp.kind": "session",
            "amp.session_id": session["session_id"],
            "amp.args": " ".join(session["args"]),
            **_env_tags(session),
            **mark_tags(session),
        }
        if journal_index.REBUILT in session:  # its entry was lost: said where the run is read
            tags["amp.rebuilt"] = session[journal_index.REBUILT]
        # _clean redacts again: a journal written before a form of password was known keeps it.
        run = self.client.create_run(
            self.experiment_id(), int(session["started"] * 1000), _clean(tags)
        )
        return run.info.run_id

    def parent_run_id(self, session: dict) -> str | None:
        """The session's parent run, once created (pytest-xdist workers log under it)."""
        return self._parents.get(session["session_id"])

    def adopt_parent(self, session: dict, run_id: str) -> None:
        self._parents[session["session_id"]] = run_id

    def start_session(self, session: dict) -> None:
        self._guard("creating the session run", self._parent, session)

    def log_record(self, session: dict, record: Record) -> None:
        """One result through MLflow's client (log_records writes a batch of them at once)."""
        self._guard(f"logging {record.test}", self._log_record, session, record, refusable=True)

    def mark_session(self, session: dict, present: list | None = None) -> int | None:
        """Tag the runs of the session (`present`: as read already; else looked up) with its
        mark (mark_tags) where they lack it: how many runs were tagged; None where MLflow is
        down (`down` says why)."""
        return self._guard("tagging the session's runs with its mark", self._mark_runs,
                           session, present)  # fmt: skip

    def _mark_runs(self, session: dict, present: list | None) -> int:
        from mlflow.entities import RunTag

        tags = _clean(mark_tags(session))
        if present is None:  # never an experiment made only to be searched
            found = self.client.get_experiment_by_name(self.experiment)
            present = self._session_runs(session["session_id"]) if found else []
        stale = [run for run in present if any(run.data.tags.get(k) != v for k, v in tags.items())]
        for run in stale:
            self.client.log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        return len(stale)

    def end_session(self, session: dict, end: dict) -> None:
        self._guard("ending the session run", self._end_session, session, end)
        if self.may_copy:
            self._guard("deleting runs made twice", self._drop_copies, session["session_id"])

    def _drop_copies(self, session_id: str) -> int:
        """Delete the runs of the session made twice (`runs.drop_copies`): how many."""
        present = self._session_runs(session_id)
        return drop_copies(self.client, present, self._parents.get(session_id))

    def log_records(self, session: dict, records: list[Record]) -> None:
        """Each of `records` as a complete run of the session: all in one transaction where the
        store is SQL (rows.Table), else one after another through MLflow's client. A result
        MLflow refuses is listed in `refused`; any other failure turns the sink off."""
        table = self._guard("opening the experiment's runs", self._table) if records else None
        if table is None:  # MLflow is down, or not an SQL store with its files in a folder
            for record in records:
                self.log_record(session, record)
            return
        batch, refused = [], []
        for record in records:
            run = self._guard(f"logging {record.test}", self._new_run, session, record)
            if run is None:
                return
            run.tags[COMPLETE] = "true"  # it is written whole or not at all
            try:
                table.check(run)
                batch.append((record, run))
            except rows.Refused:  # logged through MLflow's client, which says why it refuses
                refused.append(record)
        what = batch[0][0].test if len(batch) == 1 else f"{len(batch)} results"
        self._guard(f"logging {what}", table.write, [run for _, run in batch])
        if self.down:
            return
        for record, run in batch:
            self._note_downsampled(record, run)
        for record in refused:
            self.log_record(session, record)

    @property
    def may_copy(self) -> bool:
        """Whether a run may have been made twice: sent through MLflow's client, whose request
        retried after a cut answer makes it again (runs.drop_copies); rows never are."""
        return not self._rows

    def _table(self) -> rows.Table | None:
        if self._rows is None:
            self._rows = rows.Table.of(self.client, self.experiment_id()) or False
        return self._rows or None

    def _log_record(self, session: dict, record: Record) -> None:
        """One result through MLflow's client: four calls, the completion tag last."""
        from mlflow.entities import Metric, Param, RunTag

        run = self._new_run(session, record)
        tags = {**run.tags, COMPLETE: "false"}
        made = self.client.create_run(self.experiment_id(), run.started, tags).info
        run_id = made.run_id
        try:
            metrics = [Metric(k, v, stamp, step) for k, v, stamp, step in run.metrics]
            params = [Param(k, v) for k, v in run.params.items()]
            self._log_files(made.artifact_uri, run)
            self.client.set_terminated(run_id, run.status, run.ended)
            # One call for every metric and history of the test (per-step calls cost ~40x more)
            # and, last, the completion tag: MLflow writes a batch's tags after its params and
            # metrics. A batch MLflow's client would split (tags go with the first part) ends
            # with a call of its own for the tag.
            done = [RunTag(COMPLETE, "true")]  # the run counts from here on
            if _one_batch(metrics, params, done):
                self.client.log_batch(run_id, metrics=metrics, params=params, tags=done)
            else:
                self.client.log_batch(run_id, metrics=metrics, params=params)
                self.client.log_batch(run_id, tags=done)
        except Exception as exc:
            if _refused(exc):  # MLflow answered and said no: no half run left to look complete
                with contextlib.suppress(Exception):
                    self.client.delete_run(run_id)
            raise
        self._note_downsampled(record, run)

    def _new_run(self, session: dict, record: Record) -> rows.NewRun:
        """The run of a result, complete: its tags, params, metrics and histories (each at most
        HISTORY_POINTS points, the cut ones named in DOWNSAMPLED), its end and its files."""
        parent = self._parent(session)
        found = verdicts.of_record(record)  # each claim's status, as it counts
        tags = {
            "mlflow.parentRunId": parent,
            "mlflow.runName": run_name(record, found),
            "mlflow.note.content": description(record, found),
            "amp.kind": "test",
            "amp.session_id": session["session_id"],
            "amp.record_id": record.record_id,
            "amp.test": record.test,
            "claims": ",".join(record.claims),
            "outcome": record.outcome,
            "outcome.message": record.message,
            **_env_tags(session),
            **mark_tags(session),
        }
        known = claims.catalogue()
        for v in record.verdicts.values():
            tags[f"verdict.{v.claim}"] = v.verdict  # as recorded, before the outcome was known
            tags[f"evidence.{v.claim}"] = v.evidence
            if v.claim in known:  # where the claim comes from: the article, a paper, a team
                tags[f"source.{v.claim}"] = known[v.claim].source
        for claim, status in found.items():
            tags[f"status.{claim}"] = status.label  # what counts: "failed (was: partly)", ...
        sent = {name: downsampled(values) for name, values in record.histories.items()}
        cut = {name: len(record.histories[name]) for name, points in sent.items()
               if len(points) < len(record.histories[name])}  # fmt: skip
        if cut:
            tags[DOWNSAMPLED] = ", ".join(f"{name} ({n:,} steps)" for name, n in cut.items())
        stamp = int(record.ended * 1000)
        metrics = [(k, v, stamp, 0) for k, v in record.metrics.items()]
        metrics += [(k, v, stamp, step) for k, points in sent.items() for step, v in points]
        return rows.NewRun(
            tags=_clean(tags),
            params={**record.params, "device": record.device},
            metrics=metrics,
            started=int(record.started * 1000),
            ended=stamp,
            status=_STATUS[record.outcome],
            files=lambda folder: self._stage_files(record, folder),
            cut=cut,
        )

    def _log_files(self, artifact_uri: str, run: rows.NewRun) -> None:
        """The run's files in one upload, into its folder `artifact_uri`: a call each cost a
        request each (a transaction and a copy each on the embedded store)."""
        with tempfile.TemporaryDirectory(prefix="amp-harness-") as staged:
            run.files(Path(staged))
            self.client.log_artifacts_to(artifact_uri, staged)

    @staticmethod
    def _stage_files(record: Record, folder: Path) -> None:
        """A result's files as its run holds them: record.json and its figures (figures/NAME)."""
        (folder / "record.json").write_text(
            redact(json.dumps(record.to_dict(), indent=1)), encoding="utf-8"
        )
        for name in record.figures:
            path = record.artifact_dir / name
            if path.exists():
                (folder / "figures").mkdir(exist_ok=True)
                shutil.copyfile(path, folder / "figures" / Path(name).name)
            else:
                log.warning("%s: figure %s is gone; not logged", record.test, path)

    def _note_downsampled(self, record: Record, run: rows.NewRun) -> None:
        """One line in `notes` for every test whose histories MLflow got fewer points of."""
        if not run.cut:
            return
        test, cut = record.test, run.cut
        self._downsampled.append(
            f"{test} ({', '.join(f'{name}: {steps:,} steps' for name, steps in cut.items())})"
        )
        shown = "; ".join(self._downsampled[:3])
        more = len(self._downsampled) - 3
        note = (
            f"histories longer than {HISTORY_POINTS:,} steps went to MLflow as at most "
            f"{HISTORY_POINTS:,} points each (the first and last step, and each stretch's highest "
            f"and lowest value; tag {DOWNSAMPLED}), whole in the run's record.json: {shown}"
            + (f"; and {more} more tests" if more > 0 else "")
        )
        if self._downsampled_note is None:
            self._downsampled_note = len(self.notes)
            self.notes.append(note)
        else:
            self.notes[self._downsampled_note] = note

    def _end_session(self, session: dict, end: dict) -> None:
        from mlflow.entities import Metric, RunTag

        parent = self._parent(session)
        run = self.client.get_run(parent)
        ended_by_sync = END_REASON in run.data.tags  # a copy of the journal lacked this end
        if run.info.status != "RUNNING" and not ended_by_sync:
            return  # already ended, by the live session or an earlier sync
        stamp = int(end["ended"] * 1000)
        counts = [Metric(f"tests.{k}", v, stamp, 0) for k, v in end["counts"].items()]
        # What the session did not run (-k, modules left out): the report's "incomplete".
        tags = {EXIT_STATUS: str(end["exitstatus"])}
        if end.get("left_out"):
            tags[LEFT_OUT] = "; ".join(end["left_out"])
        tags = [RunTag(k, v) for k, v in _clean(tags).items()]
        self.client.log_batch(parent, metrics=counts, tags=tags)
        self.client.set_terminated(parent, _session_status(end["exitstatus"]), stamp)
        if ended_by_sync:
            self.client.delete_tag(parent, END_REASON)


def _one_batch(metrics: list, params: list, tags: list) -> bool:
    """Whether MLflow's client sends this log_batch as one request (it splits a larger one)."""
    from mlflow.utils import validation as limits

    return (
        len(metrics) <= limits.MAX_METRICS_PER_BATCH
        and len(params) + len(tags) <= limits.MAX_PARAMS_TAGS_PER_BATCH
        and len(metrics) + len(params) + len(tags) <= limits.MAX_ENTITIES_PER_BATCH
    )
