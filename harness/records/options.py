"""The options `amp-harness` and the pytest plugin both take with one meaning, each defined once:
where results are kept, the MLflow store and experiment they go to, and the folder of committed
baselines. Each face adds them under its own name (the plugin's carry `amp-`, beside pytest's
own options); their values are checked where they are read (`tracking.resolve_uri` for the
tracking URI), the same for both faces."""

from __future__ import annotations

from dataclasses import dataclass

from harness.records.tracking import DEFAULT_EXPERIMENT


@dataclass(frozen=True)
class Shared:
    """One option of both faces: its name in each, its default and help text."""

    cli: str
    plugin: str
    default: str | None
    help: str
    metavar: str | None = None

    def arguments(self, **changes: object) -> dict[str, object]:
        """The keyword arguments of argparse's add_argument (pytest's addoption takes the same),
        with `changes` where a face differs: the plugin's folders default to None, read from
        the project's root (`config.rootpath / REPORTS.default`)."""
        named = {"metavar": self.metavar} if self.metavar else {}  # else argparse's, from the name
        return {"default": self.default, "help": self.help, **named, **changes}


REPORTS = Shared(
    "--reports",
    "--amp-reports",
    "reports",
    "results folder: the journal, the embedded MLflow store, figures (default: reports)",
)
TRACKING_URI = Shared(
    "--tracking-uri",
    "--tracking-uri",
    None,
    "MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///REPORTS/mlflow.db)",
)
EXPERIMENT = Shared(
    "--experiment",
    "--amp-experiment",
    DEFAULT_EXPERIMENT,
    f"MLflow experiment (default: {DEFAULT_EXPERIMENT})",
)
# Committed, so never under --reports (what sessions produce): the same folder whatever it says.
BASELINES = Shared(
    "--baselines",
    "--amp-baselines",
    "reports/baselines",
    "the committed baselines and their accepted-changes.toml (default: reports/baselines)",
    metavar="DIR",
)
