"""What several commands take, and what it names: the results folder (--reports), the MLflow
store and experiment, the committed baselines (each defined once with the plugin's own:
harness.records.options), the scenario folder; the accepted changes beside the baselines, and
a results folder a command reads, which must be there."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.catalogue import claims
from harness.common.errors import HarnessError
from harness.records.options import BASELINES, EXPERIMENT, REPORTS, TRACKING_URI
from harness.reports import accepted


def command(sub, name: str, help_text: str, *, reports: bool = True) -> argparse.ArgumentParser:
    """A command of `amp-harness`, its help also its description; with --reports unless it
    neither reads nor writes results (`new`, `validate`)."""
    p = sub.add_parser(name, help=help_text, description=help_text)
    if reports:
        p.add_argument(REPORTS.cli, **REPORTS.arguments())
    return p


def scenarios(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenarios", default="scenarios", help="scenario folder")


def tracking(p: argparse.ArgumentParser, *, experiment: bool = True) -> None:
    """--tracking-uri, and --experiment unless the command logs to an experiment of its own
    (`diagnose`)."""
    p.add_argument(TRACKING_URI.cli, **TRACKING_URI.arguments())
    if experiment:
        p.add_argument(EXPERIMENT.cli, **EXPERIMENT.arguments())


def baselines(p: argparse.ArgumentParser, *aliases: str) -> None:
    """The one folder of committed baselines and their accepted-changes.toml, never under
    --reports (what sessions produce)."""
    p.add_argument(BASELINES.cli, *aliases, dest="baselines", **BASELINES.arguments())


def accepted_changes(baselines: Path) -> list:
    """The accepted changes beside the baselines (harness.reports.accepted), checked against the
    claims of every catalogue."""
    return accepted.read(accepted.default_path(baselines), claims.catalogue())


def recorded(reports: str) -> Path:
    """--reports of a command that reads what sessions recorded there: a folder that is there."""
    folder = Path(reports)
    if not folder.is_dir():
        raise HarnessError(
            f"--reports {reports}: no such folder ({folder.resolve()}): give the folder a session "
            "recorded into (`amp-harness run --reports DIR`, pytest's --amp-reports DIR), e.g. "
            "--reports reports"
        )
    return folder
