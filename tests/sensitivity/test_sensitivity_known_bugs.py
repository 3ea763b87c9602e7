"""scenarios/test_known_bugs.py can fail, each way the ledger can be contradicted, shown on a real
reproduction (fused SGD's unwritten momentum buffer: present on every release from 2.4, a
second a run) and on a fixed entry given a harm:

- the bug patched out (the reproduction's buggy path runs the control's code): no harm where the
  ledger says present fails, naming the entry;
- the bug forced into the control (the control runs the buggy code): fails, the control shows
  the harm;
- a reproduction that cannot run where the ledger says present fails; where it says absent, the
  test skips with the reason;
- a harm on a release the ledger says fixed (a bug come back) fails.

That each reproduction's own harm check and control tell the two apart is shown per entry by
test_sensitivity_known_bug_entries.py, and from the committed baselines
(tests/catalogue/test_known_bug_ledger.py): on some release, harm with a clean control."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import assert_fails_naming

from harness.lab import known_bugs
from harness.lab.known_bugs import Observed

MODULE = "test_known_bugs.py"
SGD = "KB-FUSED-SGD-SKIPPED-MOMENTUM"
FIXED = "KB-HALF-BATCHNORM-CPU-VARIANCE"  # fixed in 2.6: absent on every release CI runs
pytestmark = pytest.mark.slow  # a nested scenario session each


def _with_run(monkeypatch, bug: str, run) -> None:
    """Give `bug` the reproduction `run` (keeping its devices and control's words)."""
    old = known_bugs.REPRODUCTIONS[bug]
    monkeypatch.setitem(known_bugs.REPRODUCTIONS, bug, dataclasses.replace(old, run=run))


def test_the_reproduction_passes_unbroken(run_scenario):
    run_scenario(MODULE, "-k", SGD).assert_outcomes(passed=1)


def test_the_bug_patched_out_fails_where_the_ledger_says_present(run_scenario, monkeypatch):
    real = known_bugs.REPRODUCTIONS[SGD].run
    _with_run(monkeypatch, SGD, lambda device, control: real(device, True))
    result = run_scenario(MODULE, "-k", SGD)
    assert_fails_naming(result, SGD)
    result.stdout.fnmatch_lines([f"*{SGD}: absent*where the ledger predicts present*"])


def test_the_bug_forced_into_the_control_fails(run_scenario, monkeypatch):
    real = known_bugs.REPRODUCTIONS[SGD].run
    _with_run(monkeypatch, SGD, lambda device, control: real(device, False))
    result = run_scenario(MODULE, "-k", SGD)
    assert_fails_naming(result, SGD)
    result.stdout.fnmatch_lines([f"*{SGD}: the control shows the harm too*"])


def test_a_reproduction_that_cannot_run_fails_where_the_ledger_says_present(
    run_scenario, monkeypatch
):
    def missing(device, control):
        raise known_bugs.Unavailable("fused SGD is gone from this build")

    _with_run(monkeypatch, SGD, missing)
    result = run_scenario(MODULE, "-k", SGD)
    assert_fails_naming(result, SGD)
    result.stdout.fnmatch_lines(["*its reproduction cannot run here*fused SGD is gone*"])
    _with_run(monkeypatch, FIXED, missing)
    run_scenario(MODULE, "-k", FIXED).assert_outcomes(skipped=1)


def test_a_harm_on_a_release_the_ledger_says_fixed_fails_as_come_back(run_scenario, monkeypatch):
    def back(device, control):
        return Observed(harm=not control, says=f"running_var inf after {1} step")

    _with_run(monkeypatch, FIXED, back)
    result = run_scenario(MODULE, "-k", FIXED)
    assert_fails_naming(result, FIXED)
    result.stdout.fnmatch_lines([f"*{FIXED}: present*where the ledger predicts absent (fixed)*"])
