"""Real servers for the tests, on 127.0.0.1 and a free port: `mlflow server`, and a throwaway
PostgreSQL cluster where PostgreSQL is installed. Each test stops what it started."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from harness.records.stopsignals import end_with_parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """A real `mlflow server` on loopback in its own process group; SQLite backend by default."""

    def __init__(self, folder: Path, port: int, backend: str | None = None):
        self.folder, self.port = folder, port
        self.backend = backend or f"sqlite:///{folder / 'server.db'}"
        self.artifacts = folder / "server-artifacts"
        self.log = folder / "mlflow-server.log"
        self.uri = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120) -> MlflowServer:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
                 "--port", str(self.port), "--workers", "1",
                 "--backend-store-uri", self.backend,
                 "--artifacts-destination", self.artifacts.as_uri()],
                cwd=self.folder, start_new_session=True, stdout=log, stderr=log,
                # MLflow 3's job runner starts seven huey consumers for GenAI jobs no test
                # submits: with them, each start cost ~16 s more CPU (`amp-harness ui` turns
                # them off too).
                env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true",
                     "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                preexec_fn=end_with_parent(os.getpid()),
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        tail = self.log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"mlflow server did not become healthy within {timeout_s} s:\n{tail}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.process:
            self.process.wait(timeout=30)


def postgres_missing() -> str | None:
    """Why a PostgreSQL test cannot run here, or None."""
    if PostgresServer.bindir() is None:
        return "PostgreSQL is not installed (Debian: apt-get install -y postgresql)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed: pip install 'psycopg[binary]'"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no `postgres` user to run initdb as"
    return None


class PostgresServer:
    """A throwaway PostgreSQL cluster: trust authentication, TCP on 127.0.0.1 only, no socket
    file. As root, its commands run as the `postgres` user: initdb refuses to run as root."""

    def __init__(self, port: int, database: str = "mlflow"):
        self.port, self.database = port, database
        self.folder: Path | None = None
        self.uri = f"postgresql+psycopg://postgres@127.0.0.1:{port}/{database}"

    @staticmethod
    def bindir() -> Path | None:
        """initdb and pg_ctl: on PATH, or where Debian puts them (the newest version)."""
        debian = glob.glob("/usr/lib/postgresql/[0-9]*/bin/initdb")
        found = shutil.which("initdb") or max(
            debian, key=lambda p: int(Path(p).parts[4]), default=None
        )
        return Path(found).resolve().parent if found else None  # links: to createdb's folder

    def _run(self, *command: str) -> None:
        as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run(
            [*as_postgres, str(self.bindir() / command[0]), *command[1:]],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip

    def start(self) -> PostgresServer:
        # Not under pytest's tmp_path: its parent folders are private to root.
        self.folder = Path(tempfile.mkdtemp(prefix="amp-harness-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        data = str(self.folder / "data")
        try:
            self._run("initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8",
                      "--no-sync")  # fmt: skip
            options = f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories=''"
            self._run("pg_ctl", "-D", data, "-l", str(self.folder / "log"), "-w", "-t", "120",
                      "-o", options, "start")  # fmt: skip
            self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                      self.database)  # fmt: skip
        except subprocess.CalledProcessError as exc:
            self.stop()
            raise RuntimeError(f"{exc.cmd}: {exc.stderr.decode(errors='replace')}") from exc
        return self

    def stop(self) -> None:
        if self.folder is None:
            return
        if (self.folder / "data" / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.folder / "data"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None


class FlakyProxy:
    """A proxy on loopback in front of a server at `target` (http://127.0.0.1:PORT) that forwards
    every request and answers 500 to every `every`-th POST once the server has done its work:
    what a server that fails on the way back (or a gateway that gives up on a slow answer) looks
    like to MLflow's client, which retries the request. With `answer_after_s`, each answer waits
    that long once the server has given it: a busy server, slow but there. `requests` counts
    what it forwarded, `sent` names each ("POST /api/2.0/mlflow/runs/create"). Threads of this
    process; `stop` ends them."""

    HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}

    def __init__(self, target: str, every: int = 3, answer_after_s: float = 0):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlparse

        self.target, self.every, self.answer_after_s = urlparse(target), every, answer_after_s
        self.posts, self.failed, self.requests = 0, 0, 0
        self.sent: list[str] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                import http.client

                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in proxy.HOP_BY_HOP}  # fmt: skip
                upstream = http.client.HTTPConnection(
                    proxy.target.hostname, proxy.target.port, timeout=60
                )
                try:
                    upstream.request(self.command, self.path, body, headers)
                    answer = upstream.getresponse()
                    status, content = answer.status, answer.read()
                    kind = answer.getheader("Content-Type", "application/json")
                finally:
                    upstream.close()
                with proxy._lock:
                    proxy.requests += 1
                    proxy.sent.append(f"{self.command} {self.path}")
                time.sleep(proxy.answer_after_s)
                if self.command == "POST" and proxy._fail_this_one():
                    status, kind = 500, "application/json"
                    content = b'{"error_code": "INTERNAL_ERROR", "message": "proxy: 500"}'
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

            def log_message(self, *args) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.uri = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _fail_this_one(self) -> bool:
        with self._lock:
            self.posts += 1
            fail = self.posts % self.every == 0
            self.failed += fail
            return fail

    def start(self) -> FlakyProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


class SilentServer:
    """A server on loopback that takes every connection and never answers: one too busy to answer
    in any time a client waits. `connections` counts those it took. A thread of this process;
    `stop` ends it and closes what it holds."""

    def __init__(self):
        self._socket = socket.create_server(("127.0.0.1", 0))
        self._socket.settimeout(0.2)  # how soon `stop` is seen
        self.uri = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._take, daemon=True)

    def _take(self) -> None:
        while not self._stopping.is_set():
            try:
                self.connections.append(self._socket.accept()[0])
            except TimeoutError:
                continue

    def start(self) -> SilentServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)
        for connection in [*self.connections, self._socket]:
            connection.close()


class FullBacklog:
    """A port where no connection is ever made: a listening socket nobody accepts on, its accept
    queue full (backlog 0, one connection waiting), so the kernel (Linux) drops each new SYN, as
    a host that is off or a firewall that drops does: the client's connect times out. A context
    manager; `uri` is its address."""

    def __enter__(self) -> FullBacklog:
        self._socket = socket.create_server(("127.0.0.1", 0), backlog=0)
        self.uri = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self._waiting = socket.create_connection(self._socket.getsockname(), timeout=10)
        return self

    def __exit__(self, *exc) -> None:
        self._waiting.close()
        self._socket.close()
