"""The claim catalogue: every testable sentence of the article, as data, validated once.

The data lives in claims.json beside this module (IDs as in shared/CLAIMS.md). Scenario markers,
MLflow tags and reports use the IDs verbatim; an unknown ID is always an error.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError, closest

CATALOGUE_PATH = Path(__file__).with_name("claims.json")
VERDICTS = ("confirmed", "refuted", "partly", "inconclusive", "skipped")
_FIELDS = ("id", "section", "article", "statement", "where")
_ID_PATTERN = re.compile(r"^[A-Z][A-Z0-9]*(-[A-Z0-9]+)+$")


@dataclass(frozen=True)
class Claim:
    id: str
    section: str
    article: str  # the article's sentence, in Chinese, as written
    statement: str  # the same claim in English
    where: str  # where it can run: "cpu", "gpu", "cpu, gpu", ...


class CatalogueError(HarnessError):
    pass


def load_catalogue(path: Path) -> dict[str, Claim]:
    """Read and validate a catalogue file; every problem names the file, the entry and the field."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CatalogueError(f"{path}: cannot read the claim catalogue: {exc}") from exc
    entries = doc.get("claims") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise CatalogueError(f'{path}: expected an object with a non-empty "claims" list')
    claims: dict[str, Claim] = {}
    for index, entry in enumerate(entries):
        where = f"{path}: claims[{index}]"
        if not isinstance(entry, dict):
            raise CatalogueError(f"{where}: expected an object with fields {', '.join(_FIELDS)}")
        for field in _FIELDS:
            if not isinstance(entry.get(field), str) or not entry[field].strip():
                raise CatalogueError(f'{where}: field "{field}" is missing or empty: give it text')
        unknown = sorted(set(entry) - set(_FIELDS))
        if unknown:
            raise CatalogueError(f"{where}: unknown field(s) {unknown}: allowed are {_FIELDS}")
        claim_id = entry["id"]
        if not _ID_PATTERN.match(claim_id):
            raise CatalogueError(
                f'{where}: id "{claim_id}" is not of the form GROUP-NAME (capitals, digits, dashes)'
            )
        if claim_id in claims:
            raise CatalogueError(f'{where}: id "{claim_id}" appears twice: IDs must be unique')
        claims[claim_id] = Claim(**entry)
    return claims


@functools.cache
def catalogue() -> dict[str, Claim]:
    """The project's catalogue, loaded once per process."""
    return load_catalogue(CATALOGUE_PATH)


def unknown_ids(ids) -> list[tuple[str, str]]:
    """(bad ID, closest valid IDs) for each ID not in the catalogue."""
    known = catalogue()
    return [(i, closest(i, known)) for i in ids if i not in known]


def check_verdict(verdict: str) -> str:
    if verdict not in VERDICTS:
        raise HarnessError(
            f"unknown verdict {verdict!r}: use one of {', '.join(VERDICTS)} "
            f"(closest: {closest(verdict, VERDICTS)})"
        )
    return verdict
