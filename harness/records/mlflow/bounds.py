"""How long MLflow is waited for, and what its failures are said as.

Each HTTP request to a tracking server is bounded by who waits on it (Bounds): a session's calls,
writes and the reads among them, which the tests wait on, by SESSION; a command's (the report's
reads, and `sync`'s checks and the writes it replays), which a person runs to get MLflow's
answer, by COMMAND, patient with a busy server. Both connect within seconds: a server that is
down is said within seconds by either. A failure is said as measured (Unavailable): "down" when
no connection was made, "slow" when the server took the connection and did not answer in time.
MLflow's own sender of each request is wrapped to hold it to the bounds (_bounded_requests);
`client()` makes the BoundedClient every reader and writer uses; `reason()` says an MLflow error
in a short phrase.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import http.client
import logging
import os
import re
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlparse

from harness.common.errors import HarnessError
from harness.records import halfmade
from harness.records.mlflow import empty_store
from harness.records.mlflow.locks import _locked
from harness.records.mlflow.uris import command_line, redact, sqlite_path

log = logging.getLogger(__name__)

# Telemetry off, where the user has not set it. (The bounds of each request: Bounds, below.)
MLFLOW_ENV = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "GIT_PYTHON_REFRESH": "quiet",
}

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
    tests/records/mlflow/test_tracking.py's slow and hanging servers fail if that changes."""
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
    with foreign_warnings_ignored(), collection_paused():  # MLflow's import and store warn
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
        copied = empty_store.copy_to(store)  # a new store: a copy of MLflow's empty one
        try:
            made = MlflowClient(tracking_uri=uri)
        except Exception as exc:
            if copied:  # MLflow cannot open the cached copy: it makes the store itself
                empty_store.forget(store, uri)
                copied, made = False, MlflowClient(tracking_uri=uri)
            elif halfmade.half_made(store, exc):
                copied, made = _made_anew(store, uri, exc, set_aside)
            else:
                raise
        if copied:
            empty_store.adopt(made)
    for folder in stray:  # the deepest first; a folder with anything in it stays
        try:
            folder.rmdir()
        except OSError:
            break
    return made


def _made_anew(store: Path, uri: str, failure: Exception, set_aside: list[str] | None):
    """A half-made store (halfmade) set aside and made anew: whether it is a copy (copied),
    and MLflow's client on it. What was done is said: in `set_aside`, or on stderr."""
    from mlflow import MlflowClient

    aside = halfmade.set_aside(store, uri)
    copied = empty_store.copy_to(store)
    made = MlflowClient(tracking_uri=uri)
    note = (
        f"the store {store} was half-made ({reason(failure)}: a session or sync was "
        f"stopped while MLflow created its tables): set aside as {aside} (nothing "
        "deleted) and made anew"
    )
    if set_aside is not None:
        set_aside.append(note)
    else:  # a reader (the report): said on stderr, with what refills the store
        sync = command_line("sync", reports=store.parent, uri=uri)
        log.warning("MLflow: %s; %s fills it from the journal", note, sync)
    return copied, made


# --- every MLflow call ---------------------------------------------------------------------
# A warning attributed to any module but the harness's own: inside the harness's MLflow calls,
# MLflow's and the libraries' under it (SQLAlchemy, alembic, pydantic, urllib3, ...).
_NOT_THE_HARNESS = r"(?!harness(\.|$))"


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """The cyclic garbage collector held off: MLflow's import makes about 430,000 objects, all
    kept, which the collector would scan again and again as they are made, for nothing (a fifth
    of the import's CPU, 0.3 s)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def foreign_warnings_ignored() -> Iterator[None]:
    """The block with every warning of a module other than the harness's ignored, the warnings
    filters as they were before and after it. For the harness's MLflow calls: a user's `-W error`
    or `filterwarnings = error` made MLflow's own warnings (SQLAlchemy's deprecation of `noload`,
    as MLflow opens any store) exceptions, and MLflow was off in every session. What the
    harness itself calls wrongly still warns, and the user's filters hold for it. (Not thread-
    safe before Python 3.14, as catch_warnings is not: the session's MLflow calls run in the
    writer's own process, `writer_process`.)"""
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
    makes twice is deleted as for a 5xx (runs.drop_copies). A server that gave no answer
    raises Unavailable, saying whether it is down or slow. Its other attributes are the
    client's own."""

    def __init__(self, mlflow_client, bounds: Bounds = SESSION, label: str = ""):
        self.mlflow_client, self.bounds, self.label = mlflow_client, bounds, label

    def __getattr__(self, name: str):
        found = getattr(self.mlflow_client, name)
        return self._bounded(name, found) if callable(found) else found

    def log_artifacts_to(self, artifact_uri: str, local_dir: str) -> None:
        """MlflowClient.log_artifacts into a run's folder named by `artifact_uri` (create_run's
        answer has it): the client would first read the run back to find it, a request more
        for each result a session sends a server."""
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
        from mlflow.utils.uri import add_databricks_profile_info_to_artifact_uri

        uri = self.mlflow_client.tracking_uri
        where = add_databricks_profile_info_to_artifact_uri(artifact_uri, uri)
        upload = get_artifact_repository(where, tracking_uri=uri).log_artifacts
        self._bounded("log_artifacts", upload)(local_dir)

    def _bounded(self, name: str, found: Callable) -> Callable:
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
