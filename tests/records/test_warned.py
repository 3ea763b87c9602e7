"""harness.records.warned: a warning torch gives while a scenario runs is recorded with the
scenario's verdicts (a metric and a param of their own, never the evidence), not fatal; any other
warning keeps the ini's filters, here tox.ini's "every warning is an error"."""

from __future__ import annotations

import json

SCENARIO = """
import warnings

import pytest
import torch.nn.functional


@pytest.mark.claim("FMT-BYTES")
def test_torch_warns(record):
    # As torch's C++ warnings arrive under a torch function (torch 2.5's "Applying the CPU mse
    # kernel on half-type tensors"): attributed to a module of the torch package.
    warnings.warn_explicit(
        "Applying the CPU mse kernel on half-type tensors", UserWarning,
        torch.nn.functional.__file__, 3384, module="torch.nn.functional",
    )
    record.verdict("FMT-BYTES", "confirmed", "2 bytes per fp16 value, 4 per fp32 value")


@pytest.mark.claim("FMT-BITS")
def test_own_warning(record):
    record.verdict("FMT-BITS", "confirmed", "1 sign bit, 5 exponent bits, 10 fraction bits")
    warnings.warn("the scenario's own warning", UserWarning)
"""


def test_a_torch_warning_is_recorded_and_any_other_stays_an_error(pytester):
    pytester.makeini("[pytest]\namp_scenarios = scenarios\nfilterwarnings =\n    error\n")
    pytester.makepyfile(**{"scenarios/test_warns": SCENARIO})
    result = pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "--amp-isolate=none",
        "-p", "no:cacheprovider", f"--amp-reports={pytester.path / 'reports'}",
    )  # fmt: skip
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*torch warned in *test_torch_warns (recorded with it*"])
    lines = (pytester.path / "reports" / "journal.jsonl").read_text().splitlines()
    records = {
        e["record"]["test"].split("::")[-1]: e["record"]
        for e in map(json.loads, lines)
        if e["type"] == "record"
    }
    kept = records["test_torch_warns"]
    assert kept["outcome"] == "passed" and kept["metrics"]["torch_warnings"] == 1
    assert kept["params"]["torch_warnings"] == (
        "UserWarning: Applying the CPU mse kernel on half-type tensors "
        "(torch/nn/functional.py:3384)"
    )
    (verdict,) = kept["verdicts"]
    evidence = verdict["evidence"]
    assert evidence == "2 bytes per fp16 value, 4 per fp32 value"  # the warning stays out of it
    own = records["test_own_warning"]
    assert own["outcome"] == "failed" and "the scenario's own warning" in own["message"]
    assert "torch_warnings" not in own["metrics"]
