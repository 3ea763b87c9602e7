"""scenarios/test_compiled_parity.py can fail: break what each test measures (a compiled call
that falls back to eager, a workaround that does nothing, a compiled overflow or rounding lost,
an AOTAutograd cache key without the autocast dtype, a cache that is never reached) and the
scenario fails on an assertion naming the claim; unbroken, its aot_eager arms pass.

The nested sessions measure the aot_eager arm where that shows the check (the scenario's
BACKENDS, shrunk by the Toy plugin); the cache key is inductor's, so its sessions compile with
inductor: a Linear, seconds.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import Toy, assert_failed_on, assert_fails_naming

from harness.lab.autocast import torch_compile

MODULE = "test_compiled_parity.py"
AOT_ONLY = Toy(BACKENDS=("aot_eager",))
_compile = torch.compile


def _compile_wrapped(monkeypatch, wrap) -> None:
    """torch.compile whose result is `wrap(fn, compiled)`: what the break makes of it."""

    def compile(fn, *args, **kwargs):
        return wrap(fn, _compile(fn, *args, **kwargs))

    monkeypatch.setattr(torch, "compile", compile)


def _run(run_scenario, select: str, plugins=(AOT_ONLY,)):
    return run_scenario(MODULE, "-k", select, plugins=plugins)


@pytest.mark.slow
def test_the_aot_eager_arms_pass_unbroken(run_scenario):
    run_scenario(MODULE, "-k", "not cache_key", plugins=(AOT_ONLY,)).assert_outcomes(passed=3)


@pytest.mark.slow
def test_a_compiled_call_falling_back_to_eager_fails_the_harm(run_scenario, monkeypatch):
    """The compiled model runs eagerly: its region's backward is float32 and no step skips."""
    _compile_wrapped(monkeypatch, lambda fn, compiled: fn)
    result = _run(run_scenario, "harm_under_grad_scaler")
    assert_fails_naming(result, "CMP-DISABLED-REGION")
    assert_failed_on(result, "*CMP-DISABLED-REGION: aot_eager: predicted steps skipped*")


@pytest.mark.slow
def test_a_workaround_that_does_nothing_fails_the_harm(run_scenario, monkeypatch):
    if not torch_compile.BACKWARD_OUTSIDE_AUTOCAST.available():
        pytest.skip(f"torch {torch.__version__} has no backward_pass_autocast to break")
    monkeypatch.setattr(torch_compile.Setting, "applied", lambda self: contextlib.nullcontext())
    result = _run(run_scenario, "harm_under_grad_scaler")
    assert_fails_naming(result, "CMP-DISABLED-REGION")
    assert_failed_on(result, "*aot_eager backward_pass_autocast off: predicted eager's steps*")


def _outputs_changed(name: str, change):
    """A compiled `name` function whose outputs pass through `change(args, outputs)`."""

    def wrap(fn, compiled):
        if getattr(fn, "__name__", "") != name:
            return compiled
        return lambda *args: change(args, compiled(*args))

    return wrap


@pytest.mark.slow
def test_a_compiled_overflow_kept_finite_fails_overflow_parity(run_scenario, monkeypatch):
    """What inductor does on every release here, done on aot_eager: the float32 value of the
    float16 product computed without the float16 overflow."""

    def finite(args, outputs):
        stored, _value, isinf = outputs
        return stored, args[0].float() * args[0].float(), torch.zeros_like(isinf)

    _compile_wrapped(monkeypatch, _outputs_changed("_overflow", finite))
    result = _run(run_scenario, "overflow")
    assert_fails_naming(result, "CMP-OVERFLOW-PARITY")
    assert_failed_on(result, "*CMP-OVERFLOW-PARITY: aot_eager: predicted eager's*")


@pytest.mark.slow
def test_a_compiled_rounding_elided_fails_rounding_parity(run_scenario, monkeypatch):
    def unrounded(args, outputs):
        return args[0].clone(), args[0] + args[1]

    _compile_wrapped(monkeypatch, _outputs_changed("_roundings", unrounded))
    result = _run(run_scenario, "rounding")
    assert_fails_naming(result, "CMP-ROUNDING-PARITY")
    assert_failed_on(result, "*CMP-ROUNDING-PARITY: aot_eager: predicted eager's*")


def _details():
    """AOTAutograd's cache details class, where its key records the autocast dtype (2.13 on)."""
    from torch._functorch._aot_autograd import autograd_cache

    details = autograd_cache.AOTAutogradCacheDetails
    if not hasattr(details, "_record_runtime_state"):
        pytest.skip(f"torch {torch.__version__}'s cache key records no autocast dtype to drop")
    return autograd_cache, details


@pytest.mark.slow
def test_a_cache_key_without_the_autocast_dtype_fails_the_switch(run_scenario, monkeypatch):
    """The key keeps whether autocast is on and drops its dtype (the key before
    pytorch/pytorch#181564): the float16 compile is served bfloat16's graph."""
    _module, details = _details()
    record_state = details._record_runtime_state

    def without_dtype(self, gm):
        record_state(self, gm)
        self.autocast_state = dict.fromkeys(self.autocast_state, True)

    monkeypatch.setattr(details, "_record_runtime_state", without_dtype)
    result = run_scenario(MODULE, "-k", "cache_key")
    assert_fails_naming(result, "CMP-DTYPE-SWITCH")
    assert_failed_on(
        result, "*CMP-DTYPE-SWITCH: as released: predicted a hit*float16 compile in float16*"
    )


@pytest.mark.slow
def test_a_cache_never_reached_fails_the_switch(run_scenario, monkeypatch):
    """Every graph bypasses the cache (what a graph holding an autocast region of its own does
    from 2.12 on): the test cannot see the key, and says so instead of passing."""
    module = pytest.importorskip("torch._functorch._aot_autograd.autograd_cache")
    if not hasattr(module, "check_cacheable"):
        pytest.skip(f"torch {torch.__version__} has no AOTAutograd cache check to break")

    def bypass(gm):
        raise module.BypassAOTAutogradCache("broken by the test")

    monkeypatch.setattr(module, "check_cacheable", bypass)
    result = run_scenario(MODULE, "-k", "cache_key")
    assert_fails_naming(result, "CMP-DTYPE-SWITCH")
    assert_failed_on(result, "*CMP-DTYPE-SWITCH: *: predicted a hit*got bfloat16 (*")
