"""The known-bug ledger: mixed-precision bugs PyTorch's own tracker documents, one entry each,
with the releases they affect, so that a release can be asked which of them it has.

Two files, one format: the built-in `known_bugs.toml` beside this module, and a project's own
`known_bugs.toml` beside its `claims.toml` (a team's known bugs, no edit of harness/). Each is a
list of `[[bug]]` tables (docs/known-bugs.md):

    id, title, harm        "KB-...", a title, the harm in one line a user understands
    class                  one of CLASSES
    devices                where it can occur: ["cpu"], ["cuda"], ["cpu", "cuda"]
    upstream, fix          the threads (URLs) and the fixing PR's URL, "open", or "unknown"
                           (the fix release measured here, its PR not found)
    introduced             the first release with the bug ("2.6"), or "<2.4": before the oldest
                           release this harness supports
    fixed                  the first release without it ("2.10"), or "open"
    introduced_basis,      "measured" (bracketed by releases run here) or "read" (the fix's merge
    fixed_basis            commit against the release branches: `git tag --contains`)
    how                    how the bounds were found, in a sentence
    workaround             what a user on an affected release does instead

Each entry is also a claim of the catalogue (harness.catalogue.claims merges them): its scenario
marks the test `@pytest.mark.claim("KB-...")` and records `confirmed` where the harm showed
(the bug is present) and `refuted` where it did not, through `record.known_bug`. The verdicts,
MLflow tags, baselines and `compare` are the claims' own; what this module adds is the entry's
prediction for a release (`predicted`) and the words for a verdict (`state`): present, absent
(fixed), absent (not yet introduced).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from harness.catalogue.files import CatalogueError, check_id, quoted, tables
from harness.common.errors import closest
from harness.common.versions import release_of, release_text

BUILTIN_PATH = Path(__file__).with_name("known_bugs.toml")
PROJECT_FILE = "known_bugs.toml"  # beside the project's claims.toml
CATALOGUE = "known-bugs"  # the claims catalogue's name for the built-in entries
# The scenario test that reproduces the built-in entries, a case each (its file, its test).
SCENARIO = ("test_known_bugs.py", "test_known_bug")

# What part of mixed precision a bug is in: the ledger's classes, each with what it covers.
CLASSES = {
    "grad-scaler": "GradScaler: unscaling, the inf check, skipped steps, the scale's update",
    "autocast-policy": "which dtype an op runs in under autocast",
    "autocast-cache": "autocast's cache of weights cast to the low dtype",
    "norm-loss-numerics": "norm layers, softmax and losses computed in half precision",
    "attention": "scaled dot-product attention in half precision",
    "optimizer-fused": "fused and foreach optimizers beside AMP",
    "distributed-reduce": "the dtype gradients are reduced in across ranks",
    "checkpointing": "activation checkpointing's recomputation under autocast",
    "fp8-casts": "float8 casts, saturation and scaled matmuls",
    "compiled-parity": "torch.compile against eager under mixed precision",
}
DEVICES = ("cpu", "cuda")
BASES = ("measured", "read")
OPEN = "open"
UNKNOWN_FIX = "unknown"  # `fix` where the fix release is measured and its PR not found
OLDEST = (2, 4)  # the oldest release the harness supports (pyproject's torch>=2.4)
BEFORE_OLDEST = f"<{release_text(OLDEST)}"

PRESENT = "present"
FIXED = "absent (fixed)"
NOT_YET = "absent (not yet introduced)"
CONTRADICTED = "absent (the ledger says present)"
PRESENT_VERDICT, ABSENT_VERDICT = "confirmed", "refuted"  # the claims' verdicts for each

_RELEASE = re.compile(r"\d+\.\d+")
_TEXT_FIELDS = ("id", "title", "harm", "how", "workaround", "fix")
_FIELDS = (
    *_TEXT_FIELDS,
    "class",
    "devices",
    "upstream",
    "introduced",
    "introduced_basis",
    "fixed",
    "fixed_basis",
)


@dataclass(frozen=True)
class KnownBug:
    id: str
    title: str
    harm: str  # what a user meets, in one line
    kind: str  # one of CLASSES (the file's `class`)
    devices: tuple[str, ...]
    upstream: tuple[str, ...]  # the threads
    fix: str  # the fixing PR's URL, or OPEN
    introduced: tuple[int, int] | None  # None: before the oldest supported release
    introduced_basis: str
    fixed: tuple[int, int] | None  # None: open
    fixed_basis: str
    how: str
    workaround: str
    catalogue: str  # CATALOGUE, or "project"

    def predicted(self, version: str) -> str:
        """What the ledger says torch `version` has: PRESENT, FIXED or NOT_YET."""
        running = release_of(version)
        if self.introduced is not None and running < self.introduced:
            return NOT_YET
        if self.fixed is not None and running >= self.fixed:
            return FIXED
        return PRESENT

    def state(self, verdict: str, version: str) -> str:
        """A verdict recorded on torch `version`, in the ledger's words: PRESENT where the harm
        showed; where it did not, why (fixed, not yet introduced), or that the ledger said
        otherwise. Another verdict (skipped) is shown as it is."""
        if verdict == PRESENT_VERDICT:
            return PRESENT
        if verdict != ABSENT_VERDICT:
            return verdict
        predicted = self.predicted(version)
        return CONTRADICTED if predicted == PRESENT else predicted

    def between_in_words(self, sides: list[tuple[str, str]]) -> str:
        """Where the ledger says one of `sides` ((device type, torch version) each) has this bug
        and another not, that in a sentence; "" otherwise (a device it cannot occur on counts
        as not having it)."""
        states = {
            self.predicted(version) if device in self.devices else NOT_YET
            for device, version in sides
        }
        if PRESENT not in states or len(states) == 1:
            return ""
        return f"the known-bug ledger: {self.id} affects {self.affects}"

    @property
    def affects(self) -> str:
        """The releases it affects, in words, each bound with its basis: "every supported release
        before 2.6 (fixed in 2.6, measured)"."""
        if self.introduced is None:
            first, came = "every supported release", ""
        else:
            first = f"torch {self.introduced_text}"
            came = f"introduced in {self.introduced_text}, {self.introduced_basis}; "
        if self.fixed is None:
            still = (
                "present on the newest release measured"
                if self.fixed_basis == "measured"
                else ("no fix found upstream")
            )
            return f"{first}{' and later' if came else ''}, still open ({came}{still})"
        fixed = self.fixed_text
        return f"{first} before {fixed} ({came}fixed in {fixed}, {self.fixed_basis})"

    @property
    def introduced_text(self) -> str:
        return BEFORE_OLDEST if self.introduced is None else release_text(self.introduced)

    @property
    def fixed_text(self) -> str:
        return OPEN if self.fixed is None else release_text(self.fixed)

    @property
    def statement(self) -> str:
        """The entry as a claim: the harm occurs."""
        return f"{self.title}: {self.harm}"


def _release(where: str, field: str, value: object, allowed: str) -> tuple[int, int] | None:
    """A bound's release, or None for `allowed` ("<2.4" or "open")."""
    if value == allowed:
        return None
    if isinstance(value, str) and _RELEASE.fullmatch(value):
        return release_of(value)
    raise CatalogueError(
        f'{where}: {field} = {quoted(str(value))} is not a release: write "MAJOR.MINOR" (e.g. '
        f'"2.10"), or "{allowed}"'
    )


def _text_list(where: str, field: str, value: object, allowed: tuple[str, ...] = ()) -> tuple:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise CatalogueError(f"{where}: {field} must be a non-empty list of strings")
    for item in value:
        if allowed and item not in allowed:
            raise CatalogueError(
                f"{where}: {field} holds {quoted(item)}: use one of {', '.join(allowed)} "
                f"(closest: {closest(item, allowed)})"
            )
    return tuple(value)


def _choice(where: str, field: str, value: object, allowed) -> str:
    if value not in allowed:
        raise CatalogueError(
            f"{where}: {field} = {quoted(str(value))}: use one of {', '.join(allowed)} "
            f"(closest: {closest(str(value), list(allowed))})"
        )
    return value


def _entry(where: str, entry: dict, name: str) -> KnownBug:
    unknown = sorted(set(entry) - set(_FIELDS))
    if unknown:
        raise CatalogueError(
            f"{where}: unknown field(s) {unknown} (closest: {closest(unknown[0], _FIELDS)}): "
            f"allowed are {', '.join(_FIELDS)}"
        )
    missing = [f for f in _FIELDS if f not in entry]
    if missing:
        raise CatalogueError(f"{where}: field(s) {', '.join(missing)} missing: give each")
    for field in _TEXT_FIELDS:
        if not isinstance(entry[field], str) or not entry[field].strip():
            raise CatalogueError(f'{where}: field "{field}" must be text, not empty')
    check_id(where, entry["id"])
    if not entry["id"].startswith("KB-"):
        raise CatalogueError(f"{where}: id {quoted(entry['id'])}: a known bug's ID starts KB-")
    introduced = _release(where, "introduced", entry["introduced"], BEFORE_OLDEST)
    fixed = _release(where, "fixed", entry["fixed"], OPEN)
    if introduced is not None and fixed is not None and fixed <= introduced:
        raise CatalogueError(
            f"{where}: fixed = {entry['fixed']!r} is not after introduced = "
            f"{entry['introduced']!r}: a bug is fixed in a later release than it came in"
        )
    if (fixed is None) != (entry["fix"] == OPEN):
        raise CatalogueError(
            f"{where}: fix = {quoted(entry['fix'])} and fixed = {quoted(str(entry['fixed']))} "
            f'disagree: an open bug has fix = "open"; a fixed one the fixing PR\'s URL, or '
            f'"{UNKNOWN_FIX}" where releases measured show the fix and no PR was found'
        )
    if entry["fix"] not in (OPEN, UNKNOWN_FIX) and not entry["fix"].startswith("https://"):
        raise CatalogueError(
            f"{where}: fix = {quoted(entry['fix'])}: give the fixing PR's URL (https://...), "
            f'"{OPEN}" or "{UNKNOWN_FIX}"'
        )
    if entry["fix"] == UNKNOWN_FIX and entry["fixed_basis"] != "measured":
        raise CatalogueError(
            f'{where}: fix = "{UNKNOWN_FIX}" with fixed_basis = '
            f"{quoted(str(entry['fixed_basis']))}: "
            "a fix release without its PR stands only where releases measured here show it; "
            'set fixed_basis = "measured", or find the PR'
        )
    return KnownBug(
        id=entry["id"],
        title=entry["title"].strip(),
        harm=entry["harm"].strip(),
        kind=_choice(where, "class", entry["class"], CLASSES),
        devices=_text_list(where, "devices", entry["devices"], DEVICES),
        upstream=_text_list(where, "upstream", entry["upstream"]),
        fix=entry["fix"].strip(),
        introduced=introduced,
        introduced_basis=_choice(where, "introduced_basis", entry["introduced_basis"], BASES),
        fixed=fixed,
        fixed_basis=_choice(where, "fixed_basis", entry["fixed_basis"], BASES),
        how=entry["how"].strip(),
        workaround=entry["workaround"].strip(),
        catalogue=name,
    )


def load(path: Path, name: str) -> dict[str, KnownBug]:
    """Read and validate a ledger file; every problem names the file, the entry and the fix."""
    bugs: dict[str, KnownBug] = {}
    fix = "write it as TOML, one [[bug]] table per bug (docs/known-bugs.md)"
    for where, entry in tables(path, "bug", "the known-bug ledger", fix):
        bug = _entry(where, entry, name)
        if bug.id in bugs:
            raise CatalogueError(f"{where}: id {quoted(bug.id)} appears twice: rename one")
        bugs[bug.id] = bug
    return bugs


@functools.cache
def builtin() -> dict[str, KnownBug]:
    return load(BUILTIN_PATH, CATALOGUE)


@functools.cache
def _project(path: str, _mtime_ns: int, _size: int) -> dict[str, KnownBug]:
    return load(Path(path), "project")


def project(claims_file: Path) -> dict[str, KnownBug]:
    """A project's own known bugs: `known_bugs.toml` beside its `claims_file` (none: empty)."""
    path = Path(claims_file).with_name(PROJECT_FILE)
    try:
        stat = path.stat()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CatalogueError(f"{path}: cannot read the project's known-bug ledger: {exc}") from exc
    return _project(str(path), stat.st_mtime_ns, stat.st_size)


def reload() -> None:
    builtin.cache_clear()
    _project.cache_clear()
