"""Reading the ledger from MLflow: `read` opens the store and the experiment, reads its runs and
the saved diagnoses once, and builds the `Ledger` (harness.reports.ledger) from them with
ledger_sessions, ledger_columns and ledger_history.

Reading MLflow fails as one HarnessError naming the tracking URI (without its password) and the
fix (`reading`); every call is bounded by tracking.client's settings (about 10 s against a server
that hangs). Apart from the builders, which never query MLflow: this module is the one that does.
"""

from __future__ import annotations

import contextlib
import time
from urllib.parse import urlparse

from harness.catalogue.claims import catalogue
from harness.common.errors import HarnessError
from harness.records import tracking
from harness.reports import (
    atlas,
    diagnoses,
    differences,
    ledger_columns,
    ledger_history,
    ledger_sessions,
)
from harness.reports.ledger import Ledger, when
from harness.reports.table import cap

EMBEDDED_UI = "http://127.0.0.1:5000"  # what `amp-harness ui` (and `mlflow ui`) serve by default


def read(tracking_uri: str, experiment: str) -> Ledger:
    """The ledger of `experiment` at `tracking_uri`; reading MLflow fails as one HarnessError
    naming the store and the fix (`reading`)."""
    ui = _ui(tracking_uri)
    with reading(tracking_uri, "reading the experiment and its runs"):
        client, experiment_id = _open(tracking_uri, experiment)
        runs = tracking.search_runs(client, experiment_id)
        diagnosed = _diagnoses(client, ui)
        # The test runs of every environment by claim, where the experiment holds that view.
        held = client.get_experiment(experiment_id).tags
        view = tracking.BY_CLAIM if tracking.VIEW_TAG + tracking.BY_CLAIM in held else None
        runs_url = tracking.ui_url(ui, experiment_id, view=view)

    def link(run_id: str) -> str:
        return tracking.ui_url(ui, experiment_id, run_id)

    built = time.time()
    # The team's record, and the experiments apart from it.
    runs, experimental = ledger_sessions.apart(runs, link, built)
    environments = ledger_columns.environments(runs, link, built)
    uncovered, undecided = ledger_columns.uncovered(runs)
    rows = [
        (claim, [ledger_columns.cell(claim.id, env, link) for env in environments])
        for claim in catalogue().values()
    ]
    differ = differences.find(
        (claim.id for claim, _cells in rows), ledger_columns.compared(environments, rows)
    )
    autocast_atlas = atlas.table(ledger_columns.atlas_columns(environments))
    timeline = ledger_history.per_class(runs, link)
    return Ledger(
        built=built,
        ui=ui,
        runs_url=runs_url,
        view=view,
        environments=environments,
        experimental=experimental,
        rows=rows,
        differences=differ,
        atlas=autocast_atlas,
        history=timeline,
        history_rows=ledger_history.rows(timeline),
        uncovered=uncovered,
        undecided=undecided,
        diagnoses=diagnosed,
        regressions=[ledger_columns.capability_regressions(env) for env in environments],
        unknown=ledger_columns.unknown_claims(runs),
        classes=ledger_columns.classes(environments),
    )


@contextlib.contextmanager
def reading(uri: str, what: str):
    """MLflow's own errors while reading (a server down or hanging, a database that refuses)
    as one HarnessError naming the store and the fix; MLflow's messages repeat the URI, so
    they are redacted too."""
    started = time.monotonic()
    try:
        yield
    except HarnessError:
        raise
    except Exception as exc:  # MlflowException, requests' and SQLAlchemy's errors alike
        first = tracking.reason(exc)
        if urlparse(uri).scheme in ("http", "https"):
            fix = "start the tracking server, or correct its address"
        else:
            fix = "check that the store and its artifacts are there and readable"
        raise HarnessError(
            f"cannot read MLflow at {tracking.redact(uri)}: {what} failed after "
            f"{time.monotonic() - started:.1f} s ({first}). "
            f"Fix: {fix} (--tracking-uri or $MLFLOW_TRACKING_URI), then run `amp-harness "
            "report` again. Nothing is lost: every result is in the journal, and `amp-harness "
            "sync` sends MLflow what it lacks"
        ) from None


def _open(uri: str, experiment: str):
    # Opening a missing SQLite file would create an empty store: say where to look instead. The
    # file as SQLAlchemy reads the URI (tracking.sqlite_path): urlparse cuts a path at '#'.
    path = tracking.sqlite_path(uri)
    if path is not None and not path.is_file():
        raise HarnessError(
            f"no MLflow store {path}: run `amp-harness run` first, or pass --reports DIR "
            "or --tracking-uri URI for the store that holds the runs"
        )
    client = tracking.client(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = [e.name for e in client.search_experiments()]
        raise HarnessError(
            f"no experiment {experiment!r} at {tracking.redact(uri)}; it has: "
            f"{', '.join(names) or 'none'} (pass --experiment NAME)"
        )
    return client, found.experiment_id


def _diagnoses(client, ui: str) -> list[dict]:
    """`amp-harness diagnose` runs, the latest per factory, device and torch, each with its
    link and its reasons capped for the page."""
    found = diagnoses.latest(client)
    for d in found:
        d["url"] = tracking.ui_url(ui, d["experiment_id"], d["run_id"])
        d["when"] = when(d["started"] / 1000)
        d["recipes"] = [
            (recipe, status, cap(reasons, "in the MLflow run", chars=600))
            for recipe, status, reasons in d["recipes"]
        ]
    return found


def _ui(uri: str) -> str:
    """Where the MLflow UI for this store is: the server itself, or `amp-harness ui` /
    `mlflow ui --backend-store-uri URI` on their default address for a database store."""
    if urlparse(uri).scheme in ("http", "https"):
        return tracking.redact(uri).rstrip("/")
    return EMBEDDED_UI
