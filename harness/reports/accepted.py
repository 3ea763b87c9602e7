"""Accepted changes: the differences a team has reviewed and accepts, in a file it commits.

`reports/baselines/accepted-changes.toml`, beside the baselines it excuses (pytest's
xfail-with-reason, TorchBench's expected-failure list): one `[[accepted]]` table per change,

    [[accepted]]
    claim = "PIT2-NORM-HALF"              # the claim whose change is accepted
    metric = "bn/half_highest_finite_std" # optional: only this metric's change (`compare`'s name)
    from = "2.5"                          # the release before the change ...
    to = "2.6"                            # ... and the first release after it
    class = "cpu-x86-64-avx2"             # optional: only on this hardware class
    reason = "BatchNorm accumulates in fp32 since #126525"
    who = "jane@example.org"
    expires = 2027-06-30                  # a TOML date, or an issue link: issue = "..."

An entry covers a comparison whose two torch releases lie on either side of `from` and `to`
(a release written `2.6` is any 2.6.x), on its class where it names one. The upgrade gate
(harness.reports.compare) shows a change an entry covers as accepted, never as a regression,
unless the entry expired; an entry that covered nothing, or expired, is said.
`amp-harness validate` checks the file: each problem names the file, the line and the fix.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.common.errors import HarnessError
from harness.common.toml import tomllib
from harness.common.versions import version_key

FILENAME = "accepted-changes.toml"
TABLE = "accepted"
RELEASE = re.compile(r"\d+\.\d+(\.\d+)?(\+[A-Za-z0-9.]+)?")
_HEADER = re.compile(r"\s*\[\[\s*accepted\s*\]\]")
REQUIRED = ("claim", "from", "to", "reason", "who")
OPTIONAL = ("metric", "class", "expires", "issue")
FIX = "see the format at the top of harness/reports/accepted.py, or docs/upgrades.md"


@dataclass(frozen=True)
class Entry:
    path: Path
    line: int  # of its [[accepted]] header
    claim: str
    since: str  # `from`: the release before the change
    until: str  # `to`: the first release after it
    reason: str
    who: str
    metric: str | None = None
    hardware_class: str | None = None
    expires: datetime.date | None = None
    issue: str | None = None

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def __str__(self) -> str:
        metric = f" {self.metric}" if self.metric else ""
        on = f" on {self.hardware_class}" if self.hardware_class else ""
        return f"{self.where} ({self.claim}{metric}, {self.since} -> {self.until}{on})"

    def expired(self, today: datetime.date) -> bool:
        return self.expires is not None and self.expires < today

    def covers(self, torch_a: str, torch_b: str, hardware_class: str) -> bool:
        """Whether a comparison of torch_a with torch_b on `hardware_class` spans this change
        (either way: an upgrade or a downgrade)."""
        if self.hardware_class not in (None, hardware_class) or "n/a" in (torch_a, torch_b):
            return False
        low, high = sorted((version_key(torch_a), version_key(torch_b)))
        since, until = version_key(self.since), version_key(self.until)
        return low[: len(since)] <= since and high[: len(until)] >= until

    def matches(self, claims: Iterable[str], metric: str | None) -> bool:
        """Whether a change of `claims` (and of `metric`, for a metric's change) is this one."""
        return self.claim in claims and self.metric in (None, metric)

    def terms(self) -> str:
        """Who accepted it, why, and for how long."""
        until = f"until {self.expires}" if self.expires else f"see {self.issue}"
        return f"{self.who}: {self.reason} ({until})"


def default_path(baselines: Path) -> Path:
    return Path(baselines) / FILENAME


def read(path: Path, known_claims: Iterable[str] | None = None) -> list[Entry]:
    """The file's entries; a file with any problem is an error listing them all (an expired
    entry is no problem here: the gate says it, `validate` fails on it). No file: no entry."""
    entries, found = _parse(Path(path), set(known_claims) if known_claims is not None else None)
    if found:
        raise HarnessError("; ".join(found))
    return entries


def problems(
    path: Path, known_claims: Iterable[str], today: datetime.date | None = None
) -> list[str]:
    """Every problem of the file, one line each, for `amp-harness validate`: its mistakes, and
    each entry that expired (a change accepted for a while must be reviewed again)."""
    entries, found = _parse(Path(path), set(known_claims))
    today = today or datetime.date.today()
    for entry in entries:
        if entry.expired(today):
            found.append(
                f"{entry.where}: expires: the acceptance of {entry.claim} ran out on "
                f"{entry.expires}: review the change, then set a later `expires` or remove the "
                "entry"
            )
    return found


def _parse(path: Path, known: set[str] | None) -> tuple[list[Entry], list[str]]:
    if not path.exists():
        return [], []
    try:
        text = path.read_text(encoding="utf-8")
        document = tomllib.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        return [], [f"{path}: cannot read it: {exc}"]
    except tomllib.TOMLDecodeError as exc:
        return [], [f"{path}: not TOML ({exc}); {FIX}"]
    found = [
        f"{path}: {key!r} is not a table of this file: it holds [[{TABLE}]] entries only"
        for key in document
        if key != TABLE
    ]
    tables = document.get(TABLE, [])
    if not isinstance(tables, list):
        return [], [*found, f"{path}: `{TABLE}` must be [[{TABLE}]] tables, one per change"]
    lines = [n for n, line in enumerate(text.splitlines(), start=1) if _HEADER.match(line)]
    entries = []
    for index, table in enumerate(tables):
        line = lines[index] if index < len(lines) else 1
        entry, said = _entry(path, line, table, known, _field_lines(text, line))
        found += said
        if entry:
            entries.append(entry)
    return entries, found


def _line_of(problem: str) -> int:
    """The line a problem names (`path:LINE: ...`), to list an entry's problems in file order."""
    return int(problem.split(": ", 1)[0].rsplit(":", 1)[1])


def _field_lines(text: str, header: int) -> dict[str, int]:
    """The line of each `name = ...` of the table that starts at line `header`."""
    found: dict[str, int] = {}
    for number, line in enumerate(text.splitlines()[header:], start=header + 1):
        if line.lstrip().startswith("["):
            break
        name = line.split("=", 1)[0].strip()
        if "=" in line and name:
            found.setdefault(name, number)
    return found


def _entry(
    path: Path, line: int, table: dict, known: set[str] | None, field_lines: dict[str, int]
) -> tuple[Entry | None, list[str]]:
    """One [[accepted]] table, checked: (the entry, or None where it is unusable; its problems)."""

    def at(name: str) -> str:
        return f"{path}:{field_lines.get(name, line)}"

    found = [
        f"{at(name)}: {name!r} is not a field of an accepted change (they are: "
        f"{', '.join(REQUIRED + OPTIONAL)}): fix the name"
        for name in table
        if name not in REQUIRED + OPTIONAL
    ]
    for name in REQUIRED:
        value = table.get(name)
        if not isinstance(value, str) or not value.strip():
            found.append(
                f'{at(name)}: {name!r} is missing or empty: give it as text, {name} = "..."'
            )
    for name in ("metric", "class", "issue"):
        if name in table and (not isinstance(table[name], str) or not table[name].strip()):
            found.append(f"{at(name)}: {name!r} must be text, or left out")
    releases = []
    for name in ("from", "to"):
        value = table.get(name)
        if isinstance(value, str) and not RELEASE.fullmatch(value.strip()):
            found.append(
                f"{at(name)}: {name} = {value!r} is not a torch release: write it as torch "
                "numbers it, 2.6 or 2.6.0"
            )
        elif isinstance(value, str):
            releases.append(value.strip())
    if len(releases) == 2 and version_key(releases[0]) > version_key(releases[1]):
        found.append(
            f"{at('from')}: from = {releases[0]!r} comes after to = {releases[1]!r}: `from` is "
            "the release before the change, `to` the first one after it"
        )
    expires = table.get("expires")
    if expires is not None and type(expires) is not datetime.date:
        found.append(
            f"{at('expires')}: expires = {expires!r} is not a date: write it as a TOML date, "
            "unquoted: expires = 2027-06-30"
        )
    if "expires" not in table and "issue" not in table:
        found.append(
            f"{path}:{line}: an accepted change needs an end: `expires = 2027-06-30` (a date "
            'it is reviewed again by) or `issue = "<link>"` (where its fix is tracked)'
        )
    claim = table.get("claim")
    if known is not None and isinstance(claim, str) and claim.strip() and claim not in known:
        found.append(
            f"{at('claim')}: claim {claim!r} is in no catalogue (the built-in ones and the "
            "project's scenarios/claims.toml): fix the ID (`amp-harness list` lists them)"
        )
    if found:
        return None, sorted(found, key=_line_of)
    since, until = table["from"].strip(), table["to"].strip()
    return Entry(
        path=path,
        line=line,
        claim=claim,
        since=since,
        until=until,
        reason=table["reason"].strip(),
        who=table["who"].strip(),
        metric=table.get("metric"),
        hardware_class=table.get("class"),
        expires=expires,
        issue=table.get("issue"),
    ), []
