"""harness.lab.machine.cpu and .gpu: the CPU's class is read back from the kernels in force
(ATen's dispatch, oneDNN's own words), a class held down is recorded as that class, a class that
is not in force is an error, and the GPU's facts come from NVML where the driver has it. Nothing
here holds what this machine measured: each expectation is derived from its probed instruction
sets."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from test_capabilities import _FakeNvml

from harness.lab import devices
from harness.lab.machine import cpu as machine_cpu
from harness.lab.machine import gpu as machine_gpu
from harness.lab.machine import levels
from harness.records import environments, fingerprint

# oneDNN's names of its instruction sets (src/cpu/x64/cpu_isa_traits.hpp, get_isa_info), as its
# verbose header prints them.
ONEDNN_WORDS = {
    "Intel SSE4.1": "sse41",
    "Intel AVX": "avx",
    "Intel AVX2": "avx2",
    "Intel AVX2 with Intel DL Boost": "avx2",
    "Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ extensions": "avx512",
    "Intel AVX-512 with Intel DL Boost": "avx512",
    "Intel AVX-512 with Intel DL Boost and bfloat16 support": "avx512-bf16",
    "Intel AVX-512 with float16, Intel DL Boost and bfloat16 support": "avx512-fp16",
    "Intel AVX-512 with float16, Intel DL Boost and bfloat16 support and Intel AMX with "
    "bfloat16 and 8-bit integer support": "amx",
    "Intel AVX-512 with float16, Intel DL Boost and bfloat16 support and Intel AMX with "
    "bfloat16, float16 and 8-bit integer support": "amx-fp16",
    # oneDNN 3.x (torch 2.13's), ONEDNN_MAX_CPU_ISA=AVX512_CORE_FP16 and =AVX512_CORE_AMX:
    "Intel AVX 10.1": "avx512-fp16",
    "Intel AVX10.1 and Intel AMX with bfloat16 and 8-bit integer support": "amx",
}


@pytest.mark.parametrize(("words", "level"), ONEDNN_WORDS.items())
def test_onednn_s_words_name_their_level(words, level):
    assert machine_cpu.onednn_level(words) == level


@pytest.mark.parametrize(
    ("aten", "onednn", "level"),
    [
        ("AVX512", "avx512-bf16", "avx512-bf16"),
        ("AVX2", "avx2", "avx2"),
        ("DEFAULT", "sse41", "sse41"),
        ("NO AVX", "sse41", "sse41"),  # ATen's word for DEFAULT in 2.4.1 to 2.6.0
        ("AVX512", "avx2", "avx512+onednn-avx2"),  # held apart: both named
        ("AVX2", "avx512-bf16", "avx2+onednn-avx512-bf16"),
        ("AVX512", "", "avx512+onednn-unknown"),
    ],
)
def test_the_class_is_the_level_both_aten_and_onednn_run_at(aten, onednn, level):
    kernels = {"aten": aten, "onednn_level": onednn}
    assert machine_cpu.class_level(kernels, ["avx2", "avx512", "avx512-bf16"]) == level


def test_this_process_s_class_is_what_its_kernels_run_at():
    """The class of this very process, derived from what torch and oneDNN say, not from the
    variables: a CI machine held down (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA) reads lower."""
    facts = machine_cpu.cpu_facts()
    kernels = machine_cpu.kernels_in_force()
    assert kernels["aten"] == torch.backends.cpu.get_cpu_capability()
    assert facts["cpu.class"].endswith(machine_cpu.class_level(kernels, machine_cpu.instructions()))
    if torch.backends.mkldnn.is_available() and not kernels["onednn"].endswith("did not say)"):
        assert machine_cpu.onednn_level(kernels["onednn"]) == kernels["onednn_level"]
    # Never above what the silicon has.
    best = levels.level_rank(machine_cpu.best_level(machine_cpu.instructions()))
    assert levels.level_rank(kernels["onednn_level"]) <= best


def _classes_of_processes(*envs: dict[str, str]) -> list[dict[str, str]]:
    """The CPU facts new processes read, one under each of `envs`, side by side; each one's
    output must be their JSON alone: oneDNN's verbose lines, read back, never reach the
    process's own output."""
    code = "import json; from harness.lab.machine import cpu; print(json.dumps(cpu.cpu_facts()))"
    started = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for env in envs
    ]
    outputs = [process.communicate(timeout=120)[0] for process in started]
    assert all(process.returncode == 0 for process in started), outputs
    return [json.loads(out) for out in outputs]


@pytest.mark.slow
def test_reading_the_kernels_back_prints_nothing():
    (facts,) = _classes_of_processes({"ONEDNN_VERBOSE": "0"})
    assert facts["cpu.class"] == machine_cpu.cpu_facts()["cpu.class"]


@pytest.mark.slow
def test_a_class_held_down_is_recorded_as_that_class_read_back():
    """Every class this machine can reach below its own, held by the variables --amp-cpu-class
    sets, reads back as that class from torch and oneDNN. The control: the variables of the
    machine's own best class read as it."""
    have = machine_cpu.instructions()
    best = machine_cpu.best_level(have)
    reachable = [
        level
        for level in ("sse41", "avx2", "avx512")
        if levels.level_rank(level) <= levels.level_rank(best)
    ]
    assert reachable, f"an x86-64 CPU has SSE4.1 at least: {have}"
    found = _classes_of_processes(*(machine_cpu.HOLD[level] for level in reachable))
    for level, facts in zip(reachable, found, strict=True):
        assert facts["cpu.class"].endswith(f"-{level}"), facts
        assert machine_cpu.HOLD[level]["ONEDNN_MAX_CPU_ISA"] in facts["cpu.held_by"]


def test_a_class_above_the_machine_s_best_is_not_in_force():
    best = machine_cpu.best_level(machine_cpu.instructions())
    higher = [lv for lv in levels.LEVELS if levels.level_rank(lv) > levels.level_rank(best)]
    if not higher:
        pytest.skip(f"this CPU runs the highest class known ({best}): nothing above it to ask for")
    with pytest.raises(machine_cpu.NotInForce, match=f"this CPU's best is {best}"):
        machine_cpu.check_held(higher[-1])


def test_a_class_asked_for_after_the_kernels_were_chosen_says_to_set_it_before(monkeypatch):
    """In a process whose kernels were chosen already (here: this one), holding a lower class
    cannot take effect: the error says so and names the variables to set."""
    ran = machine_cpu.kernels_in_force()
    lower = next(
        (
            lv
            for lv in ("sse41", "avx2")
            if levels.level_rank(lv) < levels.level_rank(ran["onednn_level"])
        ),
        None,
    )
    if lower is None:
        pytest.skip(f"oneDNN runs at {ran['onednn_level']}: no lower class to ask for")
    # hold() sets the variables in this process: on a copy of its environment, put back after.
    monkeypatch.setattr(os, "environ", dict(os.environ))
    machine_cpu.hold(lower)
    with pytest.raises(machine_cpu.NotInForce, match="before Python starts"):
        machine_cpu.check_held(lower)


@pytest.mark.slow
def test_the_option_holds_the_class_for_a_session(pytester):
    """--amp-cpu-class on a session (a process of its own: its kernels are not chosen yet): its
    fingerprint (journal) records the class in force."""
    from conftest import REPO

    have = machine_cpu.instructions()
    if "avx2" not in have:
        pytest.skip(f"needs a CPU with AVX2 to hold it down to avx2: {have}")
    (pytester.path / "scenarios").mkdir()
    source = (REPO / "scenarios" / "test_formats.py").read_text()
    (pytester.path / "scenarios" / "test_formats.py").write_text(source)
    result = pytester.runpytest_subprocess(
        "scenarios/test_formats.py", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={pytester.path / 'r'}", "--amp-cpu-class", "avx2",
    )  # fmt: skip
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["amp-harness verdicts on cpu (torch *, oneDNN at avx2)"])
    lines = (pytester.path / "r" / "journal.jsonl").read_text().splitlines()
    (session,) = [json.loads(line) for line in lines if '"type": "session"' in line]
    assert session["fingerprint"]["hardware_class"] == "cpu-x86-64-avx2"
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in session["fingerprint"]["cpu.held_by"]


def test_the_fingerprint_names_the_class_and_what_each_capability_saw(tmp_path):
    cpu = devices.probe("cpu")
    facts = fingerprint.collect(cpu, tmp_path)
    assert facts["hardware_class"] == facts["cpu.class"] == environments.hardware_class(facts)
    for need, seen in cpu.capabilities.items():
        assert facts[f"capability.{need}"] == ("yes" if seen.works else "no")
    for name in ("cpu.model", "cpu.instructions", "cpu.aten_capability", "cpu.onednn_isa"):
        assert facts[name] and facts[name] != "n/a", name


def test_a_probe_of_a_cpu_kernel_follows_the_class_table():
    """Each hardware row of the table, on this CPU: present where its level is reached (or a
    regression), absent below, and absent nowhere else than where the table says why."""
    cpu = devices.probe("cpu")
    for (device, need), row in devices.EXPECTED.items():
        if device != "cpu" or not row.cpu:
            continue
        reached = levels.level_rank(cpu.onednn_level) >= levels.level_rank(row.cpu)
        lack = cpu.missing(need)
        assert (lack is None or lack.regression) == reached, (need, cpu.onednn_level, lack)


def test_a_gpu_s_mig_mode_and_clocks_come_from_nvml(monkeypatch):
    class Nvml(_FakeNvml):
        def nvmlDeviceGetMigMode(self, _handle, current, pending):
            current._obj.value, pending._obj.value = 1, 1
            return 0

        def nvmlDeviceGetMaxClockInfo(self, _handle, kind, mhz):
            mhz._obj.value = {1: 1980, 2: 3201}[kind]
            return 0

        def nvmlDeviceGetApplicationsClock(self, _handle, _kind, _mhz):
            return 3  # NVML_ERROR_NOT_SUPPORTED: left out

    nvml = Nvml(700_000, "GPU-8c1a")
    monkeypatch.setattr(machine_gpu.ctypes, "CDLL", lambda _name: nvml)
    with machine_gpu.nvml_device("8c1a") as (lib, handle):
        facts = machine_gpu._nvml_facts(lib, handle)
    assert facts == {
        "gpu.mig": "enabled",
        "gpu.max_sm_clock_mhz": "1980",
        "gpu.max_memory_clock_mhz": "3201",
    }
    assert machine_gpu.gpu_class("NVIDIA H200", facts) == "NVIDIA-H200-MIG"
    assert machine_gpu.gpu_class("NVIDIA H200", {"gpu.mig": "disabled"}) == "NVIDIA-H200"
    with machine_gpu.nvml_device("") as (_lib, handle):
        assert handle is None


def test_a_class_the_machine_cannot_reach_stops_the_session_before_any_test(pytester):
    """--amp-cpu-class above this CPU's best: a usage error naming the class, what runs and the
    CPU's best; nothing is recorded."""
    best = machine_cpu.best_level(machine_cpu.instructions())
    if best == levels.LEVELS[-1]:
        pytest.skip(f"this CPU runs the highest class known ({best})")
    pytester.makepyfile(**{"scenarios/test_scn": "def test_x():\n    pass\n"})
    result = pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={pytester.path / 'reports'}", "--amp-cpu-class", levels.LEVELS[-1],
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--amp-cpu-class amx-fp16*not in force*best is {best}*"])
    assert not (pytester.path / "reports" / "journal.jsonl").exists()
