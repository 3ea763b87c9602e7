"""scenarios/test_distributed.py can fail: faults installed inside the spawned ranks break
DDP's default communication dtype and the fp16 hook's compression, and the matching scenario
test fails with an assertion naming its claim."""

from __future__ import annotations

import pytest
from conftest import assert_fails_naming

from harness.distributed import SETUP_ENV

MODULE = "test_distributed.py"


def test_the_module_passes_unfaulted(run_scenario):
    # world size 2 only: `pytest scenarios/` runs both sizes anyway
    run_scenario(MODULE, "-k", "world2 or nccl").assert_outcomes(passed=4, skipped=1)


@pytest.mark.parametrize(
    ("fault", "test", "claim"),
    [
        ("ddp_fp16_by_default", "default_ddp and world2", "PIT3-FP16-SYNC"),
        ("fp16_hook_in_fp32", "fp16_hook and world2", "PIT3-ZERO-ALL"),
    ],
)
def test_a_fault_in_the_ranks_fails_the_scenario(run_scenario, monkeypatch, fault, test, claim):
    monkeypatch.setenv(SETUP_ENV, f"rank_faults:{fault}")
    assert_fails_naming(run_scenario(MODULE, "-k", test), claim)
