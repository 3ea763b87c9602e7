"""What an upgrade of torch changes, per hardware class, from the committed baselines.

`amp-harness upgrade --from 2.9.1 --to 2.13.0` answers the question a team asks before it moves:
on each class that has a baseline of both releases, every change `compare` counts between them,
sorted into its kind (harness.reports.kinds): predicted by a known change of the release, gained,
accepted, explained by the hardware, or unexplained. A class that lacks either release says
which releases it has. A release is written as torch numbers it (`2.9.1`, `2.9.1+cu128`), or as
`2.9` for its newest patch release among the baselines.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.common.errors import HarnessError
from harness.common.versions import version_key
from harness.reports import baseline, compare, kinds
from harness.reports.accepted import RELEASE, Entry
from harness.reports.comparison import Comparison
from harness.reports.nearest import Candidate, candidates


@dataclass
class Step:
    """One hardware class's upgrade: the two baselines compared, or why it could not be."""

    hardware_class: str
    before: Candidate | None
    after: Candidate | None
    comparison: Comparison | None = None

    def missing(self, since: str, until: str, releases: list[str]) -> str:
        lacking = [r for r, c in ((since, self.before), (until, self.after)) if c is None]
        return (
            f"no baseline of torch {' nor '.join(lacking)} (its baselines: {', '.join(releases)})"
        )


def check_release(option: str, value: str) -> str:
    if not RELEASE.fullmatch(value):
        raise HarnessError(
            f"{option} {value!r} is not a torch release: write it as torch numbers it, "
            "2.9.1 (or 2.9 for its newest patch release, 2.9.1+cu128 for one build)"
        )
    return value


def steps(
    folder: Path,
    since: str,
    until: str,
    accepted: list[Entry],
    only_class: str | None = None,
) -> list[tuple[Step, list[str]]]:
    """Per hardware class of `folder` (or `only_class`), the upgrade from release `since` to
    `until`, with the releases the class has."""
    by_class: dict[str, list[Candidate]] = {}
    for candidate in candidates(folder):
        by_class.setdefault(candidate.hardware_class, []).append(candidate)
    if not by_class:
        raise HarnessError(
            f"{folder}: no baseline to read (`amp-harness baseline save` writes one per "
            "environment): give the folder of the committed baselines with --baselines"
        )
    if only_class is not None and only_class not in by_class:
        raise HarnessError(
            f"--class {only_class!r}: no baseline of that class in {folder}; its classes: "
            f"{', '.join(sorted(by_class))}"
        )
    found = []
    for name in sorted(by_class):
        if only_class not in (None, name):
            continue
        group = sorted(by_class[name], key=lambda c: version_key(c.torch))
        step = Step(name, _pick(group, since), _pick(group, until))
        if step.before and step.after:
            step.comparison = compare.compare(
                baseline.read_baseline(step.before.path),
                baseline.read_baseline(step.after.path),
                labels=(step.before.path.name, step.after.path.name),
                accepted=accepted,
            )
        found.append((step, [c.torch for c in group]))
    return found


def _pick(group: list[Candidate], release: str) -> Candidate | None:
    """The baseline of `release` in a class's group (ordered by version): that build where the
    release names one, else the newest one it covers (`2.9`: 2.9.1)."""
    if "+" in release:
        return next((c for c in group if c.torch == release), None)
    wanted = version_key(release)
    found = [c for c in group if version_key(c.torch)[: len(wanted)] == wanted]
    return found[-1] if found else None


def lines(found: list[tuple[Step, list[str]]], since: str, until: str) -> list[str]:
    """The answer, a block per class: what was compared, the counts per kind, then each change
    under its kind, the unexplained first."""
    out = []
    for step, releases in found:
        if step.comparison is None:
            out.append(f"{step.hardware_class}: {step.missing(since, until, releases)}")
            continue
        c = step.comparison
        out.append(
            f"{step.hardware_class}: {step.before.path.name} -> {step.after.path.name}: "
            f"{c.summary_line()}"
        )
        for kind in kinds.ORDER:
            changes = c.of_kind(kind)
            if changes:
                out.append(f"  {kinds.TITLE[kind]}: {len(changes)}")
                out += [f"    {text}" for text in changes]
        out += [f"  accepted change {note}" for note in c.accepted_notes]
    return out


def to_json(found: list[tuple[Step, list[str]]], since: str, until: str) -> list[dict]:
    return [
        {
            "hardware_class": step.hardware_class,
            "releases": releases,
            "before": step.before.path.name if step.before else None,
            "after": step.after.path.name if step.after else None,
            "missing": None if step.comparison else step.missing(since, until, releases),
            "comparison": step.comparison.to_json() if step.comparison else None,
        }
        for step, releases in found
    ]


def unexplained(found: list[tuple[Step, list[str]]]) -> int:
    return sum(len(s.comparison.regressions) for s, _ in found if s.comparison)
