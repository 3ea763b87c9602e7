"""The worked example of docs/writing-a-scenario.md ("A sensitivity test for your scenario"):
a team's sensitivity test, as the guide writes it, run on the guide's team scenario in a folder
outside harness/. It passes only if the scenario fails naming TEAM-BF16-SGD once bfloat16
updates are lost, and passes unbroken (the guide's own control)."""

from __future__ import annotations

import pytest
from helpers.team_guide import write_guide_files


@pytest.mark.slow  # a pytest of its own, importing torch, that runs the scenario twice
def test_the_guides_sensitivity_test_shows_the_team_scenario_can_fail(pytester):
    write_guide_files(pytester.path)
    result = pytester.runpytest_subprocess(
        "-p", "pytester", "-p", "no:cacheprovider", "tests/test_sensitivity_bf16_sgd.py",
        timeout=600,
    )  # fmt: skip
    result.assert_outcomes(passed=2)
