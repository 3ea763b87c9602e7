"""The claim catalogues: what the scenarios check, as data, validated once.

Four kinds, merged into one catalogue in this order (IDs are unique across all of them):
- the article's, `claims.json` beside this module (IDs as in shared/CLAIMS.md): section, the
  article's sentence, its English statement;
- further built-in catalogues, `claims_*.toml` beside this module (`claims_bf16.toml`: BF16-...);
- the known-bug ledger's entries, each a claim that its harm occurs (harness.catalogue.known_bugs);
- the project's own, `claims.toml` beside its scenarios (the plugin's `amp_claims` ini option
  names another file; `use_project` sets it), and its `known_bugs.toml` beside that. Without one
  set, `scenarios/claims.toml` of the current folder, as every `amp-harness` command's
  `--scenarios` default.

A TOML catalogue is a list of `[[claim]]` tables with `id`, `statement`, `source` (the article,
a paper, an issue, a team decision: free text or a URL) and optionally `expected` (the verdict
the team expects). Scenario markers, MLflow tags and reports use the IDs verbatim; an unknown or
duplicate ID, a malformed entry or an unknown field is an error naming the file, the entry and
the fix.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from harness.catalogue import known_bugs, verdicts
from harness.catalogue.files import CatalogueError, check_id, quoted, tables
from harness.common.errors import HarnessError, closest

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
        check_id(where, claim_id)
        if claim_id in claims:
            raise CatalogueError(f'{where}: id "{claim_id}" appears twice: IDs must be unique')
        source = f"{ARTICLE} ({entry['section']})"
        claims[claim_id] = Claim(**entry, source=source, catalogue=ARTICLE)
    return claims


def load_toml_catalogue(path: Path, name: str) -> dict[str, Claim]:
    """Read and validate a TOML catalogue of `[[claim]]` tables (a built-in one, or a project's):
    every problem names the file, the entry (its number and id) and the fix."""
    claims: dict[str, Claim] = {}
    fix = (
        "write it as TOML, one [[claim]] table per claim with "
        f"{', '.join(_TOML_FIELDS)} (docs/writing-a-scenario.md)"
    )
    for where, entry in tables(path, "claim", "the claim catalogue", fix):
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
        check_id(where, entry["id"])
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
    _merge(claims, _as_claims(known_bugs.builtin()), known_bugs.BUILTIN_PATH)
    return claims


def _as_claims(bugs: dict[str, known_bugs.KnownBug]) -> dict[str, Claim]:
    """Known bugs as claims: each says its harm occurs (harness.catalogue.known_bugs)."""
    return {
        bug.id: Claim(bug.id, bug.statement, ", ".join(bug.upstream), bug.catalogue)
        for bug in bugs.values()
    }


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
def _with_project(path: str, _stats: tuple) -> dict[str, Claim]:
    claims = dict(builtin())
    claims_file = Path(path)
    if claims_file.exists():
        _merge(claims, load_toml_catalogue(claims_file, "project"), claims_file)
    bugs = known_bugs.project(claims_file)
    _merge(claims, _as_claims(bugs), claims_file.with_name(known_bugs.PROJECT_FILE))
    return claims


def _stat(path: Path) -> tuple[int, int] | None:
    """(mtime, size) of a project file, None where it does not exist."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CatalogueError(f"{path}: cannot read the project's catalogue: {exc}") from exc
    return stat.st_mtime_ns, stat.st_size


def catalogue() -> dict[str, Claim]:
    """Every claim: the built-in catalogues, then the project's claims and known bugs (re-read
    when either file changes)."""
    path = project_path()
    stats = (_stat(path), _stat(path.with_name(known_bugs.PROJECT_FILE)))
    if stats == (None, None):
        return builtin()
    return _with_project(str(path), stats)


def ledger() -> dict[str, known_bugs.KnownBug]:
    """Every known bug: the built-in ledger, then the project's."""
    return {**known_bugs.builtin(), **known_bugs.project(project_path())}


def reload() -> None:
    """Forget the catalogues read so far (tests that swap a catalogue file)."""
    builtin.cache_clear()
    _with_project.cache_clear()
    known_bugs.reload()


def unknown_ids(ids) -> list[tuple[str, str]]:
    """(bad ID, closest valid IDs) for each ID not in the catalogue."""
    known = catalogue()
    return [(i, closest(i, known)) for i in ids if i not in known]


def check_verdict(verdict: str) -> str:
    """A verdict a test may record (harness.catalogue.verdicts.RECORDABLE: a claim's expected
    verdicts and `cannot compile`, where no compiled arm of a compiled claim compiled)."""
    if verdict not in verdicts.RECORDABLE:
        raise HarnessError(
            f"unknown verdict {verdict!r}: use one of {', '.join(verdicts.RECORDABLE)} "
            f"(closest: {closest(verdict, verdicts.RECORDABLE)})"
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
    check_id(f"--claim {quoted(claim_id)}", claim_id)
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
