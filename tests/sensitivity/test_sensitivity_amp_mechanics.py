"""scenarios/test_amp_mechanics.py can fail: break the PyTorch behaviour each of its tests checks
and the scenario fails with an assertion that names the claim."""

from __future__ import annotations

import contextlib
import functools
import json
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    assert_failed_on,
    assert_fails_naming,
    load_scenario,
    predict_as_before_every_change,
    promote_layer_norm,
)

MODULE = "test_amp_mechanics.py"


def test_module_passes_unpatched(run_scenario):
    run_scenario(MODULE).assert_outcomes(passed=7)


@pytest.mark.parametrize(
    ("test", "claim", "failed"),
    [
        ("test_forward_is_not_all_fp16", "AMP-FWD-FP16", 1),
        ("test_backward_follows_forward_dtype", "AMP-BWD-FP16", 1),  # backward matmuls in fp32
        ("test_autocast_picks_the_dtype_per_op", "AMP-AUTO-DTYPE", 2),  # float16 and bfloat16
    ],
)
def test_autocast_that_does_nothing_fails(run_scenario, monkeypatch, test, claim, failed):
    # Every op then runs in its input's dtype: no fp16 matmul, no per-op choice.
    monkeypatch.setattr(torch, "autocast", lambda *args, **kwargs: contextlib.nullcontext())
    assert_fails_naming(run_scenario(MODULE, "-k", test), claim, failed)


class _Fp32BackwardLinear(torch.autograd.Function):
    """A linear layer whose forward is autocast's (fp16 output) but whose backward computes its
    matmuls in fp32 and hands back gradients in the dtypes autograd expects: every activation
    gradient still has its output's dtype, only the arithmetic of backward has changed."""

    @staticmethod
    def forward(ctx, x, weight, bias, linear):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return linear(x, weight, bias)  # autocast applies: fp16 under fp16 autocast

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors  # 2-D: the scenario's probe model feeds (batch, features)
        g = grad.float()
        grad_x = (g @ weight.float()).to(x.dtype)
        grad_weight = (g.t() @ x.float()).to(weight.dtype)
        grad_bias = g.sum(0).to(weight.dtype) if ctx.has_bias else None
        return grad_x, grad_weight, grad_bias, None


def test_fp32_backward_behind_fp16_activations_fails(run_scenario, monkeypatch):
    # What the claim is about, broken alone: forward outputs and the gradients reaching them stay
    # fp16, .grad stays fp32, but backward's matmuls run in fp32. Only an observation of the
    # backward kernels can see it (the scenario's old check, gradient dtype == output dtype,
    # passed here).
    linear = F.linear
    monkeypatch.setattr(
        F, "linear", lambda x, w, b=None: _Fp32BackwardLinear.apply(x, w, b, linear)
    )
    result = run_scenario(MODULE, "-k", "test_backward_follows_forward_dtype")
    assert_fails_naming(result, "AMP-BWD-FP16")
    assert_failed_on(result, "*predicted every backward matmul on float16*")


def _half_inputs(_module, args):
    return tuple(a.half() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


def test_fp16_parameters_fail_backward(run_scenario, monkeypatch):
    # The model arrives with fp16 parameters, so their .grad is fp16 under autocast. It casts
    # its inputs to match, as the `half` recipe does, so that the scenario's run without
    # autocast (its control) still runs rather than stopping at a dtype mismatch.
    to = torch.nn.Module.to

    def to_half(self, *args, **kwargs):
        model = to(self, *args, **kwargs).half()
        model.register_forward_pre_hook(_half_inputs)
        return model

    monkeypatch.setattr(torch.nn.Module, "to", to_half)
    result = run_scenario(MODULE, "-k", "test_backward_follows_forward_dtype")
    assert_fails_naming(result, "AMP-BWD-FP16")


def test_optimizer_with_a_master_copy_fails(run_scenario, monkeypatch):
    # An apex-O2-style optimizer: it keeps an fp32 copy of every weight in its state.
    step = torch.optim.SGD.step

    def step_keeping_a_master_copy(self, closure=None):
        loss = step(self, closure)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["master"] = p.detach().float().clone()
        return loss

    monkeypatch.setattr(torch.optim.SGD, "step", step_keeping_a_master_copy)
    result = run_scenario(MODULE, "-k", "test_fp32_parameters_are_the_only_copy")
    assert_fails_naming(result, "AMP-MASTER-FP32")


def test_layer_norm_promoted_on_cpu_fails(run_scenario, monkeypatch):
    promote_layer_norm(monkeypatch)
    result = run_scenario(MODULE, "-k", "test_norms_under_fp16_autocast")
    assert_fails_naming(result, "AMP-NORM-FP32")


def test_torch_cuda_amp_without_deprecation_fails(run_scenario, monkeypatch):
    # The article's API as it was before torch 2.4: the same objects, no FutureWarning.
    monkeypatch.setattr(torch.cuda.amp, "autocast", functools.partial(torch.autocast, "cuda"))
    monkeypatch.setattr(
        torch.cuda.amp, "GradScaler", functools.partial(torch.amp.GradScaler, "cuda")
    )
    result = run_scenario(MODULE, "-k", "test_article_api_is_deprecated")
    assert_fails_naming(result, "API-DEPRECATED")


def test_rms_norm_promoted_on_cpu_fails(run_scenario, monkeypatch):
    # CPU autocast running rms_norm as CUDA's does from torch 2.12: an fp32 output.
    rms_norm = F.rms_norm

    def promoted(x, *args, **kwargs):
        x = x.float() if torch.is_autocast_enabled(x.device.type) else x
        return rms_norm(x, *args, **kwargs)

    monkeypatch.setattr(F, "rms_norm", promoted)
    result = run_scenario(MODULE, "-k", "test_norms_under_fp16_autocast")
    assert_fails_naming(result, "AMP-NORM-FP32")


def test_rms_norm_predicted_as_before_torch_2_7_fails(run_scenario, monkeypatch):
    # Told that this torch's nn.RMSNorm promotes fp16 input times fp32 weight to float32
    # (torch < 2.7), the scenario fails on a release that returns float16.
    predict_as_before_every_change(monkeypatch)
    result = run_scenario(MODULE, "-k", "test_norms_under_fp16_autocast")
    assert_fails_naming(result, "AMP-NORM-FP32")


def test_a_torch_without_torch_cuda_amp_fails_recording_the_api_gone(
    run_scenario, monkeypatch, pytester
):
    # The removal the FutureWarning announces is a change across releases: predicted on none
    # yet, it fails (never a pass on any release), and the verdict it measured is kept.
    # torch.amp.GradScaler itself still uses torch.cuda.amp.common: the public names go.
    monkeypatch.delattr(torch.cuda.amp, "autocast")
    monkeypatch.delattr(torch.cuda.amp, "GradScaler")
    result = run_scenario(MODULE, "-k", "test_article_api_is_deprecated")
    assert_fails_naming(result, "API-DEPRECATED")
    assert_failed_on(result, "*predicted the article's torch.cuda.amp*removed them*")
    journal = (pytester.path / "reports" / "journal.jsonl").read_text().splitlines()
    (record,) = [e["record"] for e in map(json.loads, journal) if e["type"] == "record"]
    (verdict,) = record["verdicts"]
    assert (verdict["claim"], verdict["verdict"]) == ("API-DEPRECATED", "refuted")
    assert verdict["evidence"].startswith("the article's API is gone: torch ")
    assert record["params"]["article_api"].startswith("removed in torch")


CURRENT_API_CONTROL = "*API-DEPRECATED: predicted no FutureWarning from the current API*"


def test_a_capture_that_hears_no_warning_fails_the_control(run_scenario, monkeypatch):
    # "No FutureWarning from the current API" held whenever the capture heard nothing at all;
    # now the control's own assertion fails on a capture that is deaf.
    monkeypatch.setattr(warnings, "warn", lambda *args, **kwargs: None)
    result = run_scenario(MODULE, "-k", "test_article_api_is_deprecated")
    assert_fails_naming(result, "API-DEPRECATED")
    assert_failed_on(result, CURRENT_API_CONTROL + "heard ours: False*")


def test_a_current_api_that_warns_fails_the_control(run_scenario, monkeypatch):
    # The control's subject broken: torch.autocast deprecated as the article's API is.
    autocast = torch.autocast

    def warning_autocast(*args, **kwargs):
        warnings.warn("torch.autocast is deprecated", FutureWarning, stacklevel=2)
        return autocast(*args, **kwargs)

    monkeypatch.setattr(torch, "autocast", warning_autocast)
    result = run_scenario(MODULE, "-k", "test_article_api_is_deprecated")
    assert_fails_naming(result, "API-DEPRECATED")
    assert_failed_on(result, CURRENT_API_CONTROL + "torch.autocast is deprecated*")


@pytest.mark.parametrize(
    ("device", "version", "predicted"),
    [
        ("cuda", "2.12.0", torch.float32),  # on CUDA autocast's fp32 list
        ("cuda", "2.14.1+cu130", torch.float32),
        ("cuda", "2.9.1+cu128", torch.float16),  # no list: the mixed-dtype rule, as on the CPU
        ("cuda", "2.5.1+cu124", torch.float32),
        ("cpu", "2.13.0+cpu", torch.float16),
        ("cpu", "2.4.1+cu121", torch.float32),
    ],
)
def test_the_rms_norm_output_is_predicted_on_cuda_too(device, version, predicted):
    # Recorded on CUDA but never asserted before: the GPU rule, checked here on the CPU.
    scenario = load_scenario(MODULE)
    assert scenario._rms_norm_predicted(device, version) == predicted


def test_a_half_that_keeps_batch_norm_in_fp32_fails_the_control(run_scenario, monkeypatch):
    # The control's subject broken: .half() leaves BatchNorm in fp32 (apex's
    # keep_batchnorm_fp32), so its statistics are as exact as autocast's. Only the control's
    # measurement of their precision can see it: the dtypes autocast gives are unchanged.
    apply = torch.nn.BatchNorm1d._apply

    def keeping_fp32(self, fn, *args, **kwargs):
        if fn(torch.zeros(1)).dtype == torch.float16:
            return self
        return apply(self, fn, *args, **kwargs)

    monkeypatch.setattr(torch.nn.BatchNorm1d, "_apply", keeping_fp32)
    result = run_scenario(MODULE, "-k", "test_norms_under_fp16_autocast")
    assert_fails_naming(result, "AMP-NORM-FP32")
    assert_failed_on(result, "*predicted a .half() BatchNorm's running_var off the exact*")
