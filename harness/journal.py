"""The local journal: an append-only JSON-lines file that every result reaches first.

Each line is written and fsync'ed before anything is sent to MLflow, so a crash, an unreachable
tracking server or a killed session loses nothing: `amp-harness sync` replays the journal later.
"""

from __future__ import annotations

import fcntl
import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import HarnessError
from harness.record import Record

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
        line = json.dumps(entry, ensure_ascii=False, allow_nan=False)
        with self.path.open("a", encoding="utf-8") as f:
            # pytest-xdist workers append to one journal: one whole line at a time.
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
            fcntl.flock(f, fcntl.LOCK_UN)

    def entries(self) -> Iterator[dict]:
        """Every readable entry in order; a corrupt line is skipped with a warning."""
        if not self.path.exists():
            return
        with self.path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                    if not isinstance(entry, dict) or "type" not in entry:
                        raise ValueError("not a journal entry")
                except ValueError as exc:
                    warnings.warn(
                        f"{self.path}:{number}: skipped a corrupt journal line ({exc})",
                        stacklevel=2,
                    )
                    continue
                yield entry

    def sessions(self) -> dict[str, Session]:
        """Every session, in the order they began, by id; a record whose session entry is
        missing (a corrupt line) belongs to none and is left out."""
        found: dict[str, Session] = {}
        for entry in self.entries():
            session = found.get(entry.get("session_id"))
            if entry["type"] == "session":
                found[entry["session_id"]] = Session(entry)
            elif session and entry["type"] == "record":
                session.records.append(Record.from_dict(entry["record"]))
            elif session and entry["type"] == "session_end":
                session.end = entry
        return found
