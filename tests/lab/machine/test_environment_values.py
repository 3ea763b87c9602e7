"""A bad environment value is a usage error in one line, naming the variable and the fix: torch
ignores an ATEN_CPU_CAPABILITY it does not take with a warning, which under the project's own
warning filters (tox.ini: error) was a 32-line INTERNALERROR, and otherwise ran kernels other
than those asked for. Issue 55, fault 14."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

from harness.common.errors import HarnessError
from harness.lab.machine import cpu


def warns_like_torch(value: str):
    """torch.backends.cpu.get_cpu_capability as torch runs it the first time in a process where
    ATEN_CPU_CAPABILITY is `value` and not a value it takes (DispatchStub.cpp's TORCH_WARN)."""

    def capability() -> str:
        warnings.warn(f"ignoring invalid value for ATEN_CPU_CAPABILITY: {value}", stacklevel=2)
        return "AVX2"

    return capability


def test_a_value_torch_ignores_is_a_usage_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx9000")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", warns_like_torch("avx9000"))
    with pytest.raises(HarnessError) as error:
        cpu._aten_capability()
    assert str(error.value) == (
        "ATEN_CPU_CAPABILITY='avx9000': torch did not take it (ignoring invalid value for "
        "ATEN_CPU_CAPABILITY: avx9000) and runs AVX2: on x86 use avx2, avx512, default, or unset "
        "it (--amp-cpu-class holds the kernels to a class by name: "
        f"{', '.join(cpu.HOLD)})"
    )


def test_a_value_torch_takes_or_none_reads_the_capability(monkeypatch):
    """The controls: no variable, or one torch took (no warning), is read as it is."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert cpu._aten_capability() == "AVX2"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert cpu._aten_capability() == "AVX2"


def test_another_warning_without_the_variable_is_passed_on(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", warns_like_torch("x"))
    with pytest.warns(UserWarning, match="ignoring invalid value"):
        assert cpu._aten_capability() == "AVX2"


@pytest.mark.slow
def test_a_session_with_a_typo_in_aten_cpu_capability_stops_in_one_line(tmp_path):
    """The real thing: torch reads the variable once a process, so a process of its own, under
    the project's warning filter (error), as the fault was found."""
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "test_scn.py").write_text(
        "import pytest\n\n@pytest.mark.claim('FMT-BYTES')\ndef test_bytes(record):\n"
        "    record.verdict('FMT-BYTES', 'confirmed', 'fp16 2 bytes')\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings =\n    error\n")
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "scenarios", "--no-mlflow", "-p", "no:cacheprovider",
         f"--amp-reports={tmp_path / 'reports'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "ATEN_CPU_CAPABILITY": "avx9000"},
    )  # fmt: skip
    assert ran.returncode == pytest.ExitCode.USAGE_ERROR, ran.stdout + ran.stderr
    assert "INTERNALERROR" not in ran.stdout + ran.stderr
    errors = [line for line in ran.stderr.splitlines() if line.startswith("ERROR: ")]
    assert errors == [errors[0]] and "ATEN_CPU_CAPABILITY='avx9000'" in errors[0]
    assert not (tmp_path / "reports").exists()  # stopped before anything was recorded
