"""The MLflow writer's own process (issue 56): a session's MlflowSink in an interpreter apart from
the tests', started by Writer (`writer`), so that `import mlflow`, the store's opening and every
result's logging run on another core, never holding the tests' interpreter lock.

It talks JSON lines. On stdin: first its settings ({"uri", "experiment", "reports",
"parent_run"}), then the session's items ({"kind": "start" | "record" | "end", "session",
"payload"}); the end of stdin is the end. On stdout: {"started": the session's run or null}
once, {"sent": [record ids]} after each batch logged, {"state": ...} whenever what the session's
end says changes (down, recovery, refused, notes, browse).

It runs in a session of its own: Ctrl-C, a closed terminal or a signal to the tests' process
group reaches the tests' process, which ends the session and closes stdin; the writer then sends
what it holds and exits. A tests' process killed outright closes stdin all the same: the writer
sends what it got (each call bounded, `bounds`; after a failure, none made) and exits, leaving no
process behind.
"""

from __future__ import annotations

import gc
import json
import logging
import queue
import sys
import threading
from pathlib import Path

from harness.records.mlflow import bounds, rows
from harness.records.mlflow.sink import MlflowSink
from harness.records.record import Record

log = logging.getLogger(__name__)

_END = object()  # in the inbox: stdin ended
_NOTHING = object()  # nothing was taken from the inbox after a batch


class Loop:
    """The session's items from `inbox`, logged through `sink` (made in run()); replies on
    `reply` (a callable taking one dict)."""

    def __init__(self, settings: dict, inbox: queue.Queue, reply):
        self.settings, self.inbox, self.reply = settings, inbox, reply
        self.sink: MlflowSink | None = None
        self._said: dict | None = None

    def run(self) -> None:
        reports = self.settings.get("reports")
        # What opening the store makes (MLflow's import: 430,000 objects) lives as long as this
        # process: frozen before any collection scans it, out of every collection to come, which
        # would otherwise scan it all again and again (a third of this process's CPU).
        with bounds.collection_paused():
            self.sink = MlflowSink(self.settings["uri"], self.settings["experiment"],
                                   Path(reports) if reports else None)  # fmt: skip
            gc.freeze()
        self._state()
        item = self.inbox.get()
        while item is not _END:  # each item handled returns the next one
            item = self._log_waiting(item) if item["kind"] == "record" else self._handle(item)

    def _handle(self, item: dict):
        """A session's start or end; then the next item, waited for."""
        session = item["session"]
        if item["kind"] == "start":
            parent = self.settings.get("parent_run")
            if parent:  # a pytest-xdist worker: its controller made the session's run
                self.sink.adopt_parent(session, parent)
            else:
                self.sink.start_session(session)
            made = None if self.sink.down else self.sink.parent_run_id(session)
            self.reply({"started": made})
        else:
            self.sink.end_session(session, item["payload"])
        self._state()
        return self.inbox.get()

    def _log_waiting(self, item: dict):
        """The record of `item` and the session's records queued behind it (rows.BATCH at most:
        those that arrived while the last batch was written), in one write; then the next item,
        waited for."""
        session = item["session"]
        batch, after = [Record.from_dict(item["payload"])], _NOTHING
        while len(batch) < rows.BATCH and after is _NOTHING and not self.inbox.empty():
            queued = self.inbox.get_nowait()  # the only reader: what was there is still there
            if queued is not _END and queued["kind"] == "record" and queued["session"] == session:
                batch.append(Record.from_dict(queued["payload"]))
            else:
                after = queued
        self.sink.log_records(session, batch)
        if not self.sink.down:  # else they are in the journal, said in `down`: sync sends them
            self.reply({"sent": [r.record_id for r in batch]})
        self._state()
        return self.inbox.get() if after is _NOTHING else after

    def _state(self) -> None:
        """What the session's end is to say, sent where it changed."""
        sink = self.sink
        state = {"down": sink.down, "recovery": sink.recovery() if sink.down else "",
                 "refused": sink.refused, "notes": sink.notes, "browse": sink.browse()}  # fmt: skip
        if state != self._said:
            self._said = json.loads(json.dumps(state))  # a copy: the sink's lists grow
            self.reply({"state": state})


def _read(stream, inbox: queue.Queue) -> None:
    for line in stream:
        inbox.put(json.loads(line))
    inbox.put(_END)


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    stdin = open(sys.stdin.fileno(), encoding="utf-8", closefd=False)  # noqa: SIM115 - whole life
    stdout = open(sys.stdout.fileno(), "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    lock = threading.Lock()

    def reply(message: dict) -> None:
        with lock:
            stdout.write(json.dumps(message) + "\n")
            stdout.flush()

    settings = json.loads(stdin.readline())
    inbox: queue.Queue = queue.Queue()
    threading.Thread(target=_read, args=(stdin, inbox), daemon=True).start()
    loop = Loop(settings, inbox, reply)
    try:
        loop.run()
    except BrokenPipeError:  # the tests' process is gone, and read nothing more
        return 0
    except Exception as exc:  # noqa: BLE001 - said to the session, which goes on without it
        log.exception("MLflow writer stopped")
        if loop.sink is not None and not loop.sink.down:
            loop.sink._stop(f"the writer stopped ({bounds.reason(exc)})", exc)
            loop._state()
    return 0


if __name__ == "__main__":
    sys.exit(main())
