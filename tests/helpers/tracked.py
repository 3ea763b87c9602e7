"""Sessions, journals and stores the tracking tests share: a nested session of three small
scenarios and what it asked of MLflow, a journal written directly, a copy of an empty store, and
the check that a store holds each record of a journal once and whole."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import urllib3.util.connection

from harness.records import tracking
from harness.records.journal import Journal
from harness.records.record import Record
from helpers.writer import in_the_writer

SCENARIOS = """
import os, signal
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_first(record):
    record.param(recipe="fp32", seed=0)
    record.history(loss=[3.0, 2.5, 2.0], scale=[65536.0, 65536.0, 32768.0])
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes, fp32 4 bytes")

@pytest.mark.claim("FMT-BITS")
def test_second(record):
    pid = os.environ.get("KILL_SERVER_PID")
    if pid:  # the tracking server dies in the middle of the session
        os.killpg(int(pid), signal.SIGKILL)
    record.verdict("FMT-BITS", "confirmed", "fp16 5+10 bits")

@pytest.mark.claim("NUM-UNDERFLOW")
def test_third(record):
    record.verdict("NUM-UNDERFLOW", "partly", "2**-25 -> 0 but 5e-8 -> 5.96e-08")
"""


def store_in(folder: Path, empty_store: Path) -> str:
    """A copy of `empty_store` (tests/conftest.py) as folder/mlflow.db; its URI."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(empty_store, folder / "mlflow.db")
    return f"sqlite:///{folder / 'mlflow.db'}"


@dataclass(frozen=True)
class Connection:
    """A connection a session opened to a server: its port, the connect timeout it was opened
    with (tracking.Bounds.connect inside the harness's calls; MLflow's own 120 s outside them),
    and the error that ended the attempt to connect (None where it connected)."""

    port: int
    timeout: object
    error: str | None


@dataclass
class MlflowCalls:
    """What a session asked of MLflow, counted rather than timed (a loaded runner's seconds are
    no measure of what the session waited for): every connection it opened to a server, and
    every time MLflow went off for the rest of the session (MlflowSink._stop), with why."""

    connections: list[Connection] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)

    def to(self, port: int) -> list[Connection]:
        return [c for c in self.connections if c.port == port]

    def counting(self, connect: Callable, stop: Callable) -> tuple[Callable, Callable]:
        """`connect` (urllib3's create_connection) and `stop` (MlflowSink._stop), each noting
        here what it did."""

        def counted_connect(address, timeout=None, *args, **kwargs):
            try:
                opened = connect(address, timeout, *args, **kwargs)
            except OSError as exc:
                self.connected(Connection(address[1], timeout, type(exc).__name__))
                raise
            self.connected(Connection(address[1], timeout, None))
            return opened

        def counted_stop(sink, down: str, *args, **kwargs) -> None:
            self.stopped(down)
            stop(sink, down, *args, **kwargs)

        return counted_connect, counted_stop

    def connected(self, connection: Connection) -> None:
        self.connections.append(connection)

    def stopped(self, down: str) -> None:
        self.stops.append(down)


class WrittenCalls(MlflowCalls):
    """MlflowCalls made in another process (an MLflow writer's: writer_hooks), each written to
    `path` as a JSON line as it is made; `read` gives them back."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path

    def connected(self, connection: Connection) -> None:
        timeout = connection.timeout  # a number, or urllib3's default: said as its repr
        timeout = timeout if isinstance(timeout, int | float) else repr(timeout)
        self._write({"port": connection.port, "timeout": timeout, "error": connection.error})

    def stopped(self, down: str) -> None:
        self._write({"stop": down})

    def _write(self, entry: dict) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def read(self, into: MlflowCalls) -> None:
        for line in self.path.read_text().splitlines() if self.path.exists() else []:
            said = json.loads(line)
            if "stop" in said:
                into.stopped(said["stop"])
            else:
                into.connected(Connection(said["port"], said["timeout"], said["error"]))


@contextlib.contextmanager
def counting_mlflow_calls() -> Iterator[MlflowCalls]:
    """Count what the harness asks of MLflow, in this process and in the MLflow writers it
    starts (writer_hooks): the connections urllib3 opens (for requests, under MLflow's client)
    and the sink's stops."""
    calls = MlflowCalls()
    connect, stop = calls.counting(urllib3.util.connection.create_connection,
                                   tracking.MlflowSink._stop)  # fmt: skip
    with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory() as folder:
        patch.setattr(urllib3.util.connection, "create_connection", connect)
        patch.setattr(tracking.MlflowSink, "_stop", stop)
        in_writers = WrittenCalls(Path(folder) / "calls.jsonl")
        in_the_writer(patch, calls=str(in_writers.path))
        try:
            yield calls
        finally:
            in_writers.read(calls)


def run_session(pytester, *args: str) -> tuple[pytest.RunResult, MlflowCalls]:
    """A session of SCENARIOS in this process, and what it asked of MLflow."""
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIOS})
    with counting_mlflow_calls() as calls:
        result = pytester.runpytest_inprocess(
            "scenarios", "--amp-device=cpu", "-p", "no:cacheprovider",
            f"--amp-reports={pytester.path / 'reports'}", *args,
        )  # fmt: skip
    return result, calls


def runs(uri: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("amp-harness")
    return client.search_runs([experiment.experiment_id]) if experiment else []


def journal(pytester) -> Journal:
    return Journal(pytester.path / "reports" / "journal.jsonl")


def write_journal(
    folder: Path, session_id: str = "s1", records: int = 3, ended: bool = True, name: str = ""
) -> Journal:
    """A journal holding one session of `records` passing results, ended or not."""
    journal = Journal(folder / (name or "journal.jsonl"))
    started = time.time()
    journal.append({"type": "session", "session_id": session_id, "name": f"session {session_id}",
                    "started": started, "host": "h", "args": [],
                    "fingerprint": {"device": "cpu"}})  # fmt: skip
    for i in range(records):
        record = Record(f"scenarios/test_x.py::test_{i}", ["FMT-BYTES"], "cpu", folder,
                        outcome="passed", ended=time.time())  # fmt: skip
        record.metric(value=float(i))
        record.history(loss=[3.0, 2.0, 1.0])
        record.verdict("FMT-BYTES", "confirmed", f"fp16 2 bytes, fp32 4 bytes (run {i})")
        journal.append({"type": "record", "session_id": session_id, "record": record.to_dict()})
    if ended:
        journal.append({"type": "session_end", "session_id": session_id, "ended": time.time(),
                        "exitstatus": 0, "counts": {"passed": records}})  # fmt: skip
    return journal


def logged(uri: str) -> dict[str, list]:
    """The active test runs of the store, by record id."""
    found: dict[str, list] = {}
    for run in runs(uri):
        if run.data.tags.get("amp.kind") == "test":
            found.setdefault(run.data.tags["amp.record_id"], []).append(run)
    return found


def assert_each_record_once_and_whole(journal: Journal, uri: str) -> None:
    """Every record of the journal is in MLflow exactly once, ended, with its metrics."""
    found = logged(uri)
    records = {r.record_id: r for s in journal.sessions().values() for r in s.records}
    assert set(found) == set(records)
    for record_id, copies in found.items():
        assert len(copies) == 1, f"record {record_id} logged {len(copies)} times"
        (run,) = copies
        assert run.info.status == "FINISHED" and run.data.tags["amp.complete"] == "true"
        record = records[record_id]
        assert set(run.data.metrics) == {*record.metrics, *record.histories}
        assert run.data.params["device"] == record.device


def fresh(reports: Path) -> str:
    """The store's URI spelt anew: this process's MLflow keeps, by URI, the connections it
    opened to the file that was there before (moved aside since), and reads through them."""
    return f"sqlite:///{reports}/./mlflow.db"


def sync_in_a_new_process(reports: Path) -> subprocess.CompletedProcess:
    """`amp-harness sync`, as a person runs it: in a process of its own (this one keeps MLflow's
    connections to the store it opened, which moving the file aside does not close)."""
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "sync", "--reports", str(reports)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
