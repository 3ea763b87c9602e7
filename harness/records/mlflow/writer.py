"""MLflow off the tests' path (issue 56): Writer, a session's MlflowSink in a process of its own
(`writer_process`).

A session hands each result to the journal first (AmpSession.finish) and then here, where it is
queued and the test goes on. A thread of this process sends it down the writer's stdin, another
reads what the writer says back (the session's run, the results sent, what the end is to say).
The writer, started as the tests are collected, imports mlflow and opens the store on another
core while the first tests run, and logs the results as MlflowSink does (on an SQL store a
batch of them in one transaction): the tests' interpreter never waits for it, nor shares its
lock with it. At the session's end it is waited for FLUSH_S at most; past that it is stopped,
and what it has not sent is said, and left to `amp-harness sync` (a run counts once complete, so
nothing is logged twice). The tests' process killed outright closes the writer's stdin: it
sends what it got and exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import harness
from harness.records.mlflow.uris import command_line, redact
from harness.records.record import Record

# How long a session's end waits for the writer: a server that hangs costs a call about 9 s
# (SESSION: two tries of 4 s) before the sink turns off and drops the rest at once.
FLUSH_S = 30.0
# Results handed over and not yet sent; past that (a server far slower than the tests) a result
# is left to `sync` rather than held in memory or waited for.
CAPACITY = 10_000
_END = object()  # in the queue: nothing comes after it


class Writer:
    """The face of MlflowSink a session uses (label, experiment, down, refused, notes,
    recovery(), browse()), whose calls return at once: the sink works in the writer's process."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        reports: Path | None,
        parent_run: str | None = None,
        capacity: int = CAPACITY,
    ):
        self.uri, self.label, self.experiment = uri, redact(uri), experiment
        self.reports = reports
        self.capacity = capacity
        self.unsent: dict[str, str] = {}  # record id -> test: handed over, not yet logged
        self.cut = ""  # why results were left to `sync`: a full queue, the end's bound
        self._state: dict = {}  # what the writer said the session's end is to say
        self._parent_run: str | None = None
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._started = threading.Event()  # the session's run made (or the writer gone)
        self._closed = False
        settings = {"uri": uri, "experiment": experiment, "parent_run": parent_run,
                    "reports": str(reports) if reports else None}  # fmt: skip
        self._process = subprocess.Popen(
            [sys.executable, "-m", "harness.records.mlflow.writer_process"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=_environment(), start_new_session=True, encoding="utf-8",
        )  # fmt: skip
        self._send(settings)
        self._sender = threading.Thread(target=self._sending, name="amp-harness MLflow sender",
                                        daemon=True)  # fmt: skip
        self._reader = threading.Thread(target=self._reading, name="amp-harness MLflow reader",
                                        daemon=True)  # fmt: skip
        self._sender.start()
        self._reader.start()

    # --- what the session calls ------------------------------------------------------------
    def start_session(self, session: dict) -> None:
        self._queue.put({"kind": "start", "session": session})

    def log_record(self, session: dict, record: Record) -> None:
        with self._lock:
            full = len(self.unsent) >= self.capacity
            self.unsent[record.record_id] = record.test
        if full:
            self._left("the writer's queue was full: MLflow is slower than the tests")
            return
        self._queue.put({"kind": "record", "session": session, "payload": record.to_dict()})

    def end_session(self, session: dict, end: dict, flush_s: float = FLUSH_S) -> None:
        """The session's end logged after every result, waited for `flush_s` at most."""
        started = time.monotonic()
        self._queue.put({"kind": "end", "session": session, "payload": end})
        self.close(flush_s, started)

    def close(self, flush_s: float = FLUSH_S, started: float | None = None) -> None:
        """Wait for the writer to send what it holds, `flush_s` at most (from `started`, a
        time.monotonic(); now if None); then it is stopped, and what it did not send is said
        (`down`)."""
        if self._closed:
            return
        self._closed = True
        deadline = (time.monotonic() if started is None else started) + flush_s
        self._queue.put(_END)
        self._reader.join(max(0.0, deadline - time.monotonic()))  # the writer's stdout ends
        if self._reader.is_alive():
            self._left(f"the writer was still sending {flush_s:g} s after the session's end: "
                       "a slow server or store")  # fmt: skip
            self._process.kill()
            self._reader.join()
        self._process.wait()
        self._sender.join()
        self._process.stdout.close()

    def parent_run_id(self, session: dict) -> str | None:
        """The session's run, once made (pytest-xdist workers log under it): waited for."""
        self._started.wait(FLUSH_S)
        return self._parent_run

    # --- what the session's end says -------------------------------------------------------
    @property
    def down(self) -> str | None:
        """Why MLflow lacks some of the session: the sink's failure, or what was left to `sync`
        (a full queue, the end's bound, the writer gone); None while the results in hand are
        only on their way."""
        if self._state.get("down"):
            return self._state["down"]
        if not self.cut:
            return None
        with self._lock:
            unsent = sorted(self.unsent.values())
        if not unsent:  # nothing was waiting: only the session's run, or its end
            return f"{self.cut}; the session's run was not ended"
        shown = ", ".join(unsent[:3]) + (f" and {len(unsent) - 3} more" if len(unsent) > 3 else "")
        return f"{len(unsent)} results not sent live ({self.cut}): {shown}"

    def recovery(self) -> str:
        if self._state.get("down"):
            return self._state["recovery"]
        sync = command_line("sync", reports=self.reports, uri=self.uri) if self.reports else (
            f"`amp-harness sync --tracking-uri {self.label}`")  # fmt: skip
        return f"{sync} sends MLflow what it lacks"

    @property
    def refused(self) -> list[str]:
        return self._state.get("refused", [])

    @property
    def notes(self) -> list[str]:
        return self._state.get("notes", [])

    def browse(self) -> str:
        return self._state.get("browse") or f"MLflow at {self.label}"

    # --- the threads that talk to the writer -------------------------------------------------
    def _left(self, why: str) -> None:
        with self._lock:
            self.cut = self.cut or why

    def _send(self, message: dict) -> None:
        self._process.stdin.write(json.dumps(message) + "\n")
        self._process.stdin.flush()

    def _sending(self) -> None:
        """The queue, down the writer's stdin (a pipe that fills blocks this thread, never a
        test); its end closes stdin."""
        with contextlib.suppress(OSError, ValueError):  # the writer gone: said by _reading
            while (item := self._queue.get()) is not _END:
                self._send(item)
        with contextlib.suppress(OSError, ValueError):
            self._process.stdin.close()

    def _reading(self) -> None:
        """What the writer says, until its stdout ends (it exited, or was stopped)."""
        with contextlib.suppress(OSError, ValueError):
            for line in self._process.stdout:
                said = json.loads(line)
                if "started" in said:
                    self._parent_run = said["started"]
                    self._started.set()
                elif "sent" in said:
                    with self._lock:
                        for record_id in said["sent"]:
                            self.unsent.pop(record_id, None)
                else:
                    self._state = said["state"]
        self._started.set()
        status = self._process.wait()
        if status != 0 and not self._state.get("down"):
            self._left(f"the writer's process ended with exit status {status}")


def _environment() -> dict[str, str]:
    """The tests' environment, the harness importable from where this process imports it."""
    root = str(Path(harness.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
