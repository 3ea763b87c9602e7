"""Capabilities: what the probes see, held against what this build and hardware are expected to
have (harness.lab.devices.EXPECTED). A capability expected here and broken fails the tests that need
it, at setup, naming the capability, what the probe saw and the claims; only a genuine absence
skips. Each CPU capability is broken below (monkeypatch) and a real scenario module is run."""

from __future__ import annotations

import contextlib
import fnmatch
import importlib.util
import io
import json
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import REPO, Toy

from harness.lab import devices, releases
from harness.lab.devices import DeviceInfo, Probe
from harness.lab.machine import capabilities, levels, probes
from harness.lab.machine import cpu as machine_cpu
from harness.lab.machine import device as machine_device
from harness.lab.machine import gpu as machine_gpu
from harness.lab.machine.gpus import GpuFigures


@pytest.fixture
def reprobe():
    """Forget the probed devices now: after the test's monkeypatch, the nested session probes
    the patched torch (tests/conftest.py's true_device_probes puts the real one back after)."""
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


def _refuse_fused_optimizers(monkeypatch):
    """fused=True refused by SGD, Adam and AdamW, as a build without their fused kernels does."""
    for kind in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):

        def refusing(self, *args, fused=None, _init=kind.__init__, **kwargs):
            if fused:
                raise RuntimeError("`fused=True` requires all the params to be floating point "
                                   "Tensors of supported devices: [].")  # fmt: skip
            _init(self, *args, fused=fused, **kwargs)

        monkeypatch.setattr(kind, "__init__", refusing)


def _scaled_mm_refusing(rowwise_only: bool):
    """torch._scaled_mm refusing every call (a build without the CPU kernel, as before 2.9), or
    only calls with a scale per row (as 2.9 to 2.11 do)."""
    real = torch._scaled_mm

    def refusing(a, b, *args, scale_a=None, scale_b=None, **kwargs):
        if not rowwise_only or scale_a.numel() > 1 or scale_b.numel() > 1:
            raise RuntimeError("Could not run 'aten::_scaled_mm' with arguments from the 'CPU' "
                               "backend.")  # fmt: skip
        return real(a, b, *args, scale_a=scale_a, scale_b=scale_b, **kwargs)

    return refusing


def _torchao_float8_raising(monkeypatch):
    """torchao's float8 conversion raising, as a torchao built for another torch does."""
    import torchao.float8

    def raising(*args, **kwargs):
        raise RuntimeError("torchao: this torch lacks an op Float8Linear needs")

    monkeypatch.setattr(torchao.float8, "convert_to_float8_training", raising)


def _fully_shard_missing(monkeypatch):
    """A build whose FSDP2 lacks fully_shard. torch.distributed.fsdp is imported here: the probe
    imports it only when first asked (devices.DEFERRED_PROBES), so a process may not have yet."""
    import torch.distributed.fsdp

    monkeypatch.delattr(torch.distributed.fsdp, "fully_shard")


BREAKS = {
    "fp16_autocast": lambda mp: mp.setattr(torch, "autocast", _autocast_ignoring(torch.float16)),
    "bf16_autocast": lambda mp: mp.setattr(torch, "autocast", _autocast_ignoring(torch.bfloat16)),
    "grad_scaler": lambda mp: mp.setattr(torch.amp.GradScaler, "is_enabled", lambda self: False),
    "half_training": _batch_norm_without_half,
    "gloo": lambda mp: mp.setattr(torch.distributed, "is_gloo_available", lambda: False),
    "fsdp2": _fully_shard_missing,
    "fused_optimizers": _refuse_fused_optimizers,
    "fp8_scaled_mm": lambda mp: mp.setattr(torch, "_scaled_mm", _scaled_mm_refusing(False)),
    "fp8_rowwise_scaled_mm": lambda mp: mp.setattr(torch, "_scaled_mm", _scaled_mm_refusing(True)),
    "torchao_float8": _torchao_float8_raising,
}
# (capability, scenario module, -k, the tests that need it, their claims, what the probe saw)
CASES = [
    ("fp16_autocast", "test_grad_scaler.py", "", 3, ["SCL-SCALE"], "Linear output float32"),
    ("bf16_autocast", "test_amp_mechanics.py", "bfloat16", 1, ["AMP-AUTO-DTYPE"], "float32"),
    ("grad_scaler", "test_grad_scaler.py", "", 5, ["SCL-UPDATE-DYNAMIC"], "is False"),
    ("half_training", "test_formats.py", "", 1, ["NUM-OVERFLOW"], "RuntimeError"),
    ("gloo", "test_distributed.py", "world2", 5, ["PIT3-ZERO-ALL"], "answered False"),
    ("fsdp2", "test_distributed.py", "fsdp2 and world2", 1, ["PIT3-CHECK"], "ImportError"),
    ("fused_optimizers", "test_loop_shapes.py", "fused", 1, ["SCL-STEP-UNSCALES"], "RuntimeError"),
    ("fp8_scaled_mm", "test_fp8.py", "multiplies", 1, ["FP8-SCALED-MM"], "RuntimeError"),
    ("fp8_rowwise_scaled_mm", "test_fp8.py", "rowwise", 1, ["FP8-SCALED-MM"], "RuntimeError"),
    ("torchao_float8", "test_fp8_torchao.py", "", 1, ["FP8-TORCHAO-COMPILED"], "RuntimeError"),
]


@pytest.mark.parametrize(
    ("capability", "module", "select", "tests", "claims", "saw"), CASES, ids=[c[0] for c in CASES]
)
def test_a_broken_capability_fails_the_scenarios_that_need_it(
    run_scenario, pytester, monkeypatch, reprobe, capability, module, select, tests, claims, saw
):
    expected, why_not = devices.probe("cpu").expectation(capability)
    if expected is None:  # e.g. oneDNN held below what the silicon reaches: nothing to regress
        pytest.skip(f"{capability} is not expected of this machine's CPU: {why_not}")
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
    # The verdict table shows them apart from skips (its lines wrap at the terminal's width).
    assert f"({tests} test" in " ".join(line.strip() for line in result.outlines)


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
    monkeypatch.setattr(machine_gpu, "NVIDIA_DRIVER_GPUS", gpus)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    result = run_scenario("test_speed.py")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*capability regression: CUDA: the NVIDIA driver lists 1 GPU*"])

    monkeypatch.setattr(machine_gpu, "NVIDIA_DRIVER_GPUS", tmp_path / "no-driver")
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
        ((6, 1), "fused_optimizers", True, "capability regression: fused=True SGD, Adam*"),
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
    monkeypatch.setattr(torch, "__version__", "2.6.0+cpu")
    cpu = DeviceInfo("cpu", "cpu", 0, None, {"fsdp2": Probe(False, "AttributeError")})
    lack = cpu.missing("fsdp2")
    assert not lack.regression
    assert "not in torch 2.6.0+cpu, expected from torch 2.7" in lack.reason
    # CPU fp16 autocast worked on 2.4.1 (its baseline): broken there, it is a regression.
    monkeypatch.setattr(torch, "__version__", "2.4.1+cpu")
    broken = DeviceInfo("cpu", "cpu", 0, None, {"fp16_autocast": Probe(False, "it warned")})
    assert broken.missing("fp16_autocast").regression


@pytest.mark.parametrize(
    "silicon, onednn, regression",
    [("amx", "sse41", False), ("avx512-fp16", "avx512-bf16", False),  # held below its fp16
     ("avx2", "sse41", True), ("amx", "amx", True), ("amx", "avx512-fp16", True)],
)  # fmt: skip
def test_cpu_scaled_mm_is_not_expected_held_below_the_fp16_level_its_silicon_has(
    monkeypatch, silicon, onednn, regression
):
    """The one CPU capability held to the silicon as well as to oneDNN's level: measured to fail
    on an AVX512-FP16 Xeon held lower, to run on an AVX2 EPYC held to sse41."""
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    broken = {"fp8_scaled_mm": Probe(False, "could not create a primitive descriptor")}
    cpu = DeviceInfo("cpu", "cpu", 0, None, broken, onednn_level=onednn, silicon_level=silicon)
    lack = cpu.missing("fp8_scaled_mm")
    assert lack.regression is regression, lack.reason
    if not regression:
        assert f"oneDNN is held at {onednn} on a CPU that reaches avx512-fp16" in lack.reason


def test_tf32_is_never_expected_of_the_cpu():
    cpu = devices.probe("cpu")
    lack = cpu.missing("tf32")
    assert not lack.regression and "not expected on cpu" in lack.reason
    # This machine: everything expected of it works.
    assert not any(
        (lack := cpu.missing(need)) and lack.regression for need in (*devices.PROBES, "fsdp2")
    )


def test_a_probe_that_warns_or_raises_says_what_it_saw():
    warned = probes.run_probe(lambda: torch.autocast("cpu", dtype=torch.float32))
    assert not warned.works and "warned" in warned.saw and not warned.raised
    raised = probes.run_probe(lambda: 1 / 0)
    assert not raised.works and raised.raised and "ZeroDivisionError" in raised.error


OPTIONAL = """
import pytest
from harness.lab.devices import DeviceInfo, Probe

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


# --- a GPU probed without one: native bfloat16, the figures that tell variants apart -----------


def test_bf16_support_is_asked_for_native_hardware(monkeypatch):
    asked = []

    def is_bf16_supported(including_emulation=True):  # torch >= 2.5: emulation counts by default
        asked.append(including_emulation)
        return including_emulation  # a pre-Ampere GPU: bf16 only emulated

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert machine_gpu.native_bf16() is False and asked == [False]
    # torch 2.4's has no argument, and answers native support only.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert machine_gpu.native_bf16() is True


def _fake_gpu(monkeypatch, props, bf16_native: bool) -> DeviceInfo:
    """devices.probe("cuda") on this CPU: torch.cuda answers as a GPU with `props` would, and
    every capability probe works, as autocast's bf16 does where it is emulated."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _index: props)
    monkeypatch.setattr(
        torch.cuda,
        "is_bf16_supported",
        lambda including_emulation=True: including_emulation or bf16_native,
    )
    monkeypatch.setattr(
        capabilities, "PROBES", dict.fromkeys(devices.PROBES, lambda _d: Probe(True, "ran"))
    )
    monkeypatch.setattr(machine_gpu, "_nvml_max_power_w", lambda uuid: 700.0 if uuid else None)
    return devices.probe.__wrapped__("cuda")


def _props(name, cc, memory_gib, sms, clock_khz=None, uuid=""):
    from types import SimpleNamespace

    return SimpleNamespace(
        name=name, major=cc[0], minor=cc[1], total_memory=int(memory_gib * 2**30),
        multi_processor_count=sms, clock_rate=clock_khz, uuid=uuid,
    )  # fmt: skip


def test_emulated_bf16_autocast_is_not_bf16_autocast(monkeypatch):
    v100 = _fake_gpu(monkeypatch, _props("Tesla V100-SXM2-16GB", (7, 0), 16, 80), False)
    seen = v100.capabilities["bf16_autocast"]
    assert not seen.works and "emulated" in seen.saw and "sm_70" in seen.saw
    assert not v100.missing("bf16_autocast").regression  # older than sm_80: a skip
    # The control: a GPU with bf16 in hardware keeps what autocast showed.
    h200 = _fake_gpu(monkeypatch, _props("NVIDIA H200", (9, 0), 140.4, 132), True)
    assert h200.capabilities["bf16_autocast"].works


def test_a_gpu_is_identified_by_its_name_and_figures(monkeypatch):
    props = _props("NVIDIA H200", (9, 0), 140, 132, clock_khz=1_980_000, uuid="GPU-1")
    h200 = _fake_gpu(monkeypatch, props, True)
    assert h200.figures == GpuFigures(140, 132, 1980.0, 700.0)
    assert (h200.datasheet().spec.name, h200.datasheet().sure) == ("H200 SXM", True)
    # Without NVML's power limit nor the clock (torch < 2.10), memory and SMs cannot tell an
    # SXM H200 from an NVL: the entry is by name only, and says so.
    bare = _fake_gpu(monkeypatch, _props("NVIDIA H200", (9, 0), 140, 132), True)
    assert bare.figures.read() == {"total_memory_gib": 140, "sm_count": 132}
    assert not bare.datasheet().sure and "by name only" in bare.datasheet().how
    assert devices.probe("cpu").datasheet() is None


class _FakeNvml:
    """libnvidia-ml as ctypes sees it: C calls returning 0 for success, results through
    pointers."""

    def __init__(self, max_mw: int, known: str):
        self.max_mw, self.known, self.shut = max_mw, known, False

    def nvmlInit_v2(self):
        return 0

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes, _handle):
        return 0 if uuid.decode() == self.known else 13  # NVML_ERROR_NOT_FOUND

    def nvmlDeviceGetPowerManagementLimitConstraints(self, _handle, low, high):
        low._obj.value, high._obj.value = 200_000, self.max_mw
        return 0

    def nvmlShutdown(self):
        self.shut = True
        return 0


def test_the_power_limit_comes_from_nvml_where_the_driver_has_it(monkeypatch):
    nvml = _FakeNvml(600_000, "GPU-8c1a")
    monkeypatch.setattr(machine_gpu.ctypes, "CDLL", lambda _name: nvml)
    assert machine_gpu._nvml_max_power_w("8c1a") == 600.0 and nvml.shut  # torch's uuid lacks "GPU-"
    assert machine_gpu._nvml_max_power_w("GPU-8c1a") == 600.0
    assert machine_gpu._nvml_max_power_w("GPU-other") is None

    def no_driver(_name):
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    monkeypatch.setattr(machine_gpu.ctypes, "CDLL", no_driver)
    assert machine_gpu._nvml_max_power_w("GPU-8c1a") is None


# --- the fingerprint records the precision switches a result depends on ------------------------


def test_the_fingerprint_records_the_reduced_precision_switches():
    from pathlib import Path

    from harness.records import fingerprint, torch_state

    cpu = devices.probe("cpu")
    matmul = torch.backends.cuda.matmul
    before = fingerprint.collect(cpu, Path.cwd())
    key = "precision.cuda.matmul.allow_{}_reduced_precision_reduction"
    flipped = {
        fp: not getattr(matmul, f"allow_{fp}_reduced_precision_reduction")
        for fp in ("fp16", "bf16")
    }
    saved = torch_state.snapshot()
    try:  # torch's switches are properties of a module object: set and restore them by hand
        torch.set_float32_matmul_precision("medium")
        for fp, value in flipped.items():
            setattr(matmul, f"allow_{fp}_reduced_precision_reduction", value)
        after = fingerprint.collect(cpu, Path.cwd())
    finally:
        assert torch_state.restore(saved) == []
    for fp, value in flipped.items():
        assert (before[key.format(fp)], after[key.format(fp)]) == (str(not value), str(value))
    assert after["precision.float32_matmul_precision"] == "medium"
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch >= 2.9: "medium" is tf32
        assert after["precision.cuda.matmul.fp32_precision"] == "tf32"


# --- the table against what the committed baselines measured ------------------------------------

BASELINES = sorted((REPO / "reports" / "baselines").glob("*.json"))


class _Requires:
    """A pytest plugin noting each collected scenario test's `requires` capabilities, marks of
    a `pytest.param` included, by its baseline name ("scenarios/FILE::TEST[ID]")."""

    def __init__(self) -> None:
        self.needs: dict[str, set[str]] = {}

    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            needs = {n for marker in item.iter_markers("requires") for n in marker.args}
            self.needs[f"scenarios/{item.path.name}::{item.name}"] = needs


@pytest.fixture(scope="module")
def scenario_needs(tmp_path_factory) -> dict[str, set[str]]:
    reader = _Requires()
    reports = tmp_path_factory.mktemp("reports")
    folder = REPO / "scenarios"
    # Not as an xdist worker, though this one may be: on gw0, pytest-benchmark in the nested
    # session would warn that xdist disabled the scenarios' benchmarks, an error here.
    xdist = [name for name in os.environ if name.startswith("PYTEST_XDIST_")]
    try:
        # redirect_stdout: pytest's collection chatter.
        with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(io.StringIO()):
            for name in xdist:
                env.delenv(name)
            code = pytest.main(
                [str(folder), "--collect-only", "-q", "-p", "no:cacheprovider",
                 "--import-mode=importlib", "--no-mlflow", "--amp-device=cpu",
                 f"--amp-reports={reports}"],
                plugins=[reader],
            )  # fmt: skip
    finally:
        # Forget the modules collected: a nested session collecting a copy of one of them
        # later would meet this one under its name ("import file mismatch").
        for name, module in list(sys.modules.items()):
            if Path(getattr(module, "__file__", None) or "/").parent == folder:
                del sys.modules[name]
    assert code == 0 and reader.needs
    return reader.needs


def _cc(text: str) -> tuple[int, int] | None:
    return None if text == "n/a" else tuple(int(part) for part in text.split(".")[:2])


def claimed_less_than_measured(baseline: dict, needs: dict[str, set[str]]) -> list[str]:
    """Each capability a passing test of `baseline` needed (so its probe saw it work on that
    release and device) that EXPECTED does not expect there: the table claims less than was
    measured, and a broken capability there would skip instead of failing."""
    fingerprint = baseline["fingerprint"]
    device, version = fingerprint["device"], fingerprint["torch"]
    release, cc = releases.release(version), _cc(fingerprint["compute_capability"])
    wrong = []
    for test, entry in baseline["tests"].items():
        if entry["outcome"] != "passed":
            continue
        for need in sorted(needs.get(test, set()) - {"cuda"}):
            expected = devices.EXPECTED.get((device, need))
            if expected is None:
                wrong.append(f"{need} worked on {device} torch {version} ({test}): not expected")
            elif release < expected.torch or (expected.cc and cc and cc < expected.cc):
                wrong.append(
                    f"{need} worked on {device} torch {version} ({test}), expected only from "
                    f"torch {expected.torch}" + (f", sm {expected.cc}" if expected.cc else "")
                )
    return wrong


@pytest.mark.parametrize("path", BASELINES, ids=[p.stem for p in BASELINES])
def test_the_table_expects_what_every_baseline_measured(path, scenario_needs):
    baseline = json.loads(path.read_text())
    unknown = set(baseline["tests"]) - set(scenario_needs)  # a renamed test would go unchecked
    assert not unknown, f"{path.name}: tests no scenario has now: {sorted(unknown)}"
    assert not claimed_less_than_measured(baseline, scenario_needs)


def test_a_table_claiming_less_than_a_baseline_is_caught(scenario_needs, monkeypatch):
    """The control of the check above: a row moved past the oldest release a baseline shows it
    working on is reported, naming the capability and the release, in the file of each CPU class
    measured on the oldest release."""
    oldest = [p for p in BASELINES if "torch-2.4.1" in p.name]
    assert oldest, "no baseline of torch 2.4.1, the oldest release supported"
    late = devices.Expected((2, 9), source="a made-up late row")
    monkeypatch.setitem(devices.EXPECTED, ("cpu", "grad_scaler"), late)
    for path in oldest:
        found = claimed_less_than_measured(json.loads(path.read_text()), scenario_needs)
        assert found, path
        assert all("grad_scaler worked on cpu torch 2.4.1" in line for line in found), path


def hardware_rows_against(baseline: dict) -> list[str]:
    """Each CPU row that follows the hardware (a oneDNN level, or NOT_EXPECTED) held against
    what the baseline's probes saw on its class: expected there exactly where it worked, a row
    with `unheld_from` not expected where oneDNN was held below that level on silicon that
    reaches it (the session's own rule, harness.lab.machine.device). A baseline from before
    capabilities were recorded holds nothing."""
    facts = baseline["fingerprint"]
    if facts.get("device") != "cpu" or "cpu.onednn_isa" not in facts:
        return []
    level = machine_cpu.onednn_level(facts["cpu.onednn_isa"]) or ""
    release = releases.release(facts["torch"])
    wrong = []
    for device, need in devices.HARDWARE_CAPABILITIES:
        row = devices.EXPECTED.get((device, need))
        if device != "cpu":
            continue
        expected = bool(
            row and release >= row.torch and levels.level_rank(level) >= levels.level_rank(row.cpu)
        )
        silicon = machine_cpu.best_level(facts.get("cpu.instructions", "").split())
        expected = expected and not machine_device.held_below(silicon, level, row.unheld_from)
        seen = facts.get(f"capability.{need}") == "yes"
        if expected != seen:
            wrong.append(
                f"{need} on {facts['hardware_class']} torch {facts['torch']}: the table "
                f"{'expects' if expected else 'does not expect'} it, the probe saw "
                f"{facts.get(f'capability.{need}')}"
            )
    return wrong


@pytest.mark.parametrize("path", BASELINES, ids=[p.stem for p in BASELINES])
def test_the_hardware_rows_are_what_each_class_measured(path):
    assert not hardware_rows_against(json.loads(path.read_text()))


def test_a_hardware_row_claiming_more_than_a_class_measured_is_caught(monkeypatch):
    """The control: a row lowered to a class where the committed baselines saw no bf16 RNN
    kernel (sse41) is reported for each such baseline, naming the capability."""
    low = [p for p in BASELINES if "sse41" in p.name]
    assert low, "the committed baselines include a class held down to sse41"
    monkeypatch.setitem(devices.EXPECTED, ("cpu", "bf16_rnn"), devices.Expected(cpu="sse41"))
    for path in low:
        found = hardware_rows_against(json.loads(path.read_text()))
        assert any(line.startswith("bf16_rnn on cpu-x86-64-sse41") for line in found), found


@pytest.mark.parametrize("need", ["tf32", "bf16_autocast", "fp8_matmul"])
def test_a_rocm_gpu_lacking_a_compute_capability_feature_skips(monkeypatch, need):
    """ROCm answers as "cuda" with a compute capability on no NVIDIA scale (MI300: 9.4): the
    table's NVIDIA rows cannot say what an AMD GPU has, so a genuine absence is a skip naming
    ROCm, never a failure. The control: the same GPU on a CUDA build is a regression."""
    monkeypatch.setattr(torch.version, "hip", "6.2")
    mi300 = DeviceInfo("cuda", "AMD Instinct MI300X", 1, (9, 4), {need: Probe(False, "no")})
    lack = mi300.missing(need)
    assert not lack.regression and "ROCm GPU" in lack.reason, lack.reason
    # What every GPU has (fp16 autocast) stays expected on ROCm.
    fp16 = DeviceInfo(
        "cuda", "AMD Instinct MI300X", 1, (9, 4), {"fp16_autocast": Probe(False, "x")}
    )
    assert fp16.missing("fp16_autocast").regression
    monkeypatch.setattr(torch.version, "hip", None)
    assert mi300.missing(need).regression


# --- inductor_compile: probed when a test first asks for it ------------------------------------

_INDUCTOR_ONLY = Toy(BACKENDS=("inductor",))  # the scenario's inductor arm alone: no aot_eager
_COMPILED_TEST = (
    "test_compiled_amp.py",
    "-k",
    "test_compiled_block_keeps_eager_dtypes and bfloat16",
)


def _inductor_raising(*args, **kwargs):
    raise RuntimeError("g++ exited with status 1 (a broken toolchain)")


@pytest.fixture(scope="module")
def broken_probe() -> Probe:
    """inductor_compile's probe run once with inductor raising, before the test's pytester
    snapshot: what compiling imports (some 30 modules, custom ops among them) stays imported.
    pytester drops what a test imported, and torch's compiler modules imported a second time
    break ("Artifact of type=autotune already registered")."""
    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
        warnings.simplefilter("ignore", DeprecationWarning)  # torch's: torch.jit.script_method
        import torch._inductor.compile_fx

        patch.setattr(torch._inductor.compile_fx, "compile_fx", _inductor_raising)
        return probes.run_probe(lambda: devices.DEFERRED_PROBES["inductor_compile"]("cpu"))


@pytest.mark.slow
def test_a_broken_inductor_is_a_regression_and_a_missing_compiler_a_skip(
    run_scenario, pytester, monkeypatch, reprobe, broken_probe
):
    """inductor_compile's probe compiles with torch.compile(backend="inductor") the first time a
    test asks for it. With a C++ compiler on PATH and inductor raising, the probe says it raised
    and the test fails as a capability regression naming it, never a skip. The control: without
    a compiler (what torch._inductor.config.cpp.cxx names is not on PATH) the capability is
    absent, and the test skips with that reason."""
    import torch._inductor.compile_fx
    from torch._inductor import config

    assert not broken_probe.works and broken_probe.raised and not broken_probe.absent
    monkeypatch.setattr(torch._inductor.compile_fx, "compile_fx", _inductor_raising)
    result = run_scenario(*_COMPILED_TEST, plugins=(_INDUCTOR_ONLY,))
    result.assert_outcomes(failed=1)
    text = devices.CAPABILITY_TEXT["inductor_compile"]
    result.stdout.fnmatch_lines([f"*capability regression: {text}*expected on cpu*the probe*"])
    journal = pytester.path / "reports" / "journal.jsonl"
    records = [e["record"] for e in map(json.loads, journal.read_text().splitlines())
               if e["type"] == "record"]  # fmt: skip
    assert [r["outcome"] for r in records] == ["capability-regression"]

    devices.probe.cache_clear()
    # config.patch, not monkeypatch.setattr: undoing a setattr on inductor's config proxy
    # deletes the option, and every later compile in the process fails ("cpp.cxx does not exist").
    with config.patch({"cpp.cxx": (None, str(pytester.path / "no-compiler"))}):
        result = run_scenario(*_COMPILED_TEST, "-rs", plugins=(_INDUCTOR_ONLY,))
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"*needs {text}: this machine lacks*no C++ compiler*"])


def test_torchao_not_installed_skips_naming_the_extra(run_scenario, monkeypatch, reprobe):
    """torchao is an optional extra: where it is not installed, its test skips saying how to
    install it, a genuine absence even on a release that expects the capability."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a)
    )
    result = run_scenario("test_fp8_torchao.py", "-rs")
    result.assert_outcomes(skipped=1)
    assert "(torchao is not installed: pip install -e '.[fp8]')" in result.stdout.str()
