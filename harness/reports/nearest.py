"""The baseline a session is gated against: its own environment's, else the nearest one.

The upgrade is the moment the gate exists for, and a new torch release has no baseline of its
own yet. `--amp-baseline auto` (and `amp-harness report --baseline auto`) take, from the folder
of baselines, the first there is of:

1. the file `amp-harness baseline save` writes for this environment (class, torch, CUDA);
2. on its hardware class: the same release built otherwise (2.14.1+cpu for 2.14.1+cu130), then
   the nearest earlier release (an upgrade is gated against the release it upgrades from), then
   the nearest later one;
3. the same, on the nearest class of its device type: CPU classes of one architecture by their
   kernel levels (harness.lab.machine.levels), GPUs of the same compute capability first.

Every choice but the first says why. Files are told apart by their names (`baseline save`'s:
`<class>_torch-<version>[_cuda-<version>].json`) and only the one chosen is read; a file saved
before hardware classes (its class only a name) is never chosen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from harness.common.versions import version_key
from harness.lab.machine.levels import level_rank
from harness.records import environments
from harness.reports import baseline

_CPU_CLASS = re.compile(r"cpu-(?P<arch>.+?)-(?P<level>(?:sse41|avx|amx)[^+]*)(?:\+.*)?")
FAR = 1_000  # the distance of a class nothing relates to this one's


@dataclass(frozen=True)
class Candidate:
    path: Path
    hardware_class: str
    torch: str
    cuda: str  # "" for a CPU baseline

    @property
    def device(self) -> str:
        return "cpu" if self.hardware_class.startswith("cpu-") else "cuda"


@dataclass(frozen=True)
class Choice:
    """The baseline chosen (`summary`, read and checked), or where this environment's own would
    be (`path`, `summary` None) when the folder holds none to take."""

    path: Path
    summary: dict | None
    why: str = ""  # why another environment's: "" for this environment's own

    @property
    def exact(self) -> bool:
        return self.summary is not None and not self.why


def candidates(folder: Path) -> list[Candidate]:
    """The baselines of `folder`, by their names; files named otherwise are not baselines."""
    found = []
    for path in sorted(Path(folder).glob("*.json")):
        named = baseline.parse_filename(path.name)
        if named:
            found.append(Candidate(path, *named))
    return found


def choose(folder: Path, fingerprint: dict[str, str]) -> Choice:
    """The baseline to gate a session of `fingerprint` against (see the module's docstring)."""
    own = baseline.auto_path(folder, fingerprint)
    if own.is_file():
        return Choice(own, baseline.read_baseline(own))
    this_class = environments.hardware_class(fingerprint)
    torch = environments.fact(fingerprint, "torch")
    device = environments.fact(fingerprint, "device")
    if torch == "n/a":
        return Choice(own, None)
    ranked = sorted(
        (c for c in candidates(folder) if c.device == device and c.path != own),
        key=lambda c: (_class_distance(this_class, fingerprint, c), _release_rank(torch, c.torch)),
    )
    for candidate in ranked:
        summary = baseline.read_baseline(candidate.path)
        if environments.is_legacy(summary.get("fingerprint", {})):
            continue
        return Choice(candidate.path, summary, _why(own, this_class, torch, candidate, summary))
    return Choice(own, None)


def _release_rank(torch: str, other: str) -> tuple[int, tuple[int, ...]]:
    """The same release first, then earlier ones (the nearest first), then later ones."""
    mine, theirs = version_key(torch), version_key(other)
    if mine == theirs:
        return 0, ()
    if theirs < mine:
        return 1, tuple(-n for n in theirs)
    return 2, theirs


def _class_distance(this_class: str, fingerprint: dict[str, str], candidate: Candidate) -> int:
    """0 for the same class; CPU classes of one architecture by how far apart their kernel
    levels are; GPUs 1 for the same compute capability, 2 for the same major one; FAR for a
    class nothing relates."""
    if candidate.hardware_class == this_class:
        return 0
    mine, theirs = _CPU_CLASS.fullmatch(this_class), _CPU_CLASS.fullmatch(candidate.hardware_class)
    if mine and theirs:
        if mine["arch"] != theirs["arch"]:
            return FAR
        ranks = level_rank(mine["level"]), level_rank(theirs["level"])
        return abs(ranks[0] - ranks[1]) if -1 not in ranks else FAR
    if candidate.device != "cuda":
        return FAR
    capability = environments.fact(fingerprint, "compute_capability")
    theirs_cc = _compute_capability(candidate.path)
    if capability == "n/a" or theirs_cc == "n/a":
        return FAR
    if capability == theirs_cc:
        return 1
    return 2 if capability.split(".")[0] == theirs_cc.split(".")[0] else FAR


def _compute_capability(path: Path) -> str:
    """A GPU baseline's compute capability: read from the file (its name does not say it)."""
    return environments.fact(
        baseline.read_baseline(path).get("fingerprint", {}), "compute_capability"
    )


def _why(own: Path, this_class: str, torch: str, chosen: Candidate, summary: dict) -> str:
    facts = summary.get("fingerprint", {})
    theirs = environments.fact(facts, "torch")
    if version_key(theirs) == version_key(torch):
        release = f"the same release, {theirs}"
    else:
        side = "earlier" if version_key(theirs) < version_key(torch) else "later"
        release = f"the nearest {side} release, {theirs}"
    if chosen.hardware_class == this_class:
        where = f"of its class {this_class}"
    else:
        where = (
            f"on the nearest class, {chosen.hardware_class}, there being none of {this_class} "
            "(a difference the hardware explains is shown apart)"
        )
    return f"no baseline {own.name} for this environment: compared with {release}, {where}"
