"""A team's scenario folder, outside harness/, with its own capability, recipe and optimizer,
written from docs/writing-a-scenario.md alone (tests/helpers/team_guide.py reads the files from
it): it runs and passes, a capability not expected here skips with its reason, and one expected
here and lost fails as a capability regression, exactly as the built-in ones do."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.team_guide import write_guide_files

from harness.lab import devices

ARGS = ("--amp-device=cpu", "--no-mlflow", "--amp-isolate=none", "-p", "no:cacheprovider")


@pytest.fixture
def team(pytester: pytest.Pytester) -> pytest.Pytester:
    """An empty folder with the guide's scenarios/ (claims, capabilities, the scenario)."""
    devices.probe("cpu")  # the built-in probes, before a test patches torch
    pytester.makeini("[pytest]\nfilterwarnings =\n    error\n")
    write_guide_files(pytester.path, "scenarios/")
    return pytester


def run(team: pytest.Pytester, *args: str) -> pytest.RunResult:
    return team.runpytest_inprocess(
        "scenarios", *ARGS, f"--amp-reports={team.path / 'reports'}", "-rs", *args
    )


def records(team: pytest.Pytester) -> dict[str, dict]:
    lines = (team.path / "reports" / "journal.jsonl").read_text().splitlines()
    return {
        e["record"]["test"].split("::")[-1]: e["record"]
        for e in map(json.loads, lines)
        if e["type"] == "record"
    }


def test_the_guides_team_scenario_passes_and_a_capability_not_expected_here_skips(
    team, monkeypatch
):
    monkeypatch.setenv("CXX", str(team.path / "no-compiler"))  # a CPU without a C++ compiler
    result = run(team)
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(
        ["SKIPPED*needs torch.compile's inductor backend*not expected on cpu*"
         "C++ compiler: none on PATH*"]
    )  # fmt: skip
    kept = records(team)["test_bf16_sgd_reaches_fp32_loss"]
    (verdict,) = kept["verdicts"]
    assert verdict["verdict"] == "confirmed" and "SGD steps the loss is" in verdict["evidence"]
    assert kept["params"]["key_metrics"] == "loss_gap"
    assert kept["params"]["recipes"] == "fp32,bf16-params"


def test_a_team_capability_expected_here_and_lost_is_a_capability_regression(team, monkeypatch):
    """The negative control of the test above: the same files, with SGD's step a no-op, so the
    team's bf16_training probe sees no weight move: a failure at setup naming the capability,
    what the probe saw and the claim, never a skip."""
    monkeypatch.setenv("CXX", str(team.path / "no-compiler"))
    monkeypatch.setattr(torch.optim.SGD, "step", lambda self, closure=None: None)
    result = run(team)
    result.assert_outcomes(errors=1, skipped=1)
    result.stdout.fnmatch_lines(
        ["*capability regression: bfloat16 kernels to train a bfloat16 model*is expected on "
         "cpu*as torch 2.4 has bfloat16 CPU kernels*the probe says no: one SGD step moved 0 of "
         "16 bfloat16 weights*Claims of this test: TEAM-BF16-SGD*"]
    )  # fmt: skip
    regressed = records(team)["test_bf16_sgd_reaches_fp32_loss"]
    assert regressed["outcome"] == "capability-regression" and not regressed["verdicts"]


@pytest.mark.slow
def test_with_a_compiler_the_compiled_claim_runs_and_torchs_warning_stays_apart(team):
    """torch.compile for real (a subprocess: a compile in a nested in-process session would
    reuse this process's dynamo caches): both claims decided, and the warning torch.compile
    gives (torch.jit.script_method's deprecation) kept in its own field, not in the evidence."""
    result = team.runpytest_subprocess(
        "scenarios", "--amp-device=cpu", "--no-mlflow", "-p", "no:cacheprovider",
        f"--amp-reports={team.path / 'reports'}", timeout=600,
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    compiled = records(team)["test_compile_keeps_autocast_dtypes"]
    (verdict,) = compiled["verdicts"]
    assert verdict["verdict"] == "confirmed" and "warn" not in verdict["evidence"]
    if "torch_warnings" in compiled["params"]:  # torch releases differ in what they warn
        assert compiled["metrics"]["torch_warnings"] >= 1
