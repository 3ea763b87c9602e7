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
  and said once per reading;
- records whose session entry is missing or unusable are read under a session entry rebuilt
  from their session_id (harness.records.journal_index.rebuilt_session, marked `rebuilt`), and
  said, so that `amp-harness sync` sends them; a session end without its session is left out.

A session is marked experimental, or of record again, after the fact by a `session_mark` entry
appended later (`amp-harness sessions mark`): the file is never edited; the index folds the last
mark into its session's entry (harness.records.journal_index.MARK).
A session's journal survives being deleted while the session runs (`Journal.keep`): the next
append re-creates it, the session entry first, with every entry the process had appended
before, and `rewritten` says so for the end of the session.
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
        self._held: int | None = None  # the file this process writes to, held open (keep)
        self._kept: dict[tuple, dict] = {}  # what to write again if it vanishes, by identity
        self.rewritten: list[str] = []  # each time it was re-created, in words

    def keep(self, opening: dict) -> None:
        """From now on, keep this process's part of the journal whole should the file vanish
        (deleted, or its folder): `opening` (the session entry) and every entry appended from
        here on are written again, first, into the journal the next append re-creates (another
        process of the session may have re-created it already: what it holds is not written
        twice). The file is held open until `close`: while held, its inode cannot be reused, so
        a journal created anew at the path is never taken for it."""
        self.close()
        self._held = os.open(self.path, os.O_RDONLY)
        self._kept = {_identity(opening): opening}

    def close(self) -> None:
        if self._held is not None:
            os.close(self._held)
            self._held = None

    def vanished(self) -> bool:
        """Whether the file `keep` holds is no longer the journal at its path."""
        if self._held is None:
            return False
        try:
            return not _same_file(os.stat(self.path), os.fstat(self._held))
        except OSError:  # gone, or its folder can no longer be read: the next append says which
            return True

    def write_kept(self) -> None:
        """Re-create the journal with what this process keeps, if it vanished (a process that
        has nothing more to append: at its end)."""
        if self.vanished():
            self._write([])

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
        and the fix. A journal `keep` holds that vanished is re-created first (`keep`)."""
        self._write([entry])

    def _write(self, entries: list[dict]) -> None:
        fd = self._open()
        try:
            # pytest-xdist workers append to one journal: one whole line at a time.
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            again = self._lacking(fd)
            data = b"".join(map(_line, again + entries))
            # A line cut earlier (a crash, a full disk, a hand edit) must not swallow this entry:
            # the reader would see one corrupt line and lose it (a whole session, if it is the
            # session's first entry).
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            try:
                _write_all(fd, data)
                os.fsync(fd)
            except OSError as exc:
                raise self._append_failed(fd, size, (again + entries or [{}])[-1], exc) from exc
            if self._held is not None:
                self._kept.update((_identity(e), e) for e in entries)
                if not _same_file(os.fstat(fd), os.fstat(self._held)):
                    self._adopt(fd, again)
        finally:
            os.close(fd)  # releases the lock

    def _open(self) -> int:
        """The journal, opened to append; a kept journal whose folder was deleted gets it back."""
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT
        try:
            try:
                return os.open(self.path, flags, 0o666)
            except FileNotFoundError:
                if self._held is None:
                    raise
                self.path.parent.mkdir(parents=True, exist_ok=True)
                return os.open(self.path, flags, 0o666)
        except OSError as exc:
            raise HarnessError(
                f"cannot append to the journal {self.path}: {exc.strerror or exc}. Fix: make "
                f"{self.path.parent} writable, or pass --amp-reports DIR for another folder"
            ) from exc

    def _lacking(self, fd: int) -> list[dict]:
        """What this process keeps that `fd`, the journal now at the path, lacks: nothing while
        it is the file `keep` holds; once it is another one (re-created), the kept entries it
        does not hold yet, in the order they were first written."""
        if self._held is None or _same_file(os.fstat(fd), os.fstat(self._held)):
            return []
        os.lseek(fd, 0, os.SEEK_SET)
        with os.fdopen(os.dup(fd), "rb") as f:
            present = {_identity(entry) for entry in map(_entry_of, f) if entry}
        return [e for key, e in self._kept.items() if key not in present]

    def _adopt(self, fd: int, again: list[dict]) -> None:
        """`fd` is the journal from now on: held instead of the one that vanished, and said."""
        os.close(self._held)
        # Opened anew, not os.dup(fd): a duplicate would share fd's open file, and its lock with
        # it, which would then outlive this append and block the next.
        self._held = os.open(self.path, os.O_RDONLY)
        tests = [e["record"]["test"] for e in again if e.get("type") == "record"]
        opening = any(e.get("type") == "session" for e in again)
        self.rewritten.append(
            f"{self.path} vanished during this session (deleted, or its folder with it) and was "
            f"created again: {'the session entry first, then ' if opening else ''}"
            f"{len(tests)} record(s) this process had recorded before written again"
            f"{': ' + ', '.join(tests) if tests else ''}; what it held of earlier sessions is gone"
        )

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
        missing or unusable (read under a rebuilt one), what a newer version wrote."""
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


def _identity(entry: dict) -> tuple:
    """What tells one entry apart from another: its type, its session and its record's id."""
    record = entry.get("record")
    return (
        entry.get("type"),
        entry.get("session_id"),
        isinstance(record, dict) and record.get("record_id"),
    )


def _entry_of(line: bytes) -> dict | None:
    return journal_index.read_line(line)[0] if line.strip() else None


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


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
