"""scenarios/test_norm_layers.py can fail: break the fp16 BatchNorm statistics overflow, or make
CPU autocast run layer_norm in fp32, and the scenario fails with an assertion naming the claim."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    Toy,
    assert_failed_on,
    assert_fails_naming,
    predict_as_before_every_change,
    promote_layer_norm,
)

MODULE = "test_norm_layers.py"


# For the BatchNorm sweep's negative controls only: the CNN trains one step (its 30 fp16 steps
# are most of the module's 8 s); the sweep's assertions come first and do not use it.
SHORT_CNN_TRAINING = Toy(TRAIN_STEPS=1)


# The sweep's first assertion, as it fails where a std's running_var misses its prediction.
SWEEP_FAILED = "*PIT2-NORM-HALF: std *: predicted running_var *, measured *"


@pytest.mark.slow
def test_module_passes_unpatched(run_scenario):
    run_scenario(MODULE).assert_outcomes(passed=2)


@pytest.mark.slow
def test_saturating_batchnorm_statistics_fail(run_scenario, monkeypatch):
    # _BatchNorm.forward calls F.batch_norm, which updates running_var in place: clamp the
    # update of fp16 statistics at fp16's largest value, so that it saturates instead of
    # becoming inf. Through .data, as the kernel's own update: autograd saved running_var for
    # the backward of training-mode batch_norm and refuses a tensor modified since.
    batch_norm = F.batch_norm

    def saturating(input, running_mean, running_var, *args, **kwargs):
        out = batch_norm(input, running_mean, running_var, *args, **kwargs)
        if running_var is not None and running_var.dtype == torch.float16:
            running_var.data.clamp_(max=torch.finfo(torch.float16).max)
        return out

    monkeypatch.setattr(F, "batch_norm", saturating)
    result = run_scenario(
        MODULE, "-k", "test_half_batchnorm_overflows", plugins=(SHORT_CNN_TRAINING,)
    )
    assert_fails_naming(result, "PIT2-NORM-HALF")
    assert_failed_on(result, SWEEP_FAILED)


def test_layer_norm_promoted_on_cpu_fails(run_scenario, monkeypatch):
    promote_layer_norm(monkeypatch)
    result = run_scenario(MODULE, "-k", "test_norm_accuracy_under_autocast")
    assert_fails_naming(result, "AMP-NORM-FP32")


@pytest.mark.slow
def test_a_release_predicted_to_overflow_early_fails_where_it_does_not(run_scenario, monkeypatch):
    # Told that this torch accumulates the batch variance in fp16 (torch < 2.6 on the CPU), the
    # scenario predicts inf at step 1 from std 47 and fails on a release that keeps it in fp32.
    predict_as_before_every_change(monkeypatch)
    result = run_scenario(
        MODULE, "-k", "test_half_batchnorm_overflows", plugins=(SHORT_CNN_TRAINING,)
    )
    assert_fails_naming(result, "PIT2-NORM-HALF")
    assert_failed_on(result, SWEEP_FAILED)


@pytest.mark.slow
def test_autocast_keeping_statistics_in_fp16_fails_the_control(run_scenario, monkeypatch):
    # The control's subject broken: under autocast an fp32 BatchNorm's running_var is held to
    # fp16's range (stored through fp16), so the autocast fix overflows as .half() does. The
    # .half() sweep is untouched: only the control's assertion can see it.
    batch_norm = F.batch_norm

    def statistics_through_fp16(input, running_mean, running_var, *args, **kwargs):
        out = batch_norm(input, running_mean, running_var, *args, **kwargs)
        autocast = torch.is_autocast_enabled(input.device.type)
        if autocast and running_var is not None and running_var.dtype == torch.float32:
            running_var.data.copy_(running_var.data.half().float())
        return out

    monkeypatch.setattr(F, "batch_norm", statistics_through_fp16)
    result = run_scenario(
        MODULE, "-k", "test_half_batchnorm_overflows", plugins=(SHORT_CNN_TRAINING,)
    )
    assert_fails_naming(result, "PIT2-NORM-HALF")
    assert_failed_on(result, "*PIT2-NORM-HALF: predicted finite fp32 statistics*")
