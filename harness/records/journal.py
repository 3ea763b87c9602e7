"""The local journal: an append-only JSON-lines file that every result reaches first.

Each line is written and fsync'ed before anything is sent to MLflow, so a crash, an unreachable
tracking server or a killed session loses nothing: `amp-harness sync` replays the journal later.

What a reader does with a journal that was damaged (a crash or a full disk cut a line; a hand
edit; a newer version wrote it) is written down here once, for every reader (sync, list,
baseline, compare, the plugin's end of session):
- a line that is not JSON, or is nested too deeply for Python to read, is skipped with a
  warning naming `journal.jsonl:LINE`; the file is never rewritten, so nothing is lost by
  reading it;
- a line whose start is garbage and whose end is a complete entry (what a cut line followed by
  the next append used to give, before appends started on a fresh line) yields that entry;
- an entry that is JSON but cannot be used (a field missing or of the wrong type) is skipped
  with a warning naming the line and the field; the entries around it are read as usual;
- fields and entry types this version does not know (a newer version wrote them) are ignored,
  and said once per reading.
Readers go through harness.records.journal_index, which keeps what a reading found beside the
journal, so that the next reading parses only what was appended since, and only the sessions it
needs.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness.common import shown
from harness.common.errors import HarnessError
from harness.records import journal_index
from harness.records.journal_index import Indexed
from harness.records.record import Record

JOURNAL_NAME = "journal.jsonl"


@dataclass
class Session:
    """One session as the journal holds it: its opening entry, its records, its end if any."""

    entry: dict
    records: list[Record] = field(default_factory=list)
    end: dict | None = None


class Journal:
    def __init__(self, path: Path):
        self.path = Path(path)

    def check_writable(self) -> None:
        """Fail early, before any test runs, if the journal cannot be written."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8"):
                pass
        except OSError as exc:
            raise HarnessError(
                f"cannot write the journal {self.path}: {exc.strerror}. Make "
                f"{self.path.parent} writable or pass --amp-reports DIR for another folder."
            ) from exc

    def append(self, entry: dict) -> None:
        """Write `entry` as one whole line, on a line of its own, and fsync it.

        If the write fails (a full disk), the file is cut back to its size before, so no half
        line is left for the next append to glue itself to, and a HarnessError names the journal
        and the fix."""
        data = _line(entry)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            # pytest-xdist workers append to one journal: one whole line at a time.
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            # A line cut earlier (a crash, a full disk, a hand edit) must not swallow this entry:
            # the reader would see one corrupt line and lose it (a whole session, if it is the
            # session's first entry).
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            try:
                _write_all(fd, data)
                os.fsync(fd)
            except OSError as exc:
                raise self._append_failed(fd, size, entry, exc) from exc
        finally:
            os.close(fd)  # releases the lock

    def _append_failed(self, fd: int, size: int, entry: dict, exc: OSError) -> HarnessError:
        try:
            os.ftruncate(fd, size)  # what was written of this entry, gone: the journal as before
            os.fsync(fd)
            kept = "the journal is as it was before this entry"
        except OSError:
            kept = "part of this entry may remain as a cut line, which readers skip"
        what = entry.get("type", "entry")
        if isinstance(entry.get("record"), dict) and "test" in entry["record"]:
            what = f"the record of {entry['record']['test']}"
        reason = exc.strerror or str(exc)
        fix = (
            f"free space on the disk of {self.path.parent}"
            if exc.errno in (errno.ENOSPC, errno.EDQUOT)
            else f"make {self.path} writable"
        )
        return HarnessError(
            f"cannot append to the journal {self.path}: {reason} ({what} was not recorded; "
            f"{kept}). Fix: {fix}, or pass --amp-reports DIR for a folder on another disk, "
            "then run again"
        )

    def entries(self) -> Iterator[dict]:
        """Every readable entry in order; a corrupt line is skipped with a warning."""
        if not self.path.exists():
            return
        with self.path.open("rb") as f:  # bytes: a cut line may end inside a UTF-8 character
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                entry, skipped = journal_index.read_line(line)
                problem = journal_index.line_problem(entry, skipped)
                if problem:
                    warnings.warn(f"{self.path}:{number}: {problem}", stacklevel=2)
                if entry is not None:
                    yield entry

    def index(self) -> dict[str, Indexed]:
        """Every session, in the order they began, by id, as harness.records.journal_index holds it:
        its entries and where its records are, without reading them. What a full reading finds
        is said each time: a corrupt line, an entry that cannot be used (a field missing or of
        the wrong type: skipped, naming its line and the field), records whose session entry is
        missing or unusable (left out), what a newer version wrote."""
        if not self.path.exists():
            return {}
        index = journal_index.read(self.path)
        for message in index.warnings(self.path):
            warnings.warn(message, stacklevel=2)
        return index.sessions

    def load(self, chosen: Iterable[Indexed]) -> dict[str, Session]:
        """The sessions `chosen` from `index()`, with their records: only theirs are read."""
        chosen = {s.entry["session_id"]: s for s in chosen}
        if not chosen:
            return {}  # nothing to read, in a journal that may not be there at all
        try:
            found = journal_index.records(self.path, list(chosen.values()))
        except HarnessError:  # edited since index(): index it anew (said already), read again
            fresh = journal_index.read(self.path, rebuild=True).sessions
            chosen = {sid: fresh[sid] for sid in chosen if sid in fresh}
            found = journal_index.records(self.path, list(chosen.values()))
        return {sid: Session(s.entry, found[sid], s.end) for sid, s in chosen.items()}

    def sessions(self) -> dict[str, Session]:
        """Every session with its records, in the order they began, by id (`index`, then
        `load`: what the index says is said here too)."""
        return self.load(self.index().values())


def _line(entry: dict) -> bytes:
    """`entry` as one line of UTF-8 JSON. Text UTF-8 cannot encode (a Latin-1 file name decoded
    with surrogateescape: the plugin escapes records, a caller may not have) is escaped here as
    well (shown.storable): a journal that refused it would lose the entry."""
    try:
        return (json.dumps(entry, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return _line(shown.storable(entry))


def _write_all(fd: int, data: bytes) -> None:
    """os.write until all of `data` is written: a write may take part of it (a nearly full
    disk) and raise only at the next call."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
