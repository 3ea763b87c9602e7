"""The comparison with a baseline at the session's end (--amp-baseline, --amp-fail-on-regression):
the baseline chosen and checked before any test runs, compared once the session's records are in,
and written under the verdict table."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.catalogue import claims
from harness.common import shown
from harness.records import environments
from harness.records.options import BASELINES
from harness.reports import accepted as accepted_changes
from harness.reports import baseline, compare, nearest
from harness.reports.comparison import Comparison


@dataclass
class Gate:
    """The baseline a session is compared with, and the comparison once made."""

    config: pytest.Config
    path: Path  # the baseline file looked for
    summary: dict | None  # its content; None when there is none at `path`
    why: str = ""  # why another environment's baseline was taken (auto), if it was
    accepted: list[accepted_changes.Entry] = field(default_factory=list)  # the reviewed changes
    comparison: Comparison | None = None

    @classmethod
    def open(cls, config: pytest.Config, facts: dict[str, str]) -> Gate | None:
        """Read and check the baseline before any test runs: a bad file stops the session now.

        `auto` takes this environment's baseline, else the nearest (harness.reports.nearest);
        none at all is reported at the end. A path given by hand that is not there is a mistake,
        said now, and so is a mistake in the accepted-changes file beside the baselines."""
        option = config.getoption("amp_baseline")
        if option is None and config.getoption("amp_fail_on_regression"):
            option = "auto"
        if option is None:
            return None
        folder = baselines_folder(config)
        known = set(claims.catalogue())
        accepted = accepted_changes.read(accepted_changes.default_path(folder), known)
        if option == "auto":
            chosen = nearest.choose(folder, facts)
            return cls(config, chosen.path, chosen.summary, chosen.why, accepted)
        path = config.invocation_params.dir / option
        return cls(config, path, baseline.read_baseline(path), accepted=accepted)

    def compare(self, session: dict) -> None:
        """`session`: the session's summary (harness.reports.baseline.summarize)."""
        self.comparison = compare.compare(
            self.summary, session, labels=(str(self.path), "this session"), accepted=self.accepted
        )

    def fails(self) -> bool:
        """Whether --amp-fail-on-regression fails the session on this comparison."""
        return (
            self.comparison is not None
            and self.comparison.fails_the_gate
            and self.config.getoption("amp_fail_on_regression")
        )

    def write(self, terminalreporter, entry: dict, reports: Path) -> None:
        """Under the verdict table: the comparison, or why there was none. `entry`: the journal's
        session entry; `reports`: the session's reports folder."""
        comparison = self.comparison
        if comparison is None:
            terminalreporter.write_line(
                f"amp-harness: {baseline.MissingBaseline(self.path)}", yellow=True
            )
            legacy = self.path.with_name(baseline.legacy_filename(entry["fingerprint"]))
            if legacy != self.path and legacy.is_file():
                terminalreporter.write_line(
                    f"amp-harness: {legacy} was saved before hardware classes: it does not say "
                    f"which CPU class it was measured on, so it is never taken as this "
                    f"environment's ({environments.hardware_class(entry['fingerprint'])}); "
                    f"compare with it by hand (--amp-baseline {legacy}) or save one for this "
                    "class",
                    yellow=True,
                )
            return
        facts = self.summary.get("fingerprint", {})
        terminalreporter.write_line(
            f"baseline {self.path}: hardware class {environments.hardware_class(facts)}"
            + (
                " (saved before hardware classes: a name only)"
                if environments.is_legacy(facts)
                else ""
            )
            + f", torch {environments.fact(facts, 'torch')}; this session: "
            f"{environments.hardware_class(entry['fingerprint'])}"
        )
        if self.why:  # another environment's: the gate of an upgrade
            terminalreporter.write_line(f"baseline {self.path}: {self.why}", yellow=True)
        for line in comparison.kind_lines():
            terminalreporter.write_line(f"baseline {self.path}: {shown.visible(line)}")
        for note in comparison.accepted_notes:
            terminalreporter.write_line(f"accepted change {shown.visible(note)}", yellow=True)
        if comparison.not_compared:
            terminalreporter.write_line(
                f"baseline {self.path}: not compared, this session ran part of the suite "
                f"({'; '.join(comparison.b_lacks)}): {', '.join(comparison.not_compared)}",
                yellow=True,
            )
        failing = self.fails()
        if not comparison.regressions and not failing:
            overlapped = comparison.overlapped
            terminalreporter.write_line(
                f"baseline {self.path}: {comparison.summary_line()}",
                green=overlapped,
                yellow=not overlapped,
            )
            return
        terminalreporter.write_line(
            f"baseline {self.path}: {comparison.summary_line()}"
            + ("; --amp-fail-on-regression fails the session" if failing else ""),
            red=True,
            bold=True,
        )
        for line in comparison.regressions:
            terminalreporter.write_line(f"  {shown.visible(line)}", red=True)  # baseline evidence
        folder = baselines_folder(self.config)
        elsewhere = (
            ""
            if folder == self.config.rootpath / BASELINES.default
            else (f" {BASELINES.cli} {folder}")
        )
        terminalreporter.write_line(
            f"every change: `amp-harness compare {self.path} {entry['session_id']} "
            f"--reports {reports}{elsewhere}`"
        )


def baselines_folder(config: pytest.Config) -> Path:
    """--amp-baselines, else reports/baselines under the project's root: committed, so never
    under --amp-reports (what a session produces)."""
    option = config.getoption("amp_baselines")
    if option is None:
        return config.rootpath / BASELINES.default
    return config.invocation_params.dir / option
