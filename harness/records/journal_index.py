"""What the journal's readers make of each line (the rules are harness.records.journal's
docstring), and the index that keeps it between readings: per session its entries and where its
records are.

Parsing and checking every record of a year of CI history (50,000 entries, 59 MB) took `list`
9 s and 243 MB, for the few sessions it shows. The index is kept beside the journal
(`.journal.jsonl.index`): a reader checks that the part of the journal it covers is unchanged
(its SHA-1: 0.1 s for 59 MB), reads only the lines appended since, and then parses only the
records of the sessions it asks for. What reading found (skipped lines, unusable entries, fields
of a newer version) is kept with it and said at every reading, as a full reading would. Any
change to the part covered (a hand edit, a truncation) rebuilds it; where it cannot be written
(a read-only folder), it is built in memory for that reading.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.common.errors import HarnessError
from harness.records import shapes
from harness.records.record import Record

FORMAT = 3  # bump when what the index holds, or how lines are judged, changes (3: marks)
# Every entry starts with its type (json.dumps keeps the key order the harness writes): where a
# line's start is garbage, a complete entry after it starts at one of these.
_ENTRY_START = b'{"type"'
# The fields each kind of entry must have for its readers (tracking, baseline, compare, list),
# each with the JSON it must hold (a harness.records.shapes spec). Other fields are kept as they
# are.
ENTRY_FIELDS = {
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
    # `amp-harness sessions mark ID experimental|record`: folded into its session's entry (MARK)
    "session_mark": {"session_id": "text", "marked": "number", "state": "text", "reason": "text"},
}
_UNUSABLE = "(the line stays in the file: fix it by hand to read it again)"
# The field that marks a session entry the reader made up for records whose own is missing.
REBUILT = "rebuilt"
# A session's mark, in its entry: {"state": EXPERIMENTAL or RECORD, "reason": text, "marked":
# seconds since the epoch}. Written there by pytest's --amp-experimental as the session starts;
# a later `session_mark` entry (`amp-harness sessions mark`) replaces it as the index reads it.
# An experimental session is kept out of the team's record: the report's ledger, `baseline
# save`, the comparisons of `last`. None is of record until marked.
MARK = "mark"
EXPERIMENTAL, RECORD = "experimental", "record"
MARK_STATES = (EXPERIMENTAL, RECORD)


def short_id(session_id: str) -> str:
    """A session's id as the harness shows it: 12 hex digits, unique among a year of CI
    sessions (8 would not be: among 50,000 sessions, two share a prefix of 8 with a chance of
    25%), and taken by every command that takes an id (a unique prefix)."""
    return session_id[:12]


@dataclass
class Indexed:
    """One session as the index holds it: its opening entry, its end if any, the claims its
    records declare, and where each record is: [line number, byte offset, length]."""

    entry: dict
    end: dict | None = None
    records: list[list[int]] = field(default_factory=list)
    claims: list[str] = field(default_factory=list)


@dataclass
class Index:
    """What reading the journal up to byte `covered` (`lines` lines) found."""

    covered: int = 0
    lines: int = 0
    digest: str = hashlib.sha1().hexdigest()  # of the bytes covered
    sessions: dict[str, Indexed] = field(default_factory=dict)
    problems: list[list] = field(default_factory=list)  # [line, what], in line order
    orphans: list[int] = field(default_factory=list)  # ends and marks of no known session
    rebuilt: dict[str, list[int]] = field(default_factory=dict)  # session id -> its record lines
    unknown: dict[str, list[int]] = field(default_factory=dict)  # field or type -> lines

    def add(self, number: int, offset: int, line: bytes) -> None:
        """Judge line `number` (at byte `offset`) as every reader does, and note what it is."""
        if not line.strip():
            return
        entry, skipped = read_line(line)
        corrupt = line_problem(entry, skipped)
        if corrupt:
            self.problems.append([number, corrupt])
        if entry is None:
            return
        kind = entry["type"]
        if kind not in ENTRY_FIELDS:
            self.unknown.setdefault(f"entry type {kind!r}", []).append(number)
            return
        problem = shapes.fields_problem(entry, ENTRY_FIELDS[kind])
        problem = problem and f"{kind} entry: {problem}"
        if problem is None and kind == "session_mark" and entry["state"] not in MARK_STATES:
            self.unknown.setdefault(f"session_mark state {entry['state']!r}", []).append(number)
            return
        record = None
        if problem is None and kind == "record":
            try:
                record = Record.from_dict(entry["record"])
            except HarnessError as exc:
                problem = f"record: {exc}"
            for name in Record.unknown_fields(entry["record"]):
                self.unknown.setdefault(f"record.{name}", []).append(number)
        if problem is not None:
            self.problems.append([number, f"skipped a journal entry it cannot use: {problem} "
                                  + _UNUSABLE])  # fmt: skip
            return
        sid = entry["session_id"]
        session = self.sessions.get(sid)
        if kind == "session" and self.rebuilt.pop(sid, None) is not None:
            # Its records came first: written again after it vanished; a mark read since stays.
            session.entry = {**entry, **{k: v for k, v in session.entry.items() if k == MARK}}
        elif kind == "session":
            self.sessions[sid] = Indexed(entry)
        elif record is not None:
            if session is None:  # its session entry is missing or unusable: sync still sends it
                session = self.sessions[sid] = Indexed(rebuilt_session(sid, record))
                self.rebuilt[sid] = []
            if sid in self.rebuilt:
                self.rebuilt[sid].append(number)
            session.records.append([number, offset, len(line)])
            session.claims = list(dict.fromkeys(session.claims + record.claims))
        elif session is None:
            self.orphans.append(number)
        elif kind == "session_mark":
            session.entry = {**session.entry, MARK: mark(entry["state"], entry["reason"],
                                                         entry["marked"])}  # fmt: skip
        else:
            session.end = entry

    def warnings(self, path: Path) -> list[str]:
        """What this reading found that a reader must say, naming `path`:LINE."""
        said = [f"{path}:{number}: {what}" for number, what in self.problems]
        rebuilt = sorted(n for lines in self.rebuilt.values() for n in lines)
        if rebuilt:
            said.append(
                f"{path}: read {len(rebuilt)} records of sessions whose session entry is missing "
                f"or unusable (lines {lines_text(rebuilt)}) under a session rebuilt from their "
                "session_id, without its fingerprint: `amp-harness sync` sends them"
            )
        if self.orphans:
            said.append(
                f"{path}: left out {len(self.orphans)} session ends or marks of sessions whose "
                f"session entry is missing or unusable (lines {lines_text(self.orphans)})"
            )
        if self.unknown:
            names = ", ".join(f"{n} (lines {lines_text(ls)})" for n, ls in self.unknown.items())
            said.append(
                f"{path}: ignored what this version of amp-harness does not know (written by a "
                f"newer one? upgrade to read it): {names}"
            )
        return said


def rebuilt_session(sid: str, record: Record) -> dict:
    """The session entry of records whose own is missing (the journal was deleted while the
    session ran, and re-created without it) or unusable: made from their session_id, started
    with the first of them, without the fingerprint no record holds; marked REBUILT."""
    return {
        "type": "session",
        "session_id": sid,
        "name": f"session {short_id(sid)} (its session entry is missing: rebuilt from its records)",
        "started": record.started,
        "args": [],
        "fingerprint": {},
        REBUILT: "the journal holds records of this session but not its session entry",
    }


def mark(state: str, reason: str, marked: float) -> dict:
    """A session's mark (MARK), as its entry holds it: `state` (EXPERIMENTAL or RECORD) since
    `marked`, for `reason` ("" where none was given)."""
    return {"state": state, "reason": reason, "marked": marked}


def mark_entry(session_id: str, state: str, reason: str, marked: float) -> dict:
    """The journal entry that marks a session after the fact (`amp-harness sessions mark`)."""
    return {"type": "session_mark", "session_id": session_id, **mark(state, reason, marked)}


def mark_of(session: dict) -> dict | None:
    """The mark of a session entry (MARK: {"state", "reason", "marked"}); None where it was
    never marked, or its mark is not one this version reads (a hand edit)."""
    found = session.get(MARK)
    usable = isinstance(found, dict) and found.get("state") in MARK_STATES
    return found if usable and isinstance(found.get("reason"), str) else None


def is_experimental(session: dict) -> bool:
    """Whether the session entry is marked experimental (MARK): kept out of the team's record."""
    found = mark_of(session)
    return found is not None and found["state"] == EXPERIMENTAL


def read(path: Path, rebuild: bool = False) -> Index:
    """The index of the journal at `path`: the one kept beside it, checked against the part of
    the journal it covers and extended with what was appended since (and kept again), or built
    anew. A last line without its new line (being written, or cut) is judged for this reading
    only: the next one judges it again. `rebuild`: read it all, whatever the index kept."""
    index = Index() if rebuild else _load(_index_path(path))
    unended = b""
    with open(path, "rb") as f:
        hasher = hashlib.sha1()
        for chunk in iter(lambda: f.read(min(1 << 20, index.covered - f.tell())), b""):
            hasher.update(chunk)
        if f.tell() != index.covered or hasher.hexdigest() != index.digest:
            index, hasher = Index(), hashlib.sha1()  # changed where it was read: read it all
            f.seek(0)
        kept = index.covered
        for line in f:
            if not line.endswith(b"\n"):
                unended = line
                break
            index.lines += 1
            index.add(index.lines, index.covered, line)
            hasher.update(line)
            index.covered += len(line)
    if index.covered != kept:
        index.digest = hasher.hexdigest()
        _save(_index_path(path), index)
    if unended:
        index.add(index.lines + 1, index.covered, unended)
    return index


def records(path: Path, sessions: list[Indexed]) -> dict[str, list[Record]]:
    """The records of `sessions` (from `read`), by session id, read at their offsets. A line
    that no longer holds the record it held (the journal was edited since, or the index was
    damaged) is a HarnessError: `read(path, rebuild=True)`, then ask again."""
    found: dict[str, list[Record]] = {}
    with open(path, "rb") as f:
        for session in sessions:
            sid = session.entry["session_id"]
            found[sid] = []
            for number, offset, length in session.records:
                f.seek(offset)
                entry, _ = read_line(f.read(length))
                if entry is None or entry.get("session_id") != sid:
                    raise HarnessError(f"{path}:{number}: changed since it was indexed")
                found[sid].append(Record.from_dict(entry["record"]))
    return found


def _index_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.index")


def _load(path: Path) -> Index:
    """The index kept at `path`; an empty one where there is none, or none this version reads
    (another version's, a damaged one: the journal is then read whole)."""
    try:
        data = shapes.loads(path.read_text(encoding="utf-8"))
        if data.pop("format") != FORMAT:
            return Index()
        data["sessions"] = {sid: Indexed(**s) for sid, s in data["sessions"].items()}
        index = Index(**data)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # absent or not ours
        return Index()
    whole = all(isinstance(n, int) and n >= 0 for n in (index.covered, index.lines))
    return index if whole and isinstance(index.digest, str) else Index()


def _save(path: Path, index: Index) -> None:
    """Keep `index` (atomically: readers at once each write a whole one). A folder it cannot
    be written to costs the next reading its speed, nothing else."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps({"format": FORMAT, **asdict(index)}), encoding="utf-8")
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):  # a read-only folder refuses the unlink as well
            temporary.unlink(missing_ok=True)


def read_line(line: bytes) -> tuple[dict | None, str]:
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


def line_problem(entry: dict | None, skipped: str) -> str | None:
    """What a reader says of a line `read_line` gave `entry` and `skipped` for; None if whole."""
    if entry is None:
        return f"skipped a corrupt journal line ({skipped})"
    if skipped:
        return (
            f"skipped a corrupt start of a journal line ({skipped}) and read the complete "
            f"{entry['type']} entry after it"
        )
    return None


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


def lines_text(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:5]))
    return shown + (f" and {len(numbers) - 5} more" if len(numbers) > 5 else "")
