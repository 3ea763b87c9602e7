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
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness import shapes
from harness.errors import HarnessError
from harness.record import Record

JOURNAL_NAME = "journal.jsonl"
# Every entry starts with its type (json.dumps keeps the key order the harness writes): where a
# line's start is garbage, a complete entry after it starts at one of these.
_ENTRY_START = b'{"type"'


@dataclass
class Session:
    """One session as the journal holds it: its opening entry, its records, its end if any."""

    entry: dict
    records: list[Record] = field(default_factory=list)
    end: dict | None = None


# The fields each kind of entry must have for its readers (tracking, baseline, compare, list),
# each with the JSON it must hold (a harness.shapes spec). Other fields are kept as they are.
_ENTRY_FIELDS = {
    "session": {
        "session_id": "text",
        "name": "text",
        "started": "number",
        "args": ("list", "text"),
        "fingerprint": "object",
    },
    "record": {"session_id": "text", "record": "object"},
    "session_end": {
        "session_id": "text",
        "ended": "number",
        "exitstatus": "whole",
        "counts": ("object", "whole"),
    },
}


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
        for _, entry in self._numbered_entries():
            yield entry

    def _numbered_entries(self) -> Iterator[tuple[int, dict]]:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:  # bytes: a cut line may end inside a UTF-8 character
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                entry, skipped = _read_line(line)
                where = f"{self.path}:{number}"
                if entry is None:
                    warnings.warn(
                        f"{where}: skipped a corrupt journal line ({skipped})", stacklevel=3
                    )
                    continue
                if skipped:
                    warnings.warn(
                        f"{where}: skipped a corrupt start of a journal line ({skipped}) and read "
                        f"the complete {entry['type']} entry after it",
                        stacklevel=3,
                    )
                yield number, entry

    def sessions(self) -> dict[str, Session]:
        """Every session, in the order they began, by id. An entry that cannot be used (a field
        missing or of the wrong type) is skipped with a warning naming its line and the field;
        a record whose session entry is missing or unusable belongs to none and is left out,
        and said."""
        found: dict[str, Session] = {}
        unknown: dict[str, list[int]] = {}  # field or entry type -> the lines that hold it
        orphans: list[int] = []
        for number, entry in self._numbered_entries():
            kind = entry["type"]
            if kind not in _ENTRY_FIELDS:
                unknown.setdefault(f"entry type {kind!r}", []).append(number)
                continue
            problem = shapes.fields_problem(entry, _ENTRY_FIELDS[kind])
            problem = problem and f"{kind} entry: {problem}"
            record = None
            if problem is None and kind == "record":
                try:
                    record = Record.from_dict(entry["record"])
                except HarnessError as exc:
                    problem = f"record: {exc}"
                for name in Record.unknown_fields(entry["record"]):
                    unknown.setdefault(f"record.{name}", []).append(number)
            if problem is not None:
                warnings.warn(
                    f"{self.path}:{number}: skipped a journal entry it cannot use: {problem} "
                    "(the line stays in the file: fix it by hand to read it again)",
                    stacklevel=2,
                )
                continue
            session = found.get(entry["session_id"])
            if kind == "session":
                found[entry["session_id"]] = Session(entry)
            elif session is None:
                orphans.append(number)
            elif record is not None:
                session.records.append(record)
            else:
                session.end = entry
        if orphans:
            warnings.warn(
                f"{self.path}: left out {len(orphans)} entries of sessions whose session entry "
                f"is missing or unusable (lines {_lines(orphans)})",
                stacklevel=2,
            )
        if unknown:
            names = ", ".join(f"{name} (lines {_lines(lines)})" for name, lines in unknown.items())
            warnings.warn(
                f"{self.path}: ignored what this version of amp-harness does not know (written "
                f"by a newer one? upgrade to read it): {names}",
                stacklevel=2,
            )
        return found


def _line(entry: dict) -> bytes:
    """`entry` as one line of UTF-8 JSON. Text UTF-8 cannot encode (a Latin-1 file name decoded
    with surrogateescape: the plugin escapes records, a caller may not have) is escaped here as
    well (shapes.storable): a journal that refused it would lose the entry."""
    try:
        return (json.dumps(entry, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return _line(shapes.storable(entry))


def _write_all(fd: int, data: bytes) -> None:
    """os.write until all of `data` is written: a write may take part of it (a nearly full
    disk) and raise only at the next call."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_line(line: bytes) -> tuple[dict | None, str]:
    """The entry a journal line holds, and what was skipped to read it ("" if nothing); None and
    why if the line holds none.

    The whole line is tried first. Failing that, a complete entry at the end of the line, after
    garbage: each place where an entry could start (`{"type"`), left to right, is tried, and
    the first one that parses as an entry up to the end of the line wins. Left to right finds
    the outermost entry: a nested object that also starts with "type" (a param named type)
    parses but leaves the rest of its entry unread, so it is never taken for one."""
    entry, why = _parse(line)
    if entry is not None:
        return entry, ""
    start = line.find(_ENTRY_START, 1)
    while start != -1:
        found, _ = _parse(line[start:])
        if found is not None:
            return found, f"{start} bytes: {why}"
        start = line.find(_ENTRY_START, start + 1)
    return None, why


def _parse(text: bytes) -> tuple[dict | None, str]:
    try:
        entry = shapes.loads(text.decode("utf-8"))  # a line nested too deeply: a ValueError
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 at byte {exc.start}"
    except ValueError as exc:
        return None, str(exc)
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
        return None, "not a journal entry"
    return entry, ""


def _lines(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:5]))
    return shown + (f" and {len(numbers) - 5} more" if len(numbers) > 5 else "")
