"""Capabilities: what the probes see, held against what this build and hardware are expected to
have (harness.devices.EXPECTED). A capability expected here and broken fails the tests that need
it, at setup, naming the capability, what the probe saw and the claims; only a genuine absence
skips. Each CPU capability is broken below (monkeypatch) and a real scenario module is run."""

from __future__ import annotations

import contextlib
import fnmatch
import json

import pytest
import torch

from harness import devices
from harness.devices import DeviceInfo, Probe


@pytest.fixture
def reprobe():
    """Forget the probed devices now (after the test's monkeypatch, the nested session probes
    the patched torch) and again afterwards (later tests probe the real one)."""
    devices.probe.cache_clear()
    yield
    devices.probe.cache_clear()


def _autocast_ignoring(dtype: torch.dtype):
    """torch.autocast that silently computes in float32 for `dtype`, as a broken build would."""
    real = torch.autocast

    def autocast(device_type, dtype_=None, *args, **kwargs):
        wanted = kwargs.pop("dtype", dtype_)
        if wanted == dtype:
            return contextlib.nullcontext()
        return real(device_type, wanted, *args, **kwargs)

    return autocast


def _batch_norm_without_half(monkeypatch):
    forward = torch.nn.BatchNorm1d.forward

    def without_half(self, x):
        if x.dtype == torch.half:
            raise RuntimeError("\"batch_norm\" not implemented for 'Half'")
        return forward(self, x)

    monkeypatch.setattr(torch.nn.BatchNorm1d, "forward", without_half)


BREAKS = {
    "fp16_autocast": lambda mp: mp.setattr(torch, "autocast", _autocast_ignoring(torch.float16)),
    "bf16_autocast": lambda mp: mp.setattr(torch, "autocast", _autocast_ignoring(torch.bfloat16)),
    "grad_scaler": lambda mp: mp.setattr(torch.amp.GradScaler, "is_enabled", lambda self: False),
    "half_training": _batch_norm_without_half,
}
# (capability, scenario module, -k, the tests that need it, their claims, what the probe saw)
CASES = [
    ("fp16_autocast", "test_grad_scaler.py", "", 3, ["SCL-SCALE"], "Linear output float32"),
    ("bf16_autocast", "test_amp_mechanics.py", "bfloat16", 1, ["AMP-AUTO-DTYPE"], "float32"),
    ("grad_scaler", "test_grad_scaler.py", "", 5, ["SCL-UPDATE-DYNAMIC"], "is False"),
    ("half_training", "test_formats.py", "", 1, ["NUM-OVERFLOW"], "RuntimeError"),
]


@pytest.mark.parametrize(
    ("capability", "module", "select", "tests", "claims", "saw"), CASES, ids=[c[0] for c in CASES]
)
def test_a_broken_capability_fails_the_scenarios_that_need_it(
    run_scenario, pytester, monkeypatch, reprobe, capability, module, select, tests, claims, saw
):
    BREAKS[capability](monkeypatch)
    devices.probe.cache_clear()
    result = run_scenario(module, *(["-k", select] if select else []))
    outcomes = result.parseoutcomes()
    assert outcomes.get("errors") == tests and "skipped" not in outcomes, outcomes
    text = devices.CAPABILITY_TEXT[capability]
    result.stdout.fnmatch_lines([f"*capability regression: {text} is expected on cpu*{saw}*"])
    for claim in claims:
        result.stdout.fnmatch_lines([f"*Claims of this test: *{claim}*"])
    if capability == "half_training":  # the probe raised: its traceback is in the failure
        result.stdout.fnmatch_lines(["*The probe's traceback:*", "*RuntimeError*batch_norm*"])
    journal = pytester.path / "reports" / "journal.jsonl"
    records = [e["record"] for e in map(json.loads, journal.read_text().splitlines())
               if e["type"] == "record"]  # fmt: skip
    regressed = [r for r in records if r["outcome"] == "capability-regression"]
    assert len(regressed) == tests and all(not r["verdicts"] for r in regressed)
    # The verdict table shows them apart from skips.
    result.stdout.fnmatch_lines([f"*({tests} test*; claims*"])


def test_the_tests_pass_on_the_unbroken_capabilities(run_scenario, reprobe):
    """The control of the cases above: the same module, the same probe path, nothing broken."""
    devices.probe.cache_clear()
    run_scenario("test_grad_scaler.py").assert_outcomes(passed=5)


def test_a_gpu_the_driver_lists_but_torch_cannot_use_is_a_regression(
    run_scenario, monkeypatch, tmp_path, reprobe
):
    """A CUDA build beside a GPU the driver sees, and no CUDA for torch: a broken install, not
    a CPU machine. Without the driver's GPU, the same tests skip (the control)."""
    gpus = tmp_path / "gpus"
    (gpus / "0000:00:04.0").mkdir(parents=True)
    monkeypatch.setattr(devices, "NVIDIA_DRIVER_GPUS", gpus)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    result = run_scenario("test_speed.py")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*capability regression: CUDA: the NVIDIA driver lists 1 GPU*"])

    monkeypatch.setattr(devices, "NVIDIA_DRIVER_GPUS", tmp_path / "no-driver")
    run_scenario("test_speed.py").assert_outcomes(skipped=2)


# --- the table of expectations, on synthetic devices (no GPU needed) ---------------------------


def gpu(cc: tuple[int, int], **probes: bool) -> DeviceInfo:
    caps = {name: Probe(works, f"probe {name}: {works}") for name, works in probes.items()}
    return DeviceInfo("cuda", "NVIDIA X", 1, cc, caps)


@pytest.mark.parametrize(
    ("cc", "need", "regression", "reason"),
    [
        ((9, 0), "tf32", True, "capability regression: TF32 tensor cores*expected on NVIDIA X*"),
        ((7, 0), "tf32", False, "needs TF32*NVIDIA X is older than compute capability 8.0*"),
        ((8, 0), "bf16_autocast", True, "capability regression: bfloat16 autocast*sm_80*"),
        ((7, 5), "bf16_autocast", False, "needs bfloat16 autocast: NVIDIA X is older than*8.0*"),
        ((6, 1), "fp16_autocast", True, "capability regression: float16 autocast*"),
        ((6, 1), "grad_scaler", True, "capability regression: a working torch.amp.GradScaler*"),
        ((9, 0), "fp8_matmul", True, "capability regression: an fp8 matmul*sm_90*"),
        ((8, 0), "fp8_matmul", False, "needs an fp8 matmul*older than compute capability 8.9*"),
    ],
)
def test_cuda_expectations_follow_the_compute_capability(cc, need, regression, reason):
    lack = gpu(cc, **{need: False}).missing("cuda", need)
    assert lack.regression is regression
    assert lack.capability == need
    assert fnmatch.fnmatch(lack.reason, reason), lack.reason


def test_a_capability_that_works_is_never_missing():
    assert (
        gpu((9, 0), tf32=True, bf16_autocast=True).missing("cuda", "tf32", "bf16_autocast") is None
    )


def test_a_torch_older_than_the_feature_skips_naming_both_releases(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.4.1+cpu")
    cpu = DeviceInfo("cpu", "cpu", 0, None, {"fp16_autocast": Probe(False, "it warned")})
    lack = cpu.missing("fp16_autocast")
    assert not lack.regression
    assert "not in torch 2.4.1+cpu, expected from torch 2.5" in lack.reason


def test_tf32_is_never_expected_of_the_cpu():
    cpu = devices.probe("cpu")
    lack = cpu.missing("tf32")
    assert not lack.regression and "not expected on cpu" in lack.reason
    # This machine: everything expected of it works.
    assert not any((lack := cpu.missing(need)) and lack.regression for need in devices.PROBES)


def test_a_probe_that_warns_or_raises_says_what_it_saw():
    warned = devices._run_probe(lambda: torch.autocast("cpu", dtype=torch.float32))
    assert not warned.works and "warned" in warned.saw and not warned.raised
    raised = devices._run_probe(lambda: 1 / 0)
    assert not raised.works and raised.raised and "ZeroDivisionError" in raised.error


OPTIONAL = """
import pytest
from harness.devices import DeviceInfo, Probe

@pytest.mark.claim("FMT-SPEED")
def test_uses_fp8_where_present(record):
    h200 = DeviceInfo("cuda", "NVIDIA H200", 1, (9, 0), {"fp8_matmul": Probe(False, "gave 0")})
    h200.optional("fp8_matmul")
"""


def test_a_capability_used_where_present_fails_as_a_regression_where_expected(pytester):
    """DeviceInfo.optional (test_speed's fp8 arm): absent is None or a reason, expected and
    broken raises, and the plugin records the test as a capability regression."""
    a100 = gpu((8, 0), fp8_matmul=False)
    assert not a100.optional("fp8_matmul").regression  # genuinely absent: the arm is left out
    assert gpu((9, 0), fp8_matmul=True).optional("fp8_matmul") is None
    pytester.makepyfile(**{"scenarios/test_fp8": OPTIONAL})
    result = pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={pytester.path / 'reports'}",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*CapabilityRegression: capability regression: an fp8 matmul*"])
    lines = (pytester.path / "reports" / "journal.jsonl").read_text().splitlines()
    (record,) = [e["record"] for e in map(json.loads, lines) if e["type"] == "record"]
    assert record["outcome"] == "capability-regression"
    assert record["message"].startswith("capability regression: an fp8 matmul")
