"""scenarios/test_speed.py can fail: break autocast, or the fp16 cast of the matmul's inputs, and
the scenario fails with an assertion that names the claim. The scenario times CUDA kernels, so
these tests run it on the GPU (--amp-device=cuda) and skip without one."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import assert_fails_naming

from harness.lab import devices

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs CUDA: scenarios/test_speed.py times GPU kernels and skips on the CPU",
)

MODULE = "test_speed.py"
ON_GPU = "--amp-device=cuda"  # after run_scenario's --amp-device=cpu: the last one counts
# The broken sweep is rerun at 100M alone: a broken autocast makes every arm strict fp32, and
# the 1B size would then cost a minute of the GPU check's five
# (tests/sensitivity/test_gpu_budget.py). At 100M an H200's AMP is ~5x strict fp32, so the
# prediction at the sweep's largest size fails there only because autocast is broken.
KEPT_SIZES = ("100M",)


class KeptSizes:
    """A pytest plugin that keeps the sizes KEPT_SIZES of the scenario's sweep."""

    def pytest_collection_modifyitems(self, items):
        for module in {item.module for item in items}:
            module.SIZES = tuple(s for s in module.SIZES if s.label in KEPT_SIZES)


@pytest.fixture
def gpu_probed():
    """Probe the GPU before a test patches torch, as run_scenario does for the CPU: a patch must
    reach the scenario's measurement, not the capability probe (a skip instead of a failure)."""
    devices.probe("cuda")


def test_module_passes_unpatched(run_scenario):
    run_scenario(MODULE, ON_GPU).assert_outcomes(passed=2)


def test_autocast_that_does_nothing_fails(run_scenario, monkeypatch, gpu_probed):
    # Every AMP step then runs in strict fp32: no speed-up at 1B, or at any size.
    monkeypatch.setattr(torch, "autocast", lambda *args, **kwargs: contextlib.nullcontext())
    result = run_scenario(MODULE, ON_GPU, "-k", "training_step", plugins=(KeptSizes(),))
    assert_fails_naming(result, "PIT4-ONLY-ABOVE-1B")


def test_fp16_cast_that_keeps_fp32_fails(run_scenario, monkeypatch, gpu_probed):
    # The "fp16" matmul then multiplies fp32 inputs, with TF32 off: no faster than fp32.
    monkeypatch.setattr(torch.Tensor, "half", lambda self, *args, **kwargs: self.float())
    result = run_scenario(MODULE, ON_GPU, "-k", "matmul")
    assert_fails_naming(result, "FMT-SPEED")
