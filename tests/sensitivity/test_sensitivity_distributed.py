"""scenarios/test_distributed.py can fail: faults installed inside the spawned ranks break
DDP's default communication dtype, the fp16 hook's compression, the all-reduce itself, the
`no_sync` control and the fp16 underflow, and the matching scenario test fails with an
assertion naming its claim."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import assert_failed_on, assert_fails_naming

from harness.lab.distributed import SETUP_ENV

MODULE = "test_distributed.py"


@pytest.mark.slow
def test_the_module_passes_unfaulted(run_scenario):
    # world size 2 only: `pytest scenarios/` runs both sizes anyway
    run_scenario(MODULE, "-k", "world2 or nccl").assert_outcomes(passed=5, skipped=1)


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


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "test", "claim", "says"), FAULTS, ids=[f[0] for f in FAULTS])
def test_a_fault_in_the_ranks_fails_the_scenario(
    run_scenario, monkeypatch, fault, test, claim, says
):
    monkeypatch.setenv(SETUP_ENV, f"helpers.rank_faults:{fault}")
    result = run_scenario(MODULE, "-k", test)
    assert_fails_naming(result, claim, failed=len(says))
    errors = [line for line in result.outlines if line.startswith("E ")]
    for words in says:  # each test failed on the prediction this fault breaks
        assert any(f"{claim}: predicted" in e and words in e for e in errors), (words, errors)


def sharded_scaler_without_sync() -> None:
    """A rank fault (AMP_HARNESS_RANK_SETUP=test_sensitivity_distributed:...): each rank decides
    on inf from its own gradient shard alone. Under FSDP2 the found-inf flag is synchronised
    twice, and both go: ShardedGradScaler's all-reduce, and DTensor's handler of the inf check
    (private: where a torch moves it, this fault raises in the ranks and the test fails)."""
    from torch.distributed.fsdp import sharded_grad_scaler
    from torch.distributed.tensor import DTensor

    done = SimpleNamespace(wait=lambda: None)
    sharded_grad_scaler.dist = SimpleNamespace(all_reduce=lambda *_args, **_kwargs: done)

    def check_local_shard_only(op_call, args, kwargs):
        grads, *rest = args
        op_call([grad.to_local() for grad in grads], *rest, **kwargs)

    op = torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default
    handlers = DTensor._op_dispatcher._custom_op_handlers
    assert op in handlers, "DTensor no longer handles the inf check here: update this fault"
    handlers[op] = check_local_shard_only


@pytest.mark.slow
def test_an_fsdp2_scaler_deciding_alone_fails_the_scenario(run_scenario, monkeypatch):
    # Rank 1 skips its poisoned shard and every other rank steps: the ranks diverge.
    monkeypatch.setenv(SETUP_ENV, f"{__name__}:sharded_scaler_without_sync")
    result = run_scenario(MODULE, "-k", "fsdp2 and world2")
    assert_fails_naming(result, "PIT3-CHECK-BEFORE-STEP")
    assert_failed_on(result, "*predicted every FSDP2 rank to skip*")


def fully_shard_that_breaks() -> None:
    """A rank fault: FSDP2 present but broken, as torch 2.6's is on CPU ranks."""
    from torch.distributed import fsdp

    def broken(*_args, **_kwargs):
        raise AttributeError("'Stream' object has no attribute 'record_event'")

    fsdp.fully_shard = broken


@pytest.mark.slow
def test_a_broken_fsdp2_fails_its_test_alone(run_scenario, monkeypatch):
    # Present but broken is a failure, not a skip, and the launch's other experiments still get
    # their verdicts: only the FSDP2 test fails.
    monkeypatch.setenv(SETUP_ENV, f"{__name__}:fully_shard_that_breaks")
    result = run_scenario(MODULE, "-k", "world2")
    assert_fails_naming(result, "PIT3-CHECK-BEFORE-STEP", passed=4)  # the other experiments
    assert_failed_on(result, "*FSDP2 fully_shard failed: rank 0: AttributeError*record_event*")


def fsdp2_without_its_names() -> None:
    """A rank fault: FSDP2's public names gone from the ranks' torch, as an install that lost
    them would be. The test process keeps them, so only the ranks' own probe can tell."""
    from torch.distributed import fsdp
    from torch.distributed.fsdp import sharded_grad_scaler

    del fsdp.fully_shard, fsdp.MixedPrecisionPolicy
    del sharded_grad_scaler.ShardedGradScaler


@pytest.mark.slow
def test_fsdp2_lost_in_the_ranks_is_a_capability_regression(run_scenario, monkeypatch, pytester):
    # On a torch the table expects FSDP2 on CPU ranks (2.7 on), missing names are a failure
    # recorded as a capability regression, never a skip whose "decided beats skipped" verdict
    # would leave PIT3-CHECK-BEFORE-STEP standing on the other tests.
    monkeypatch.setenv(SETUP_ENV, f"{__name__}:fsdp2_without_its_names")
    result = run_scenario(MODULE, "-k", "fsdp2 and world2")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*CapabilityRegression: capability regression: FSDP2*expected on cpu*ImportError*"]
    )
    lines = (pytester.path / "reports" / "journal.jsonl").read_text().splitlines()
    (record,) = [e["record"] for e in map(json.loads, lines) if e["type"] == "record"]
    assert record["outcome"] == "capability-regression", record
