"""The GPU as it decides behaviour: its class, its memory, clocks and MIG mode (NVML, through
the driver's own library), the cuBLAS this process loaded, the figures that tell variants of one
model apart (harness.lab.machine.gpus), whether it has bfloat16 in hardware, and the GPUs the
NVIDIA driver lists.

A GPU's class is its name (which implies its architecture), with `-MIG` for a MIG slice
(harness.lab.machine.cpu has the CPU's).
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from harness.lab.machine.gpus import GpuFigures

NVIDIA_DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the driver sees


def gpu_facts(index: int = 0) -> dict[str, str]:
    """A GPU's memory, its MIG mode and clocks (NVML, where the driver's library is there),
    and the cuBLAS/cuBLASLt this process loaded: `env.gpu.*`, `env.cublas`, `env.cublaslt`."""
    props = torch.cuda.get_device_properties(index)
    facts = {
        "gpu.memory_gib": f"{props.total_memory / 2**30:.1f}",
        "gpu.sm_count": str(props.multi_processor_count),
        "cublas": _cublas_version("libcublas.so", "cublasGetProperty"),
        "cublaslt": _cublas_version("libcublasLt.so", "cublasLtGetProperty"),
    }
    uuid = str(getattr(props, "uuid", "") or "")
    with nvml_device(uuid) as (nvml, handle):
        if handle is not None:
            facts.update(_nvml_facts(nvml, handle))
    return {k: v or "n/a" for k, v in facts.items()}


@contextlib.contextmanager
def nvml_device(uuid: str) -> Iterator[tuple[object, ctypes.c_void_p | None]]:
    """(NVML, the device's handle) through the driver's own libnvidia-ml with ctypes, so no
    Python package is needed; the handle is None wherever it cannot be had."""
    if not uuid:
        yield None, None
        return
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        yield None, None
        return
    if nvml.nvmlInit_v2() != 0:
        yield nvml, None
        return
    try:
        handle = ctypes.c_void_p()
        name = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"  # NVML's form of the UUID
        found = nvml.nvmlDeviceGetHandleByUUID(name.encode(), ctypes.byref(handle)) == 0
        yield nvml, handle if found else None
    finally:
        nvml.nvmlShutdown()


_NVML_CLOCK = {"sm": 1, "memory": 2}  # nvmlClockType_t


def _nvml_facts(nvml, handle) -> dict[str, str]:
    facts = {}
    current, pending = ctypes.c_uint(), ctypes.c_uint()
    if nvml.nvmlDeviceGetMigMode(handle, ctypes.byref(current), ctypes.byref(pending)) == 0:
        facts["gpu.mig"] = "enabled" if current.value == 1 else "disabled"
    for name, kind in _NVML_CLOCK.items():
        mhz = ctypes.c_uint()
        if nvml.nvmlDeviceGetMaxClockInfo(handle, kind, ctypes.byref(mhz)) == 0:
            facts[f"gpu.max_{name}_clock_mhz"] = str(mhz.value)
        if nvml.nvmlDeviceGetApplicationsClock(handle, kind, ctypes.byref(mhz)) == 0:
            facts[f"gpu.application_{name}_clock_mhz"] = str(mhz.value)
    return facts


def _cublas_version(library: str, getter: str) -> str:
    """The version of a CUDA library this process has loaded (major.minor.patch), read with the
    library's own property getter; "not loaded" before the first matmul loads it."""
    path = _loaded(library)
    if path is None:
        return "not loaded"
    lib = ctypes.CDLL(path)
    parts = []
    for prop in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL (libraryPropertyType)
        value = ctypes.c_int()
        if getattr(lib, getter)(prop, ctypes.byref(value)) != 0:
            return "unknown"
        parts.append(str(value.value))
    return ".".join(parts)


def _loaded(library: str) -> str | None:
    """The path of a shared library this process has mapped, by its name's stem."""
    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1] if len(line.split()) >= 6 else ""
        if Path(path).name.startswith(library):
            return path
    return None


def gpu_class(name: str, facts: dict[str, str]) -> str:
    """A GPU's class: its name (which implies its architecture), `-MIG` on a MIG slice."""
    mig = "-MIG" if facts.get("gpu.mig") == "enabled" else ""
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", name).strip("-") + mig


def gpu_figures(index: int) -> GpuFigures:
    """The figures that tell variants of one GPU apart (harness/lab/machine/gpus.json
    `figures`): total memory and SMs as CUDA reports them, the peak SM clock where this torch
    exposes it, and the board's maximum power limit from NVML where the driver's library is
    there."""
    props = torch.cuda.get_device_properties(index)
    clock_khz = getattr(props, "clock_rate", None)  # torch >= 2.10
    uuid = str(getattr(props, "uuid", "") or "")
    return GpuFigures(
        total_memory_gib=props.total_memory / 2**30,
        sm_count=props.multi_processor_count,
        max_sm_clock_mhz=clock_khz / 1000 if clock_khz else None,
        max_power_w=_nvml_max_power_w(uuid) if uuid else None,
    )


def _nvml_max_power_w(uuid: str) -> float | None:
    """The highest power limit the board allows, in W (nvmlDeviceGetPowerManagementLimit-
    Constraints): an SXM H200 allows 700, an H200 NVL 600; None wherever it cannot be read."""
    with nvml_device(uuid) as (nvml, handle):
        if handle is None:
            return None
        low, high = ctypes.c_uint(), ctypes.c_uint()
        found = nvml.nvmlDeviceGetPowerManagementLimitConstraints(
            handle, ctypes.byref(low), ctypes.byref(high)
        )
        return high.value / 1000 if found == 0 and high.value else None  # milliwatts


def native_bf16() -> bool:
    """Whether the current CUDA device has bfloat16 in hardware. `is_bf16_supported()` also
    counts bf16 that merely runs, emulated (pre-Ampere GPUs), unless asked for native support;
    releases without the `including_emulation` argument (torch 2.4) answer native only."""
    check = torch.cuda.is_bf16_supported
    if "including_emulation" in inspect.signature(check).parameters:
        return bool(check(including_emulation=False))
    return bool(check())


def driver_gpus() -> int:
    """How many GPUs the NVIDIA driver lists (0 without the driver), whether or not torch can
    use them."""
    try:
        return sum(1 for _ in NVIDIA_DRIVER_GPUS.iterdir())
    except OSError:
        return 0
