"""Where a diagnosis goes (harness.lab.diagnose measures it): a JSON file first, then an MLflow run,
then the terminal's short table; the report reads the runs back.

The file, `REPORTS/diagnoses/<factory>-<time>.json`, is written (and fsync'ed) before MLflow is
called, so an unreachable tracking server loses nothing: the session says so and the file holds
the whole diagnosis. The MLflow run lives in its own experiment (EXPERIMENT, apart from the
scenarios' runs) with the tag `amp.kind=diagnosis`: params (factory, device, torch, steps),
metrics per recipe (`drift.<recipe>`, `underflow.<recipe>`, `skipped.<recipe>`,
`speedup.<recipe>` on CUDA), tags `status.<recipe>` and `reasons.<recipe>`, and the JSON as an
artifact.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from harness.common.errors import HarnessError
from harness.common.shown import visible
from harness.records import tracking
from harness.reports.table import cap

if TYPE_CHECKING:  # harness.lab.diagnose imports torch, which the report reading runs never needs
    from harness.lab.diagnose import Diagnosis

EXPERIMENT = "amp-harness-diagnose"
KIND = "diagnosis"
FOLDER = "diagnoses"


def save(diagnosis: Diagnosis, reports: Path) -> Path:
    folder = Path(reports) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", diagnosis.factory)
    path = folder / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    with open(path, "w", encoding="utf-8") as out:
        json.dump(diagnosis.as_dict(), out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    return path


def log(diagnosis: Diagnosis, uri: str, saved: Path, reports: Path) -> str:
    """The diagnosis as one MLflow run; its id. The experiment is made as the scenarios' is
    (MlflowSink): on the embedded store, its artifacts go to reports/mlartifacts."""
    from mlflow.entities import Metric, Param

    sink = tracking.MlflowSink(uri, EXPERIMENT, reports)
    if sink.down:
        raise HarnessError(sink.down)
    client, experiment = sink.client, sink.experiment_id()
    tags = {
        "mlflow.runName": f"diagnose {diagnosis.factory}",
        "amp.kind": KIND,
        "amp.factory": diagnosis.factory,
    }
    for run in diagnosis.runs.values():
        tags[f"status.{run.recipe}"] = run.status
        tags[f"reasons.{run.recipe}"] = cap(" | ".join(run.reasons), "in diagnosis.json", 5000)
    for row in (diagnosis.verify or {}).get("rows", []):
        tags[f"truth.{row['recipe']}"] = row["truth"]
    for row in (diagnosis.compiled or {}).get("rows", []):
        tags[f"compiled.{row['recipe']}"] = cap(_compiled_words(row), "in diagnosis.json", 5000)
    run_id = client.create_run(experiment, tags=tags).info.run_id
    stamp = int(time.time() * 1000)
    metrics = [
        Metric(f"{name}.{run.recipe}", value, stamp, 0)
        for run in diagnosis.runs.values()
        if not run.unsupported
        for name, value in (
            ("drift", run.drift),
            ("underflow", run.underflow),
            ("skipped", float(run.skipped)),
            ("speedup", run.speedup),
        )
        if value is not None and math.isfinite(value)
    ]
    params = [
        Param(k, str(v))
        for k, v in {
            "factory": diagnosis.factory,
            "device": diagnosis.device,
            "torch": diagnosis.torch,
            "steps": diagnosis.steps,
            "recipes": ",".join(diagnosis.runs),  # their order, for readers of the tags
        }.items()
    ]
    client.log_batch(run_id, metrics=metrics, params=params)
    client.log_artifact(run_id, str(saved))
    client.set_terminated(run_id, "FINISHED")
    return run_id


def render(diagnosis: Diagnosis, width: int, color: bool) -> str:
    """One line per recipe (its status, its loss against fp32's), its reasons wrapped beneath:
    readable at 80 columns and in a CI log."""
    from harness.lab.diagnose import NOT_RUN, OVERFLOWS_WITHIN_NOISE, REFERENCE, SAFE

    console = Console(file=io.StringIO(), width=width, force_terminal=color, no_color=not color)
    console.print(
        f"amp-harness diagnose {visible(diagnosis.factory)} on {diagnosis.device} "
        f"(torch {diagnosis.torch}, {diagnosis.steps} steps)",
        style="bold",
        markup=False,
        highlight=False,
    )
    compiled = {row["recipe"]: row for row in (diagnosis.compiled or {}).get("rows", [])}
    backend = (diagnosis.compiled or {}).get("backend", "")
    for run in diagnosis.runs.values():
        quiet = (NOT_RUN, OVERFLOWS_WITHIN_NOISE)  # no alarm: not run, or an option to weigh
        style = "green" if run.status == SAFE else "yellow" if run.status in quiet else "red"
        line = Text(f"  {run.recipe:<18} ")
        line.append(run.status, style="" if run.recipe == REFERENCE else style)
        if not run.unsupported and run.recipe != REFERENCE:
            drift = f"{run.drift:.2%}" if math.isfinite(run.drift) else "non-finite"
            line.append(f"   loss vs fp32: {drift}")
        console.print(line, highlight=False)
        _wrapped(console, " | ".join(run.reasons), width, "      ")
        for check in run.fixes:
            verdict = (
                "held"
                if check.held
                else "did not hold"
                if check.settled
                else f"not settled in {diagnosis.steps} steps: {check.unsettled}"
            )
            against = "" if check.reference == REFERENCE else f", against {check.reference}"
            _wrapped(console, f"fix tried: {check.fix} -> {check.status} ({verdict}{against})",
                     width, "      ")  # fmt: skip
            for code in check.code:  # the lines a user adds: what the check ran
                console.print(f"          {visible(code)}", markup=False, highlight=False)
        if run.recipe in compiled:
            _wrapped(console, f"torch.compile ({backend}): {_compiled_words(compiled[run.recipe])}",
                     width, "      ")  # fmt: skip
    if diagnosis.verify:
        _render_verify(console, diagnosis.verify, width)
    return console.file.getvalue()


def _compiled_words(row: dict) -> str:
    """A recipe's compiled run against its eager one: "as eager (why)" or "DIFFERS: why"."""
    return f"as eager: {row['why']}" if row["as_eager"] else f"DIFFERS from eager: {row['why']}"


def _wrapped(console: Console, text: str, width: int, indent: str) -> None:
    """Wrapped, never cut: a reason cut short hid the rest of the judgement (a half run's list
    of 34 norm layers crowded out its other reasons). The model's own module names are in the
    reasons: shown as data (harness.common.shown)."""
    for line in textwrap.wrap(visible(text), width=max(width - len(indent), 40)):
        console.print(f"{indent}{line}", markup=False, highlight=False)


def _render_verify(console: Console, verify: dict, width: int) -> None:
    """--verify's truths: each recipe's prediction against what N steps of training did."""
    seeds = verify.get("seeds", 1)  # diagnoses kept before --seeds have none
    paired = f", paired over {seeds} seeds" if seeds > 1 else ""
    console.print(
        f"verified over {verify['steps']} steps{paired} (fp32's own spread: loss "
        f"{verify['noise']:.3g}, held-out {verify['held_out_noise']:.3g}):",
        style="bold", markup=False, highlight=False,
    )  # fmt: skip
    for row in verify["rows"]:
        held = "" if row["held"] is None else _held_word(row["predicted"], row["held"])
        held += f"; {row['lead']}" if row.get("lead") else ""  # kept before issue 54: none
        _wrapped(console, f"{row['recipe']}: said {row['predicted']}, {row['truth']} "
                 f"({row['why']}){held}", width, "  ")  # fmt: skip
    if verify["noise_note"]:
        _wrapped(console, verify["noise_note"], width, "  ")
    for fix in verify["fixes"]:
        _wrapped(console, f"fix {fix['fix']}: {fix['truth']} ({fix['why']}): {_fix_word(fix)}",
                 width, "  ")  # fmt: skip
    for forecast in verify.get("forecasts", []):  # diagnoses kept before the forecast have none
        _wrapped(console, f"forecast: {forecast['words']}", width, "  ")


def _fix_word(fix: dict) -> str:
    """What a fix's training says of it. A fix that trains *better* than its reference beyond
    the spread did not give fp32's run, but did no harm: said so, neither alarm nor "held"."""
    from harness.lab.diagnose.verify import DIFFERS

    if fix["held"]:
        return "the fix held"
    if fix["truth"] == DIFFERS:
        return ("not fp32's run: it trains better than fp32 here, beyond fp32's seed spread "
                "(no harm measured); whether a different run suits you is for your own metric "
                "to say")  # fmt: skip
    return "THE FIX DID NOT HOLD"


def _held_word(predicted: str, held: bool) -> str:
    from harness.lab.diagnose import SAFE

    if held:
        return ": the prediction held"
    return ": MISSED (said safe)" if predicted == SAFE else ": a false alarm"


def latest(client) -> list[dict]:
    """The latest diagnosis of each factory on each device and torch, as the report shows it:
    factory, device, torch, started (ms), run_id, experiment_id, and (recipe, status, reasons)
    per recipe."""
    found = client.get_experiment_by_name(EXPERIMENT)
    if found is None:
        return []
    newest: dict[tuple, object] = {}
    for run in tracking.search_runs(client, found.experiment_id, f"tags.`amp.kind` = '{KIND}'"):
        params = run.data.params
        key = (params.get("factory"), params.get("device"), params.get("torch"))
        if key not in newest or run.info.start_time > newest[key].info.start_time:
            newest[key] = run
    return [
        {
            "factory": factory,
            "device": device,
            "torch": torch_version,
            "started": run.info.start_time,
            "run_id": run.info.run_id,
            "experiment_id": found.experiment_id,
            "recipes": [
                (
                    recipe,
                    run.data.tags.get(f"status.{recipe}", "?"),
                    run.data.tags.get(f"reasons.{recipe}", ""),
                )
                for recipe in run.data.params.get("recipes", "").split(",")
                if recipe
            ],
        }
        for (factory, device, torch_version), run in sorted(newest.items(), key=str)
    ]
