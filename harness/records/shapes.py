"""The shape of a JSON value, checked: what the journal's readers (harness.records.journal, and
harness.records.record for a record's fields) accept, and what they say when a value does not fit.

A spec is a word, "text", "number", "whole" (a whole number), "value" (a metric: a number, or
inf/NaN spelled as text, since JSON has neither) or "object", or a (container, item spec) pair
with container "list" or "object".
"""

from __future__ import annotations

import json

NON_FINITE = ("inf", "-inf", "nan")  # how a record spells them in JSON
_WORDS = {
    "text": ("text", "text"),
    "number": ("a number", "numbers"),
    "whole": ("a whole number", "whole numbers"),
    "value": ("a number", "numbers"),
    "object": ("an object", "objects"),
}


class TooDeep(ValueError):
    """JSON nested deeper than Python's recursion allows: json.loads recurses once per [ or {,
    so `[` * 100000 (a hand edit, a hostile file) raises RecursionError, which no reader
    expects. Raised as a ValueError, like any other JSON that cannot be read."""


def loads(text: str | bytes):
    """json.loads for files the harness reads (baselines, the journal): nesting too deep for
    Python is a TooDeep (a ValueError) instead of a RecursionError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise TooDeep("nested too deeply for Python to read") from None


def problem(value, spec, where: str = "") -> str | None:
    """What is wrong with `value` as `spec`, from `where` inside it (`['loss'][3]`); None if
    nothing is: e.g. `['loss'] is text 'low', not a number`."""
    if isinstance(spec, tuple):
        container, item = spec
        if not isinstance(value, dict if container == "object" else list):
            return f"{where} is {kind_of(value)}, not {_describe(spec)}"
        inner_values = value.values() if isinstance(value, dict) else value
        if isinstance(item, str) and all(_fits(inner, item) for inner in inner_values):
            return None  # the common case, without a path built for each item (a history)
        pairs = value.items() if isinstance(value, dict) else enumerate(value)
        for key, inner in pairs:
            found = problem(inner, item, f"{where}[{key!r}]")
            if found:
                return found
        return None
    return None if _fits(value, spec) else f"{where} is {kind_of(value)}, not {_describe(spec)}"


def _fits(value, word: str) -> bool:
    """Whether `value` is JSON of the kind `word` names."""
    if word == "text":
        return isinstance(value, str)
    if word == "object":
        return isinstance(value, dict)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if word == "whole":
        return number and isinstance(value, int)
    return number or (word == "value" and value in NON_FINITE)


def fields_problem(data: dict, fields: dict) -> str | None:
    """The first of `fields` (name -> spec) that `data` lacks or holds in the wrong shape, in
    words (`field "verdicts" is missing`); None if none."""
    for name, spec in fields.items():
        if name not in data:
            return f'field "{name}" is missing'
        found = problem(data[name], spec)
        if found:
            return f'field "{name}"{found}'
    return None


def kind_of(value) -> str:
    """A JSON value, in words: its type, and the text itself when it is short."""
    if isinstance(value, str):
        return f"text {value!r}" if len(value) <= 40 else "text"
    if isinstance(value, bool):
        return "a boolean"
    words = {int: "a number", float: "a number", list: "a list", dict: "an object"}
    return words.get(type(value), "null" if value is None else type(value).__name__)


def _describe(spec, plural: bool = False) -> str:
    if isinstance(spec, tuple):
        container, item = spec
        return f"{'an object' if container == 'object' else 'a list'} of {_describe(item, True)}"
    return _WORDS[spec][plural]
