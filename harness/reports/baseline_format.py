"""The baseline file's one schema: each field, its type, and the closed vocabularies, checked
where a file is read and before one is written (harness.reports.baseline reads and writes it).

A baseline is input: committed, edited by hand, written by another harness version, or handed
over by someone else. Read as trusted, one verdict word outside the vocabulary ended `compare`
in a traceback with a regression's exit status, a field of the wrong type was compared as if
it were right (`torch None -> 2.13.0+cpu`), and a new line in a claim ID printed a line of
`compare`'s own. So every field has a type here, the verdict labels and test outcomes are the
words harness.catalogue.verdicts makes (never a copy: a word added there is valid here), and the
names a comparison prints on lines of its own (claim IDs, test IDs, metric names, facts) are one
line of printable text. What is wrong is said as `PATH: field "NAME" ...` or `PATH: ...`, the
value shown as data (repr: a new line reads `\\n`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from harness.catalogue import verdicts
from harness.records import shapes

FORMAT = 2  # 2: verdicts carry their test's outcome (`stands`); sessions say what they lack
_SHOWN = 60  # characters of a bad value shown in the error
# A name shown on a line of its own: no control character (new line, tab, ESC, CR), none of
# the separators that break a line, and nothing invisible.
_NOT_ONE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


@dataclass(frozen=True)
class Text:
    one_line: bool = True  # a name printed on a line of its own (False: evidence, free text)

    def problem(self, value: object) -> str | None:
        if not isinstance(value, str):
            return f"is {_shown(value)}, not text"
        if self.one_line and _NOT_ONE_LINE.search(value):
            return f"is {_shown(value)}: a name is one line of printable text"
        return None


@dataclass(frozen=True)
class Number:
    non_finite: bool = False  # "inf", "-inf", "nan" as text too (how JSON keeps them)

    def problem(self, value: object) -> str | None:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return None
        if self.non_finite and value in shapes.NON_FINITE:
            return None
        return f"is {_shown(value)}, not a number"


@dataclass(frozen=True)
class Flag:
    def problem(self, value: object) -> str | None:
        return None if isinstance(value, bool) else f"is {_shown(value)}, not true or false"


@dataclass(frozen=True)
class Word:
    """One word of a closed vocabulary, read from where the vocabulary is made."""

    vocabulary: Callable[[], Iterable[str]]
    what: str

    def problem(self, value: object) -> str | None:
        words = list(self.vocabulary())
        if isinstance(value, str) and value in words:
            return None
        # The verdict labels of a test that did not pass ("failed (was: partly)") are many:
        # the plain words, then how many such labels there are, with one for an example.
        plain, compound = [w for w in words if "(" not in w], [w for w in words if "(" in w]
        listed = ", ".join(map(repr, plain)) + (
            f", or one of {len(compound)} labels of a test that did not pass, e.g. {compound[0]!r}"
            if compound
            else ""
        )
        return f"is {_shown(value)}, not {self.what}: use {listed}"


@dataclass(frozen=True)
class Exactly:
    value: object
    why: str

    def problem(self, value: object) -> str | None:
        if type(value) is type(self.value) and value == self.value:
            return None
        return f"is {_shown(value)}; this harness reads {self.value!r} ({self.why})"


@dataclass(frozen=True)
class ListOf:
    item: object


@dataclass(frozen=True)
class MapOf:
    value: object


@dataclass(frozen=True)
class Fields:
    """A JSON object: each field's type, and whether it must be there. A field this harness
    does not know is an error: it would be compared, or dropped, without being understood."""

    required: dict[str, object]
    optional: dict[str, object]


NAME = Text()
VERDICT = Fields(
    required={
        "claim": NAME,
        "verdict": Word(lambda: verdicts.labels(), "a verdict"),
        "stands": Flag(),
        "evidence": Text(one_line=False),
        "test": NAME,
    },
    optional={},
)
TEST = Fields(
    required={"metrics": MapOf(Number(non_finite=True))},
    optional={
        "outcome": Word(lambda: verdicts.OUTCOMES, "a test outcome"),
        "claims": ListOf(NAME),
        "key_metrics": ListOf(NAME),
        "depends_on_hardware": ListOf(NAME),
        "scenario_sha256": NAME,
    },
)
BASELINE = Fields(
    required={
        "format": Exactly(
            FORMAT, "format 1 files predate verdicts that carry their test's outcome"
        ),
        "verdicts": ListOf(VERDICT),
        "tests": MapOf(TEST),
    },
    optional={
        "session_id": NAME,
        "name": NAME,
        "started": Number(),
        "complete": Flag(),
        "lacks": ListOf(NAME),
        "fingerprint": MapOf(NAME),
    },
)


def problem(summary: object) -> str | None:
    """What is wrong with a baseline summary, naming the field and its path; None if nothing."""
    if not isinstance(summary, dict):
        return f"expected a JSON object (a baseline summary), found {_shown(summary)}"
    return _problem(BASELINE, summary, "") or _consistency(summary)


def _problem(spec: object, value: object, path: str) -> str | None:
    """What is wrong with `value` (at `path`, "" at the top) against `spec`, or None."""
    here = f"{path} " if path else ""
    if not isinstance(spec, Fields | ListOf | MapOf):
        found = spec.problem(value)
        return f"{here}{found}" if found else None
    found = _shape(spec, value)
    if found:
        return f"{here}{found}"
    if isinstance(spec, ListOf):
        entries = ((f"{path}[{i}]", item) for i, item in enumerate(value))
        return next((p for at, item in entries if (p := _problem(spec.item, item, at))), None)
    if isinstance(spec, MapOf):
        for key, item in value.items():
            found = NAME.problem(key) and f"{here.rstrip()}: a key {NAME.problem(key)}"
            found = found or _problem(spec.value, item, f"{path}[{_quoted(key)}]")
            if found:
                return found
        return None
    return _fields(spec, value, path)


def _shape(spec: Fields | ListOf | MapOf, value: object) -> str | None:
    if isinstance(spec, ListOf):
        return None if isinstance(value, list) else f"is {_shown(value)}, not a list"
    return None if isinstance(value, dict) else f"is {_shown(value)}, not an object"


def _fields(spec: Fields, value: dict, path: str) -> str | None:
    here = f"{path}: " if path else ""
    known = (*spec.required, *spec.optional)
    for name in value:
        if name not in known:
            return f"{here}field {_shown(name)} is not a baseline field (known: {', '.join(known)})"
    for name, field in (*spec.required.items(), *spec.optional.items()):
        if name not in value:
            if name in spec.required:
                return f'{here}field "{name}" is missing'
            continue
        if isinstance(field, Fields | ListOf | MapOf):
            found = _shape(field, value[name])
            if found:
                return f'{here}field "{name}" {found}'
            found = _problem(field, value[name], f"{path}.{name}" if path else name)
        else:
            found = field.problem(value[name])
            found = found and f'{here}field "{name}" {found}'
        if found:
            return found
    return None


def _quoted(key: str) -> str:
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _consistency(summary: dict) -> str | None:
    """What the types alone do not hold: a verdict stands exactly when its label is one that
    stands, and a key metric is one of its test's metrics."""
    stands = verdicts.labels()
    for i, verdict in enumerate(summary["verdicts"]):
        if verdict["stands"] != stands[verdict["verdict"]]:
            should = "stands" if stands[verdict["verdict"]] else "does not stand"
            return (
                f'verdicts[{i}]: field "stands" is {verdict["stands"]!r}, but a '
                f"{verdict['verdict']!r} verdict {should}"
            )
    for test, entry in summary["tests"].items():
        for name in entry.get("key_metrics", []):
            if name not in entry["metrics"]:
                return f"tests[{_quoted(test)}].key_metrics: {name!r} is not one of its metrics"
    return None
