"""The claim catalogues: what the scenarios check, as data, validated once.

Three kinds, merged into one catalogue in this order (IDs are unique across all of them):
- the article's, `claims.json` beside this module (IDs as in shared/CLAIMS.md): section, the
  article's sentence, its English statement;
- further built-in catalogues, `claims_*.toml` beside this module (`claims_bf16.toml`: BF16-...);
- the project's own, `claims.toml` beside its scenarios (the plugin's `amp_claims` ini option
  names another file; `use_project` sets it). Without one set, `scenarios/claims.toml` of the
  current folder, as every `amp-harness` command's `--scenarios` default.

A TOML catalogue is a list of `[[claim]]` tables with `id`, `statement`, `source` (the article,
a paper, an issue, a team decision: free text or a URL) and optionally `expected` (the verdict
the team expects). Scenario markers, MLflow tags and reports use the IDs verbatim; an unknown or
duplicate ID, a malformed entry or an unknown field is an error naming the file, the entry and
the fix.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from harness.common.errors import HarnessError, closest
from harness.common.toml import tomllib

CATALOGUE_PATH = Path(__file__).with_name("claims.json")
BUILTIN_TOML = (
    Path(__file__).with_name("claims_bf16.toml"),
    Path(__file__).with_name("claims_autocast.toml"),
    Path(__file__).with_name("claims_compile.toml"),
    Path(__file__).with_name("claims_fp8.toml"),
)
PROJECT_FILE = "claims.toml"
DEFAULT_PROJECT = Path("scenarios") / PROJECT_FILE  # relative to the current folder
VERDICTS = ("confirmed", "refuted", "partly", "inconclusive", "skipped")
ARTICLE = "article"
_FIELDS = ("id", "section", "article", "statement", "where")  # of claims.json
_TOML_FIELDS = ("id", "statement", "source", "expected")
_TOML_REQUIRED = ("id", "statement", "source")
# Held with fullmatch: `re.match(...$)` lets a final line break through ("TEAM-X\n"), which
# would reach MLflow's tag names (`verdict.<ID>`).
_ID_PATTERN = re.compile(r"[A-Z][A-Z0-9]*(-[A-Z0-9]+)+")


@dataclass(frozen=True)
class Claim:
    id: str
    statement: str  # the claim in English
    source: str  # where it comes from: "article (section)", a paper, an issue, a URL
    catalogue: str  # "article", "bf16", or "project"
    section: str = ""  # article claims: the article's section
    article: str = ""  # article claims: the article's sentence, in Chinese, as written
    where: str = ""  # article claims: where it can run: "cpu", "gpu", "cpu, gpu", ...
    expected: str | None = None  # the verdict the catalogue's authors expect, if they said


class CatalogueError(HarnessError):
    pass


def _quoted(claim_id: str) -> str:
    """An ID as a message shows it: in quotes, a line break or tab written out (`"TEAM-X\\n"`),
    as TOML and JSON write it. (A valid ID needs no escape: the label of each of 10,000 entries
    is made at once.)"""
    if _ID_PATTERN.fullmatch(claim_id):
        return f'"{claim_id}"'
    return json.dumps(claim_id, ensure_ascii=False)


def _check_id(where: str, claim_id: str) -> None:
    if _ID_PATTERN.fullmatch(claim_id):
        return
    what = f"{where}: id {_quoted(claim_id)} is not of the form GROUP-NAME"
    bare = "".join(claim_id.split())
    if bare != claim_id and _ID_PATTERN.fullmatch(bare):
        raise CatalogueError(
            f"{what} (capitals, digits, dashes): it holds white space (a line break, a tab or a "
            f"space), which MLflow's tag names would keep; write it {_quoted(bare)}"
        )
    raise CatalogueError(f'{what} (capitals, digits, dashes), e.g. "TEAM-BF16-LOSS"')


def load_catalogue(path: Path) -> dict[str, Claim]:
    """Read and validate the article's catalogue (JSON); every problem names the file, the entry
    and the field."""
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
        _check_id(where, claim_id)
        if claim_id in claims:
            raise CatalogueError(f'{where}: id "{claim_id}" appears twice: IDs must be unique')
        source = f"{ARTICLE} ({entry['section']})"
        claims[claim_id] = Claim(**entry, source=source, catalogue=ARTICLE)
    return claims


def load_toml_catalogue(path: Path, name: str) -> dict[str, Claim]:
    """Read and validate a TOML catalogue of `[[claim]]` tables (a built-in one, or a project's):
    every problem names the file, the entry (its number and id) and the fix."""
    try:
        doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CatalogueError(
            f"{path}: cannot read the claim catalogue: {exc}. Fix: write it as TOML, one "
            "[[claim]] table per claim with id, statement and source (docs/writing-a-scenario.md)"
        ) from exc
    other = sorted(set(doc) - {"claim"})
    if other:
        raise CatalogueError(
            f"{path}: unknown top-level key(s) {other}: a catalogue holds only [[claim]] tables "
            f"(fields {', '.join(_TOML_FIELDS)})"
        )
    entries = doc.get("claim", [])
    if not isinstance(entries, list):
        raise CatalogueError(
            f"{path}: `claim` is not a list: write each claim as a [[claim]] table"
        )
    claims: dict[str, Claim] = {}
    for number, entry in enumerate(entries, start=1):
        label = entry.get("id") if isinstance(entry, dict) else None
        where = f"{path}: [[claim]] #{number}" + (
            f" (id {_quoted(label)})" if isinstance(label, str) else ""
        )
        if not isinstance(entry, dict):
            raise CatalogueError(f"{where}: expected a [[claim]] table")
        unknown = sorted(set(entry) - set(_TOML_FIELDS))
        if unknown:
            raise CatalogueError(
                f"{where}: unknown field(s) {unknown} (closest: "
                f"{closest(unknown[0], _TOML_FIELDS)}): allowed are {', '.join(_TOML_FIELDS)}"
            )
        for field in _TOML_REQUIRED:
            if not isinstance(entry.get(field), str) or not entry[field].strip():
                raise CatalogueError(
                    f'{where}: field "{field}" is missing or empty: give it text, e.g. '
                    + ('id = "TEAM-BF16-LOSS"' if field == "id" else f'{field} = "..."')
                )
        _check_id(where, entry["id"])
        expected = entry.get("expected")
        if expected is not None and expected not in VERDICTS:
            raise CatalogueError(
                f'{where}: expected = "{expected}" is not a verdict: use one of '
                f"{', '.join(VERDICTS)} (closest: {closest(str(expected), VERDICTS)}), or leave "
                "it out"
            )
        if entry["id"] in claims:
            raise CatalogueError(
                f'{where}: id "{entry["id"]}" appears twice in this file: IDs must be unique; '
                "rename one"
            )
        claims[entry["id"]] = Claim(
            id=entry["id"],
            statement=entry["statement"].strip(),
            source=entry["source"].strip(),
            catalogue=name,
            expected=expected,
        )
    return claims


def _name_of(path: Path) -> str:
    return path.stem.removeprefix("claims_")  # claims_bf16.toml -> "bf16"


def _merge(into: dict[str, Claim], claims: dict[str, Claim], path: Path) -> None:
    for number, claim in enumerate(claims.values(), start=1):
        if claim.id in into:
            raise CatalogueError(
                f'{path}: [[claim]] #{number} (id "{claim.id}"): the ID is already a claim of '
                f"the {into[claim.id].catalogue} catalogue ({into[claim.id].statement!r}): give "
                "your claim another ID, or drop the entry and mark the test with the existing one"
            )
        into[claim.id] = claim


@functools.cache
def builtin() -> dict[str, Claim]:
    """The catalogues shipped with the harness: the article's, then the others (bf16)."""
    claims = dict(load_catalogue(CATALOGUE_PATH))
    for path in BUILTIN_TOML:
        _merge(claims, load_toml_catalogue(path, _name_of(path)), path)
    return claims


_project: list[Path | None] = [None]  # set by use_project; None: DEFAULT_PROJECT


def use_project(path: Path | None):
    """Name the project's catalogue (None: the default, scenarios/claims.toml of the current
    folder). Returns a function that restores the previous one (a nested pytest session calls
    it at its end, so the outer session keeps its own)."""
    previous = _project[0]
    _project[0] = None if path is None else Path(path).resolve()

    def restore() -> None:
        _project[0] = previous

    return restore


def project_path() -> Path:
    """The project catalogue's file (it may not exist: then the project has no claims of its
    own)."""
    return _project[0] or DEFAULT_PROJECT.resolve()


@functools.cache
def _with_project(path: str, _mtime_ns: int, _size: int) -> dict[str, Claim]:
    claims = dict(builtin())
    _merge(claims, load_toml_catalogue(Path(path), "project"), Path(path))
    return claims


def catalogue() -> dict[str, Claim]:
    """Every claim: the built-in catalogues, then the project's (re-read when its file changes)."""
    path = project_path()
    try:
        stat = path.stat()
    except FileNotFoundError:
        return builtin()
    except OSError as exc:
        raise CatalogueError(f"{path}: cannot read the project's claim catalogue: {exc}") from exc
    return _with_project(str(path), stat.st_mtime_ns, stat.st_size)


def reload() -> None:
    """Forget the catalogues read so far (tests that swap a catalogue file)."""
    builtin.cache_clear()
    _with_project.cache_clear()


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


def toml_entry(claim_id: str, statement: str, source: str, expected: str | None = None) -> str:
    """One [[claim]] table, as `amp-harness new --claim` appends it (JSON strings are TOML basic
    strings); `expected` only when given."""
    quote = functools.partial(json.dumps, ensure_ascii=False)
    return (
        f"\n[[claim]]\nid = {quote(claim_id)}\nstatement = {quote(statement)}\n"
        f"source = {quote(source)}\n" + (f"expected = {quote(expected)}\n" if expected else "")
    )


def add_project_claim(
    path: Path, claim_id: str, statement: str, source: str, expected: str | None = None
) -> Claim:
    """Append a claim to the project catalogue at `path` (created if absent), after checking it
    against every catalogue; the file is rewritten whole, or not at all."""
    path = Path(path)
    if expected is not None and expected not in VERDICTS:
        raise CatalogueError(
            f"--expected {expected}: not a verdict: use one of {', '.join(VERDICTS)} "
            f"(closest: {closest(expected, VERDICTS)})"
        )
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    new = (
        old
        + ("" if not old or old.endswith("\n") else "\n")
        + toml_entry(claim_id, statement, source, expected)
    )
    claims = dict(builtin())
    if old:
        _merge(claims, load_toml_catalogue(path, "project"), path)
    _check_id(f"--claim {_quoted(claim_id)}", claim_id)
    if claim_id in claims:
        raise CatalogueError(
            f"--claim {claim_id}: already a claim of the {claims[claim_id].catalogue} catalogue "
            f"({claims[claim_id].statement!r}): pick a new ID, or write the scenario without "
            f'--claim and mark its test @pytest.mark.claim("{claim_id}")'
        )
    if not statement.strip():
        raise CatalogueError(f'--claim {claim_id} "": give the claim a statement, in a sentence')
    temporary = path.with_name(f".{path.name}.new")
    try:
        temporary.write_text(new, encoding="utf-8")
        load_toml_catalogue(temporary, "project")  # what was written reads back
        temporary.replace(path)
    except OSError as exc:
        raise CatalogueError(f"cannot write {path}: {exc.strerror}; make it writable") from None
    finally:
        temporary.unlink(missing_ok=True)
    return Claim(claim_id, statement, source, "project", expected=expected)
