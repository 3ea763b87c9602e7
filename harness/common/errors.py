"""The errors the harness raises for bad input: each names what was wrong and how to fix it."""

import difflib


class HarnessError(Exception):
    """Bad input or configuration; the message says which file or option, and the fix."""


def closest(name: str, valid, n: int = 3) -> str:
    """A 'did you mean' phrase listing the valid names closest to `name`."""
    matches = difflib.get_close_matches(name, list(valid), n=n, cutoff=0.4)
    return ", ".join(matches) if matches else "none close"
