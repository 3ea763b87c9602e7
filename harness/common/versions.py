"""torch release strings as numbers: "2.13.0+cpu" ordered after "2.4.1", and its (major, minor).

Read by every floor that holds a release against another (the lab's known changes, the autocast
docs per release, the known-bug ledger's bounds, the reports' sorting) without importing torch.
"""

from __future__ import annotations


def version_key(version: str) -> tuple[int, ...]:
    """2.13.0+cpu -> (2, 13, 0): versions ordered as numbers, not as text (2.4 before 2.13).
    A part that is not a number (a pre-release's "0a0") counts as 0."""
    numbers = version.split("+")[0].split(".")
    return tuple(int(n) if n.isdigit() else 0 for n in numbers)


def release_of(version: str) -> tuple[int, int]:
    """ "2.13.0+cpu" -> (2, 13): the release a version belongs to."""
    major, minor = (version_key(version) + (0, 0))[:2]
    return major, minor


def release_text(release: tuple[int, int]) -> str:
    """(2, 13) -> "2.13"."""
    return f"{release[0]}.{release[1]}"
