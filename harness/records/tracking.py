"""MLflow, downstream of the journal: one parent run per session, one child run per test.

Every call is bounded (MLflow's defaults block for minutes on a dead server) and the first
failure turns the sink off for the rest of the session: results keep going to the journal, and
`amp-harness sync` replays what MLflow lacks. Live logging and sync share one code path, keyed by
the `amp.session_id` and `amp.record_id` tags, so replaying twice never duplicates a run.

A child run counts as logged only once it is complete: it is created with `amp.complete=false`
(MLflow creates a run before its metrics and files can be sent) and the tag turns `true` as the
last call, after its metrics, artifacts and end. A run left half-made (a process killed in the
middle, a call MLflow refused) is deleted by `sync` and its record logged afresh; the parent run
of a session that never ended (its process killed) is ended by `sync` as KILLED, saying why.
`sync` holds a lock beside the journal, and leaves alone the sessions that still run (each holds
a lock of its own while it runs), so neither another sync nor a live session logs a record twice.

Each HTTP request to a tracking server is bounded by who waits on it (Bounds): a session's calls,
writes and the reads among them, which the tests wait on, by SESSION; a command's (the report's
reads, and `sync`'s checks and the writes it replays), which a person runs to get MLflow's
answer, by COMMAND, patient with a busy server. Both connect within seconds: a server that is
down is said within seconds by either. A failure is said as measured (Unavailable): "down" when
no connection was made, "slow" when the server took the connection and did not answer in time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import http.client
import json
import logging
import os
import re
import shlex
import socket
import sqlite3
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

from harness.catalogue import claims, verdicts
from harness.common.errors import HarnessError
from harness.records import halfmade, journal_index
from harness.records.journal import Journal, Session
from harness.records.record import Record

log = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "amp-harness"
DB_NAME = "mlflow.db"
ARTIFACTS_NAME = "mlartifacts"
SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")
COMPLETE = "amp.complete"  # "false" from the run's creation, "true" as its last call
END_REASON = "amp.end_reason"  # on a session run ended by `sync`, not by its session
LEFT_OUT = "amp.left_out"  # on a session run: what of the suite it did not run, if anything
EXIT_STATUS = "amp.exitstatus"  # on a session run: pytest's exit status
# On a session's parent and test runs once it is marked (journal_index.MARK: pytest's
# --amp-experimental, `amp-harness sessions mark`): "true" for an experiment, "false" once of
# record again; a team filters experiments out with `tags.amp.experimental != 'true'`.
EXPERIMENTAL = "amp.experimental"
EXPERIMENTAL_REASON = "amp.experimental_reason"
RUNNING_FOLDER = ".running"  # beside the journal: one lock file per session while it runs
SYNC_LOCK = ".sync.lock"  # beside the journal: one `sync` at a time
DOWNSAMPLED = "amp.downsampled"  # on a test run: its histories MLflow got fewer points of
# The points of one history MLflow gets: each is a row of its store (a 10^6-step history took
# 365 s and 1.46 GB to log, 249 MB to keep; now 2.2 s, most of it record.json, which holds it
# whole, and 2.4 MB). 2,000 points log in 0.1 to 0.3 s and give each of 1,000 stretches its
# highest and lowest value (downsampled): a chart 1,000 pixels wide, three times the 320
# points MLflow's UI samples of a history to draw it.
HISTORY_POINTS = 2000

# Telemetry off, where the user has not set it. (The bounds of each request: Bounds, below.)
MLFLOW_ENV = {
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
RUN_NAME_CHARS = 250  # MLflow's limit on a run name
# The experiment is model training, not GenAI: MLflow's experiment-kind tag says so to the UIs
# that choose their view by it. MLflow 3.17's own UI ignores it (a build flag makes its
# "GenAI | Model training" switch decide, kept in the browser, GenAI by default, and read from
# the URL's `workflowType`): the links the harness prints carry UI_VIEW (ui_url), which opens
# the runs list. Checked in headless Chromium by tests/reports/test_mlflow_ui.py.
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}
UI_VIEW = "workflowType=machine_learning"
_PAGE = 5000  # runs per search call
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


# --- how long a tracking server is waited for ------------------------------------------------
# MLflow's own bound is one number for the connection and the answer alike (120 s, 7 retries with
# backoff: minutes per call on a server that is down or hangs). The harness's requests go with
# two, by who waits on them; a user's MLFLOW_HTTP_REQUEST_* settings win (Bounds.in_force).


@dataclasses.dataclass(frozen=True)
class Bounds:
    """How long one HTTP request to a tracking server may take: `connect` seconds to make the
    connection, `read` seconds for the answer once connected; sent again `retries` times after a
    connection refused, a timeout or a 5xx, the second retry `backoff` seconds after the first
    (doubled for each one after it; urllib3 sends the first at once)."""

    connect: float
    read: float
    retries: int
    backoff: float

    def in_force(self) -> Bounds:
        """These bounds with the user's settings in their place: MLFLOW_HTTP_REQUEST_TIMEOUT
        is the read timeout, and the connect timeout where it is shorter; then
        MLFLOW_HTTP_REQUEST_MAX_RETRIES and MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR."""
        read = float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", self.read))
        return Bounds(
            connect=min(self.connect, read),
            read=read,
            retries=int(os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES", self.retries)),
            backoff=float(os.environ.get("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", self.backoff)),
        )


# A connection is made in milliseconds by a server that is up, loaded or not; 4 s leaves room for
# two lost SYNs (resent after 1 s and 3 s). A refused one, or a name that does not resolve, fails
# at once: a server that is down is said within seconds, by a session and a command alike.
# A session's calls, writes and the reads among them: the tests wait on each. One answer that
# takes over 4 s (a server that hangs: about 8 s, two tries) and the session goes on with the
# journal alone: `sync` later sends MLflow the rest, with COMMAND's patience, and a busy server
# never holds the tests for minutes.
SESSION = Bounds(connect=4, read=4, retries=1, backoff=1)
# A command's calls (the report's reads, `sync`'s checks and the writes it replays): a person runs
# it for MLflow's answer, and a busy team server (PostgreSQL under load) takes tens of seconds
# for one. Three tries of 30 s, the last 2 s after the second: a server that never answers is
# said to be slow after about 1.5 min.
COMMAND = Bounds(connect=4, read=30, retries=2, backoff=1)
# Those of the harness's MLflow call in progress, if any. A global, not a context variable: MLflow
# downloads a run's artifacts in threads of its own, whose requests are the call's too.
_bounds_now: Bounds | None = None


@contextlib.contextmanager
def _bounded_by(bounds: Bounds) -> Iterator[None]:
    """The block's HTTP requests held to `bounds` (_bounded_requests)."""
    global _bounds_now
    before, _bounds_now = _bounds_now, bounds
    try:
        yield
    finally:
        _bounds_now = before


def _bounded_requests(send: Callable) -> Callable:
    """MLflow's sender of each HTTP request (its own retries included), held to the bounds of the
    harness's call in progress: MLflow passes it one timeout from MLFLOW_HTTP_REQUEST_TIMEOUT,
    requests takes (connect, read). A request outside the harness's calls (MLflow used by a
    scenario itself) is left as MLflow sends it."""

    @functools.wraps(send)
    def bounded(method, url, max_retries, backoff_factor, *args, timeout=None, **kwargs):
        if _bounds_now is not None:
            bounds = _bounds_now.in_force()
            max_retries, backoff_factor = bounds.retries, bounds.backoff
            timeout = (bounds.connect, bounds.read)
        return send(method, url, max_retries, backoff_factor, *args, timeout=timeout, **kwargs)

    bounded.amp_bounds = True
    return bounded


def _hold_requests_to_bounds() -> None:
    """MLflow's sender replaced by _bounded_requests, once. MLflow 3.17's, where every request
    of its REST store and artifact repository goes (mlflow.utils.rest_utils.http_request):
    tests/records/test_tracking.py's slow and hanging servers fail if that changes."""
    from mlflow.utils import rest_utils

    if not getattr(rest_utils._get_http_response_with_retries, "amp_bounds", False):
        rest_utils._get_http_response_with_retries = _bounded_requests(
            rest_utils._get_http_response_with_retries
        )


def client(uri: str, set_aside: list[str] | None = None) -> BoundedClient:
    """An MlflowClient whose calls are bounded (BoundedClient), for every reader and writer: by
    a command's patient bounds (COMMAND: the report reads with them), which a session's sink
    sets to SESSION.

    An embedded store left half-made (halfmade.py) is set aside and made anew; what was done is
    appended to `set_aside` ("the store ... was half-made (...): set aside as ...")."""
    for key, value in MLFLOW_ENV.items():
        os.environ.setdefault(key, value)
    # MLflow prints "View run NAME at: URL" whenever it ends a run on an HTTP server, the URL
    # with the URI's password in it. The harness prints its own line, without the password: this
    # one is not left to the user's setting.
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    with foreign_warnings_ignored():  # MLflow's import and its store's making warn
        made = _mlflow_client(uri, set_aside)
    _hold_requests_to_bounds()
    return BoundedClient(made, COMMAND, redact(uri))


def _mlflow_client(uri: str, set_aside: list[str] | None):
    try:
        from mlflow import MlflowClient  # imported here: it takes seconds
    except ImportError as exc:  # e.g. an offline GPU runner's wheelhouse missing a requirement
        raise HarnessError(
            f"MLflow cannot be imported ({exc}): install it with its requirements "
            "(`pip install -e .` does), or pass --no-mlflow to record to the journal only"
        ) from exc
    store = sqlite_path(uri)
    if store is None:
        return MlflowClient(tracking_uri=uri)
    # MLflow creates the folder of the URI's text taken as a path, escapes and all: a folder
    # that does not exist beside the real one (".../a%3Fb/reports" for ".../a?b/reports").
    # Take away what it made that way.
    literal = Path(uri.split(":///", 1)[1]).parent
    stray = [p for p in (literal, *literal.parents) if not p.exists()] if (
        store.parent != literal) else []  # fmt: skip
    # An empty store gets its tables from the first client that opens it; two sessions opening
    # a new store at once would both create them ("table ... already exists"). MLflow says so in
    # two INFO lines on the user's terminal, above the session's first line: the session names
    # its store itself at its end.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    with _locked(store.with_name(f".{store.name}.lock")):
        try:
            made = MlflowClient(tracking_uri=uri)
        except Exception as exc:
            if not halfmade.half_made(store, exc):
                raise
            aside = halfmade.set_aside(store, uri)
            made = MlflowClient(tracking_uri=uri)
            note = (
                f"the store {store} was half-made ({reason(exc)}: a session or sync was "
                f"stopped while MLflow created its tables): set aside as {aside} (nothing "
                "deleted) and made anew"
            )
            if set_aside is not None:
                set_aside.append(note)
            else:  # a reader (the report): said on stderr, with what refills the store
                sync = command_line("sync", reports=store.parent, uri=uri)
                log.warning("MLflow: %s; %s fills it from the journal", note, sync)
    for folder in stray:  # the deepest first; a folder with anything in it stays
        try:
            folder.rmdir()
        except OSError:
            break
    return made


# --- every MLflow call ---------------------------------------------------------------------
# A warning attributed to any module but the harness's own: inside the harness's MLflow calls,
# MLflow's and the libraries' under it (SQLAlchemy, alembic, pydantic, urllib3, ...).
_NOT_THE_HARNESS = r"(?!harness(\.|$))"


@contextlib.contextmanager
def foreign_warnings_ignored() -> Iterator[None]:
    """The block with every warning of a module other than the harness's ignored, the warnings
    filters as they were before and after it. For the harness's MLflow calls: a user's `-W error`
    or `filterwarnings = error` made MLflow's own warnings (SQLAlchemy's deprecation of `noload`,
    as MLflow opens any store) exceptions, and MLflow was off in every session. What the
    harness itself calls wrongly still warns, and the user's filters hold for it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=_NOT_THE_HARNESS)
        yield


# MLflow's tqdm bar for each artifact it uploads or downloads: `amp-harness report` printed one
# per figure ("Downloading artifacts", 7 bars before its own line). Off inside the harness's
# calls, where the user has not set it (mlflow.environment_variables reads it at each call).
PROGRESS_BARS = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


@contextlib.contextmanager
def progress_bars_off() -> Iterator[None]:
    """The block without MLflow's artifact progress bars, unless the user set them; the
    environment as it was after it. MLflow's warnings are its own business (they stay)."""
    if PROGRESS_BARS in os.environ:
        yield
        return
    os.environ[PROGRESS_BARS] = "false"
    try:
        yield
    finally:
        os.environ.pop(PROGRESS_BARS, None)


class BoundedClient:
    """An MlflowClient (`mlflow_client`, of the store `label` names) whose every method runs with
    foreign_warnings_ignored, its HTTP requests held to `bounds` (SESSION unless told), and is
    sent again when its answer was cut in the middle (_cut): MLflow's client retries a request
    whose answer never came or was a 5xx, never one whose body broke off, and one such answer
    turned MLflow off for the rest of the session. As many times as MLflow's client would retry
    a 5xx (the retries in force), each bounded as its requests are; what a request sent twice
    makes twice is deleted as for a 5xx (MlflowSink._drop_copies). A server that gave no answer
    raises Unavailable, saying whether it is down or slow. Its other attributes are the
    client's own."""

    def __init__(self, mlflow_client, bounds: Bounds = SESSION, label: str = ""):
        self.mlflow_client, self.bounds, self.label = mlflow_client, bounds, label

    def __getattr__(self, name: str):
        found = getattr(self.mlflow_client, name)
        if not callable(found):
            return found

        @functools.wraps(found)
        def bounded(*args, **kwargs):
            sent_again, started = 0, time.monotonic()
            while True:
                try:
                    with foreign_warnings_ignored(), progress_bars_off(), _bounded_by(self.bounds):
                        return found(*args, **kwargs)
                except Exception as exc:
                    bounds = self.bounds.in_force()
                    if _cut(exc) and sent_again < bounds.retries:
                        sent_again += 1
                        log.info("MLflow: %s: the answer was cut (%s); sent again", name,
                                 reason(exc))  # fmt: skip
                        continue
                    condition = _condition(exc)
                    if condition is None:
                        raise
                    seconds = time.monotonic() - started
                    raise Unavailable(self.label, condition, reason(exc), bounds, seconds) from exc

        return bounded


class Unavailable(HarnessError):
    """A tracking server that gave no answer, said as measured: `condition` "down" (no connection
    made: refused, a name that does not resolve, no route, the connect timeout) or "slow" (it
    took the connection and did not answer within the read timeout: busy). Never "start the
    server" to a server that runs."""

    def __init__(self, label: str, condition: str, detail: str, bounds: Bounds, seconds: float):
        self.condition, self.read = condition, bounds.read
        tries = f"{bounds.retries + 1} tries in {seconds:.1f} s"
        self.said = (f"no connection ({tries}): {detail}" if condition == "down" else
                     f"no answer within {bounds.read:g} s ({tries}): {detail}")  # fmt: skip
        super().__init__(
            f"MLflow at {label} is {condition}: {self.said}. Fix: {advice(condition, bounds.read)}"
        )


def advice(condition: str, read: float) -> str:
    """What to do about a server that is "down" or "slow" (given `read` seconds an answer)."""
    if condition == "down":
        return (
            "start the tracking server, or check its URI (--tracking-uri or $MLFLOW_TRACKING_URI)"
        )
    return (
        f"the server took the connection but did not answer within {read:g} s: it is busy. "
        "Retry later, or give it longer (MLFLOW_HTTP_REQUEST_TIMEOUT=SECONDS)"
    )


def _condition(exc: Exception) -> str | None:
    """Said "down" where no connection was made (urllib3's ConnectTimeoutError covers a refused one,
    a name that does not resolve and no route too), "slow" where a made one timed out waiting
    for the answer, None for any other failure (a reset, a 5xx, a refusal, a bug)."""
    from requests.exceptions import ConnectTimeout, ReadTimeout
    from urllib3.exceptions import ConnectTimeoutError, ReadTimeoutError

    chain = list(_chain(exc))
    no_connection = (ConnectTimeoutError, ConnectTimeout, ConnectionRefusedError, socket.gaierror)
    if any(isinstance(e, no_connection) for e in chain):
        return "down"
    if any(isinstance(e, (ReadTimeoutError, ReadTimeout)) for e in chain):
        return "slow"
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and the exceptions it was raised from or while handling (MLflow raises its own
    MlflowException while handling requests', which handled urllib3's)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _cut(exc: Exception) -> bool:
    """Whether `exc` is an answer that broke off while its body was read: the connection closed
    or reset after the headers (http.client's IncompleteRead or a reset, under urllib3's
    ProtocolError, under requests' ChunkedEncodingError). MLflow's client has urllib3 retry a
    request whose answer never started (a reset before the headers, a 5xx), never this one."""
    from requests.exceptions import ChunkedEncodingError

    return any(isinstance(e, ChunkedEncodingError) for e in _chain(exc))


def _unreachable(exc: Exception) -> bool:
    """Whether `exc` says MLflow could not be reached or gave no whole answer (a connection
    refused, reset or cut, a timeout, a name that does not resolve, a server error through every
    retry): what waiting for the server fixes. A store MLflow cannot use, an error in its code
    or a warning made an error is not."""
    import requests
    from mlflow.exceptions import RestException

    network = (ConnectionError, TimeoutError, socket.gaierror, http.client.HTTPException,
               requests.RequestException)  # fmt: skip
    return any(isinstance(e, network) or (isinstance(e, RestException) and e.get_http_status_code()
               >= 500) for e in _chain(exc))  # fmt: skip


def _fix(exc: Exception) -> str:
    """What to fix for a failure that is no connection problem, named by its exception's class;
    for a warning that the warnings filters made an error, how to let it warn."""
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else (
        f"{kind.__module__}.{kind.__qualname__}")  # fmt: skip
    if isinstance(exc, Warning):
        return (
            f"{name} is a warning that the warnings filters (-W error, filterwarnings = error) "
            f"made an error: let it warn (-W 'default::{name}')"
        )
    return f"fix what raised {name}"


def _check_writable(store: Path | None) -> None:
    """A writer's embedded store must be writable, and its folder (SQLite writes its journal
    beside it): else MLflow logs a traceback for each refused write, or, for a store it has to
    make, retries for minutes before it gives up. A HarnessError says which folder."""
    if store is None:
        return
    folder = next(p for p in (store.parent, *store.parents) if p.exists())
    for path in (folder, store) if store.exists() else (folder,):
        if not os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
            raise HarnessError(f"cannot write the store {store}: {path} is read-only")


@contextlib.contextmanager
def _locked(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """An exclusive flock on `path` for the block (created if need be, with its folder: a new
    store's, which MLflow would make next). Where it cannot be created (a read-only folder), the
    lock is one in the temporary folder named after it, left there for the next one to take."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
        fd = os.open(Path(tempfile.gettempdir()) / f"amp-harness-{digest}.lock",
                     os.O_RDWR | os.O_CREAT, 0o666)  # fmt: skip
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# --- sessions that still run ---------------------------------------------------------------


def _running_path(folder: Path, session_id: str) -> Path:
    digest = hashlib.sha256(session_id.encode()).hexdigest()[:32]
    return Path(folder) / RUNNING_FOLDER / f"{digest}.lock"


class Running:
    """Says "this session still runs" to `amp-harness sync` until closed: a lock file beside the
    journal, held for the session's life. The kernel lets go of it when the process ends,
    however it ends (kill -9 included), so a lock nobody holds is a session that is over."""

    def __init__(self, folder: Path, session_id: str):
        self.path = _running_path(folder, session_id)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def close(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def is_running(folder: Path, session_id: str) -> bool:
    """Whether the session of this journal folder still runs (its Running lock is held). A lock
    file left by a session that died is taken away."""
    path = _running_path(folder, session_id)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        path.unlink(missing_ok=True)
        return False
    finally:
        os.close(fd)


# --- the sink ------------------------------------------------------------------------------


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
            _check_writable(self.store)
            self.client = client(uri, set_aside)
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
            found = self._follow_moved_store(found)
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
            for key, value in views().items():
                if present.get(key) != value:
                    self.client.set_experiment_tag(self._experiment_id, key, value)
        except Exception as exc:
            if not _refused(exc):
                raise
            self.notes.append(f"MLflow refused the saved views of the runs ({reason(exc)}): "
                              "its links open the runs list as MLflow shows it")  # fmt: skip
            return
        self._views_saved = True

    def _follow_moved_store(self, experiment):
        """The embedded store moved (or was copied) with its reports folder: its experiments
        still name the old folder's mlartifacts/, fixed by MLflow when each was created, and
        every new run would write its artifacts there. MLflow has no call to change an
        experiment's artifact location, so the store's paths are rewritten, old runs' included,
        to the mlartifacts/ beside the store, where their files moved with it."""
        if not self._artifact_root or self.store != self.reports / DB_NAME:
            return experiment  # a server, or a store of its own named with --tracking-uri
        old = experiment.artifact_location
        old_path = Path(unquote(urlparse(old).path)) if old.startswith("file:") else None
        new_path = self.reports / ARTIFACTS_NAME
        if old_path is None or old_path.name != ARTIFACTS_NAME:
            return experiment  # made by hand, elsewhere: not the harness's layout
        if old_path.resolve() == new_path.resolve():
            return experiment
        if old_path.exists() and not new_path.exists():
            # The store was copied without its artifacts: they are still only at the old path.
            self.notes.append(
                f"the experiment {self.experiment!r} keeps its artifacts in {old_path}, outside "
                f"{self.reports}: copy that folder to {new_path} for them to move here"
            )
            return experiment
        runs = _rebase(self.store, old, self._artifact_root)
        self.notes.append(
            f"the store moved from {old_path.parent} to {self.reports}: the artifact paths of "
            f"its experiments and {runs} runs now point into {new_path}"
        )
        return self.client.get_experiment(experiment.experiment_id)

    def _session_runs(self, session_id: str) -> list:
        """Every active run of the session, parent and children."""
        query = f"tags.`amp.session_id` = '{session_id}'" if _PLAIN_ID.fullmatch(session_id) else ""
        found = search_runs(self.client, self.experiment_id(), query)
        return [r for r in found if r.data.tags.get("amp.session_id") == session_id]

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
        self._guard("deleting runs made twice", self._drop_copies, session["session_id"])

    def _drop_copies(self, session_id: str) -> int:
        """Delete the runs of the session made twice: MLflow's client sends a request again
        when the answer was a 500 or did not come in time, also a request the server has
        already carried out (runs/create: a second parent run, left RUNNING for ever, or a
        second child run, left half-logged). The copy kept of each: the parent run the session
        logged under; for a test, its complete run (under that parent where there are several).
        What is deleted says why (the tag amp.end_reason), and MLflow can restore it."""
        present = self._session_runs(session_id)
        main = main_parent(present)
        parent = self._parents.get(session_id) or (main.info.run_id if main else None)
        copies = [
            r for r in present
            if r.data.tags.get("amp.kind") == "session" and r.info.run_id != parent
        ]  # fmt: skip
        by_record: dict[str, list] = {}
        for run in present:
            if run.data.tags.get("amp.kind") == "test":
                by_record.setdefault(run.data.tags.get("amp.record_id"), []).append(run)
        for runs in by_record.values():
            if len(runs) > 1 and any(_complete(r) for r in runs):
                under = [r.data.tags.get("mlflow.parentRunId") == parent for r in runs]
                kept = max(range(len(runs)), key=lambda i: (_complete(runs[i]), under[i]))
                copies += runs[:kept] + runs[kept + 1 :]
        for run in copies:
            kept_id = parent if run.data.tags.get("amp.kind") == "session" else "another run"
            self.client.set_tag(run.info.run_id, END_REASON, (
                f"deleted by amp-harness: a copy of {kept_id}, made when MLflow's client sent "
                "its request again after the server had carried it out"))  # fmt: skip
            self.client.delete_run(run.info.run_id)
        return len(copies)

    def _log_record(self, session: dict, record: Record) -> None:
        from mlflow.entities import Metric, Param, RunTag

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
            COMPLETE: "false",
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
        run_id = self.client.create_run(
            self.experiment_id(), int(record.started * 1000), _clean(tags)
        ).info.run_id
        try:
            stamp = int(record.ended * 1000)
            metrics = [Metric(k, v, stamp, 0) for k, v in record.metrics.items()]
            metrics += [
                Metric(k, v, stamp, step) for k, points in sent.items() for step, v in points
            ]
            params = [Param(k, v) for k, v in {**record.params, "device": record.device}.items()]
            self.client.log_text(
                run_id, redact(json.dumps(record.to_dict(), indent=1)), "record.json"
            )
            for name in record.figures:
                path = record.artifact_dir / name
                if path.exists():
                    self.client.log_artifact(run_id, str(path), "figures")
                else:
                    log.warning("%s: figure %s is gone; not logged", record.test, path)
            self.client.set_terminated(run_id, _STATUS[record.outcome], stamp)
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
        if cut:
            self._note_downsampled(record.test, cut)

    def _note_downsampled(self, test: str, cut: dict[str, int]) -> None:
        """One line in `notes` for every test whose histories MLflow got fewer points of."""
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

    def _end_unfinished(self, session: Session) -> bool:
        """A session whose journal has no end, and which no longer runs: its process was killed
        or crashed. Its parent run is ended as KILLED, with the reason as a tag."""
        parent = self._parent(session.entry)
        if self.client.get_run(parent).info.status != "RUNNING":
            return False
        last = max([r.ended for r in session.records] + [session.entry["started"]])
        reason = (
            "ended by `amp-harness sync`: the journal has no end for this session (its process "
            f"was killed or crashed) after {len(session.records)} results"
        )
        self.client.set_tag(parent, END_REASON, reason)
        self.client.set_terminated(parent, "KILLED", int(last * 1000))
        return True

    def sync(self, journal: Journal, on_wait: Callable[[], None] | None = None) -> dict[str, int]:
        """Send MLflow what the journal has and MLflow lacks; idempotent. One sync at a time
        per journal (`on_wait` is called when it has to wait for another one)."""
        counts = dict.fromkeys(
            ("sessions", "records_sent", "records_present", "records_replaced",
             "records_refused", "sessions_killed", "sessions_running", "copies_deleted",
             "runs_marked"), 0,
        )  # fmt: skip
        folder = journal.path.parent
        if self.client is not None:  # a command: waiting for a busy server is what it is for
            self.client.bounds = COMMAND
        if self.client is not None and self.store is not None:
            _commit_without_fsync(self.client)
        with _locked(folder / SYNC_LOCK, on_wait):
            for sid, session in journal.sessions().items():
                if is_running(folder, sid):  # its own process logs it; its end is to come
                    counts["sessions_running"] += 1
                    continue
                present = self._guard("reading the runs already logged", self._session_runs, sid)
                if present is None:
                    break
                counts["sessions"] += 1
                self._sync_session(session, present, counts)
                if self.down:
                    break
        if self.down:
            raise HarnessError(
                f"sync stopped: MLflow at {self.label}: {self.down}. Fix: {self.recovery()}"
            )
        return counts

    def _sync_session(self, session: Session, present: list, counts: dict[str, int]) -> None:
        main = main_parent(present)
        if main:
            self._parents[session.entry["session_id"]] = main.info.run_id
        journalled = {r.record_id for r in session.records}
        complete: set[str] = set()
        half: list = []
        for run in present:
            if run.data.tags.get("amp.kind") != "test":
                continue
            record_id = run.data.tags.get("amp.record_id")
            if _complete(run):
                complete.add(record_id)
            elif record_id in journalled:  # the journal holds all of it: log it afresh
                half.append(run)
        sent = False
        for run in half:
            self._guard("deleting a half-logged run", self.client.delete_run, run.info.run_id)
            if self.down:
                return
        # Marked since these runs were logged (`amp-harness sessions mark`, MLflow unreachable)
        counts["runs_marked"] += self.mark_session(session.entry, [
            r for r in present if r not in half]) or 0  # fmt: skip
        if self.down:
            return
        counts["records_replaced"] += len({r.data.tags["amp.record_id"] for r in half} - complete)
        for record in session.records:
            if record.record_id in complete:
                counts["records_present"] += 1
                continue
            refused, sent = len(self.refused), True
            self.log_record(session.entry, record)
            if self.down:
                return
            counts["records_refused" if len(self.refused) > refused else "records_sent"] += 1
        if session.end:
            self._guard("ending the session run", self._end_session, session.entry, session.end)
        elif self._guard("ending an unfinished session run", self._end_unfinished, session):
            counts["sessions_killed"] += 1
        sid = session.entry["session_id"]
        if sent or _has_copies(present):  # what this sync sent may have been made twice too
            counts["copies_deleted"] += self._guard("deleting runs made twice",
                                                    self._drop_copies, sid) or 0  # fmt: skip


def downsampled(values: list[float], limit: int = HISTORY_POINTS) -> list[tuple[int, float]]:
    """(step, value) for the points of a history MLflow gets: all of them up to `limit`; of a
    longer one, the first and the last step and, in each of (limit - 2) // 2 equal stretches of
    the steps between, the lowest and the highest value (a NaN counts as both: a step that went
    NaN is what a history of mixed precision is read for), in step order, at their real steps."""
    if len(values) <= limit:
        return list(enumerate(values))
    import numpy as np

    series = np.asarray(values, dtype=np.float64)
    nan = np.isnan(series)
    low, high = np.where(nan, -np.inf, series), np.where(nan, np.inf, series)
    edges = np.linspace(1, len(series) - 1, (limit - 2) // 2 + 1).astype(np.int64).tolist()
    steps = {0, len(series) - 1}
    for start, end in zip(edges[:-1], edges[1:], strict=True):
        steps.update((start + int(low[start:end].argmin()), start + int(high[start:end].argmax())))
    return [(step, values[step]) for step in sorted(steps)]


def search_runs(client, experiment_id: str, query: str = "") -> list:
    """Every run of the experiment that `query` selects, page by page."""
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], query, max_results=_PAGE, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _commit_without_fsync(mlflow_client) -> None:
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


def main_parent(runs: list):
    """The session's parent run among `runs`, or None: where a retried runs/create made two,
    the one its tests were logged under (then one that ended, then the first made)."""
    parents = [r for r in runs if r.data.tags.get("amp.kind") == "session"]
    under = [r.data.tags.get("mlflow.parentRunId") for r in runs]
    return min(parents, default=None, key=lambda r: (
        -under.count(r.info.run_id), r.info.status == "RUNNING", r.info.start_time))  # fmt: skip


def _has_copies(runs: list) -> bool:
    """Whether `runs`, one session's, hold two parent runs or two runs of one record."""
    keys = [r.data.tags.get("amp.record_id") or r.data.tags.get("amp.kind") for r in runs]
    return len(keys) != len(set(keys))


def _one_batch(metrics: list, params: list, tags: list) -> bool:
    """Whether MLflow's client sends this log_batch as one request (it splits a larger one)."""
    from mlflow.utils import validation as limits

    return (
        len(metrics) <= limits.MAX_METRICS_PER_BATCH
        and len(params) + len(tags) <= limits.MAX_PARAMS_TAGS_PER_BATCH
        and len(metrics) + len(params) + len(tags) <= limits.MAX_ENTITIES_PER_BATCH
    )


def _complete(run) -> bool:
    """Whether a child run holds its whole record. Runs logged before the completion tag
    existed count when they ended: their end was their last call."""
    tag = run.data.tags.get(COMPLETE)
    return tag == "true" if tag is not None else run.info.status != "RUNNING"


def _refused(exc: Exception) -> bool:
    """MLflow answered and refused this call (a value too long, a key it does not take), as
    opposed to a server or store that is not there."""
    return getattr(exc, "error_code", None) == "INVALID_PARAMETER_VALUE"


def reason(exc: Exception) -> str:
    """An MLflow error as a short phrase: its first line, without passwords, and for a failed
    HTTP request the endpoint and the cause ("Connection refused", "Read timed out"); for a
    server that gave no answer, whether it is down or slow."""
    if isinstance(exc, Unavailable):
        return f"the server is {exc.condition}: {exc.said}"
    # SQLAlchemy puts a line about its autoflush before the database's own words: skip it.
    lines = [line for line in str(exc).strip().splitlines()
             if not line.startswith("(raised as a result of")]  # fmt: skip
    text = redact((lines or [type(exc).__name__])[0])
    # A timeout's text goes on after the cause: "... To increase the timeout, set ...".
    request = re.match(r"API request to (\S+) failed with (?:timeout )?exception (.*)", text)
    if request:
        cause = re.search(r"\(Caused by \w+\((.*)\)\)\.?(?: To increase the timeout.*)?\s*$",
                          request[2])  # fmt: skip
        # A connect timeout's cause starts with the connection's repr: "<HTTPConnection(...)>, "
        detail = re.sub(r"^<[^>]*>, ", "", cause[1]) if cause else request[2]
        detail = detail.strip("'\"").rsplit("): ", 1)[-1]
        text = f"{urlparse(request[1]).path}: {detail}"
    return text if len(text) <= 300 else f"{text[:140]} ... {text[-140:]}"


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


def run_name(record: Record, found: dict[str, verdicts.Status]) -> str:
    """What the runs list shows: the claims and their verdicts as they count (`found`:
    verdicts.of_record), then the test ("SCL-NAN-INCREASES refuted · test_nan_halves_the_scale")."""
    verdicts_shown = ", ".join(f"{claim} {status.label}" for claim, status in found.items())
    name = f"{verdicts_shown} · {record.test.split('::')[-1]}"
    return name if len(name) <= RUN_NAME_CHARS else name[: RUN_NAME_CHARS - 1] + "\u2026"


def description(record: Record, found: dict[str, verdicts.Status]) -> str:
    """The run's description in the MLflow UI (Markdown): each claim's verdict and evidence."""
    lines = [f"`{record.test}`: {record.outcome or '?'}", ""]
    for claim, status in found.items():
        lines += [f"**{claim}**: {status.label}", "", status.evidence, ""]
    return "\n".join(lines)  # cut to MLflow's limit, as every tag, by _clean


def _clean(tags: dict[str, str]) -> dict[str, str]:
    """Tags as MLflow gets them: without passwords, and cut to a length it takes."""
    return {k: redact(v)[:_TAG_LIMIT] for k, v in tags.items()}


def _session_status(exitstatus: int) -> str:
    """pytest's exit status as an MLflow run status: 2 is an interrupted session (Ctrl-C)."""
    return {0: "FINISHED", 2: "KILLED"}.get(exitstatus, "FAILED")


def _env_tags(session: dict) -> dict[str, str]:
    return {f"env.{k}": v for k, v in session["fingerprint"].items()}


def mark_tags(session: dict) -> dict[str, str]:
    """The tags of a session entry's mark (journal_index.MARK) on its runs: EXPERIMENTAL and
    its reason ("" where none was given); none where it was never marked."""
    found = journal_index.mark_of(session)
    if found is None:
        return {}
    experimental = found["state"] == journal_index.EXPERIMENTAL
    return {EXPERIMENTAL: str(experimental).lower(), EXPERIMENTAL_REASON: found["reason"]}
