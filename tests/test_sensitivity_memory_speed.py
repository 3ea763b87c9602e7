"""scenarios/test_memory_speed.py can fail: make autocast do nothing and AMP's speed-up is gone;
make AdamW keep a third state tensor and the memory model no longer matches what training holds.
Either way the scenario fails with an assertion naming the claim. CUDA only, like the scenario."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import assert_fails_naming

from harness import devices

MODULE = "test_memory_speed.py"
CUDA = "--amp-device=cuda"  # run_scenario passes --amp-device=cpu first; the last one wins

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs CUDA: scenarios/test_memory_speed.py measures GPU peak memory and step times, "
    "and this machine has no GPU",
)


@pytest.fixture(autouse=True)
def cuda_probed():
    # run_scenario probes only the CPU before the test patches torch; probe CUDA here too, so
    # that a patched torch.autocast reaches the measurement, not the capability probe (a skip).
    devices.probe("cuda")


def test_module_passes_unpatched(run_scenario):
    run_scenario(MODULE, CUDA).assert_outcomes(passed=2)


def test_autocast_that_does_nothing_fails(run_scenario, monkeypatch):
    # Every AMP arm then runs the fp32 step (TF32 off, as the AMP recipes set it): no speed-up.
    monkeypatch.setattr(torch, "autocast", lambda *args, **kwargs: contextlib.nullcontext())
    result = run_scenario(MODULE, CUDA, "-k", "test_amp_speedup_of_a_training_step")
    assert_fails_naming(result, "HDL-SPEED")


def test_adamw_with_a_third_state_tensor_fails(run_scenario, monkeypatch):
    # 4 more bytes per fp32 parameter (2 per fp16 one) that the memory model does not count.
    step = torch.optim.AdamW.step

    def step_keeping_a_third_state(self, closure=None):
        loss = step(self, closure)
        for group in self.param_groups:
            for p in group["params"]:
                if "extra" not in self.state[p]:
                    self.state[p]["extra"] = torch.zeros_like(p)
        return loss

    monkeypatch.setattr(torch.optim.AdamW, "step", step_keeping_a_third_state)
    result = run_scenario(MODULE, CUDA, "-k", "test_memory_of_a_training_step")
    assert_fails_naming(result, "HDL-MEMORY")
