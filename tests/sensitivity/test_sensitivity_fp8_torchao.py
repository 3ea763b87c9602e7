"""scenarios/test_fp8_torchao.py can fail: a compiled Float8Linear that strays from eager fails
FP8-TORCHAO-COMPILED naming the arm, and an FP8 model that rounds nothing fails its control.
Needs torchao (the dev extra installs it); aot_eager only, where a case does not need inductor."""

from __future__ import annotations

import pytest
from conftest import Toy, assert_fails_naming

from harness.lab import devices
from harness.lab.autocast import torch_compile

MODULE = "test_fp8_torchao.py"
# The nested runs compile with aot_eager alone: each break shows on it, where inductor would add
# seconds of C++ compilation to every nested session. The scenario's inductor arms run in CI's
# scenario session.
AOT_ONLY = Toy(ARMS={"aot_eager": ("aot_eager", None)})
pytest.importorskip("torchao.float8", reason="torchao is not installed: pip install -e '.[fp8]'")
pytestmark = pytest.mark.slow


def test_the_module_passes_unbroken(run_scenario):
    run_scenario(MODULE, plugins=(AOT_ONLY,)).assert_outcomes(passed=1)


def test_a_compiled_model_that_strays_from_eager_fails_naming_the_arm(run_scenario, monkeypatch):
    real = torch_compile.fresh

    def straying(fn, backend, **kwargs):
        call = real(fn, backend, **kwargs)
        return lambda x: call(x) * (1 + 1e-3) if backend == "aot_eager" else call(x)

    monkeypatch.setattr(torch_compile, "fresh", straying)
    result = run_scenario(MODULE, plugins=(AOT_ONLY,))
    assert_fails_naming(result, "FP8-TORCHAO-COMPILED")
    result.stdout.fnmatch_lines(["*predicted every compiled arm within*got aot_eager off by 0.00*"])


def test_an_fp8_model_that_rounds_nothing_fails_the_control(run_scenario, monkeypatch):
    import torchao.float8

    # The capability probed before the break (its probe converts a Linear too): what breaks
    # here is the scenario's control, not torchao_float8.
    assert devices.probe("cpu").missing("torchao_float8") is None
    monkeypatch.setattr(torchao.float8, "convert_to_float8_training", lambda m, config: m)
    result = run_scenario(MODULE, plugins=(AOT_ONLY,))
    assert_fails_naming(result, "FP8-TORCHAO-COMPILED")
    result.stdout.fnmatch_lines(["*control: FP8's rounding must show against float32's*"])
