"""The truth benchmark of `amp-harness diagnose`: the quick look (8 steps) against what longer
training does (`--verify`), on the engineered failures and the harness's models of
tests/helpers/zoo.py (the transformers architectures are in scripts/diagnose-truth and
docs/diagnose.md's table: too slow for every CI run on 2 cores).

What must hold, whatever the model:
- no recipe that diverges within the horizon was called "safe";
- no "drifts" for a recipe that trains as fp32 does (inside fp32's own seed spread, either way);
- every fix the quick look says held also holds over the long run, each judged against fp32 with
  the fix's own optimizer change (AdamW's eps).
"""

from __future__ import annotations

import pytest
from helpers import zoo

from harness.lab import diagnose
from harness.lab.diagnose.verify import DIFFERS, DIVERGES, FINE, HARMED

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS, HORIZON = 8, 300


# Each model's diagnosis serves three tests: under `pytest -n 2 --dist loadgroup`, ungrouped,
# they went to both workers and both computed it (this file: 44 s of CPU, 29 s grouped). The
# group reaches the scheduler as a suffix of the test's node id, which pytest-xdist 3.8 writes
# to item._nodeid, where pytest 9 no longer reads it (item._id): the suite's conftest.py has to
# apply it for pytest 9, or no xdist_group takes effect.
@pytest.fixture(
    scope="module",
    params=[
        pytest.param(name, marks=pytest.mark.xdist_group(f"truth-{name}")) for name in zoo.FAST
    ],
)
def verified(request) -> diagnose.Diagnosis:
    return diagnose.diagnose(getattr(zoo, request.param), "cpu", steps=STEPS, verify=HORIZON)


@pytest.mark.slow
def test_no_recipe_that_diverges_within_the_horizon_was_called_safe(verified):
    for row in verified.verify["rows"]:
        if row["truth"] == DIVERGES:
            assert row["predicted"] != diagnose.SAFE, (verified.factory, row)


@pytest.mark.slow
def test_no_drift_alarm_for_a_recipe_that_trains_as_fp32_does(verified):
    for row in verified.verify["rows"]:
        if row["predicted"] == diagnose.DRIFTS:
            assert row["truth"] in (HARMED, DIFFERS, DIVERGES), (verified.factory, row)


@pytest.mark.slow
def test_every_fix_the_quick_look_says_held_holds_over_the_horizon(verified):
    long = {(fix["recipe"], fix["fix"]): fix for fix in verified.verify["fixes"]}
    for fix in long.values():  # the eps's own effect is not fp16's: fp32 with it is the reference
        assert fix["reference"] == ("fp32 with AdamW eps 0.0001" if "eps" in fix["fix"] else "fp32")
    for name, run in verified.runs.items():
        for check in run.fixes:
            if check.held and (name, check.fix) in long:
                assert long[name, check.fix]["truth"] == FINE, (verified.factory, check, long)


def test_the_engineered_failures_are_caught_and_the_healthy_model_is_not():
    """The benchmark's control: what each engineered model breaks, the quick look names."""
    found = {
        name: diagnose.diagnose(getattr(zoo, name), "cpu", steps=STEPS, names=[recipe])
        for name, recipe in (
            ("exp_forward", "amp-fp16"),
            ("raw_targets", "amp-fp16"),
            ("tiny_grad", "amp-fp16-noscaler"),
            ("healthy", "amp-fp16"),
        )
    }
    assert found["exp_forward"].runs["amp-fp16"].status == diagnose.KEEP_IN_FP32
    assert found["raw_targets"].runs["amp-fp16"].status == diagnose.UNSTABLE
    assert found["tiny_grad"].runs["amp-fp16-noscaler"].status == diagnose.NEEDS_SCALING
    assert found["healthy"].runs["amp-fp16"].status == diagnose.SAFE


def test_the_command_verifies_and_says_whether_each_prediction_held(tmp_path, capsys):
    from harness.cli import main

    code = main(["diagnose", "harness.lab.diagnose.examples:fragile", "--device", "cpu", "--steps",
                 "4", "--verify", "30", "--reports", str(tmp_path), "--no-mlflow"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "verified over 30 steps" in out
    assert "amp-fp16: said keep layers in fp32 or use bf16, diverges" in out
    assert "amp-bf16: said safe, trains as fp32" in out and "MISSED" not in out
    assert "fix amp-fp16 with amplifier in fp32: trains as fp32" in out and "the fix held" in out
