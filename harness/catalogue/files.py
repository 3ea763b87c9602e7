"""What every catalogue file shares: its TOML tables read, each entry named in an error, the IDs
(claims and known bugs share one namespace: `GROUP-NAME`, capitals, digits and dashes) and the
error every catalogue raises; apart, so that each catalogue module uses them without importing
another.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from harness.common.errors import HarnessError
from harness.common.toml import tomllib

# Held with fullmatch: `re.match(...$)` lets a final line break through ("TEAM-X\n"), which
# would reach MLflow's tag names (`verdict.<ID>`).
ID_PATTERN = re.compile(r"[A-Z][A-Z0-9]*(-[A-Z0-9]+)+")


class CatalogueError(HarnessError):
    pass


def quoted(claim_id: str) -> str:
    """An ID as a message shows it: in quotes, a line break or tab written out (`"TEAM-X\\n"`),
    as TOML and JSON write it. (A valid ID needs no escape: the label of each of 10,000 entries
    is made at once.)"""
    if ID_PATTERN.fullmatch(claim_id):
        return f'"{claim_id}"'
    return json.dumps(claim_id, ensure_ascii=False)


def check_id(where: str, claim_id: str) -> None:
    if ID_PATTERN.fullmatch(claim_id):
        return
    what = f"{where}: id {quoted(claim_id)} is not of the form GROUP-NAME"
    bare = "".join(claim_id.split())
    if bare != claim_id and ID_PATTERN.fullmatch(bare):
        raise CatalogueError(
            f"{what} (capitals, digits, dashes): it holds white space (a line break, a tab or a "
            f"space), which MLflow's tag names would keep; write it {quoted(bare)}"
        )
    raise CatalogueError(f'{what} (capitals, digits, dashes), e.g. "TEAM-BF16-LOSS"')


def tables(path: Path, table: str, what: str, fix: str) -> Iterator[tuple[str, dict]]:
    """Each `[[table]]` of the TOML file at `path`, with how an error names it ("FILE: [[claim]]
    #3 (id "X")"). A file that is not TOML, holds another top-level key or a `table` that is
    not a list is an error naming the file and `fix`."""
    try:
        doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CatalogueError(f"{path}: cannot read {what}: {exc}. Fix: {fix}") from exc
    other = sorted(set(doc) - {table})
    if other:
        raise CatalogueError(f"{path}: unknown top-level key(s) {other}. Fix: {fix}")
    entries = doc.get(table, [])
    if not isinstance(entries, list):
        raise CatalogueError(f"{path}: `{table}` is not a list. Fix: {fix}")
    for number, entry in enumerate(entries, start=1):
        label = entry.get("id") if isinstance(entry, dict) else None
        where = f"{path}: [[{table}]] #{number}" + (
            f" (id {quoted(label)})" if isinstance(label, str) else ""
        )
        if not isinstance(entry, dict):
            raise CatalogueError(f"{where}: expected a [[{table}]] table")
        yield where, entry
