"""A team adds its own claim and scenario the way docs/writing-a-scenario.md says, in a copy of
this repository, without touching harness/: the claim joins the catalogue (list, the verdict
table), the scenario passes, and the project's own tests still pass beside it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

CLAIM, STATEMENT = "TEAM-BF16-LOSS", "Our loss trains in bf16 without a GradScaler."
SOURCE = "https://example.com/team/decisions/7"
LEFT_OUT = shutil.ignore_patterns(".venv", "reports", ".git", "__pycache__", "*.egg-info")


def sources(repo) -> dict:
    return {
        p: p.read_bytes()
        for p in (repo / "harness").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def run(*args: str, cwd) -> subprocess.CompletedProcess:
    ran = subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    return ran


@pytest.mark.slow
def test_a_new_claim_and_its_scenario_from_the_docs_alone(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(REPO, copy, ignore=LEFT_OUT)
    harness_files = sources(copy)
    cli = ("-m", "harness.cli")

    # The guide's three commands, with the claim named on the first.
    source = ("--source", SOURCE)
    run(*cli, "new", "team_bf16", "--claim", CLAIM, STATEMENT, *source, cwd=copy)
    run(*cli, "validate", cwd=copy)
    ran = run(
        "-m", "pytest", "scenarios/test_team_bf16.py", "--amp-device=cpu",
        "-p", "no:cacheprovider", "--amp-reports=reports", "-v", cwd=copy,
    )  # fmt: skip
    assert CLAIM in ran.stdout and "example.com/team" in ran.stdout  # -v's table: its source

    # MLflow and the report treat it as an article claim, and say where it comes from.
    import mlflow

    store = f"sqlite:///{copy / 'reports' / 'mlflow.db'}"
    runs = mlflow.MlflowClient(store).search_runs(
        [e.experiment_id for e in mlflow.MlflowClient(store).search_experiments()],
        filter_string=f"tags.`verdict.{CLAIM}` = 'confirmed'",
    )
    assert [r.data.tags[f"source.{CLAIM}"] for r in runs] == [SOURCE]
    run(*cli, "report", cwd=copy)
    page = (copy / "reports" / "report" / "index.html").read_text()
    assert f'id="claim-{CLAIM}"' in page and f"source: {SOURCE}" in page

    listed = {r["id"]: r for r in json.loads(run(*cli, "list", "--json", cwd=copy).stdout)}
    assert listed[CLAIM]["source"] == SOURCE and listed[CLAIM]["catalogue"] == "project"
    assert listed[CLAIM]["tests"] == ["scenarios/test_team_bf16.py::test_team_bf16"]
    assert listed[CLAIM]["last_verdict"] == "confirmed"

    # The tests that once counted claims or scenario files pass beside the team's scenario.
    # Without tests/conftest.py, whose start-up imports (torch._dynamo, MLflow's stores,
    # matplotlib: ~4 s of CPU) are for nested sessions that use them, none of which these are;
    # pytester, which it would load, named instead. A fixture of it missing would fail here.
    run("-m", "pytest", "tests/catalogue/test_claims.py", "-q", "-p", "no:cacheprovider",
        "--noconftest", "-p", "pytester", cwd=copy)  # fmt: skip
    assert sources(copy) == harness_files  # harness/ untouched
