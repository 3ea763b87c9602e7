"""The CPU as it decides behaviour, read from the machine and from the kernels in force.

A result depends on the silicon only through the kernels that ran on it. On the CPU those are
chosen twice: by ATen's dispatch (`torch.backends.cpu.get_cpu_capability()`: DEFAULT, AVX2,
AVX512) and by oneDNN, which picks its own instruction set (its RNN, matmul and convolution
kernels: a bf16 LSTM exists from AVX-512 on, not on an AVX2 CPU). Both can be held below the
machine's best (`ATEN_CPU_CAPABILITY`, `ONEDNN_MAX_CPU_ISA`), so the CPU *class* of a run is
read back from torch and from oneDNN itself, never from the variables or the silicon alone.

The class is what changes behaviour: the architecture and the highest kernel level in force,
`cpu-x86-64-avx2`, `cpu-x86-64-avx512-bf16` (a GPU's class: harness.lab.machine.gpu). Baselines,
ledger columns and `compare` go by it (harness.records.environments reads it back from a
fingerprint without torch).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import re
import tempfile
import warnings
from pathlib import Path

import torch

from harness.common.errors import HarnessError
from harness.lab.machine.levels import LEVELS, level_rank

# What holds the kernels to a level on a machine that has more (`--amp-cpu-class`): ATen's
# dispatch, oneDNN's and MKL's. Each is read once, when the library first runs a kernel.
HOLD: dict[str, dict[str, str]] = {
    "sse41": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "avx512-bf16": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
    "avx512-fp16": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_FP16"},
    "amx": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"},
    "amx-fp16": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX_FP16"},
}
MKL_HOLD = {"sse41": "SSE4_2", "avx2": "AVX2"}  # MKL_ENABLE_INSTRUCTIONS; AVX-512 is its top
HOLD_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")

# ATen's names of its levels: the lowest is "NO AVX" in 2.4.1 to 2.6.0, "DEFAULT" from 2.9.1.
_ATEN_LEVEL = {"DEFAULT": "sse41", "NO AVX": "sse41", "AVX2": "avx2", "AVX512": "avx512"}

# oneDNN's own name of the instruction set it runs (its verbose "isa:" line), most specific
# first: the first pattern found names the level.
_ONEDNN_LEVEL = (
    (r"AMX with bfloat16, float16", "amx-fp16"),
    (r"AMX", "amx"),
    (r"AVX-512 with float16", "avx512-fp16"),
    (r"AVX ?10\.1", "avx512-fp16"),  # oneDNN 3.x's name for the same ISA (torch 2.13 on)
    (r"AVX-512.*bfloat16", "avx512-bf16"),
    (r"AVX-512", "avx512"),
    (r"AVX2", "avx2"),
    (r"\bAVX\b", "avx"),
    (r"SSE4\.1", "sse41"),
)

# Instruction sets a kernel branches on: torch's own probe where this torch has it, else the
# kernel's /proc/cpuinfo flag (either name given).
_INSTRUCTIONS = (
    ("avx2", "_is_avx2_supported", "avx2"),
    ("avx512", "_is_avx512_supported", "avx512bw"),
    ("avx512-vnni", "_is_vnni_supported", "avx512_vnni"),
    ("avx512-bf16", "_is_avx512_bf16_supported", "avx512_bf16"),
    ("avx512-fp16", None, "avx512_fp16"),
    ("amx", "_is_amx_tile_supported", "amx_tile"),
    ("amx-fp16", "_is_amx_fp16_supported", "amx_fp16"),
    ("f16c", None, "f16c"),
    ("bf16", None, "bf16"),  # aarch64: BFloat16 instructions
    ("sve", None, "sve"),
)


def cpu_facts() -> dict[str, str]:
    """The CPU as it decides behaviour: model, cores, threads used, the instruction sets it has,
    the kernel levels in force (ATen's and oneDNN's, read back), the libraries, and its class.
    Flat strings, as the fingerprint logs them (`env.cpu.*`)."""
    info = _cpuinfo()
    kernels = kernels_in_force()
    facts = {
        "cpu.vendor": info.get("vendor_id") or info.get("CPU implementer") or platform.system(),
        "cpu.model": info.get("model name") or platform.processor() or platform.machine(),
        "cpu.cores": str(os.cpu_count() or 0),
        "cpu.usable_cores": str(_usable_cores()),
        "cpu.threads": str(torch.get_num_threads()),
        "cpu.instructions": " ".join(instructions(info)) or "none of those probed",
        "cpu.aten_capability": kernels["aten"],
        "cpu.onednn_isa": kernels["onednn"],
        "cpu.held_by": " ".join(
            f"{name}={os.environ[name]}" for name in HOLD_VARIABLES if os.environ.get(name)
        )
        or "nothing (the machine's best)",
        "cpu.class": cpu_class(kernels, instructions(info)),
        "onednn": _config_version(r"MKL-DNN v([\w.]+)"),
        "mkl": _config_version(r"Math Kernel Library Version ([\w.]+)"),
    }
    return {k: v or "n/a" for k, v in facts.items()}


def instructions(info: dict[str, str] | None = None) -> list[str]:
    """The instruction sets of `_INSTRUCTIONS` this CPU has (not what is in force)."""
    info = _cpuinfo() if info is None else info
    flags = set((info.get("flags") or info.get("Features") or "").split())
    found = []
    for name, probe, flag in _INSTRUCTIONS:
        check = getattr(torch.cpu, probe, None) if probe else None
        if check is not None:
            try:
                present = bool(check())
            except RuntimeError:  # a build without cpuinfo for this architecture
                present = flag in flags
        else:
            present = flag in flags
        if present:
            found.append(name)
    return found


def cpu_class(kernels: dict[str, str], silicon: list[str]) -> str:
    """`cpu-<arch>-<level>` (class_level)."""
    return f"cpu-{architecture()}-{class_level(kernels, silicon, architecture())}"


def architecture() -> str:
    """The CPU architecture under one name whatever the OS calls it (Windows: AMD64, macOS:
    arm64)."""
    arch = re.sub(r"[^a-z0-9]+", "-", platform.machine().lower()) or "unknown"
    return {"amd64": "x86-64", "x64": "x86-64", "arm64": "aarch64"}.get(arch, arch)


def class_level(kernels: dict[str, str], silicon: list[str], arch: str = "x86-64") -> str:
    """The level both ATen and oneDNN run at. Where they are held to different families, both
    are named (`avx2+onednn-avx512-bf16`)."""
    if arch not in ("x86-64", "i386", "i686"):
        # ATen names its own levels there (DEFAULT, SVE256, ...); bf16 instructions change
        # which kernels run.
        return kernels["aten"].lower() + ("-bf16" if "bf16" in silicon else "")
    aten = _ATEN_LEVEL.get(kernels["aten"], kernels["aten"].lower())
    onednn = kernels["onednn_level"]
    if not onednn:
        return f"{aten}+onednn-unknown"
    family = {"sse41": "sse41", "avx": "sse41", "avx2": "avx2"}.get(onednn, "avx512")
    return onednn if family == aten else f"{aten}+onednn-{onednn}"


def onednn_level(words: str) -> str | None:
    """The level oneDNN's name of its instruction set stands for; None for none known."""
    for pattern, level in _ONEDNN_LEVEL:
        if re.search(pattern, words):
            return level
    return None


@functools.cache
def kernels_in_force() -> dict[str, str]:
    """What the CPU kernels run at in this process, read back from the libraries once: ATen's
    capability and oneDNN's instruction set (its own words, and its level).

    oneDNN says it only in its verbose output, printed at its first kernel: it is captured from
    file descriptor 1 around one tiny call. Called before any probe runs
    (harness.lab.machine.device.probe), so that oneDNN's one-time header comes here, not to a test.
    MKL (fp32 GEMM) is held down with the rest but not read back: its verbose banner, which
    names its code path, measures the CPU's clock first (a second per process)."""
    aten = _aten_capability()
    onednn = ""
    if torch.backends.mkldnn.is_available():
        with contextlib.suppress(Exception):  # a read-back that fails leaves the fact unknown
            onednn = _onednn_isa()
    level = onednn_level(onednn) if onednn else _onednn_fallback()
    return {
        "aten": aten,
        "onednn": onednn
        or (f"{level}, inferred from the CPU's flags" if level else "unknown")
        + " (oneDNN did not say)",
        "onednn_level": level or "",
    }


def _aten_capability() -> str:
    """ATen's capability in force. torch reads ATEN_CPU_CAPABILITY once, at the first kernel it
    dispatches (here, before any probe), and a value it does not take (a typo, `avx9000`; or
    `sve256` on a CPU without it) it ignores with a warning and runs the machine's best: not
    the kernels asked for, so a usage error, in one line, naming the variable and the fix."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        aten = torch.backends.cpu.get_cpu_capability()
    asked = os.environ.get("ATEN_CPU_CAPABILITY")
    if asked is not None and caught:
        said = str(caught[0].message).split(" (Triggered internally")[0]
        held = sorted({hold["ATEN_CPU_CAPABILITY"] for hold in HOLD.values()})
        raise HarnessError(
            f"ATEN_CPU_CAPABILITY={asked!r}: torch did not take it ({said}) and runs {aten}: on "
            f"x86 use {', '.join(held)}, or unset it (--amp-cpu-class holds the kernels to a "
            f"class by name: {', '.join(HOLD)})"
        )
    for warning in caught:  # not about the variable: as torch gave it
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return aten


def _onednn_isa() -> str:
    def one_kernel() -> None:
        with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
            torch.ones(4, 4).to_mkldnn().to_dense()  # a oneDNN reorder: a primitive, no math

    found = re.search(r"isa:(.+)", stdout_of(one_kernel))
    return found[1].strip() if found else ""


def _onednn_fallback() -> str | None:
    """oneDNN printed no instruction set (a build without its verbose mode, or its header
    already printed in this process): held down by ONEDNN_MAX_CPU_ISA, unknown (None); else the
    silicon's best, which oneDNN takes by default."""
    if os.environ.get("ONEDNN_MAX_CPU_ISA") or not torch.backends.mkldnn.is_available():
        return None
    return best_level(instructions())


def best_level(have: list[str]) -> str:
    """The highest level among a CPU's instruction sets (`instructions`)."""
    return max((i for i in have if i in LEVELS), key=level_rank, default="sse41")


def stdout_of(call) -> str:
    """What C code printed to file descriptor 1 while `call()` ran: C's buffers are flushed on
    both sides; Python's own buffered output is left in its buffer, to reach the real output."""
    libc = ctypes.CDLL(None)
    with tempfile.TemporaryFile() as captured:
        libc.fflush(None)
        saved = os.dup(1)
        try:
            os.dup2(captured.fileno(), 1)
            try:
                call()
            finally:
                libc.fflush(None)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        captured.seek(0)
        return captured.read().decode("utf-8", "replace")


def _config_version(pattern: str) -> str:
    found = re.search(pattern, torch.__config__.show())
    return found[1] if found else ""


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 0


def _cpuinfo() -> dict[str, str]:
    """The first processor's entry of /proc/cpuinfo ({} where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    info: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():
        name, _, value = line.partition(":")
        info.setdefault(name.strip(), value.strip())
    return info


# --- holding the CPU kernels down ---------------------------------------------------------------


class NotInForce(Exception):
    """A CPU class was asked for and is not what runs."""


def hold(level: str) -> dict[str, str]:
    """Set the variables that hold this process's CPU kernels (and its children's) to `level`;
    returns what was set. Takes effect only before the libraries ran a kernel: `check_held`
    says whether it did."""
    variables = dict(HOLD[level])
    if level in MKL_HOLD:
        variables["MKL_ENABLE_INSTRUCTIONS"] = MKL_HOLD[level]
    os.environ.update(variables)
    return variables


def check_held(level: str) -> str:
    """The class in force, when it is `level`; NotInForce naming what runs instead and why."""
    kernels = kernels_in_force()
    have = instructions()
    found = class_level(kernels, have, architecture())
    if found == level:
        return found
    best = best_level(have)
    if level_rank(level) > level_rank(best):
        why = f"this CPU's best is {best} ({' '.join(have) or 'no instruction set probed'})"
    else:
        why = (
            "torch or oneDNN had already chosen their kernels when the class was set: set "
            + " ".join(f"{k}={v}" for k, v in HOLD[level].items())
            + " in the environment before Python starts"
        )
    raise NotInForce(
        f"CPU class {level} is not in force: ATen runs {kernels['aten']}, oneDNN "
        f"{kernels['onednn']!r}; {why}"
    )
