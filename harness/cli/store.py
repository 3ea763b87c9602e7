"""`amp-harness sync` and `ui`: the journal replayed into MLflow, and MLflow's UI on the embedded
store, started, checked, and stopped with every process it started."""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from harness.cli.arguments import command, recorded, tracking
from harness.common.errors import HarnessError
from harness.records.journal import JOURNAL_NAME, Journal
from harness.records.tracking import (
    ARTIFACTS_NAME,
    DB_NAME,
    DEFAULT_EXPERIMENT,
    MlflowSink,
    default_uri,
    resolve_uri,
    sync,
    ui_url,
    views,
)


def add_sync(sub) -> None:
    sync = command(sub, "sync", "replay the journal into MLflow; what is there already is skipped")
    tracking(sync)
    sync.set_defaults(handler=_sync)


def add_ui(sub) -> None:
    ui = command(sub, "ui", "start the MLflow UI on the embedded store")
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    ui.add_argument("--port", type=int, default=5000)
    ui.set_defaults(handler=_ui)


def _sync(args: argparse.Namespace) -> int:
    uri = resolve_uri(args.tracking_uri, Path(args.reports))
    journal = Journal(Path(args.reports) / JOURNAL_NAME)
    sink = MlflowSink(uri, args.experiment, Path(args.reports))

    def waiting() -> None:
        print(f"waiting for another `amp-harness sync` of {journal.path} to finish", flush=True)

    counts = sync(sink, journal, on_wait=waiting)
    for note in sink.notes:
        print(f"MLflow: {note}")
    parts = [
        f"{counts['sessions']} sessions",
        f"{counts['records_sent']} results sent"
        + (f" ({counts['records_replaced']} replacing half-logged runs)"
           if counts["records_replaced"] else ""),
        f"{counts['records_present']} already there",
    ]  # fmt: skip
    if counts["sessions_killed"]:
        parts.append(f"{counts['sessions_killed']} unfinished sessions ended as KILLED")
    if counts["copies_deleted"]:
        parts.append(f"{counts['copies_deleted']} runs made twice by a retried request deleted")
    if counts["runs_marked"]:
        parts.append(f"{counts['runs_marked']} runs tagged with their session's mark "
                     "(amp.experimental, `amp-harness sessions mark`)")  # fmt: skip
    if counts["sessions_running"]:
        parts.append(f"{counts['sessions_running']} still running, left to their own process")
    print(f"synced {journal.path} to {sink.label}: {', '.join(parts)}")
    for refused in sink.refused:
        print(f"amp-harness: error: MLflow refused {refused}", file=sys.stderr)
    if sink.refused:
        print(
            f"amp-harness: error: {len(sink.refused)} results refused by MLflow stay in the "
            "journal only: fix what it said (a value too long, a name it does not take), then "
            "sync again",
            file=sys.stderr,
        )
        return 2
    return 0


def _ui(args: argparse.Namespace) -> int:
    # A folder that is there: MLflow would make it, and an empty store in it, silently.
    reports = recorded(args.reports).resolve()
    uri, cwd = default_uri(reports), None
    if uri != f"sqlite:///{reports / DB_NAME}":
        # A '?' or '%' in the path is escaped in the URI, and MLflow would create the folder the
        # escaped text names: from inside the folder, the plain file name needs no escape.
        uri, cwd = f"sqlite:///{DB_NAME}", reports
    _check_ui_address(args.host, args.port)
    command = [
        sys.executable, "-m", "mlflow", "ui",
        "--backend-store-uri", uri,
        "--default-artifact-root", (reports / ARTIFACTS_NAME).as_uri(),
        "--host", args.host, "--port", str(args.port),
        "--workers", "1",  # one person browsing: MLflow's default starts 4
    ]  # fmt: skip
    url = f"http://{args.host}:{args.port}"
    print(f"MLflow UI starting for {reports / DB_NAME} (Ctrl-C stops it)", flush=True)
    env = {
        **os.environ,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
        # MLflow 3's job runner starts seven huey consumer processes for GenAI jobs the harness
        # never submits: browsing runs needs none of them.
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    # Its own process group, so that a stop reaches the server and every worker it started.
    server = subprocess.Popen(
        command, env=env, start_new_session=True, **({"cwd": cwd} if cwd else {})
    )

    def stop(signum, _frame) -> None:
        # Unwind first: the server is stopped in `finally`, once server.wait() has let go of
        # the lock a second wait would block on.
        raise SystemExit(128 + signum)

    # SIGHUP too: a closed terminal or a dropped ssh session ends the UI as Ctrl-C does.
    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {s: signal.signal(s, stop) for s in stops}
    try:
        if _answers(f"{url}/health", server):
            runs = _runs_page(url, DEFAULT_EXPERIMENT)
            where = f"; the runs: {runs}" if runs else ""
            print(f"MLflow UI answering on {url}{where}", flush=True)
        return server.wait()
    except SystemExit as stopped:
        return 0 if stopped.code == 128 + signal.SIGINT else int(stopped.code)
    finally:
        _stop_group(server)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _answers(url: str, server: subprocess.Popen, timeout_s: float = 120.0) -> bool:
    """Wait until the server answers `url` (True), or exits or times out (False)."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            time.sleep(0.3)
    return False


def _runs_page(url: str, experiment: str) -> str | None:
    """The page of the experiment's runs on the UI at `url` (tracking.ui_url: the model training
    view, its test runs by claim), or None where the store has no such experiment yet. A store
    that lacks the harness's saved views (tracking.views: one from before them) is given them
    here, as MLflow's own "Save view" does; where it cannot be, the page is the runs list."""
    import urllib.parse
    import urllib.request

    api = f"{url}/ajax-api/2.0/mlflow/experiments"
    query = urllib.parse.urlencode({"experiment_name": experiment})
    try:
        with urllib.request.urlopen(f"{api}/get-by-name?{query}", timeout=10) as answer:
            found = json.load(answer)["experiment"]
        present = {t["key"]: t.get("value") for t in found.get("tags", [])}
        found = found["experiment_id"]
    except (OSError, ValueError, KeyError, TypeError):  # 404: no such experiment; an odd answer
        return None
    try:
        for key, value in views().items():
            if present.get(key) != value:
                tag = {"experiment_id": found, "key": key, "value": value}
                request = urllib.request.Request(
                    f"{api}/set-experiment-tag", json.dumps(tag).encode(), method="POST",
                    headers={"Content-Type": "application/json"},
                )  # fmt: skip
                urllib.request.urlopen(request, timeout=10).close()
    except OSError:  # a read-only store, a refusal: the runs list as MLflow opens it
        return ui_url(url, found, view=None)
    return ui_url(url, found)


def _stop_group(server: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, then SIGKILL if it has not ended in 10 s."""
    if server.poll() is not None:
        return
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    except ProcessLookupError:
        pass


def _check_ui_address(host: str, port: int) -> None:
    """Before the UI starts: the port must be free (MLflow's server would say so only in its
    log, and `amp-harness ui` would have claimed to serve it), and an address other than
    loopback is said to answer the network."""
    import ipaddress
    import socket

    if not 0 < port < 65536:
        raise HarnessError(f"--port {port}: give a port from 1 to 65535 (default 5000)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        raise HarnessError(
            f"--host {host}: not an address of this machine ({exc.strerror or exc}); the default "
            "127.0.0.1 serves this machine only"
        ) from None
    with socket.socket(family, kind, proto) as trial:
        trial.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds it
        try:
            trial.bind(address)
        except OSError as exc:
            taken = exc.errno == errno.EADDRINUSE
            raise HarnessError(
                f"--port {port}: port {port} on {host} is taken (another `amp-harness ui`, or "
                f"another server): stop it, or pass another port, e.g. --port {port % 65535 + 1}"
                if taken
                else f"--host {host}: cannot listen there ({exc.strerror or exc}): use an "
                "address of this machine, e.g. 127.0.0.1 (the default)"
            ) from None
    if not ipaddress.ip_address(address[0]).is_loopback:
        print(
            f"amp-harness: warning: --host {host}: the MLflow UI answers the network, and it has "
            f"no authentication: anyone who reaches port {port} can read and delete the runs. "
            "Leave --host out to serve this machine only (127.0.0.1)",
            file=sys.stderr,
        )
