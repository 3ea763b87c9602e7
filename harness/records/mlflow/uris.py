"""Where MLflow's store is, and what of it is said: the tracking URI (--tracking-uri, else
$MLFLOW_TRACKING_URI, else the embedded store in the reports folder), passwords taken out of
anything printed or recorded (`redact`), the `amp-harness` command lines a user copies, and the
links into MLflow's UI with the saved views they open."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from urllib.parse import unquote, urlparse

from harness.catalogue import claims
from harness.common.errors import HarnessError

DEFAULT_EXPERIMENT = "amp-harness"
DB_NAME = "mlflow.db"
ARTIFACTS_NAME = "mlartifacts"
SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")
# The experiment is model training, not GenAI: MLflow's experiment-kind tag says so to the UIs
# that choose their view by it. MLflow 3.17's own UI ignores it (a build flag makes its
# "GenAI | Model training" switch decide, kept in the browser, GenAI by default, and read from
# the URL's `workflowType`): the links the harness prints carry UI_VIEW (ui_url), which opens
# the runs list. Checked in headless Chromium by tests/reports/test_mlflow_ui.py.
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}
UI_VIEW = "workflowType=machine_learning"
# An id MLflow's filter language can hold between quotes: it has no escape for a quote inside a
# string, so any other id (a journal written by hand or by another tool) is matched here instead.
_PLAIN_ID = re.compile(r"[A-Za-z0-9_.:-]+")


# The view a team compares in. MLflow 3.17's runs page reads its search from the URL (only
# searchFilter, orderByKey, orderByAsc, startTime, lifecycleFilter, modelVersionFilter and
# datasetsFilter; `isComparingRuns` is no longer read) but not its columns or grouping: those
# are kept in the browser, or in a saved view ("Views", "Save view"), which MLflow keeps as the
# experiment's tag VIEW_TAG + key and opens from the URL's `viewStateShareKey=<key>`. The
# harness saves VIEWS in its experiment (views(), on every session's start and by `amp-harness
# ui`) and its links open BY_CLAIM: the test runs alone (no collapsed sessions), grouped,
# their names wide, with the verdict columns. A URL with both a search and a view key opens
# without the view, so each view is the whole state. The assistant's panel is the browser's
# alone. Checked in headless Chromium by tests/reports/test_mlflow_ui.py.
VIEW_TAG = "mlflow.sharedViewState."
BY_CLAIM, BY_ENVIRONMENT = "amp-harness-by-claim", "amp-harness-by-environment"
ENVIRONMENT_TAGS = ("env.hardware_class", "env.torch")  # an environment, as grouped in MLflow
_VIEW_CHARS = 20_000  # MLflow's limit on an experiment tag's value (its UI's on a saved view)
_VIEW_FIRST_COLUMNS = ("attributes.`Run Name`", "runDateAndNestInfo", "duration")  # MLflow's
# The names wide enough for claim, verdict and most of the test; the environment whole.
_VIEW_WIDTHS = {"attributes.`Run Name`": 480, "runDateAndNestInfo": 140,
                "tags.`env.hardware_class`": 170, "tags.`env.torch`": 110}  # fmt: skip
_VIEW_SAVED = 1_796_515_200_000  # a fixed time (ms): a view's tag is rewritten only on a change


def views(claim_ids: list[str] | None = None) -> dict[str, str]:
    """The experiment tags of the harness's saved views in MLflow's UI, each in the envelope of
    MLflow's "Save view": the test runs, latest first, grouped by claim (BY_CLAIM) or by
    environment (BY_ENVIRONMENT), with a verdict column per claim of the catalogue (`claim_ids`:
    those) in the order of their ids, as many as MLflow's limit on a tag holds (the rest: the
    page's Columns menu). MLflow draws a column only for a tag the runs it loaded have."""
    if claim_ids is None:
        try:
            claim_ids = list(claims.catalogue())
        except claims.CatalogueError:  # a broken project catalogue: the session says so itself
            claim_ids = list(claims.builtin())
    claim_ids = sorted(c for c in claim_ids if _PLAIN_ID.fullmatch(c))  # an id holds no `
    env = [f"tags.`{t}`" for t in ENVIRONMENT_TAGS]
    found = {}
    for key, name, group, shown in (
        (BY_CLAIM, "amp-harness: tests by claim", ["claims"], ["tags.`outcome`", *env]),
        (BY_ENVIRONMENT, "amp-harness: tests by environment", ENVIRONMENT_TAGS,
         ["tags.`outcome`"]),
    ):  # fmt: skip

        def envelope(n: int, name=name, group=group, shown=shown) -> str:
            columns = shown + [f"tags.`verdict.{c}`" for c in claim_ids[:n]]
            state = {
                "searchFilter": "tags.`amp.kind` = 'test'",
                "orderByKey": "attributes.end_time",
                "orderByAsc": False,
                "selectedColumns": columns,
                "columnOrder": [*_VIEW_FIRST_COLUMNS, *columns],
                "columnWidths": _VIEW_WIDTHS,
                "groupBy": {
                    "aggregateFunction": "average",
                    "groupByKeys": [{"mode": "tag", "groupByData": t} for t in group],
                },
            }
            return json.dumps({"name": name, "createdAt": _VIEW_SAVED, "updatedAt": _VIEW_SAVED,
                               "state": json.dumps(state)})  # fmt: skip

        low, high = 0, len(claim_ids)  # the most verdict columns that fit
        while low < high:
            middle = (low + high + 1) // 2
            fits = len(envelope(middle)) <= _VIEW_CHARS
            low, high = (middle, high) if fits else (low, middle - 1)
        found[VIEW_TAG + key] = envelope(low)
    return found


def ui_url(
    ui: str, experiment_id: str, run_id: str | None = None, view: str | None = BY_CLAIM
) -> str:
    """The page of one run, or of an experiment's runs in its saved `view` (one of views(),
    which the experiment must hold; None: the runs list as MLflow opens it), in the MLflow UI
    at `ui`, in its model training view (UI_VIEW)."""
    page = f"{ui.rstrip('/')}/#/experiments/{experiment_id}/runs"
    if run_id:
        return f"{page}/{run_id}?{UI_VIEW}"
    return f"{page}?{UI_VIEW}" + (f"&viewStateShareKey={view}" if view else "")


# --- passwords -------------------------------------------------------------------------------
# scheme://user:password@host, also with the URI percent-encoded inside another one
# (http%3A%2F%2Fuser%3Apw%40host), and in the shapes a URI is mistyped in: one slash or none
# (http:/user:pw@host, http:user:pw@host) or no scheme at all (user:pw@host:5432, read as
# "scheme" user and "userinfo" pw). The authority runs to the first / ? # or blank; its userinfo
# to the last @ in it, so a raw @ inside a password is cut with the rest of it. The scheme starts
# where no scheme character precedes it: a regex free to start inside a run of letters takes time
# quadratic in the run (100 KB of letters in evidence: 81 s per redaction).
_AUTHORITY = re.compile(
    r"(?<![A-Za-z0-9+.-])(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)(?P<sep>:/{0,3}|%3A(?:%2F){0,3})"
    r"(?P<authority>(?:(?!%2F|%3F|%23)[^/?#\s\"'<>])*)",
    re.IGNORECASE,
)
# A query parameter that holds a secret: password=, token=, access_token=, api_key=, sig=, ...;
# also percent-encoded (%3Ftoken%3D...). Its name holds no ? & ; (a run of them would make each
# a start to scan the rest from: quadratic again).
_SECRET_PARAMETER = re.compile(
    r"(?P<name>(?:[?&;]|%3F|%26)[^=&#?;\s%]*?(?:pass|pwd|token|secret|key|auth|sig|credential)"
    r"[^=&#?;\s%]*(?:=|%3D))(?P<value>(?:(?!%26)[^&#\s\"'<>])*)",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """`text` without the password of anything shaped like a URI in it: scheme://user:pw@host ->
    scheme://user@host (scheme://:pw@host -> scheme://host), percent-encoded forms too, with one
    slash or none, or no scheme (user:pw@host -> user@host; so mailto:a@b reads mailto@b: a
    password kept would be worse), and the value of a query parameter named like a secret
    (?password=, ?token=, ...) -> ***. Command lines, links and MLflow's error messages are
    recorded, printed and shared."""

    def authority(found: re.Match) -> str:
        text, encoded = found["authority"], found["sep"].startswith("%")
        at = max(text.rfind("@"), text.upper().rfind("%40") if encoded else -1)
        if at < 0:
            return found[0]
        userinfo, host = text[:at], text[at:].removeprefix("@")
        host = host[3:] if host.upper().startswith("%40") else host
        start, at_sign = found["scheme"] + found["sep"], "%40" if encoded else "@"
        user, *password = re.split(r":|%3A", userinfo, maxsplit=1, flags=re.IGNORECASE)
        if not password and found["sep"].upper() in (":", "%3A"):
            # user:pw@host, without a scheme: what looked like one is the user, and the
            # userinfo the password.
            return found["scheme"] + at_sign + host
        if not user:
            return start + host
        return start + user + at_sign + host

    return _SECRET_PARAMETER.sub(r"\g<name>***", _AUTHORITY.sub(authority, text))


# --- where the store is --------------------------------------------------------------------


def default_uri(reports: Path) -> str:
    """The embedded store, reports/mlflow.db, as an SQLite URI.

    SQLAlchemy reads what follows a '?' as connection options and decodes %XX escapes, so a '?'
    or '%' in the path would name another file: those two are escaped. Only those: MLflow also
    takes the URI's text as a path (to create its folder), where any other escape would name a
    folder that does not exist (a '#' or a blank means nothing to SQLAlchemy)."""
    path = str((Path(reports) / DB_NAME).resolve())
    return "sqlite:///" + path.replace("%", "%25").replace("?", "%3F")


def sqlite_path(uri: str) -> Path | None:
    """The file of an SQLite tracking URI, read as SQLAlchemy reads it (the text before '?', its
    %XX escapes decoded), or None for any other store. Readers of the URI use this, never
    urlparse, which would also cut the path at a '#'."""
    found = re.match(r"sqlite(?:\+\w+)?:///(?P<database>[^?]*)", uri)
    if not found or found["database"] in ("", ":memory:"):
        return None
    return Path(unquote(found["database"]))


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
            f"{origin}={redact(uri)!r}: unsupported tracking URI scheme {scheme or '(none)'!r}. "
            f"Use one of {', '.join(s + '://' for s in SCHEMES)}, e.g. sqlite:///reports/mlflow.db "
            "or http://127.0.0.1:5000 (the file store ./mlruns is refused by MLflow 3)."
        )
    return uri


def command_line(name: str, *args: str, reports: Path, uri: str | None = None) -> str:
    """`amp-harness NAME ARGS` for the folder `reports` and the store `uri`, as a user copies it
    from what a session or command printed: with --reports unless `reports` is the commands'
    default (./reports), with --tracking-uri unless the command finds that store itself
    ($MLFLOW_TRACKING_URI, else the folder's mlflow.db); quoted for the shell, without the
    password, and then how to give it."""
    words, note = ["amp-harness", name, *args], ""
    if Path(reports).resolve() != Path("reports").resolve():
        words += ["--reports", str(reports)]
    if uri is not None and uri != (os.environ.get("MLFLOW_TRACKING_URI") or default_uri(reports)):
        words += ["--tracking-uri", redact(uri)]
        note = f" ({PASSWORD_LEFT_OUT})" if redact(uri) != uri else ""
    return f"`{shlex.join(words)}`{note}"


PASSWORD_LEFT_OUT = (
    "with the password, left out here: put it back in the URI, or set MLFLOW_TRACKING_USERNAME "
    "and MLFLOW_TRACKING_PASSWORD"
)
