"""tests/conftest.py's true_device_probes: what one test probed under its monkeypatch never
reaches the next test of its process; without the fixture, it does (the negative control)."""

from __future__ import annotations

import pytest

TWO_TESTS = """
from harness.lab import devices
from harness.lab.devices import Probe
from harness.lab.machine import capabilities
{fixture}

def faked(_device):
    return Probe(True, "faked")


def test_a_probes_under_a_patch(monkeypatch):
    monkeypatch.setattr(capabilities, "PROBES", dict.fromkeys(devices.PROBES, faked))
    monkeypatch.setitem(devices.DEFERRED_PROBES, "fused_optimizers", faked)
    devices.probe.cache_clear()
    cpu = devices.probe("cpu")
    assert cpu.capabilities["bf16_autocast"].saw == "faked"
    assert cpu.missing("fused_optimizers") is None  # the deferred probe, run under the patch


def test_b_sees_the_real_torch():
    cpu = devices.probe("cpu")
    cpu.missing("fused_optimizers")
    assert cpu.capabilities["bf16_autocast"].saw != "faked"
    assert cpu.capabilities["fused_optimizers"].saw != "faked"
"""


@pytest.mark.parametrize(
    ("fixture", "outcomes"),
    [("from conftest import true_device_probes  # noqa: F401", {"passed": 2}),
     ("", {"passed": 1, "failed": 1})],
    ids=["with-the-fixture", "without"],
)  # fmt: skip
def test_a_probe_made_under_a_patch_dies_with_its_test(pytester, fixture, outcomes):
    pytester.makepyfile(test_two=TWO_TESTS.format(fixture=fixture))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:amp_harness")
    result.assert_outcomes(**outcomes)
    if outcomes.get("failed"):
        result.stdout.fnmatch_lines(["*test_b_sees_the_real_torch*", "*faked*"])
