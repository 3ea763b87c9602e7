"""What one scenario test observed: params, metrics, per-step histories, figures, and one verdict
per declared claim with an evidence sentence that carries the numbers.

A Record is plain data. The pytest plugin creates one per scenario test, hands it to the test
through the `record` fixture, and after the test adds the outcome and passes it downstream
(journal, then MLflow). Nothing here imports pytest or MLflow: names are held to a copy of
MLflow's rule for keys (and to MLflow's own check as well, when MLflow is already loaded).
"""

from __future__ import annotations

import math
import posixpath
import re
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.catalogue import known_bugs, verdicts
from harness.catalogue.claims import check_verdict, ledger
from harness.common import shown
from harness.common.errors import HarnessError
from harness.records import environments, shapes

# MLflow's rule for metric, param and tag keys (mlflow/utils/validation.py in MLflow 3.17:
# validate_param_and_metric_name, path_not_unique, MAX_ENTITY_KEY_LENGTH), copied so that recording
# needs no MLflow (a GPU runner may lack it) and a bad name fails its test at once, not at log
# time, where MLflow's refusal switches MLflow off for the rest of the session. The characters
# are MLflow's Windows set (no ':'), since a journal may be synced to a server on any platform;
# fullmatch, not MLflow's re.match(...$), which lets a trailing newline through.
_KEY_CHARACTERS = re.compile(r"[/\w.\- ]*")
_KEY_LENGTH = 250
# MLflow's own check for each kind of name; run as well when MLflow is already imported (a
# tracked session imports it before any test), so a newer MLflow's stricter rule is met too.
_MLFLOW_CHECK = {
    "metric": "_validate_metric_name",
    "history": "_validate_metric_name",
    "param": "_validate_param_name",
    "figure": "_validate_metric_name",
}
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
        self.params.update({_key(k, "param"): str(v) for k, v in values.items()})

    def metric(self, **values: float) -> None:
        """Scalar observations; names become MLflow metric keys."""
        for name, value in values.items():
            self.metrics[_key(name)] = float(value)

    def key_metric(self, **values: float) -> None:
        """Metrics that say which way the behaviour went (a threshold, a step, a count), not how
        fast or how close: the report and `amp-harness baseline changes` hold them side by side
        across environments and mark those that differ. Named in the param `key_metrics`."""
        self.metric(**values)
        named = [name for name in self.params.get(KEY_METRICS, "").split(",") if name]
        self.params[KEY_METRICS] = ",".join(dict.fromkeys(named + [_key(k) for k in values]))

    def key_metrics(self) -> dict[str, float]:
        return key_metrics(self.params, self.metrics)

    def depends_on_hardware(self, *capabilities: str) -> None:
        """Capabilities (harness.lab.devices.known_capabilities) whose presence follows the hardware
        and decides this test's verdicts, or `class` for the hardware class as a whole (a
        timing test). Where two environments' classes differ in one of them, `compare` and the
        report attribute a difference of this test to the hardware. Named in the param
        `depends_on_hardware`; the plugin adds the test's `requires` that follow the hardware."""
        from harness.lab.devices import known_capabilities  # torch: loaded in any scenario test

        known = known_capabilities()  # the built-in ones and the team's (scenarios/capabilities.py)
        unknown = [c for c in capabilities if c not in known and c != environments.CLASS]
        if unknown:
            raise HarnessError(
                f"{self.test}: depends_on_hardware({', '.join(map(repr, unknown))}): not a "
                f"capability; known are {', '.join(sorted(known))}, and "
                f"{environments.CLASS!r} for the hardware class as a whole"
            )
        named = environments.depends_on(self.params.get(DEPENDS_ON_HARDWARE, ""))
        self.params[DEPENDS_ON_HARDWARE] = ",".join(sorted(named | set(capabilities)))

    def history(self, prefix: str = "", **series) -> None:
        """Per-step arrays (loss=[...], scale=[...]); sent to MLflow in one batch per test."""
        for name, values in series.items():
            self.histories[_key(prefix + name, "history")] = [float(v) for v in values]

    def figure(self, name: str, fig) -> None:
        """Save a matplotlib figure as PNG beside the record; it is logged as an artifact.

        Build figures with `matplotlib.figure.Figure` (as harness.lab.figures does): pyplot
        keeps every figure it made alive until closed, and needs a display backend."""
        self.artifact_dir.mkdir(parents=True, exist_ok=True)
        filename = f"{_key(name, 'figure').replace('/', '_')}.png"
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

    @staticmethod
    def over_arms(failed: dict[str, bool | None]) -> str:
        """A compiled claim's verdict from its arms (backends), None for an arm that could not
        compile: harness.catalogue.verdicts.over_arms, reached through the record as scenarios
        reach the catalogue (they import the lab and nothing else of the harness)."""
        return verdicts.over_arms(failed)

    def known_bug(
        self, bug: str, present: bool | None, control_clean: bool, evidence: str, version: str = ""
    ) -> str | None:
        """The verdict on a known bug of the ledger (harness.catalogue.known_bugs): `confirmed`
        where its harm showed, `refuted` where not, `skipped` where the reproduction could not
        run (present None; the evidence says why). Returns what contradicts the ledger, or None:
        a harm, or none, that its bounds do not predict for this release (a wrong bound, a bug
        come back, a reproduction that no longer triggers); a control that shows the harm too (a
        reproduction that cannot tell the bug apart); a reproduction that cannot run where the
        ledger says the bug is present. The test asserts on it."""
        import torch  # loaded in any scenario test; record.py itself needs no torch

        entry = ledger()[bug]
        version = version or torch.__version__
        predicted = entry.predicted(version)
        if present is None:
            self.verdict(bug, "skipped", evidence)
            if predicted != known_bugs.PRESENT:
                return None
            return (
                f"{bug}: the ledger says torch {version} has it (affects {entry.affects}), but "
                f"its reproduction cannot run here: {evidence}"
            )
        verdict = known_bugs.PRESENT_VERDICT if present else known_bugs.ABSENT_VERDICT
        self.verdict(bug, verdict, evidence)
        # Both kept in a baseline: that a reproduction's harm and its control's absence of it
        # were measured apart on some release is what shows the reproduction can fail.
        self.key_metric(
            **{"known_bug/present": int(present), "known_bug/control_clean": int(control_clean)}
        )
        if not control_clean:
            return (
                f"{bug}: the control shows the harm too, so the reproduction does not isolate "
                f"the bug: {evidence}"
            )
        if present == (predicted == known_bugs.PRESENT):
            return None
        return (
            f"{bug}: {entry.state(verdict, version)} on torch {version}, where the ledger "
            f"predicts {predicted} (affects {entry.affects}): a bound is wrong, the bug came "
            f"back, or the reproduction no longer triggers: {evidence}"
        )

    def make_storable(self) -> None:
        """Escape, in place, every text of the record that UTF-8 cannot encode (shown.storable:
        a file name decoded with surrogateescape, `caf\\udce9` -> `caf\\xe9`): the journal
        would refuse the whole record, MLflow and the terminal likewise. The test may have set
        any field directly, so all are done; artifact_dir is a path to read figures from, and
        stays (the journal escapes it)."""
        for name in ("test", "claims", "device", "params", "metrics", "histories", "figures",
                     "message"):  # fmt: skip
            setattr(self, name, shown.storable(getattr(self, name)))
        for verdict in self.verdicts.values():
            verdict.evidence = shown.storable(verdict.evidence)

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
        """The record `to_dict` wrote. A field missing or of the wrong type is a HarnessError
        naming the field (readers of the journal skip that record and say so); fields this
        version does not know, from a newer one, are ignored (`unknown_fields` names them)."""
        if not isinstance(data, dict):
            raise HarnessError(f"is {shapes.kind_of(data)}, not an object")
        problem = shapes.fields_problem(data, _FIELDS)
        if problem:
            raise HarnessError(problem)
        verdicts = {}
        for index, v in enumerate(data["verdicts"]):
            problem = shapes.fields_problem(v, _VERDICT_FIELDS)
            if problem:
                raise HarnessError(f"verdicts[{index}]: {problem}")
            verdicts[v["claim"]] = Verdict(*(v[name] for name in _VERDICT_FIELDS))
        values = {name: data[name] for name in _FIELDS}
        values["artifact_dir"] = Path(values["artifact_dir"])
        values["verdicts"] = verdicts
        values["metrics"] = {k: float(v) for k, v in values["metrics"].items()}
        values["histories"] = {k: [float(v) for v in vs] for k, vs in values["histories"].items()}
        return cls(**values)

    @staticmethod
    def unknown_fields(data: dict) -> list[str]:
        """The fields of a record dict that this version does not read (a newer one wrote them)."""
        found = [name for name in data if name not in _FIELDS]
        for v in data.get("verdicts") or []:
            if isinstance(v, dict):
                found += [f"verdicts[].{name}" for name in v if name not in _VERDICT_FIELDS]
        return list(dict.fromkeys(found))


# The fields to_dict writes, each with the JSON it must hold (a harness.records.shapes spec). All
# are required: a record_id or `started` made up by default would make `sync` send the record
# again at every run, and an empty default would hide what was lost.
_FIELDS = {
    "test": "text",
    "claims": ("list", "text"),
    "device": "text",
    "artifact_dir": "text",
    "record_id": "text",
    "started": "number",
    "params": ("object", "text"),
    "metrics": ("object", "value"),
    "histories": ("object", ("list", "value")),
    "figures": ("list", "text"),
    "verdicts": ("list", "object"),
    "outcome": "text",
    "message": "text",
    "ended": "number",
}
_VERDICT_FIELDS = {"claim": "text", "verdict": "text", "evidence": "text"}


KEY_METRICS = "key_metrics"  # the param that names a test's key metrics, comma-separated
DEPENDS_ON_HARDWARE = "depends_on_hardware"  # the param naming Record.depends_on_hardware's
SCENARIO_DIGEST = "scenario_sha256"  # the param holding its scenario file's digest (16 digits)


def key_metrics(params: dict[str, str], metrics: dict[str, float]) -> dict[str, float]:
    """The key metrics (Record.key_metric) among `metrics`, by the names `params` holds."""
    names = [name for name in params.get(KEY_METRICS, "").split(",") if name]
    return {name: metrics[name] for name in names if name in metrics}


def _read(evidence: str) -> tuple[list[str], list[str]]:
    """The numbers standing on their own in `evidence`, and the names with digits inside."""
    found = list(_NAME_OR_NUMBER.finditer(evidence))
    numbers = [m[0] for m in found if not m["name"]]
    names = [m["name"] for m in found if m["name"] and any(c.isdigit() for c in m["name"])]
    return numbers, list(dict.fromkeys(names))


def _key(name: str, kind: str = "metric") -> str:
    """`name` if MLflow takes it as a key, else a HarnessError naming it, the rule and the fix."""
    problem = key_problem(name, kind)
    if problem:
        raise HarnessError(f"{kind} name {name!r}: {problem}")
    return name


def key_problem(name: str, kind: str = "metric") -> str | None:
    """Why MLflow would refuse `name` as a `kind` (metric, history, param, figure) key; None if
    it would not."""
    if not isinstance(name, str) or not name:
        return "a name must be a non-empty string"
    if not _KEY_CHARACTERS.fullmatch(name):
        return "use letters, digits, and _ - . / or spaces (MLflow's rule)"
    norm = posixpath.normpath(name)
    # MLflow's path_not_unique: a key may become a file path; it must name itself and stay inside.
    if norm != name or norm == "." or norm.startswith("..") or norm.startswith("/"):
        parts = [p for p in name.split("/") if p and p not in (".", "..")]
        fix = f"e.g. {'/'.join(parts)!r}" if parts else "a name with letters or digits"
        return (
            f"MLflow treats names as file paths and refuses one that would resolve to another "
            f"({norm!r}) or leave its folder: no empty, '.' or '..' parts, no leading or trailing "
            f"'/', no leading '..' (MLflow's rule); use {fix}"
        )
    if len(name) > _KEY_LENGTH:
        return f"{len(name)} characters: MLflow takes at most {_KEY_LENGTH}; use a shorter name"
    mlflow = sys.modules.get("mlflow.utils.validation")  # never imported here: it takes seconds
    check = getattr(mlflow, _MLFLOW_CHECK[kind], None)
    if check is not None:
        try:
            check(name)
        except Exception as exc:  # MlflowException, whose message states MLflow's rule
            version = getattr(sys.modules.get("mlflow"), "__version__", "")
            return f"MLflow {version} refuses it: {exc}"
    return None


def _jsonable(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)  # "inf", "-inf", "nan"
