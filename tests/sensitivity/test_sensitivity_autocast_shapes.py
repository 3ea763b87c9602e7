"""scenarios/test_autocast_shapes.py can fail: break autocast in one shape of a training loop or
of nested regions, and the scenario fails with an assertion that names the claim and that
shape, while the other shapes still hold (the failure does not name them)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_failed_on, assert_fails_naming

MODULE = "test_autocast_shapes.py"
LOOP_TEST = "test_each_step_sees_the_update and bfloat16"
BLOCK_TEST = "test_disabled_block_inside_a_region and bfloat16"
SWITCH_TEST = "test_dtype_switch_inside_a_region"

LOOP_SHAPES = {  # each loop shape's name in the scenario's messages
    "per step": "in a region per step:",
    "one region": "in one region around the loop:",
    "inside a region": "in a region per step inside an outer region:",
    "inside a disabled region": "in a region per step inside autocast(enabled=False):",
    "control": "control:",
}
SWITCH_SHAPES = {
    "fresh ops": "a matmul before, inside and after the switch: predicted",
    "before and inside": "a layer run before the switch and inside it: predicted",
    "inside and after": "a layer run inside the switch and after it: predicted",
}


@pytest.fixture(autouse=True)
def no_cached_casts():
    """A break may keep autocast's cache past its regions: empty it once the patch is undone
    (this fixture is set up before monkeypatch, so torn down after it)."""
    yield
    torch.clear_autocast_cache()


def assert_fails_naming_only(result, claim: str, named: list[str], shapes: dict[str, str]):
    """The run failed on `claim`'s assertion naming each shape in `named`, and no other."""
    assert_fails_naming(result, claim)
    errors = "\n".join(line for line in result.outlines if line.startswith("E "))
    for shape, text in shapes.items():
        assert (text in errors) == (shape in named), (shape, errors)


def test_module_passes_unpatched(run_scenario):
    run_scenario(MODULE).assert_outcomes(passed=5)


# --- the weight-cast cache across training steps -------------------------------------------


def test_a_cache_never_cleared_fails_the_per_step_region(run_scenario, monkeypatch):
    # The region's exit clears nothing: each step's forward is given the first step's copies.
    monkeypatch.setattr(torch, "clear_autocast_cache", lambda: None)
    result = run_scenario(MODULE, "-k", LOOP_TEST)
    assert_fails_naming_only(result, "AMP-MASTER-FP32", ["per step"], LOOP_SHAPES)


class _OutermostRegionUncached(torch.autocast):
    """The outermost region never caches, inner regions do unless told not to (by default a
    region takes the setting in force where it is made: here the outermost's): a torch that
    would not cache where backward and the update run inside the region."""

    depth = 0

    def __init__(self, *args, cache_enabled=None, **kwargs):
        super().__init__(*args, cache_enabled=cache_enabled, **kwargs)
        self.asked = cache_enabled

    def __enter__(self):
        self._cache_enabled = _OutermostRegionUncached.depth > 0 and self.asked is not False
        _OutermostRegionUncached.depth += 1
        return super().__enter__()

    def __exit__(self, *exc):
        _OutermostRegionUncached.depth -= 1
        return super().__exit__(*exc)


def test_an_uncached_outermost_region_fails_the_long_region(run_scenario, monkeypatch):
    monkeypatch.setattr(torch, "autocast", _OutermostRegionUncached)
    result = run_scenario(MODULE, "-k", LOOP_TEST)
    assert_fails_naming_only(result, "AMP-MASTER-FP32", ["one region"], LOOP_SHAPES)


class _InnerExitClears(torch.autocast):
    """An inner region's exit back into an enabled region clears the cache, as the outermost
    region's exit does: the other answer to "does an inner exit clear the outer's cache?"."""

    def __exit__(self, *exc):
        suppressed = super().__exit__(*exc)
        if torch.is_autocast_enabled(self.device):
            torch.clear_autocast_cache()
        return suppressed


def test_an_inner_exit_that_clears_fails_the_nested_region(run_scenario, monkeypatch):
    monkeypatch.setattr(torch, "autocast", _InnerExitClears)
    result = run_scenario(MODULE, "-k", LOOP_TEST)
    assert_fails_naming_only(result, "AMP-MASTER-FP32", ["inside a region"], LOOP_SHAPES)


class _DisabledRegionUncounted(torch.autocast):
    """An autocast(enabled=False) region is not counted as a region: the exit of a region
    inside it is the outermost exit, and clears the cache."""

    def __enter__(self):
        entered = super().__enter__()
        if not self._enabled:
            torch.autocast_decrement_nesting()
        return entered

    def __exit__(self, *exc):
        if not self._enabled:
            torch.autocast_increment_nesting()
        return super().__exit__(*exc)


def test_an_uncounted_disabled_region_fails_the_region_inside_it(run_scenario, monkeypatch):
    monkeypatch.setattr(torch, "autocast", _DisabledRegionUncounted)
    result = run_scenario(MODULE, "-k", LOOP_TEST)
    assert_fails_naming_only(result, "AMP-MASTER-FP32", ["inside a disabled region"], LOOP_SHAPES)


class _CacheAlways(torch.autocast):
    """cache_enabled=False ignored: the controls' fix does nothing."""

    def __init__(self, *args, cache_enabled=None, **kwargs):
        super().__init__(*args, **kwargs)


def test_a_cache_that_cannot_be_disabled_fails_both_controls(run_scenario, monkeypatch):
    monkeypatch.setattr(torch, "autocast", _CacheAlways)
    result = run_scenario(MODULE, "-k", f"{LOOP_TEST} or {SWITCH_TEST}")
    assert_fails_naming(result, "AMP-MASTER-FP32", failed=2)
    assert_fails_naming(result, "AMP-AUTO-DTYPE", failed=2)
    assert_failed_on(result, "*AMP-MASTER-FP32: control: predicted every forward sees the upd*")
    assert_failed_on(result, "*AMP-AUTO-DTYPE: control: predicted every op in its region's*")


# --- an autocast(enabled=False) block inside a region ---------------------------------------

BLOCK_SHAPES = {
    "forward": "the block's forward: predicted",
    "backward": "backward through the block: predicted",
    "control": "control:",
}


class _EnabledAlways(torch.autocast):
    """enabled=False ignored: the block lowers its ops as the region around it does."""

    def __init__(self, *args, enabled=True, **kwargs):
        super().__init__(*args, enabled=True, **kwargs)


def test_an_autocast_that_cannot_be_disabled_fails_the_block(run_scenario, monkeypatch):
    monkeypatch.setattr(torch, "autocast", _EnabledAlways)
    result = run_scenario(MODULE, "-k", BLOCK_TEST)
    assert_fails_naming_only(result, "AMP-AUTO-DTYPE", ["forward", "backward"], BLOCK_SHAPES)


class _DisabledUntilTheRegionEnds(torch.autocast):
    """A disabled block's exit leaves autocast off: the region's choice is not back after it."""

    def __exit__(self, *exc):
        suppressed = super().__exit__(*exc)
        if not self._enabled:
            torch.set_autocast_enabled(self.device, False)
        return suppressed


def test_a_region_not_restored_after_the_block_fails_its_forward(run_scenario, monkeypatch):
    monkeypatch.setattr(torch, "autocast", _DisabledUntilTheRegionEnds)
    result = run_scenario(MODULE, "-k", BLOCK_TEST)
    assert_fails_naming_only(result, "AMP-AUTO-DTYPE", ["forward"], BLOCK_SHAPES)


class _CastDroppingTheGradient(torch.autograd.Function):
    """A cast to float32 whose backward hands back zeros: nothing flows through it."""

    @staticmethod
    def forward(ctx, x):
        ctx.dtype = x.dtype
        return x.to(torch.float32)

    @staticmethod
    def backward(ctx, grad):
        return torch.zeros_like(grad, dtype=ctx.dtype)


def test_a_gradient_stopped_at_the_block_fails_its_backward(run_scenario, monkeypatch):
    # The cast at the block's entry (`.float()` of the region's low output) passes no gradient
    # back: the dtypes of the forward, and the matmuls of backward, are unchanged.
    to_float = torch.Tensor.float

    def dropping(self, *args, **kwargs):
        if self.requires_grad and self.dtype in (torch.float16, torch.bfloat16):
            return _CastDroppingTheGradient.apply(self)
        return to_float(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "float", dropping)
    result = run_scenario(MODULE, "-k", BLOCK_TEST)
    assert_fails_naming_only(result, "AMP-AUTO-DTYPE", ["backward"], BLOCK_SHAPES)
    assert_failed_on(result, "*off by 1*")


# --- a dtype switch inside a region ---------------------------------------------------------


class _InnerDtypeIgnored(torch.autocast):
    """A region entered inside an enabled one keeps the enclosing region's dtype."""

    def __enter__(self):
        if torch.is_autocast_enabled(self.device):
            self.fast_dtype = torch.get_autocast_dtype(self.device)
        return super().__enter__()


def test_an_ignored_inner_dtype_fails_the_switch(run_scenario, monkeypatch):
    # Every shape of the switch rests on the inner dtype: the layers then run in float16 on
    # both sides and raise nothing, which their prediction names too.
    monkeypatch.setattr(torch, "autocast", _InnerDtypeIgnored)
    result = run_scenario(MODULE, "-k", SWITCH_TEST)
    assert_fails_naming_only(result, "AMP-AUTO-DTYPE", list(SWITCH_SHAPES), SWITCH_SHAPES)
    assert_failed_on(result, "*switch: predicted float16 / bfloat16 / float16, got float16 / fl*")


def _cache_cleared_at_a_switch(when: str) -> type[torch.autocast]:
    """An autocast that empties the cache on entering (`when` "enter") or leaving ("exit") a
    region whose dtype differs from the enabled region around it: a cache that looks at the
    dtype, at that side of the switch."""

    class ClearedAtASwitch(torch.autocast):
        def __enter__(self):
            device = self.device
            enclosing = torch.get_autocast_dtype(device)
            self.switches = torch.is_autocast_enabled(device) and enclosing != self.fast_dtype
            if when == "enter" and self.switches:
                torch.clear_autocast_cache()
            return super().__enter__()

        def __exit__(self, *exc):
            suppressed = super().__exit__(*exc)
            if when == "exit" and self.switches:
                torch.clear_autocast_cache()
            return suppressed

    return ClearedAtASwitch


@pytest.mark.parametrize(
    ("when", "shape"), [("enter", "before and inside"), ("exit", "inside and after")]
)
def test_a_cache_cleared_at_the_switch_fails_the_layer_shape(
    run_scenario, monkeypatch, when, shape
):
    monkeypatch.setattr(torch, "autocast", _cache_cleared_at_a_switch(when))
    result = run_scenario(MODULE, "-k", SWITCH_TEST)
    assert_fails_naming_only(result, "AMP-AUTO-DTYPE", [shape], SWITCH_SHAPES)
