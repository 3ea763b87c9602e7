"""scenarios/test_memory_speed.py can fail: make autocast do nothing and AMP's speed-up is gone;
make AdamW keep a third state tensor and the memory model no longer matches what training holds.
Either way the scenario fails with an assertion naming the claim. CUDA only, like the scenario,
except its static-bytes test of HDL-MEMORY, which runs (and is broken here) on the CPU."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import assert_failed_on, assert_fails_naming, half_in_larger_buffers

from harness.lab import devices

MODULE = "test_memory_speed.py"
CUDA = "--amp-device=cuda"  # run_scenario passes --amp-device=cpu first; the last one wins
# HDL-SPEED times the largest width; broken, every arm runs strict fp32, so the rerun times the
# 236M width instead of 875M (tests/sensitivity/test_gpu_budget.py), where AMP is still ~5x strict
# fp32 on an H200: the prediction fails there only because autocast is broken.
SPEED_WIDTHS = (1024, 2048)


class Widths:
    """A pytest plugin that sets the scenario's WIDTHS to SPEED_WIDTHS."""

    def pytest_collection_modifyitems(self, items):
        for module in {item.module for item in items}:
            module.WIDTHS = SPEED_WIDTHS


needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs CUDA: scenarios/test_memory_speed.py measures GPU peak memory and step times, "
    "and this machine has no GPU",
)


@pytest.fixture
def cuda_probed():
    # run_scenario probes only the CPU before the test patches torch; probe CUDA here too, so
    # that a patched torch.autocast reaches the measurement, not the capability probe (a skip).
    devices.probe("cuda")


@needs_cuda
def test_module_passes_unpatched(run_scenario, cuda_probed):
    run_scenario(MODULE, CUDA).assert_outcomes(passed=3)


@needs_cuda
def test_autocast_that_does_nothing_fails(run_scenario, monkeypatch, cuda_probed):
    # Every AMP arm then runs the fp32 step (TF32 off, as the AMP recipes set it): no speed-up.
    monkeypatch.setattr(torch, "autocast", lambda *args, **kwargs: contextlib.nullcontext())
    result = run_scenario(
        MODULE, CUDA, "-k", "test_amp_speedup_of_a_training_step", plugins=(Widths(),)
    )
    assert_fails_naming(result, "HDL-SPEED")


def _adamw_with_a_third_state(monkeypatch) -> None:
    """4 more bytes per fp32 parameter (2 per fp16 one) that the memory model does not count."""
    step = torch.optim.AdamW.step

    def step_keeping_a_third_state(self, closure=None):
        loss = step(self, closure)
        for group in self.param_groups:
            for p in group["params"]:
                if "extra" not in self.state[p]:
                    self.state[p]["extra"] = torch.zeros_like(p)
        return loss

    monkeypatch.setattr(torch.optim.AdamW, "step", step_keeping_a_third_state)


@needs_cuda
def test_adamw_with_a_third_state_tensor_fails(run_scenario, monkeypatch, cuda_probed):
    _adamw_with_a_third_state(monkeypatch)
    result = run_scenario(MODULE, CUDA, "-k", "test_memory_of_a_training_step")
    assert_fails_naming(result, "HDL-MEMORY")


@pytest.mark.slow
def test_static_bytes_on_the_cpu_fail_with_a_third_adamw_state(run_scenario, monkeypatch):
    # The CPU's share of HDL-MEMORY, the one a CPU session decides from, can fail too.
    _adamw_with_a_third_state(monkeypatch)
    result = run_scenario(MODULE, "-k", "test_static_memory_of_training_a_7b_model")
    assert_fails_naming(result, "HDL-MEMORY")


@pytest.mark.slow
def test_static_bytes_on_the_cpu_pass_unpatched(run_scenario):
    run_scenario(MODULE, "-k", "test_static_memory_of_training_a_7b_model").assert_outcomes(
        passed=1
    )


@pytest.mark.slow
def test_half_parameters_that_keep_a_larger_buffer_fail_the_static_control(
    run_scenario, monkeypatch
):
    # The control's subject: fp16 storage takes half the bytes. Here `half`'s parameters are
    # fp16 views of buffers twice their size, so dtype and shape look halved and the storages
    # do not: the control, which reads the storages, fails, with its own message.
    half_in_larger_buffers(monkeypatch)
    result = run_scenario(MODULE, "-k", "test_static_memory_of_training_a_7b_model")
    assert_fails_naming(result, "HDL-MEMORY")
    assert_failed_on(result, "*negative control: predicted `half` to halve*")
