"""scenarios/test_compiled_amp.py can fail: break what each claim says torch.compile keeps of
eager autocast (a compiled call that drops the ambient autocast, reuses the first call's dtype,
falls back to eager, flushes non-finite gradients, ...) and the scenario fails on an assertion
naming the claim; unbroken, the module passes.

Each break wraps torch.compile, so that it reaches the compiled arms alone and eager stays the
reference. The nested sessions measure the aot_eager arm only (the scenario's BACKENDS, shrunk
by the Toy plugin): it shows every claim's assertion as well, where inductor would add seconds
of C++ compilation per graph to every session.
"""

from __future__ import annotations

import contextlib
import json
import os

import pytest
import torch
from conftest import Toy, assert_failed_on, assert_fails_naming

MODULE = "test_compiled_amp.py"
AOT_ONLY = Toy(BACKENDS=("aot_eager",))
_compile, _autocast = torch.compile, torch.autocast


def _compile_wrapped(monkeypatch, wrap) -> None:
    """torch.compile whose result is `wrap(fn, compiled, kwargs)`: what the break makes of it."""

    def compile(fn, *args, **kwargs):
        return wrap(fn, _compile(fn, *args, **kwargs), kwargs)

    monkeypatch.setattr(torch, "compile", compile)


def _run(run_scenario, select: str):
    return run_scenario(MODULE, "-k", select, plugins=(AOT_ONLY,))


@pytest.mark.slow
def test_the_module_passes_unbroken(run_scenario):
    run_scenario(MODULE, plugins=(AOT_ONLY,)).assert_outcomes(passed=10)


@pytest.mark.slow
def test_a_compiled_call_that_drops_autocast_fails_the_dtypes(run_scenario, monkeypatch):
    def dropping(fn, compiled, kwargs):
        def call(*args):
            with _autocast("cpu", enabled=False):
                return compiled(*args)

        return call

    _compile_wrapped(monkeypatch, dropping)
    result = _run(run_scenario, "test_compiled_block_keeps_eager_dtypes and bfloat16")
    assert_fails_naming(result, "CMP-BLOCK-DTYPES")
    assert_failed_on(result, "*CMP-BLOCK-DTYPES: aot_eager: predicted as eager*output dtype*")


@pytest.mark.slow
def test_a_disabled_region_that_stays_in_autocast_fails_the_region(run_scenario, monkeypatch):
    """autocast(enabled=False) made a no-op: the region's Linears run in the outer region's
    dtype, in eager (the control) and compiled."""

    def autocast(device_type, dtype=None, enabled=True, cache_enabled=None):
        if not enabled:
            return contextlib.nullcontext()
        return _autocast(device_type, dtype=dtype, cache_enabled=cache_enabled)

    monkeypatch.setattr(torch, "autocast", autocast)
    result = _run(run_scenario, "test_disabled_region_computes_in_float32 and bfloat16")
    assert_fails_naming(result, "CMP-DISABLED-REGION")
    assert_failed_on(result, "*CMP-DISABLED-REGION: aot_eager: predicted float32 region outputs*")


@pytest.mark.slow
def test_a_compiled_call_that_keeps_its_first_dtype_fails_the_switch(run_scenario, monkeypatch):
    """The graph of the first call's autocast dtype served to every later call, as a guard
    blind to the autocast state would."""

    def first_dtype(fn, compiled, kwargs):
        seen = []

        def call(*args):
            seen.append(torch.get_autocast_dtype("cpu"))
            with _autocast("cpu", dtype=seen[0]):
                return compiled(*args)

        return call

    _compile_wrapped(monkeypatch, first_dtype)
    result = _run(run_scenario, "test_dtype_switch_recompiles")
    assert_fails_naming(result, "CMP-DTYPE-SWITCH")
    assert_failed_on(
        result, "*CMP-DTYPE-SWITCH: aot_eager: predicted a recompile*compiled: bfloat16*"
    )


@pytest.mark.slow
def test_a_compiled_call_falling_back_to_eager_fails_the_weight_cache(run_scenario, monkeypatch):
    """After its first call the compiled model runs eagerly (what dynamo does past its
    recompile limit): inside one long region, autocast's cache of the weights' casts is back."""

    def eager_after_first(fn, compiled, kwargs):
        calls = []

        def call(*args):
            calls.append(1)
            return (compiled if len(calls) == 1 else fn)(*args)

        return call

    _compile_wrapped(monkeypatch, eager_after_first)
    result = _run(run_scenario, "test_compiled_loop_in_one_region_sees_each_update and bfloat16")
    assert_fails_naming(result, "CMP-WEIGHT-CACHE")
    assert_failed_on(result, "*CMP-WEIGHT-CACHE: aot_eager: predicted each step's weights seen*")


def _on_gradients(change):
    """A compiled module whose parameters' gradients pass through `change` on their way out of
    the compiled backward (a hook on each parameter, put on when it is compiled)."""

    def wrap(fn, compiled, kwargs):
        if isinstance(fn, torch.nn.Module):
            for param in fn.parameters():
                param.register_hook(change)
        return compiled

    return wrap


@pytest.mark.slow
def test_a_compiled_backward_flushing_inf_and_nan_fails_the_scaler(run_scenario, monkeypatch):
    _compile_wrapped(monkeypatch, _on_gradients(lambda g: torch.nan_to_num(g, 0.0, 0.0, 0.0)))
    result = _run(run_scenario, "test_grad_scaler_skips_a_compiled_overflow")
    assert_fails_naming(result, "CMP-SCALER-SKIP")
    assert_failed_on(result, "*CMP-SCALER-SKIP: predicted a skip*aot_eager: inf: stepped*")


@pytest.mark.slow
def test_dynamic_shapes_losing_autocast_on_a_new_shape_fail(run_scenario, monkeypatch):
    """With dynamic=True, a call at a shape other than the first returns float32, as a graph
    traced for the new shape without autocast would (cast here: no second trace to wait for)."""

    def new_shape_in_float32(fn, compiled, kwargs):
        shapes = []

        def call(x):
            shapes.append(x.shape)
            outputs = compiled(x)
            if kwargs.get("dynamic") and x.shape != shapes[0]:
                return {name: out.float() for name, out in outputs.items()}
            return outputs

        return call

    _compile_wrapped(monkeypatch, new_shape_in_float32)
    result = _run(run_scenario, "test_dynamic_shapes_keep_eager_dtypes")
    assert_fails_naming(result, "CMP-DYNAMIC-SHAPES")
    assert_failed_on(result, "*CMP-DYNAMIC-SHAPES: aot_eager: predicted as eager*at (3, 6, 8)*")


@pytest.mark.slow
def test_a_compiled_backward_losing_its_gradients_fails_the_loss_curve(run_scenario, monkeypatch):
    _compile_wrapped(monkeypatch, _on_gradients(torch.zeros_like))
    result = _run(run_scenario, "test_compiled_training_follows_eager")
    assert_fails_naming(result, "CMP-LOSS-CURVE")
    assert_failed_on(result, "*CMP-LOSS-CURVE: predicted within fp32's spread: aot_eager: outside*")


class _CacheSeen:
    """A pytest plugin noting inductor's cache folder once the session's tests are collected
    (the variable is set when the session is configured; no test needs to run)."""

    def __init__(self):
        self.seen: list[str | None] = []

    def pytest_collection_finish(self, session):
        self.seen.append(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))


def test_the_session_keeps_inductors_cache_under_its_reports(run_scenario, pytester, monkeypatch):
    """Inductor's compiled kernels go to <reports>/inductor-cache for the session (a second
    session with that folder reuses them), and the environment is put back after it; a folder
    the user chose stands (torch's own default, which torch writes into the environment the
    first time it looks, is none)."""
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    cache = _CacheSeen()
    run_scenario(MODULE, "-k", "no_test_has_this_name", plugins=(cache,))
    assert cache.seen == [str(pytester.path / "reports" / "inductor-cache")]
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == before
    # The control: a folder the user set is left as it is.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(pytester.path / "users-cache"))
    chosen = _CacheSeen()
    run_scenario(MODULE, "-k", "no_test_has_this_name", plugins=(chosen,))
    assert chosen.seen == [str(pytester.path / "users-cache")]


@pytest.mark.slow
def test_an_arm_that_cannot_compile_records_its_own_outcome(run_scenario, pytester, monkeypatch):
    """aot_eager made to raise compiling: the test fails (a compile error nowhere predicted),
    and what it recorded is `cannot compile`, not a verdict on the claim."""

    def raising(fn, compiled, kwargs):
        def call(*args):
            raise RuntimeError("the backend failed to compile (broken by the test)")

        return call

    _compile_wrapped(monkeypatch, raising)
    result = _run(run_scenario, "test_compiled_block_keeps_eager_dtypes and bfloat16")
    assert_fails_naming(result, "CMP-BLOCK-DTYPES")
    assert_failed_on(result, "*CMP-BLOCK-DTYPES: aot_eager: raised RuntimeError: the backend fail*")
    journal = (pytester.path / "reports" / "journal.jsonl").read_text().splitlines()
    recorded = [v["verdict"] for line in journal if (entry := json.loads(line))["type"] == "record"
                for v in entry["record"]["verdicts"]]  # fmt: skip
    assert recorded == ["cannot compile"], recorded
