"""A torch without the float8 dtypes (the support range starts at 2.4, and builds without them
exist): scenarios/test_fp8.py skips at collection with the reason, and the rest of the suite
runs; it was a collection error that stopped a whole-suite run. Issue 55, fault 15. Simulated
here by deleting the dtypes from torch for the nested session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import harness.lab
from harness.lab import fp8

SCENARIOS = Path(__file__).parents[2] / "scenarios"
OTHER = """
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes, fp32 4 bytes")
"""


def session(pytester: pytest.Pytester, monkeypatch, *args: str) -> pytest.RunResult:
    monkeypatch.delitem(sys.modules, "test_fp8", raising=False)  # imported afresh, as in a run
    (pytester.path / "scenarios").mkdir(exist_ok=True)
    (pytester.path / "scenarios" / "test_fp8.py").write_text(
        (SCENARIOS / "test_fp8.py").read_text(encoding="utf-8"), encoding="utf-8"
    )
    pytester.makepyfile(**{"scenarios/test_other": OTHER})
    return pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "--amp-isolate=none", "-rs",
        "-p", "no:cacheprovider", f"--amp-reports={pytester.path / 'reports'}", *args,
    )  # fmt: skip


def test_without_float8_dtypes_the_fp8_scenarios_skip_with_the_reason(pytester, monkeypatch):
    monkeypatch.delattr(torch, "float8_e4m3fn")
    # harness.lab.fp8 imported afresh too, as that torch would import it (the package's
    # attribute put back after, with the module)
    monkeypatch.delitem(sys.modules, "harness.lab.fp8")
    monkeypatch.setattr(harness.lab, "fp8", fp8)
    result = session(pytester, monkeypatch)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(passed=1, skipped=1)  # the other module ran
    result.stdout.fnmatch_lines([
        f"SKIPPED [[]1[]] scenarios/test_fp8.py:*: needs torch's float8 dtypes: torch "
        f"{torch.__version__} has no float8_e4m3fn"
    ])  # fmt: skip
    assert "error" not in result.stdout.str().splitlines()[-1]


def test_with_float8_dtypes_the_fp8_scenarios_are_collected(pytester, monkeypatch):
    """The control: the skip is for a torch without them, not for this one."""
    assert fp8.lacking() is None
    result = session(pytester, monkeypatch, "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.OK
    assert sum("test_fp8.py::" in line for line in result.stdout.lines) > 10
