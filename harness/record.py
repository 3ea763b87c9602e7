"""What one scenario test observed: params, metrics, per-step histories, figures, and one verdict
per declared claim with an evidence sentence that carries the numbers.

A Record is plain data. The pytest plugin creates one per scenario test, hands it to the test
through the `record` fixture, and after the test adds the outcome and passes it downstream
(journal, then MLflow). Nothing here knows about pytest or MLflow.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.claims import check_verdict
from harness.errors import HarnessError

_METRIC_NAME = re.compile(r"^[A-Za-z0-9_\-./ ]+$")  # what MLflow accepts as a key
# Evidence read as names and numbers, left to right: a run of letters, digits and _ that starts
# with a letter is a name (fp16, float32, sm_90, e4m3fn, H200), whose digits measure nothing; a
# run of digits elsewhere is a number (65536, 0.19, 2**-25, 3/4, 1e-7, 12%). "x1000" is a factor.
_NAME_OR_NUMBER = re.compile(
    r"(?P<factor>x\d[\d.]*)\b|(?P<name>[^\W\d]\w*)|(?P<number>\d+(?:\.\d+)?)"
)


@dataclass
class Verdict:
    claim: str
    verdict: str
    evidence: str


@dataclass
class Record:
    test: str  # pytest node id
    claims: list[str]
    device: str
    artifact_dir: Path  # where figures are written before they are logged
    record_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.time)
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    histories: dict[str, list[float]] = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)  # file names inside artifact_dir
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    # Filled in by the plugin once the test has run.
    outcome: str = ""  # passed | failed | skipped | error
    message: str = ""  # skip reason or the first line of the failure
    ended: float = 0.0

    def param(self, **values) -> None:
        """Inputs of the experiment: recipe, model, size, seed, ..."""
        self.params.update({k: str(v) for k, v in values.items()})

    def metric(self, **values: float) -> None:
        """Scalar observations; names become MLflow metric keys."""
        for name, value in values.items():
            self.metrics[_key(name)] = float(value)

    def history(self, prefix: str = "", **series) -> None:
        """Per-step arrays (loss=[...], scale=[...]); sent to MLflow in one batch per test."""
        for name, values in series.items():
            self.histories[_key(prefix + name)] = [float(v) for v in values]

    def figure(self, name: str, fig) -> None:
        """Save a matplotlib figure as PNG beside the record; it is logged as an artifact.

        Build figures with `matplotlib.figure.Figure` (as harness.figures does): pyplot keeps
        every figure it made alive until closed, and needs a display backend."""
        self.artifact_dir.mkdir(parents=True, exist_ok=True)
        filename = f"{_key(name).replace('/', '_')}.png"
        fig.savefig(self.artifact_dir / filename, dpi=100)
        self.figures.append(filename)

    def verdict(self, claim: str, verdict: str, evidence: str) -> None:
        """The verdict on one declared claim, with the numbers that decided it."""
        if claim not in self.claims:
            raise HarnessError(
                f"{self.test}: verdict for {claim!r}, which the test does not declare; its "
                f"@pytest.mark.claim names {', '.join(self.claims)}: add {claim!r} there"
            )
        check_verdict(verdict)
        # A skipped verdict's evidence is the skip reason: there was nothing to measure.
        numbers, names = _read(evidence)
        if verdict != "skipped" and not numbers:
            inside = f" (only inside the names {', '.join(names)})" if names else ""
            raise HarnessError(
                f"{self.test}: the evidence for {claim} carries no number{inside}: say what was "
                f"measured, formatted from the values (e.g. f'scale {{before:g}} -> {{after:g}} "
                f"after an injected inf', which reads 'scale 65536 -> 32768 ...')"
            )
        self.verdicts[claim] = Verdict(claim, verdict, evidence)

    def missing_verdicts(self) -> list[str]:
        return [c for c in self.claims if c not in self.verdicts]

    def to_dict(self) -> dict:
        data = asdict(self)
        data["artifact_dir"] = str(self.artifact_dir)
        data["verdicts"] = [asdict(v) for v in self.verdicts.values()]
        # JSON has no inf/NaN: keep them as strings so the journal stays standard JSON.
        data["metrics"] = {k: _jsonable(v) for k, v in self.metrics.items()}
        data["histories"] = {k: [_jsonable(v) for v in vs] for k, vs in self.histories.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Record:
        data = dict(data)
        data["artifact_dir"] = Path(data["artifact_dir"])
        data["verdicts"] = {v["claim"]: Verdict(**v) for v in data["verdicts"]}
        data["metrics"] = {k: float(v) for k, v in data["metrics"].items()}
        data["histories"] = {k: [float(v) for v in vs] for k, vs in data["histories"].items()}
        return cls(**data)


def _read(evidence: str) -> tuple[list[str], list[str]]:
    """The numbers standing on their own in `evidence`, and the names with digits inside."""
    found = list(_NAME_OR_NUMBER.finditer(evidence))
    numbers = [m[0] for m in found if not m["name"]]
    names = [m["name"] for m in found if m["name"] and any(c.isdigit() for c in m["name"])]
    return numbers, list(dict.fromkeys(names))


def _key(name: str) -> str:
    if not _METRIC_NAME.match(name):
        raise HarnessError(
            f"metric name {name!r}: use letters, digits, and _ - . / or spaces (MLflow's rule)"
        )
    return name


def _jsonable(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)  # "inf", "-inf", "nan"
