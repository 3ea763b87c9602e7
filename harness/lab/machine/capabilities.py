"""What a capability is, and the built-in ones: one row each, in the shape a team declares its
own (`Capability(name, text, probe, expected)`).

A row says everything the harness knows of a capability: its name (what
`@pytest.mark.requires(...)` calls it), what it is in words (a skip reason reads "needs
<text>: ..."), its probe (harness.lab.machine.probes: a tiny real case on the device type), and
per device type why this build and hardware should have it (`Expected`: from which torch
release, compute capability or CPU level on). A device type without a row never expects it, so
its absence there is a skip; a built-in row may say why (`not_expected`), and may defer its
probe to the first test that asks (`deferred`). Adding a built-in capability is one row of
BUILT_IN, below.

The tables the rest of the harness reads (PROBES, DEFERRED_PROBES, CAPABILITY_TEXT, EXPECTED,
NOT_EXPECTED, HARDWARE_CAPABILITIES) are made from the rows, once, at import.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from harness.common.errors import HarnessError, closest
from harness.lab.machine import probes
from harness.lab.machine.levels import LEVELS
from harness.lab.machine.probes import Probe

DEVICE_TYPES = ("cpu", "cuda")


@dataclass(frozen=True)
class Expected:
    """A capability this build and hardware should have: from `torch` on, on CUDA from compute
    capability `cc`, on the CPU from oneDNN's kernel level `cpu` (harness.lab.machine.levels,
    read back from oneDNN: a class held down counts as that class). `source` says why.
    `unheld_from`, on the CPU: where the silicon reaches this level, only while oneDNN is not held
    below it (`held`: what was measured held)."""

    torch: tuple[int, int] = (2, 4)
    cc: tuple[int, int] | None = None
    source: str = ""
    cpu: str | None = None
    unheld_from: str | None = None
    held: str = ""

    def __post_init__(self) -> None:
        problem = _expected_problem(self)
        if problem:  # a team's row: held when built, not when first compared (a TypeError)
            raise HarnessError(f"Expected(source={self.source!r}): {problem}")


def _expected_problem(row: Expected) -> str | None:
    """What is wrong with an Expected row's fields, with the fix; None when nothing is."""
    for name in ("torch", "cc"):
        value = getattr(row, name)
        numbers = isinstance(value, tuple) and len(value) == 2
        numbers = numbers and all(type(v) is int and v >= 0 for v in value)
        if (value is not None or name == "torch") and not numbers:
            example = "(2, 9)" if name == "torch" else "(8, 0)"
            return f"{name}={value!r}: use two whole numbers, (major, minor), e.g. {name}={example}"
    for name in ("cpu", "unheld_from"):
        value = getattr(row, name)
        if value is not None and value not in LEVELS:
            return (
                f"{name}={value!r}: use a CPU level, one of {', '.join(LEVELS)} "
                f"(closest: {closest(str(value), LEVELS)})"
            )
    for name in ("source", "held"):
        if not isinstance(getattr(row, name), str):
            return f"{name}={getattr(row, name)!r}: say it in words (text)"
    return None


_CAPABILITY_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True, eq=False)
class Capability:
    """A capability a team declares beside its scenarios, in the list CAPABILITIES of
    `scenarios/capabilities.py`, held to the rules of the built-in ones: where `expected` has
    no row for the device type, or the row's torch release, compute capability or CPU level is
    not reached, its absence is a skip with the reason; where the row holds and the probe says
    no (or raises), the tests that need it fail as a capability regression."""

    name: str  # as @pytest.mark.requires names it: lower case letters, digits and _
    text: str  # what it is, in words: the skip reason reads "needs <text>: ..."
    probe: Callable[[str], Probe]  # runs a tiny real case on the device type ("cpu", "cuda")
    expected: Mapping[str, Expected] = field(default_factory=dict)  # per device type: why

    def __post_init__(self) -> None:
        problem = _capability_problem(self)
        if problem:
            raise HarnessError(f"Capability({self.name!r}): {problem}")


@dataclass(frozen=True, eq=False)
class BuiltIn(Capability):
    """A built-in capability: a team's Capability, and two things more. `deferred`: its probe
    takes seconds, so it runs the first time a test needs the capability, not at the start of
    every session and isolated worker, most of which never ask. `not_expected`: per device type
    without an `expected` row, why, where there is more to say than "not expected on ..."."""

    deferred: bool = False
    not_expected: Mapping[str, str] = field(default_factory=dict)


def _capability_problem(capability: Capability) -> str | None:
    """What is wrong with a declared capability's fields, with the fix; None when nothing is."""
    name = capability.name
    if not isinstance(name, str) or not _CAPABILITY_NAME.fullmatch(name):
        return "name: use lower case letters, digits and _, starting with a letter, e.g. 'inductor'"
    if not isinstance(capability, BuiltIn) and name in CAPABILITY_TEXT:
        return (
            f"name: {name!r} is a built-in capability ({CAPABILITY_TEXT[name]}): require the "
            "built-in one as it is, or give yours another name"
        )
    if not isinstance(capability.text, str) or not capability.text.strip():
        return "text: say what it is in a few words; the skip reason reads 'needs <text>: ...'"
    if not callable(capability.probe):
        return 'probe: use a function of the device type ("cpu" or "cuda") returning a Probe'
    rows = capability.expected
    if not isinstance(rows, Mapping):
        return f"expected={rows!r}: use a dict, e.g. {{'cpu': Expected(source='why')}}"
    for device_type, row in rows.items():
        if device_type not in DEVICE_TYPES:
            return (
                f"expected[{device_type!r}]: the device types are {', '.join(DEVICE_TYPES)} "
                f"(closest: {closest(str(device_type), DEVICE_TYPES)})"
            )
        if not isinstance(row, Expected) or not row.source.strip():
            return (
                f"expected[{device_type!r}]={row!r}: use Expected(source='why this build and "
                "hardware should have it'), with torch=, cc= or cpu= where it holds only from there"
            )
    for device_type in getattr(capability, "not_expected", {}):
        if device_type not in DEVICE_TYPES or device_type in rows:
            return f"not_expected[{device_type!r}]: a device type without an expected row"
    return None


_FP16_ON_NO_CPU_YET = (
    "oneDNN computes float16 there only with AVX512-FP16 or AMX-FP16 (Sapphire Rapids on), and "
    "no such CPU was measured: the table expects it on no CPU class yet"
)

# The built-in capabilities, one row each; the session's device itself ("cuda") is not probed
# here: it is a device, or not (harness.lab.machine.device). Rows without an `expected` entry for
# a device type never expect the capability there (TF32 on the CPU): its absence is a skip.
BUILT_IN: tuple[BuiltIn, ...] = (
    BuiltIn(
        "fp16_autocast",
        "float16 autocast",
        lambda device: probes.probe_autocast(device, torch.float16),
        {
            # Documented from 2.5, but it works in 2.4 (every fp16-autocast scenario passed on
            # 2.4.1: reports/baselines/), and tests/lab/machine/test_capabilities.py holds each
            # row to the baselines.
            "cpu": Expected(source="CPU autocast ran float16 in torch 2.4.1"),
            "cuda": Expected(source="float16 is CUDA autocast's default dtype"),
        },
    ),
    BuiltIn(
        "bf16_autocast",
        "bfloat16 autocast",
        # On CUDA, bfloat16 emulated (pre-Ampere) counts as absent: harness.lab.machine.device.
        lambda device: probes.probe_autocast(device, torch.bfloat16),
        {
            "cpu": Expected(source="CPU autocast has run bfloat16 since torch 1.10"),
            "cuda": Expected(cc=(8, 0), source="bfloat16 tensor cores from Ampere (sm_80) on"),
        },
    ),
    BuiltIn(
        "grad_scaler",
        "a working torch.amp.GradScaler for this device",
        probes.probe_grad_scaler,
        {
            "cpu": Expected(source='torch.amp.GradScaler("cpu") exists since torch 2.3'),
            "cuda": Expected(source="torch.amp.GradScaler was made for CUDA"),
        },
    ),
    BuiltIn(
        "half_training",
        "float16 kernels to train a .half() model (linear, batch and layer norm)",
        probes.probe_half_training,
        {
            "cpu": Expected(
                source="torch 2.4 ships float16 CPU kernels for linear, batch_norm and layer_norm"
            ),
            "cuda": Expected(source="every CUDA GPU torch supports has fp16 kernels"),
        },
    ),
    BuiltIn(
        "tf32",
        "TF32 tensor cores (an NVIDIA GPU of compute capability 8.0 or newer)",
        probes.probe_tf32,
        {"cuda": Expected(cc=(8, 0), source="TF32 tensor cores from Ampere (sm_80) on")},
    ),
    BuiltIn(
        "fp8_matmul",
        "an fp8 matmul (torch._scaled_mm on float8_e4m3fn, compute capability 8.9+)",
        probes.probe_fp8_matmul,
        {
            "cuda": Expected(
                (2, 5),
                (8, 9),
                "fp8 tensor cores from Ada and Hopper (sm_89, sm_90) on, with "
                "torch._scaled_mm's single-tensor result from torch 2.5",
            ),
        },
    ),
    BuiltIn(
        "fp8_scaled_mm",
        "torch._scaled_mm on this device (float8_e4m3fn, one scale per tensor)",
        probes.probe_fp8_scaled_mm,
        {
            "cpu": Expected(
                (2, 9),
                source="torch._scaled_mm has a CPU kernel from 2.9 on: measured absent on 2.4.1, "
                "2.5.1 and 2.6.0 ('Could not run aten::_scaled_mm ... CPU backend'), present on "
                "2.9.1, 2.11.0, 2.12.1, 2.13.0 and 2.14.1 (2.7 and 2.8 not measured)",
                unheld_from="avx512-fp16",
                held="on a Xeon with AVX512-FP16 and AMX, torch 2.13.0, oneDNN held to sse41, "
                "avx2, avx512 or avx512-bf16 (ONEDNN_MAX_CPU_ISA): 'could not create a primitive "
                "descriptor for the matmul primitive' once oneDNN has run another kernel; an "
                "AVX2 EPYC held to sse41 runs it",
            ),
            "cuda": Expected(
                (2, 5), (8, 9), "torch._scaled_mm on CUDA needs fp8 tensor cores (sm_89, sm_90 on)"
            ),
        },
    ),
    BuiltIn(
        "fp8_rowwise_scaled_mm",
        "torch._scaled_mm with a scale per row and per column",
        lambda device: probes.probe_fp8_scaled_mm(device, rowwise=True),
        {
            # Rowwise scales on the CPU: 2.9.1 asserts scale_a.numel() == 1. No CUDA row: which
            # GPUs take rowwise scales in which release was not measured (a present one runs;
            # none skips).
            "cpu": Expected(
                (2, 12),
                source="measured: 2.9.1 and 2.11.0 refuse rowwise scales on the CPU (an internal "
                "assert that both scales have one element); 2.12.1, 2.13.0 and 2.14.1 compute "
                "them",
            ),
        },
    ),
    BuiltIn(
        "fused_optimizers",
        "fused=True SGD, Adam and AdamW (kernels that take GradScaler's check)",
        probes.probe_fused_optimizers,
        {
            "cpu": Expected(
                source="fused=True SGD, Adam and AdamW step on the CPU in every release the "
                "harness supports: measured on torch 2.4.1, 2.5.1, 2.6.0, 2.9.1, 2.13.0 and 2.14.1"
            ),
            "cuda": Expected(
                source="torch 2.4's SGD, Adam and AdamW list cuda first among the devices with "
                "fused kernels (torch.utils._foreach_utils._get_fused_kernels_supported_devices)"
            ),
        },
        # Building an optimizer imports dynamo (torch.optim's constructors): 1.7 s, a third of a
        # session's start-up.
        deferred=True,
    ),
    BuiltIn(
        "torchao_float8",
        "torchao's float8 training (Float8Linear; the `fp8` extra)",
        probes.probe_torchao_float8,
        {
            # Where torchao is installed (the probe says absent otherwise: a skip): it must work.
            "cpu": Expected(
                (2, 13),
                source="torchao 0.18's Float8Linear trains emulated on the CPU: measured on torch "
                "2.13.0 and 2.14.1 (older releases not measured with it)",
            ),
            "cuda": Expected(
                (2, 13), source="torchao's float8 training is made for CUDA (emulated below sm_89)"
            ),
        },
        deferred=True,  # importing torchao: seconds, and it prints
    ),
    BuiltIn(
        "gloo",
        "torch.distributed with gloo (the CPU ranks of the distributed scenarios)",
        probes.probe_gloo,
        {
            "cpu": Expected(source="every torch wheel for Linux, macOS and Windows has gloo"),
            "cuda": Expected(source="every torch wheel for Linux and Windows has gloo"),
        },
    ),
    BuiltIn(
        "fsdp2",
        "FSDP2 (fully_shard, MixedPrecisionPolicy, ShardedGradScaler) on gloo CPU ranks",
        probes.probe_fsdp2,
        {
            "cpu": Expected(
                (2, 7),
                source="FSDP2 runs on gloo CPU ranks from torch 2.7 (2.6 made fully_shard public, "
                "but its all-gather needs Stream.record_event, which 2.6's CPU stream lacks: "
                "measured AttributeError on 2.6.0; it runs on 2.7.1, 2.9.1, 2.13.0 and 2.14.1)",
            ),
            # The FSDP2 rehearsal runs on CPU ranks whatever the session's device: from 2.7.
            "cuda": Expected((2, 7), source="FSDP2 runs on gloo CPU ranks from torch 2.7"),
        },
        # Importing FSDP2: 0.8 s, in every session and xdist worker, where only the distributed
        # scenario asks.
        deferred=True,
    ),
    # The CPU rows that follow the hardware, measured by holding one machine's kernels down
    # (--amp-cpu-class; docs/hardware.md). float16 RNN and matmul kernels need AVX512-FP16 or
    # AMX-FP16 in oneDNN; no such CPU was measured, so the table expects them nowhere yet.
    BuiltIn(
        "bf16_rnn",
        "a bfloat16 LSTM under autocast (on the CPU: oneDNN's RNN kernel)",
        lambda device: probes.probe_rnn(device, torch.bfloat16),
        {
            "cpu": Expected(
                cpu="avx512",
                source="oneDNN runs a bfloat16 LSTM from AVX-512 on (AVX512_CORE, converting): "
                "measured on torch 2.13 and 2.14 with oneDNN held to AVX512_CORE, "
                "AVX512_CORE_BF16 and below (and at AVX512_CORE_BF16 on 2.4 to 2.9); at AVX2 and "
                "SSE4.1 it raises 'could not create a primitive descriptor'",
            ),
        },
    ),
    BuiltIn(
        "fp16_rnn",
        "a float16 LSTM under autocast (on the CPU: oneDNN's RNN kernel)",
        lambda device: probes.probe_rnn(device, torch.float16),
        not_expected={"cpu": _FP16_ON_NO_CPU_YET},
    ),
    BuiltIn(
        "bf16_matmul_kernel",
        "a CPU matmul kernel computing in bfloat16 instructions (oneDNN)",
        lambda device: probes.probe_matmul_kernel(device, torch.bfloat16),
        {
            "cpu": Expected(
                cpu="avx512-bf16",
                source="oneDNN runs a bfloat16 matmul on avx512_core_bf16 instructions "
                "(brg_matmul) where the CPU has AVX512-BF16: measured on torch 2.13 and 2.14; "
                "held to AVX512_CORE it converts (gemm:jit:bf16), at AVX2 ATen computes it",
            ),
        },
    ),
    BuiltIn(
        "fp16_matmul_kernel",
        "a CPU matmul kernel computing in float16 instructions (oneDNN)",
        lambda device: probes.probe_matmul_kernel(device, torch.float16),
        not_expected={"cpu": _FP16_ON_NO_CPU_YET},
    ),
    BuiltIn(
        "inductor_compile",
        "torch.compile's inductor backend (a C++ compiler on the CPU, triton on CUDA)",
        probes.probe_inductor_compile,
        {
            # Where the machine has what inductor builds with (the probe says absent otherwise:
            # a skip).
            "cpu": Expected(
                source="inductor compiles CPU kernels with the machine's C++ compiler (torch 2.0 "
                "on): measured compiling on torch 2.4.1, 2.5.1, 2.6.0, 2.9.1, 2.13.0 and 2.14.1 "
                "with g++"
            ),
            "cuda": Expected(
                source="inductor generates CUDA kernels with triton, a dependency of torch's "
                "Linux CUDA wheels"
            ),
        },
        # A torch.compile: importing dynamo and inductor alone takes about 3 s on 2 cores, a
        # first C++ build 10 s more.
        deferred=True,
    ),
)

# The tables the harness reads, made from the rows. The probes run when the device is probed,
# at the start of a session; the deferred ones the first time a test asks for their capability.
PROBES: dict[str, Callable[[str], Probe]] = {c.name: c.probe for c in BUILT_IN if not c.deferred}
DEFERRED_PROBES: dict[str, Callable[[str], Probe]] = {
    c.name: c.probe for c in BUILT_IN if c.deferred
}
CAPABILITY_TEXT: dict[str, str] = {"cuda": "CUDA", **{c.name: c.text for c in BUILT_IN}}
# What a capability's absence means, per (device type, capability). Not listed: never expected
# there, so its absence is a skip.
EXPECTED: dict[tuple[str, str], Expected] = {
    (device_type, c.name): row for c in BUILT_IN for device_type, row in c.expected.items()
}
# Why a capability has no row where it has none, when there is more to say than that.
NOT_EXPECTED: dict[tuple[str, str], str] = {
    (device_type, c.name): why for c in BUILT_IN for device_type, why in c.not_expected.items()
}
# The capabilities whose presence follows the hardware (a row with a compute capability or a
# CPU level): a test that needs one depends on the hardware, and where two environments'
# classes differ in it, the hardware explains what differs (harness.records.environments).
HARDWARE_CAPABILITIES = frozenset(
    {key for key, row in EXPECTED.items() if row.cc or row.cpu or row.unheld_from}
    | set(NOT_EXPECTED)
)  # (device type, capability)
