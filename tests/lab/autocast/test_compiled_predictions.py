"""scenarios/test_compiled_amp.py's predictions are derived from what the run and the machine
did, not from words or assumptions: a predicted failure to compile is any error compiling (not
one message); the flush-to-zero of 2.4's and 2.5's inductor is predicted from the C++
compiler's probed behaviour; a graph of the other dtype is blamed on Dynamo's guard or on the
AOTAutograd cache by what the run showed (a recompile or none, the cache on or off)."""

from __future__ import annotations

import pytest
from conftest import load_scenario

from harness.lab.autocast import torch_compile

amp = load_scenario("test_compiled_amp.py")


class _Cpu:
    type = "cpu"


@pytest.fixture
def before_every_change(monkeypatch):
    monkeypatch.setattr(amp, "_before", lambda change, device: True)


def test_a_predicted_failure_to_compile_is_held_by_behaviour_not_words(before_every_change):
    assert amp._raise_as_predicted(_Cpu, "inductor", "InductorError: assert vars1 == vars2") is None
    assert amp._raise_as_predicted(_Cpu, "inductor", "BackendCompilerFailed: other words") is None
    assert "got no error" in amp._raise_as_predicted(_Cpu, "inductor", "")


@pytest.mark.parametrize("links", [True, False, None])
def test_the_flush_is_predicted_from_the_compiler_probe(before_every_change, monkeypatch, links):
    monkeypatch.setattr(torch_compile, "fast_math_flushes", lambda: (links, "probed"))
    assert amp._predicted_flush(_Cpu, "inductor") is (links is True)
    assert amp._predicted_flush(_Cpu, "aot_eager") is False


@pytest.mark.parametrize("cache_on", [True, False])
def test_another_dtypes_graph_is_blamed_on_what_the_run_showed(monkeypatch, cache_on):
    monkeypatch.setattr(torch_compile, "autograd_cache_on", lambda: cache_on)
    assert "#112260" in amp._switch_cause(0)  # no recompile: Dynamo's missing guard
    blamed = amp._switch_cause(1)
    assert ("#181564" in blamed) is cache_on  # the cache is named only where it is on
    monkeypatch.setattr(amp, "_before", lambda change, device: change == amp.CACHE_KEYS_DTYPE)
    assert amp._may_serve_other("inductor") is cache_on
