"""The report's history: per hardware class, each claim's verdict and key metrics across the
sessions of record, oldest first, each session labelled with its torch release.

harness.reports.ledger_history reads the runs; this module sees only what each session said (a
`Point`): each claim's verdict as it counts (harness.catalogue.verdicts), and the key metrics
(Record.key_metric) of the claim's tests. From them, per claim and class (a `Track`):
- since when its current verdict holds: the first session from which every session that gave it
  a verdict gave the one it has now. Over every session of record, not only those drawn: "since"
  is the whole answer or none.
- its verdicts over the last SHOWN sessions, as stretches of one verdict
  (`confirmed x12 -> refuted x3`): a flapping claim across a year of CI would otherwise be a
  segment per session, and the page must stay readable with ~190 claims.
- a trend per key metric that took more than one value over those sessions, compared as
  harness.reports.differences compares them (4 significant digits): a steady metric draws a
  flat line that says nothing, and there are hundreds of them.

By class, not by ledger column: a history that crosses a torch upgrade is what says when a
release changed a verdict. Where two releases of one class run side by side (interleaved), the
track alternates between their verdicts, and each point names its release.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from harness.reports.differences import metric_label, value

SHOWN = 50  # sessions drawn per class: the page's size stays bounded whatever the history's
WIDTH, HEIGHT, MARGIN = 120, 22, 2  # a trend's SVG, in pixels
BLOCKS = "▁▂▃▄▅▆▇█"  # a trend in summary.md, one block a session, lowest to highest
NOT_FINITE = "·"  # inf or NaN in a trend: drawn apart, never scaled


@dataclass(frozen=True)
class Point:
    """One session of record as the history reads it."""

    session: str  # its id
    name: str
    when: str  # when it started, as the report shows a time
    started: float  # seconds since the epoch: the order
    torch: str  # its torch release
    url: str | None  # its parent run in the MLflow UI, where MLflow has one
    verdicts: dict[str, tuple[str, str]]  # claim -> (its verdict's label, the kind it is drawn in)
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    # claim -> {"test: metric": value} for the key metrics of its tests this session ran


@dataclass(frozen=True)
class Stretch:
    """Consecutive sessions (among those drawn) that gave a claim one verdict."""

    label: str
    kind: str
    first: Point
    last: Point
    sessions: int


class Sample(NamedTuple):
    index: int  # of its session among the class's drawn ones: every trend shares the x axis
    point: Point
    value: float


@dataclass(frozen=True)
class Trend:
    """A key metric that moved over the sessions drawn."""

    name: str  # "test: metric", as harness.reports.differences names it
    samples: tuple[Sample, ...]
    span: int  # how many sessions are drawn

    @property
    def label(self) -> str:
        return metric_label(self.name)

    @property
    def first(self) -> str:
        return value(self.samples[0].value)

    @property
    def last(self) -> str:
        return value(self.samples[-1].value)

    @property
    def changed_at(self) -> list[Point]:
        """The sessions at which it took another value than in the session before."""
        pairs = itertools.pairwise(self.samples)
        return [b.point for a, b in pairs if value(a.value) != value(b.value)]

    def words(self) -> str:
        """First and last value, and when it last changed."""
        last = self.changed_at[-1]
        return f"{self.first} → {self.last}; last changed {last.when} (torch {last.torch})"

    def polylines(self) -> list[str]:
        """The SVG polylines' points ("x,y x,y"), one per run of finite values."""
        low, high = self._range()
        lines, current = [], []
        for sample in self.samples:
            if not math.isfinite(sample.value):  # a gap in the line: it has no height
                lines.append(current)
                current = []
                continue
            x = MARGIN + (WIDTH - 2 * MARGIN) * sample.index / max(self.span - 1, 1)
            height = (sample.value - low) / (high - low) if high > low else 0.5
            current.append(f"{x:.1f},{HEIGHT - MARGIN - (HEIGHT - 2 * MARGIN) * height:.1f}")
        return [" ".join(line) for line in [*lines, current] if line]

    def blocks(self) -> str:
        """The trend as text, a block per session it was measured in: summary.md's."""
        low, high = self._range()
        top = len(BLOCKS) - 1
        return "".join(
            BLOCKS[round(top * (s.value - low) / (high - low)) if high > low else top // 2]
            if math.isfinite(s.value)
            else NOT_FINITE
            for s in self.samples
        )

    def _range(self) -> tuple[float, float]:
        finite = [s.value for s in self.samples if math.isfinite(s.value)]
        return (min(finite), max(finite)) if finite else (0.0, 0.0)


@dataclass(frozen=True)
class Track:
    """One claim in one hardware class."""

    claim: str
    label: str  # its verdict in the latest session that gave it one
    kind: str
    since: Point  # the first session of the latest stretch of that verdict
    held: int  # how many sessions that stretch holds
    always: bool  # it has held since the first session that gave the claim a verdict
    stretches: list[Stretch]  # over the sessions drawn
    trends: list[Trend]  # the key metrics that moved over the sessions drawn

    @property
    def changed(self) -> bool:
        """Its verdict or a key metric changed over the sessions drawn."""
        return len(self.stretches) > 1 or bool(self.trends)

    def since_words(self) -> str:
        """Since when its verdict holds: the session, its release, how many sessions since."""
        held = f"{self.held} session{'s' if self.held != 1 else ''}"
        first = "the first session that ran it, " if self.always else ""
        point = self.since
        return f"since {first}{point.when} ({point.name}, torch {point.torch}; {held})"

    def stretch_words(self) -> str:
        """Its verdicts over the sessions drawn: `refuted ×3 → confirmed ×5`."""
        return " → ".join(f"{s.label} ×{s.sessions}" for s in self.stretches)


@dataclass(frozen=True)
class ClassHistory:
    name: str  # the hardware class
    points: list[Point]  # every session of record, oldest first
    shown: list[Point]  # the last SHOWN of them
    tracks: dict[str, Track]  # by claim

    @property
    def capped(self) -> bool:
        return len(self.shown) < len(self.points)

    def words(self) -> str:
        """How many sessions, from when to when, which releases, and how many are drawn."""
        releases = ", ".join(dict.fromkeys(p.torch for p in self.points))
        count = len(self.points)
        text = (f"{count} session{'s' if count != 1 else ''} of record, {self.points[0].when} "
                f"to {self.points[-1].when}, torch {releases}")  # fmt: skip
        return text + (f"; the last {len(self.shown)} drawn" if self.capped else "")

    def changed(self) -> list[str]:
        """The claims whose verdict or a key metric changed over the sessions drawn."""
        return [claim for claim, track in self.tracks.items() if track.changed]


def build(classes: dict[str, list[Point]], shown: int = SHOWN) -> list[ClassHistory]:
    """Each class's history (by class name), from its sessions of record in any order."""
    found = []
    for name, points in sorted(classes.items()):
        points = sorted(points, key=lambda p: p.started)
        drawn = points[-shown:]
        claims = dict.fromkeys(claim for p in points for claim in p.verdicts)
        tracks = {claim: _track(claim, points, drawn) for claim in claims}
        found.append(ClassHistory(name, points, drawn, tracks))
    return found


def _track(claim: str, points: list[Point], drawn: list[Point]) -> Track:
    decided = [p for p in points if claim in p.verdicts]  # a session that ran none of its tests
    label, kind = decided[-1].verdicts[claim]  # says nothing of it: no point, no change
    streak = list(itertools.takewhile(lambda p: p.verdicts[claim][0] == label, reversed(decided)))
    return Track(
        claim,
        label,
        kind,
        since=streak[-1],
        held=len(streak),
        always=len(streak) == len(decided),
        stretches=_stretches(claim, drawn),
        trends=_trends(claim, drawn),
    )


def _stretches(claim: str, drawn: list[Point]) -> list[Stretch]:
    found = []
    decided = (p for p in drawn if claim in p.verdicts)
    for (label, kind), group in itertools.groupby(decided, key=lambda p: p.verdicts[claim]):
        group = list(group)
        found.append(Stretch(label, kind, group[0], group[-1], len(group)))
    return found


def _trends(claim: str, drawn: list[Point]) -> list[Trend]:
    seen: dict[str, list[Sample]] = {}
    for index, point in enumerate(drawn):
        for name, number in point.metrics.get(claim, {}).items():
            seen.setdefault(name, []).append(Sample(index, point, number))
    return [
        Trend(name, tuple(samples), len(drawn))
        for name, samples in seen.items()
        if len({value(s.value) for s in samples}) > 1
    ]
