"""scenarios/test_distributed.py can fail: faults installed inside the spawned ranks break
DDP's default communication dtype, the fp16 hook's compression, the all-reduce itself, the
`no_sync` control and the fp16 underflow, and the matching scenario test fails with an
assertion naming its claim."""

from __future__ import annotations

import pytest
from conftest import assert_fails_naming

from harness.distributed import SETUP_ENV

MODULE = "test_distributed.py"


def test_the_module_passes_unfaulted(run_scenario):
    # world size 2 only: `pytest scenarios/` runs both sizes anyway
    run_scenario(MODULE, "-k", "world2 or nccl").assert_outcomes(passed=4, skipped=1)


# (fault, the scenario tests it should fail, the claim, what each failure says it predicted)
FAULTS = [
    # fp16 everywhere: both PIT3-FP16-SYNC probes see it (the bucket dtype and the signature;
    # the values an fp16 sync flushes).
    (
        "ddp_fp16_by_default",
        "(default_ddp or fp16_hook) and world2",
        "PIT3-FP16-SYNC",
        ["predicted fp32 buckets", "predicted default DDP to deliver"],
    ),
    # The negative control of the flush probe: an fp16 hook that flushes nothing.
    ("fp16_hook_in_fp32", "fp16_hook and world2", "PIT3-FP16-SYNC", ["flush at <="]),
    # No all-reduce: rank 0 keeps its zeros after the "sync".
    ("ddp_without_allreduce", "zero and world2", "PIT3-ZERO-ALL", ["after the sync"]),
    # The control itself: no_sync that syncs leaves no rank with its own zeros.
    ("no_sync_that_syncs", "zero and world2", "PIT3-ZERO-ALL", ["without the sync"]),
    # No fp16 in backward: rank 0's gradient does not underflow, the claim's premise is gone.
    ("autocast_that_does_nothing", "zero and world2", "PIT3-ZERO-ALL", ["without the sync"]),
]


@pytest.mark.parametrize(("fault", "test", "claim", "says"), FAULTS, ids=[f[0] for f in FAULTS])
def test_a_fault_in_the_ranks_fails_the_scenario(
    run_scenario, monkeypatch, fault, test, claim, says
):
    monkeypatch.setenv(SETUP_ENV, f"rank_faults:{fault}")
    result = run_scenario(MODULE, "-k", test)
    assert_fails_naming(result, claim, failed=len(says))
    errors = [line for line in result.outlines if line.startswith("E ")]
    for words in says:  # each test failed on the prediction this fault breaks
        assert any(f"{claim}: predicted" in e and words in e for e in errors), (words, errors)
