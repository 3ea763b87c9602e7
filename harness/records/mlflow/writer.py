"""MLflow off the tests' path (issue 56): Writer, a session's MlflowSink in a thread of its own.

A session hands each result to the journal first (AmpSession.finish) and then here, where it is
queued and the test goes on: the thread makes the sink (`import mlflow` and opening the store,
seconds, while the first test runs) and logs each result as MlflowSink does, one log_batch a
result and its files in one upload. At the session's end it is waited for FLUSH_S at most;
what it has not sent by then is said, and `amp-harness sync` sends it (replay: a run counts once
complete, so a result the thread was in the middle of is logged afresh, never twice). A process
killed mid-result leaves what a killed synchronous session left: the journal whole, a run
half-made, which sync replaces.

The thread never touches the warnings filters the tests run under (catch_warnings is not
thread-safe before Python 3.14: the test's filters would be swapped under it): its MLflow calls
ignore foreign warnings through a filter of its own that matches in this thread only
(bounds.ignore_foreign_in_this_thread).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path

from harness.records.mlflow import bounds
from harness.records.mlflow.sink import MlflowSink
from harness.records.mlflow.uris import command_line, redact
from harness.records.record import Record

log = logging.getLogger(__name__)

# How long a session's end waits for the writer: a server that hangs costs a call about 9 s
# (SESSION: two tries of 4 s) before the sink turns off and drops the rest at once.
FLUSH_S = 30.0
# Results waiting for the thread; past that (a server far slower than the tests) a result is
# left to `sync` rather than held in memory or waited for.
CAPACITY = 10_000
# Results written in one go (one transaction on an SQL store): those queued while the last
# batch was written, as many as a session's tests finished meanwhile.
BATCH = 500
_END = None  # in the queue: nothing comes after it
_DRAINED = object()  # nothing was taken from the queue after a batch


class Writer:
    """The face of MlflowSink a session uses (label, experiment, down, refused, notes,
    recovery(), browse()), whose calls return at once: the sink works in a thread."""

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
        self.sink: MlflowSink | None = None  # made in the thread
        self.unsent: dict[str, str] = {}  # record id -> test: handed over, not yet logged
        self.cut = ""  # why results were left to `sync`: the queue full, the end's bound
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue(capacity)
        self._started = threading.Event()  # the session's run made (or MLflow off)
        self._stop = threading.Event()  # the end's bound passed: log nothing more
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, args=(parent_run,), name="amp-harness MLflow writer", daemon=True
        )
        self._thread.start()

    # --- what the session calls ------------------------------------------------------------
    def start_session(self, session: dict) -> None:
        self._put(("start", session, None))

    def log_record(self, session: dict, record: Record) -> None:
        with self._lock:
            self.unsent[record.record_id] = record.test
        if not self._put(("record", session, record)):
            self._left("the writer's queue was full: MLflow is slower than the tests")

    def end_session(self, session: dict, end: dict, flush_s: float = FLUSH_S) -> None:
        """The session's end logged after every result, waited for `flush_s` at most."""
        started = time.monotonic()
        self._put(("end", session, end), block=True, timeout=flush_s)  # room as it sends
        self.close(flush_s, started)

    def close(self, flush_s: float = FLUSH_S, started: float | None = None) -> None:
        """Wait for the thread to send what it holds, `flush_s` at most (from `started`, a
        time.monotonic(); now if None); then it stops before its next call, and what it did
        not send is said (`down`)."""
        if self._closed:
            return
        self._closed = True
        deadline = (time.monotonic() if started is None else started) + flush_s
        self._put(_END, block=True, timeout=max(0.0, deadline - time.monotonic()))
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            self._stop.set()
            self._left(f"the writer was still sending {flush_s:g} s after the session's end: "
                       "a slow server or store")  # fmt: skip

    def parent_run_id(self, session: dict) -> str | None:
        """The session's run, once made (pytest-xdist workers log under it): waited for."""
        self._started.wait(FLUSH_S)
        return self.sink.parent_run_id(session) if self.sink and not self.sink.down else None

    # --- what the session's end says -------------------------------------------------------
    @property
    def down(self) -> str | None:
        """Why MLflow lacks some of the session: the sink's failure, or what was left to `sync`
        (a full queue, the end's bound); None while the results in hand are only on their way."""
        if self.sink is not None and self.sink.down:
            return self.sink.down
        if not self.cut:
            return None
        with self._lock:
            unsent = sorted(self.unsent.values())
        if not unsent:  # nothing was waiting: only the session's run, or its end
            return f"{self.cut}; the session's run was not ended"
        shown = ", ".join(unsent[:3]) + (f" and {len(unsent) - 3} more" if len(unsent) > 3 else "")
        return f"{len(unsent)} results not sent live ({self.cut}): {shown}"

    def recovery(self) -> str:
        if self.sink is not None and self.sink.down:
            return self.sink.recovery()
        sync = command_line("sync", reports=self.reports, uri=self.uri) if self.reports else (
            f"`amp-harness sync --tracking-uri {self.label}`")  # fmt: skip
        return f"{sync} sends MLflow what it lacks"

    @property
    def refused(self) -> list[str]:
        return self.sink.refused if self.sink else []

    @property
    def notes(self) -> list[str]:
        return self.sink.notes if self.sink else []

    def browse(self) -> str:
        return self.sink.browse() if self.sink else f"MLflow at {self.label}"

    # --- the thread ------------------------------------------------------------------------
    def _put(self, item, block: bool = False, timeout: float | None = None) -> bool:
        try:
            self._queue.put(item, block, timeout)
        except queue.Full:
            return False
        return True

    def _left(self, why: str) -> None:
        with self._lock:
            self.cut = self.cut or why

    def _run(self, parent_run: str | None) -> None:
        bounds.ignore_foreign_in_this_thread()
        try:
            self.sink = MlflowSink(self.uri, self.experiment, self.reports)
            item = self._queue.get()
            while not self._stop.is_set() and item is not _END:
                kind, session, payload = item
                if kind == "record":  # with those queued behind it: then the next item
                    item = self._log_waiting(session, payload)
                    continue
                self._handle(kind, session, payload, parent_run)
                item = self._queue.get()
        except Exception as exc:  # noqa: BLE001 - a bug here must not end the session
            log.exception("MLflow writer stopped")
            if self.sink is not None and not self.sink.down:
                self.sink._stop(f"the writer stopped ({bounds.reason(exc)})", exc)
        finally:
            self._started.set()
            bounds.ignore_foreign_in_this_thread(False)

    def _log_waiting(self, session: dict, record: Record):
        """`record` and the session's results queued behind it (BATCH at most) in one write
        (MlflowSink.log_records: one transaction on an SQL store); then the queue's next item,
        waited for."""
        batch, after = [record], _DRAINED
        while len(batch) < BATCH and after is _DRAINED and not self._queue.empty():
            item = self._queue.get_nowait()  # the only reader: what was there is still there
            if item is not _END and item[0] == "record" and item[1] is session:
                batch.append(item[2])
            else:
                after = item
        started = time.monotonic()
        self.sink.log_records(session, batch)
        if not self.sink.down:  # else they are in the journal, said in `down`: sync sends them
            with self._lock:
                for done in batch:
                    self.unsent.pop(done.record_id, None)
        log.debug("MLflow: %d results logged in %.2f s", len(batch), time.monotonic() - started)
        return self._queue.get() if after is _DRAINED else after

    def _handle(self, kind: str, session: dict, payload, parent_run: str | None) -> None:
        sink = self.sink
        if kind == "start":
            if parent_run:  # a pytest-xdist worker: its controller made the session's run
                sink.adopt_parent(session, parent_run)
            else:
                sink.start_session(session)
            self._started.set()
        else:
            sink.end_session(session, payload)
