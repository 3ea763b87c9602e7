"""What this machine can do, probed at run time, and held against what this build and hardware
are expected to have.

Each capability a scenario needs (`@pytest.mark.requires(...)`) is, on the session's device:
- present: its probe ran a tiny real case and saw it work;
- absent: the hardware or the build genuinely lacks it (no GPU, a CPU-only wheel, a compute
  capability or a torch release older than the feature), or the machine lacks what it is built
  with (a probe's `Probe(absent=True)`: no C++ compiler for inductor): the test skips, and the
  reason says which, so that a person can act on it;
- a capability regression: EXPECTED says this build and hardware should have it, but the probe
  saw otherwise, or raised. The test fails at setup, naming the capability, what the probe saw
  and the claims it checks: a broken feature must never pass for a missing one.

Most probes run when the device is probed, at the start of a session; those that take seconds
(inductor_compile's torch.compile, fused_optimizers' import of dynamo, fsdp2's of FSDP) are in
DEFERRED_PROBES and run the first time a test asks for their capability.

A team declares capabilities of its own beside its scenarios (`scenarios/capabilities.py`, the
list CAPABILITIES of `Capability(name, text, probe, expected)`); the plugin loads them with
`with_team_capabilities` and holds them to the same rules (docs/writing-a-scenario.md).
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import functools
import importlib.metadata
import importlib.util
import inspect
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.common.errors import HarnessError, closest
from harness.lab import hardware, releases, tf32
from harness.lab.gpus import GpuFigures, Identified, identify

DEVICE_TYPES = ("cpu", "cuda")
DEVICE_CHOICES = ("auto", *DEVICE_TYPES)
TEAM_CAPABILITIES = "capabilities.py"  # beside the scenarios (the ini option amp_capabilities)
NVIDIA_DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the driver sees


@dataclass(frozen=True)
class Probe:
    """What one capability probe saw on this device."""

    works: bool
    saw: str  # in words: "autocast(cpu, bfloat16) made a Linear output float32"
    error: str = ""  # the probe's traceback, when it raised
    # The machine lacks what the capability is built with (no C++ compiler for inductor): a
    # genuine absence, a skip even where EXPECTED expects the capability of this build.
    absent: bool = False

    @property
    def raised(self) -> bool:
        return bool(self.error)


def _run_probe(fn) -> Probe:
    """Run a probe. A warning is what the probe saw (autocast's "...Disabling autocast" is how
    an unsupported dtype answers), never a crash; anything raised is kept with its traceback."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return fn()
    except Warning as warning:
        return Probe(False, f"it warned: {type(warning).__name__}: {warning}")
    except Exception as exc:
        return Probe(False, f"it raised {type(exc).__name__}: {_first_sentence(exc)}",
                     traceback.format_exc())  # fmt: skip


def _first_sentence(exc: BaseException, chars: int = 240) -> str:
    """What an exception says, up to its first sentence's end: a skip reason is read, and a
    dispatcher error goes on to list 40 backends (the whole text stays in Probe.error)."""
    text = " ".join(str(exc).split())
    end = text.find(". ")
    text = text[: end + 1] if 0 < end < chars else text
    return text if len(text) <= chars else text[: chars - 3] + "..."


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _probe_autocast(device: str, dtype: torch.dtype) -> Probe:
    linear = torch.nn.Linear(4, 4).to(device)
    with torch.autocast(device_type=device, dtype=dtype):
        out = linear(torch.ones(2, 4, device=device)).dtype
    return Probe(
        out == dtype, f"under autocast({device}, {_dtype(dtype)}) a Linear output {_dtype(out)}"
    )


def _probe_grad_scaler(device: str) -> Probe:
    enabled = torch.amp.GradScaler(device).is_enabled()
    return Probe(enabled, f"torch.amp.GradScaler({device!r}).is_enabled() is {enabled}")


def _probe_half_training(device: str) -> Probe:
    """`model.half()` needs half kernels for linear, batch/layer norm, forward and backward."""
    model = (
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.LayerNorm(4))
        .to(device)
        .half()
    )
    model(torch.ones(3, 4, device=device, dtype=torch.half)).sum().backward()
    grad = model[0].weight.grad.dtype
    return Probe(
        grad == torch.half,
        f"a .half() Linear-BatchNorm-LayerNorm trained with {_dtype(grad)} .grad",
    )


def _probe_tf32(device: str) -> Probe:
    """TF32 rounds matmul inputs to 10 mantissa bits: with it allowed, an fp32 matmul's error
    against float64 grows ~1000x. A flag that no longer changes the numbers is a broken TF32."""
    if device != "cuda":
        return Probe(False, "TF32 is an NVIDIA tensor-core format; this device is the CPU")
    a = torch.randn(256, 256, device=device, generator=torch.Generator(device).manual_seed(0))
    exact = a.double() @ a.double()
    saved = tf32.tf32_settings()  # the new fp32_precision API where the build has it
    errors = {}
    try:
        for allowed in (True, False):
            tf32.set_tf32(allowed)
            errors[allowed] = float(((a @ a).double() - exact).abs().max() / exact.abs().max())
    finally:
        tf32.restore_tf32(saved)
    return Probe(
        errors[True] > 8 * errors[False],
        f"a 256x256 fp32 matmul's relative error was {errors[True]:.1e} with TF32 allowed and "
        f"{errors[False]:.1e} without",
    )


def _probe_fp8_scaled_mm(device: str, rowwise: bool = False) -> Probe:
    """torch._scaled_mm on this device, float8_e4m3fn ones in and float32 out, with one scale
    per tensor (or, `rowwise`, one per row of the first operand and per column of the second):
    32 is the exact answer. The CPU's has no hardware requirement; CUDA's needs sm_89+."""
    if not hasattr(torch, "_scaled_mm"):
        return Probe(False, f"torch {torch.__version__} has no torch._scaled_mm")
    ones = torch.ones(32, 32, device=device).to(torch.float8_e4m3fn)
    scales = (torch.ones(32, 1, device=device), torch.ones(1, 32, device=device))
    unit = torch.ones((), device=device)
    scale_a, scale_b = scales if rowwise else (unit, unit)
    out_dtype = torch.bfloat16 if rowwise else torch.float32  # rowwise: bfloat16 out on CUDA
    out = torch._scaled_mm(
        ones, ones.t().contiguous().t(), scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype
    )
    out = out[0] if isinstance(out, tuple) else out  # torch 2.4 returned (out, amax)
    return Probe(
        out.dtype == out_dtype and float(out[0, 0]) == 32.0,
        f"ones(32, 32) @ ones(32, 32) gave {float(out[0, 0]):g} in {out.dtype}, expected 32",
    )


def _probe_fp8_matmul(device: str) -> Probe:
    """torch._scaled_mm on float8_e4m3fn ones, as scenarios/test_speed.py times it: unit scales,
    the second operand column-major (cuBLASLt's layout), bfloat16 out; 32 is the exact answer."""
    if device != "cuda":
        return Probe(False, "fp8 GEMMs are timed on CUDA (cuBLASLt) only; this device is the CPU")
    if not hasattr(torch, "_scaled_mm"):
        return Probe(False, f"torch {torch.__version__} has no torch._scaled_mm")
    ones = torch.ones(32, 32, device=device).to(torch.float8_e4m3fn)
    unit = torch.ones((), device=device)
    out = torch._scaled_mm(
        ones, ones.t().contiguous().t(), scale_a=unit, scale_b=unit, out_dtype=torch.bfloat16
    )
    value = float(out[0, 0])
    return Probe(
        out.dtype == torch.bfloat16 and value == 32.0,
        f"torch._scaled_mm of two 32x32 float8_e4m3fn matrices of ones gave {value:g} in "
        f"{_dtype(out.dtype)} (exact: 32 in bfloat16)",
    )


def _probe_rnn(device: str, dtype: torch.dtype) -> Probe:
    """nn.LSTM under autocast: on the CPU, autocast runs it as oneDNN's mkldnn_rnn_layer, whose
    kernels for a 16-bit dtype exist only from some instruction sets on."""
    lstm = torch.nn.LSTM(4, 4).to(device)
    with torch.autocast(device_type=device, dtype=dtype):
        out, _ = lstm(torch.ones(3, 2, 4, device=device))
    return Probe(
        out.dtype == dtype,
        f"under autocast({device}, {_dtype(dtype)}) an nn.LSTM output {_dtype(out.dtype)}",
    )


# oneDNN's names for matmul kernels that compute on 16-bit floats in hardware, not by converting
# to float32 first ("brg_matmul:avx512_core_bf16"; "gemm:jit:bf16" converts on AVX-512 alone).
_NATIVE_KERNELS = {
    torch.bfloat16: r"avx512_core_bf16|amx|avx10|avx2_vnni_2|avx512_core_fp16",
    torch.float16: r"avx512_core_fp16|amx_fp16|avx10|avx2_vnni_2",
}


def _probe_matmul_kernel(device: str, dtype: torch.dtype) -> Probe:
    """Which kernel runs a 16-bit CPU matmul, read from oneDNN's verbose lines: one that uses
    the CPU's own bf16/fp16 instructions, an emulated one, or none of oneDNN's (ATen's)."""
    if device != "cpu":
        return Probe(False, "a question about CPU kernels; this device is CUDA")
    a = torch.ones(64, 64, dtype=dtype)

    def matmul() -> None:
        with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
            a @ a

    ran = re.findall(r"exec,cpu,matmul,([^,]+)", hardware.stdout_of(matmul))
    kernel = ran[0] if ran else "no oneDNN kernel (ATen's own)"
    return Probe(
        bool(ran) and re.search(_NATIVE_KERNELS[dtype], kernel) is not None,
        f"a {_dtype(dtype)} 64x64 matmul ran on {kernel}",
    )


def _probe_fused_optimizers(device: str) -> Probe:
    """SGD, Adam and AdamW built with fused=True on the device and stepped once: their kernels
    take GradScaler's inv_scale and inf check themselves (`_step_supports_amp_scaling`)."""
    stepped = {}
    for make in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
        param = torch.nn.Parameter(torch.ones(4, device=device))
        param.grad = torch.ones_like(param)
        optimizer = make([param], lr=0.5, fused=True)
        optimizer.step()
        scaling = getattr(optimizer, "_step_supports_amp_scaling", False)
        stepped[make.__name__] = (float(param.detach().max()), scaling)
    works = all(value < 1 and scaling for value, scaling in stepped.values())
    return Probe(
        works,
        "fused=True "
        + ", ".join(
            f"{name} stepped 1 -> {value:.4g}{'' if scaling else ' (no GradScaler hook)'}"
            for name, (value, scaling) in stepped.items()
        ),
    )


def _probe_gloo(device: str) -> Probe:
    """The distributed scenarios rehearse on gloo ranks on the CPU, whatever the session's
    device: gloo is part of every Linux, macOS and Windows wheel torch publishes."""
    import torch.distributed as dist

    works = dist.is_available() and dist.is_gloo_available()
    return Probe(
        works, f"torch.distributed.is_available() and is_gloo_available() answered {works}"
    )


def _probe_fsdp2(device: str) -> Probe:
    """FSDP2's public names, imported as a rank imports them. Whether it then runs on this
    device's ranks is for the experiment to show: a rank reports its own probe and the scenario
    judges it here (`DeviceInfo.optional(need, seen)`), by the same table."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: F401
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler  # noqa: F401
    except ImportError as exc:
        return Probe(False, f"importing FSDP2's public names raised ImportError: {exc}")
    return Probe(
        True, "torch.distributed.fsdp has fully_shard, MixedPrecisionPolicy, ShardedGradScaler"
    )


def _probe_inductor_compile(device: str) -> Probe:
    """torch.compile with backend="inductor" of a tiny function, run and held to eager. What it
    is built with is looked up first: a machine without it lacks the capability (absent); with
    it, a compile that raises or computes otherwise is a broken one. Warnings torch gives while
    importing and compiling are counted, not fatal: they are not what is probed."""
    from harness.lab.autocast import compiled  # no torch._dynamo import until a test needs this

    def tiny(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2 + 1

    with warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("always")
        if device == "cpu":
            found, looked_for = compiled.cpp_compiler()
            tool = f"C++ compiler {found}" if found else ""
            missing = f"no C++ compiler: {looked_for} (torch._inductor.config.cpp.cxx) not on PATH"
        else:
            spec = importlib.util.find_spec("triton")
            tool = f"triton at {spec.origin}" if spec else ""
            missing = "triton is not installed (inductor generates CUDA kernels with it)"
        if not tool:
            return Probe(False, missing, absent=True)
        x = torch.linspace(-2, 2, 8, device=device)
        with compiled.denormals_kept():  # torch 2.4's kernels would turn flush-to-zero on
            got, want = compiled.fresh(tiny, "inductor")(x), tiny(x)
    gap = float((got - want).abs().max())
    return Probe(
        torch.equal(got, want),
        f"torch.compile(backend='inductor') of relu(x) * 2 + 1 with the {tool}: "
        + ("eager's values" if gap == 0 else f"off eager's by up to {gap:g}")
        + f" for {x.numel()} inputs"
        + (f" ({len(heard)} warning(s) while compiling)" if heard else ""),
    )


def _probe_torchao_float8(device: str) -> Probe:
    """torchao's float8 training: a Linear converted to its Float8Linear (tensorwise scales;
    emulated where the device has no FP8 matmul, as on the CPU), a forward and a backward, the
    output held to the plain Linear's within FP8's rounding. Not installed: absent (the `fp8`
    extra); installed and failing: a broken one."""
    if importlib.util.find_spec("torchao") is None:
        return Probe(False, "torchao is not installed: pip install -e '.[fp8]'", absent=True)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    emulate = device == "cpu" or not _probe_fp8_scaled_mm(device).works
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(32, 32)).to(device)
    fp8 = convert_to_float8_training(
        copy.deepcopy(plain), config=Float8LinearConfig(emulate=emulate)
    )
    x = torch.randn(16, 32, device=device)
    got, want = fp8(x), plain(x)
    got.sum().backward()
    got, want = got.detach(), want.detach()
    gap = float((got - want).abs().max() / want.abs().max())
    converted = type(fp8[0]).__name__
    return Probe(
        converted == "Float8Linear" and bool(fp8[0].weight.grad.isfinite().all()) and gap < 0.1,
        f"torchao {installed_version('torchao')}: a Linear(32, 32) became {converted}"
        f"{' (emulated)' if emulate else ''}, its output off the plain Linear's by {gap:.3g} of "
        "the largest entry",
    )


def installed_version(distribution: str) -> str:
    """A distribution's version, read from its metadata (nothing imported); "" if absent."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


PROBES = {
    "fp16_autocast": lambda device: _probe_autocast(device, torch.float16),
    "bf16_autocast": lambda device: _probe_autocast(device, torch.bfloat16),
    "grad_scaler": _probe_grad_scaler,
    "half_training": _probe_half_training,
    "tf32": _probe_tf32,
    "fp8_matmul": _probe_fp8_matmul,
    "fp8_scaled_mm": _probe_fp8_scaled_mm,
    "fp8_rowwise_scaled_mm": lambda device: _probe_fp8_scaled_mm(device, rowwise=True),
    "gloo": _probe_gloo,
    "bf16_rnn": lambda device: _probe_rnn(device, torch.bfloat16),
    "fp16_rnn": lambda device: _probe_rnn(device, torch.float16),
    "bf16_matmul_kernel": lambda device: _probe_matmul_kernel(device, torch.bfloat16),
    "fp16_matmul_kernel": lambda device: _probe_matmul_kernel(device, torch.float16),
}

# Probes that take seconds run the first time a test needs their capability, not at the start of
# every session and isolated worker, most of which never ask: a torch.compile (importing dynamo
# and inductor alone takes about 3 s on 2 cores, a first C++ build 10 s more), building an
# optimizer (torch.optim's constructors import dynamo: 1.7 s, a third of a session's start-up),
# importing FSDP2 (0.8 s; in every session and xdist worker, where only the distributed
# scenario asks), and torchao's float8 training.
DEFERRED_PROBES = {
    "inductor_compile": _probe_inductor_compile,
    "fused_optimizers": _probe_fused_optimizers,
    "fsdp2": _probe_fsdp2,
    "torchao_float8": _probe_torchao_float8,  # importing torchao: seconds, and it prints
}

CAPABILITY_TEXT = {
    "cuda": "CUDA",
    "fp16_autocast": "float16 autocast",
    "bf16_autocast": "bfloat16 autocast",
    "grad_scaler": "a working torch.amp.GradScaler for this device",
    "half_training": "float16 kernels to train a .half() model (linear, batch and layer norm)",
    "tf32": "TF32 tensor cores (an NVIDIA GPU of compute capability 8.0 or newer)",
    "fp8_matmul": "an fp8 matmul (torch._scaled_mm on float8_e4m3fn, compute capability 8.9+)",
    "fp8_scaled_mm": "torch._scaled_mm on this device (float8_e4m3fn, one scale per tensor)",
    "fp8_rowwise_scaled_mm": "torch._scaled_mm with a scale per row and per column",
    "fused_optimizers": "fused=True SGD, Adam and AdamW (kernels that take GradScaler's check)",
    "torchao_float8": "torchao's float8 training (Float8Linear; the `fp8` extra)",
    "gloo": "torch.distributed with gloo (the CPU ranks of the distributed scenarios)",
    "fsdp2": "FSDP2 (fully_shard, MixedPrecisionPolicy, ShardedGradScaler) on gloo CPU ranks",
    "bf16_rnn": "a bfloat16 LSTM under autocast (on the CPU: oneDNN's RNN kernel)",
    "fp16_rnn": "a float16 LSTM under autocast (on the CPU: oneDNN's RNN kernel)",
    "bf16_matmul_kernel": "a CPU matmul kernel computing in bfloat16 instructions (oneDNN)",
    "fp16_matmul_kernel": "a CPU matmul kernel computing in float16 instructions (oneDNN)",
    "inductor_compile": "torch.compile's inductor backend (a C++ compiler on the CPU, triton "
    "on CUDA)",
}


@dataclass(frozen=True)
class Expected:
    """A capability this build and hardware should have: from `torch` on, on CUDA from compute
    capability `cc`, on the CPU from oneDNN's kernel level `cpu` (harness.lab.hardware.LEVELS,
    read back from oneDNN: a class held down counts as that class). `source` says why."""

    torch: tuple[int, int] = (2, 4)
    cc: tuple[int, int] | None = None
    source: str = ""
    cpu: str | None = None


# What a capability's absence means, per device type. Not listed: never expected there (TF32 on
# the CPU), so its absence is a skip.
EXPECTED: dict[tuple[str, str], Expected] = {
    # Documented from 2.5, but it works in 2.4 (every fp16-autocast scenario passed on 2.4.1:
    # reports/baselines/), and tests/lab/test_capabilities.py holds each row to the baselines.
    ("cpu", "fp16_autocast"): Expected(source="CPU autocast ran float16 in torch 2.4.1"),
    ("cpu", "bf16_autocast"): Expected(source="CPU autocast has run bfloat16 since torch 1.10"),
    ("cpu", "grad_scaler"): Expected(source='torch.amp.GradScaler("cpu") exists since torch 2.3'),
    ("cpu", "half_training"): Expected(
        source="torch 2.4 ships float16 CPU kernels for linear, batch_norm and layer_norm"
    ),
    ("cpu", "fused_optimizers"): Expected(
        source="fused=True SGD, Adam and AdamW step on the CPU in every release the harness "
        "supports: measured on torch 2.4.1, 2.5.1, 2.6.0, 2.9.1, 2.13.0 and 2.14.1"
    ),
    ("cpu", "gloo"): Expected(source="every torch wheel for Linux, macOS and Windows has gloo"),
    ("cpu", "fsdp2"): Expected(
        (2, 7),
        source="FSDP2 runs on gloo CPU ranks from torch 2.7 (2.6 made fully_shard public, but "
        "its all-gather needs Stream.record_event, which 2.6's CPU stream lacks: measured "
        "AttributeError on 2.6.0; it runs on 2.7.1, 2.9.1, 2.13.0 and 2.14.1)",
    ),
    ("cuda", "gloo"): Expected(source="every torch wheel for Linux and Windows has gloo"),
    # Where the machine has what inductor builds with (the probe says absent otherwise: a skip).
    ("cpu", "inductor_compile"): Expected(
        source="inductor compiles CPU kernels with the machine's C++ compiler (torch 2.0 on): "
        "measured compiling on torch 2.4.1, 2.5.1, 2.6.0, 2.9.1, 2.13.0 and 2.14.1 with g++"
    ),
    ("cuda", "inductor_compile"): Expected(
        source="inductor generates CUDA kernels with triton, a dependency of torch's Linux "
        "CUDA wheels"
    ),
    # Where torchao is installed (the probe says absent otherwise: a skip): it must work.
    ("cpu", "torchao_float8"): Expected(
        (2, 13),
        source="torchao 0.18's Float8Linear trains emulated on the CPU: measured on torch "
        "2.13.0 and 2.14.1 (older releases not measured with it)",
    ),
    ("cuda", "torchao_float8"): Expected(
        (2, 13), source="torchao's float8 training is made for CUDA (emulated below sm_89)"
    ),
    # The FSDP2 rehearsal runs on CPU ranks whatever the session's device: from 2.7, as there.
    ("cuda", "fsdp2"): Expected((2, 7), source="FSDP2 runs on gloo CPU ranks from torch 2.7"),
    ("cuda", "fp16_autocast"): Expected(source="float16 is CUDA autocast's default dtype"),
    ("cuda", "grad_scaler"): Expected(source="torch.amp.GradScaler was made for CUDA"),
    ("cuda", "half_training"): Expected(source="every CUDA GPU torch supports has fp16 kernels"),
    ("cuda", "fused_optimizers"): Expected(
        source="torch 2.4's SGD, Adam and AdamW list cuda first among the devices with fused "
        "kernels (torch.utils._foreach_utils._get_fused_kernels_supported_devices)"
    ),
    ("cuda", "bf16_autocast"): Expected(
        cc=(8, 0), source="bfloat16 tensor cores from Ampere (sm_80) on"
    ),
    ("cuda", "tf32"): Expected(cc=(8, 0), source="TF32 tensor cores from Ampere (sm_80) on"),
    ("cuda", "fp8_matmul"): Expected(
        (2, 5),
        (8, 9),
        "fp8 tensor cores from Ada and Hopper (sm_89, sm_90) on, with "
        "torch._scaled_mm's single-tensor result from torch 2.5",
    ),
    ("cuda", "fp8_scaled_mm"): Expected(
        (2, 5), (8, 9), "torch._scaled_mm on CUDA needs fp8 tensor cores (sm_89, sm_90 on)"
    ),
    ("cpu", "fp8_scaled_mm"): Expected(
        (2, 9),
        source="torch._scaled_mm has a CPU kernel from 2.9 on: measured absent on 2.4.1, 2.5.1 "
        "and 2.6.0 ('Could not run aten::_scaled_mm ... CPU backend'), present on 2.9.1, 2.11.0, "
        "2.12.1, 2.13.0 and 2.14.1 (2.7 and 2.8 not measured)",
    ),
    # Rowwise scales on the CPU: 2.9.1 asserts scale_a.numel() == 1. No CUDA row: which GPUs
    # take rowwise scales in which release was not measured (a present one runs; none skips).
    ("cpu", "fp8_rowwise_scaled_mm"): Expected(
        (2, 12),
        source="measured: 2.9.1 and 2.11.0 refuse rowwise scales on the CPU (an internal assert "
        "that both scales have one element); 2.12.1, 2.13.0 and 2.14.1 compute them",
    ),
    # The CPU rows that follow the hardware, measured by holding one machine's kernels down
    # (--amp-cpu-class; docs/hardware.md). float16 RNN and matmul kernels need AVX512-FP16 or
    # AMX-FP16 in oneDNN; no such CPU was measured, so the table expects them nowhere yet.
    ("cpu", "bf16_rnn"): Expected(
        cpu="avx512",
        source="oneDNN runs a bfloat16 LSTM from AVX-512 on (AVX512_CORE, converting): "
        "measured on torch 2.13 and 2.14 with oneDNN held to AVX512_CORE, AVX512_CORE_BF16 "
        "and below (and at AVX512_CORE_BF16 on 2.4 to 2.9); at AVX2 and SSE4.1 it raises "
        "'could not create a primitive descriptor'",
    ),
    ("cpu", "bf16_matmul_kernel"): Expected(
        cpu="avx512-bf16",
        source="oneDNN runs a bfloat16 matmul on avx512_core_bf16 instructions (brg_matmul) "
        "where the CPU has AVX512-BF16: measured on torch 2.13 and 2.14; held to AVX512_CORE "
        "it converts (gemm:jit:bf16), at AVX2 ATen computes it",
    ),
}
# Why a capability has no row where it has none, when there is more to say than that.
NOT_EXPECTED = {
    ("cpu", need): "oneDNN computes float16 there only with AVX512-FP16 or AMX-FP16 (Sapphire "
    "Rapids on), and no such CPU was measured: the table expects it on no CPU class yet"
    for need in ("fp16_rnn", "fp16_matmul_kernel")
}
# The capabilities whose presence follows the hardware (a row with a compute capability or a
# CPU level): a test that needs one depends on the hardware, and where two environments'
# classes differ in it, the hardware explains what differs (harness.records.environments).
HARDWARE_CAPABILITIES = frozenset(
    {key for key, row in EXPECTED.items() if row.cc or row.cpu} | set(NOT_EXPECTED)
)  # (device type, capability)


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


def _capability_problem(capability: Capability) -> str | None:
    """What is wrong with a declared capability's fields, with the fix; None when nothing is."""
    name = capability.name
    if not isinstance(name, str) or not _CAPABILITY_NAME.fullmatch(name):
        return "name: use lower case letters, digits and _, starting with a letter, e.g. 'inductor'"
    if name in CAPABILITY_TEXT:
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
    return None


def with_team_capabilities(device: DeviceInfo, path: Path) -> DeviceInfo:
    """`device` with the capabilities declared in `path` (a team's capabilities.py, its list
    CAPABILITIES), each probed now, once, as the built-in ones are; `device` as it is where
    there is no such file. A declaration that cannot be used is a HarnessError naming the file,
    the entry and the fix."""
    if not path.is_file():
        return device
    try:
        declared = _load_capabilities(path)
        probed = {c.name: _probe_team(c, device.type) for c in declared}
    except HarnessError as exc:
        raise HarnessError(f"{path}: {exc}") from None
    DECLARED.update({c.name: c.text for c in declared})
    return dataclasses.replace(
        device,
        capabilities={**device.capabilities, **probed},
        team={c.name: c for c in declared},
    )


# The team capabilities this process has loaded, name -> text: names a record may give
# `depends_on_hardware` beside the built-in ones (it has no DeviceInfo to ask).
DECLARED: dict[str, str] = {}


def known_capabilities() -> dict[str, str]:
    """Every capability name a scenario may name here, built-in or its team's, with its text."""
    return {**CAPABILITY_TEXT, **DECLARED}


def _load_capabilities(path: Path) -> tuple[Capability, ...]:
    name = f"amp_team_capabilities_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass declared there looks its module up in sys.modules
    try:
        spec.loader.exec_module(module)
    except HarnessError as exc:  # a Capability(...) with a wrong field: its line, then the fix
        raise HarnessError(f"line {_line_in(exc, path)}: {exc}") from None
    except Exception as exc:
        raise HarnessError(
            f"line {_line_in(exc, path)}: importing it raised {type(exc).__name__}: {exc}. Fix "
            f"the file (`python {path}` shows the traceback)"
        ) from exc
    declared = getattr(module, "CAPABILITIES", None)
    if not isinstance(declared, list | tuple):
        raise _not_declared("CAPABILITIES", declared)
    for index, capability in enumerate(declared):
        if not isinstance(capability, Capability):
            raise _not_declared(f"CAPABILITIES[{index}]", capability)
        if [c.name for c in declared].count(capability.name) > 1:
            raise HarnessError(
                f"CAPABILITIES[{index}]: {capability.name!r} is declared twice: keep one"
            )
    return tuple(declared)


def _line_in(exc: BaseException, path: Path) -> int | str:
    """The line of `path` an exception raised in (its innermost frame there), or '?'."""
    lines = [
        frame.lineno
        for frame in traceback.extract_tb(exc.__traceback__)
        if Path(frame.filename).resolve() == path.resolve()
    ]
    return lines[-1] if lines else getattr(exc, "lineno", None) or "?"


def _not_declared(where: str, found: object) -> HarnessError:
    return HarnessError(
        f"{where} is {found!r}: declare CAPABILITIES = [Capability(name, text, probe, "
        "expected), ...] with harness.lab.devices.Capability (docs/writing-a-scenario.md)"
    )


def _probe_team(capability: Capability, device_type: str) -> Probe:
    seen = _run_probe(lambda: capability.probe(device_type))
    if not isinstance(seen, Probe):
        raise HarnessError(
            f"Capability({capability.name!r}): probe({device_type!r}) returned {seen!r}: return "
            "Probe(works, saw), e.g. Probe(ok, f'a C++ compiler at {path}')"
        )
    return seen


@dataclass(frozen=True)
class Lack:
    """Why this device cannot run something. `regression`: it should be able to."""

    capability: str
    reason: str
    regression: bool = False
    error: str = ""  # the probe's traceback, when it raised
    why: str = ""  # why it is not expected here, alone (the reason also quotes the probe)

    def __str__(self) -> str:
        return self.reason


class CapabilityRegression(HarnessError):
    """A capability expected here is broken: raised inside a test that uses it where present
    (DeviceInfo.optional); the plugin records the test as a capability regression."""

    def __init__(self, lack: Lack):
        self.lack = lack
        super().__init__(lack.reason)


@dataclass(frozen=True)
class DeviceInfo:
    """The device a session runs its scenarios on, with its probed capabilities."""

    type: str  # "cpu" or "cuda"
    name: str  # "cpu" or the GPU's name
    gpu_count: int
    compute_capability: tuple[int, int] | None
    capabilities: dict[str, Probe] = field(default_factory=dict, hash=False)  # hashable: a key
    figures: GpuFigures | None = None  # a GPU's variant figures (gpus.identify); None on the CPU
    onednn_level: str = ""  # the CPU kernel level oneDNN runs at (hardware.LEVELS), read back
    team: dict[str, Capability] = field(default_factory=dict, hash=False)  # a team's, by name

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.type)

    def missing(self, *needs: str, gpus: int = 0) -> Lack | None:
        """Why this device cannot run something that needs `needs`, or None if it can."""
        for need in needs:
            if self._text(need) is None:
                known = sorted({*CAPABILITY_TEXT, *self.team})
                raise HarnessError(
                    f"unknown capability {need!r}: known are {', '.join(known)} (closest: "
                    f"{closest(need, known)}); a team's own are declared in "
                    f"scenarios/{TEAM_CAPABILITIES}"
                )
            lack = self._cuda_lack() if need == "cuda" else self._lack(need)
            if lack:
                return lack
        if gpus > self.gpu_count:
            return Lack("gpus", f"needs {gpus} CUDA GPUs, found {self.gpu_count}")
        return None

    def optional(self, need: str, seen: Probe | None = None) -> Lack | None:
        """For a capability a test uses only where present (test_speed's fp8 arm): None when
        present, why not when genuinely absent; raises CapabilityRegression when expected here.
        `seen`: what a probe run elsewhere saw (inside spawned ranks), judged by the same table:
        a capability lost there must not pass for one missing."""
        lack = self._lack(need, seen) if seen else self.missing(need)
        if lack and lack.regression:
            raise CapabilityRegression(lack)
        return lack

    def _cuda_lack(self) -> Lack | None:
        if self.type == "cuda":
            return None
        if self.gpu_count:
            return Lack(
                "cuda", "needs CUDA: this session runs on the CPU (pass --amp-device cuda or auto)"
            )
        listed = _driver_gpus()
        if torch.version.cuda and listed:  # the hardware and the build are there; CUDA is not
            return Lack(
                "cuda",
                f"capability regression: CUDA: the NVIDIA driver lists {listed} GPU(s) and torch "
                f"{torch.__version__} is built for CUDA {torch.version.cuda}, but "
                "torch.cuda.is_available() is False (a driver/runtime mismatch?)",
                regression=True,
            )
        return Lack("cuda", _no_cuda_reason())

    def _lack(self, need: str, seen: Probe | None = None) -> Lack | None:
        seen = seen or self._seen(need)
        if seen is not None and seen.works:
            return None
        text = self._text(need)
        saw = seen.saw if seen else "not probed"
        if seen is not None and seen.absent:
            why = "this machine lacks what it is built with"
            return Lack(need, f"needs {text}: {why} ({saw})", why=why)
        expected, why_not = self._expectation(need)
        if expected is None:
            return Lack(need, f"needs {text}: {why_not} ({saw})", why=why_not)
        what = "the probe raised" if seen and seen.raised else "the probe says no"
        return Lack(
            need,
            f"capability regression: {text} is expected on {self.describe()}, as "
            f"{expected.source}; but {what}: {saw}",
            regression=True,
            error=seen.error if seen else "",
        )

    def _seen(self, need: str) -> Probe | None:
        """What `need`'s probe saw; a deferred probe (DEFERRED_PROBES) runs now, the first time
        it is asked for, and is kept with the others."""
        if need not in self.capabilities and need in DEFERRED_PROBES:
            self.capabilities[need] = _run_probe(lambda: DEFERRED_PROBES[need](self.type))
        return self.capabilities.get(need)

    def follows_hardware(self, need: str) -> bool:
        """Whether `need`'s presence here follows the hardware (its row expects it from a
        compute capability or a CPU level): a test that needs it depends on the hardware."""
        team = self.team.get(need)
        if team is None:
            return (self.type, need) in HARDWARE_CAPABILITIES
        row = team.expected.get(self.type)
        return row is not None and bool(row.cc or row.cpu)

    def _text(self, need: str) -> str | None:
        """What `need` is, in words: a built-in capability's, or a team's; None if unknown."""
        team = self.team.get(need)
        return team.text if team else CAPABILITY_TEXT.get(need)

    def _expectation(self, need: str) -> tuple[Expected | None, str]:
        """(what EXPECTED, or the team's declaration, says of `need` here, or None with why it
        is not expected)."""
        team = self.team.get(need)
        expected = team.expected.get(self.type) if team else EXPECTED.get((self.type, need))
        if expected is None:
            return None, NOT_EXPECTED.get((self.type, need), f"not expected on {self.describe()}")
        if releases.release() < expected.torch:
            release = ".".join(map(str, expected.torch))
            return None, f"not in torch {torch.__version__}, expected from torch {release}"
        if expected.cc and _rocm():
            # ROCm reports no NVIDIA compute capability to hold the row to: which AMD GPUs have
            # TF32, bf16 or fp8 is not in the table, so an absence is a skip that says so.
            return None, (
                f"{self.name} is a ROCm GPU: the table expects this from NVIDIA compute "
                f"capability {expected.cc[0]}.{expected.cc[1]}, and holds no AMD architecture"
            )
        if expected.cc and (self.compute_capability or (0, 0)) < expected.cc:
            major, minor = expected.cc
            return None, f"{self.name} is older than compute capability {major}.{minor}"
        if expected.cpu and hardware.level_rank(self.onednn_level) < hardware.level_rank(
            expected.cpu
        ):
            return None, (
                f"oneDNN runs at {self.onednn_level or 'an unknown level'} on this CPU, below "
                f"{expected.cpu}"
            )
        return expected, ""

    def datasheet(self) -> Identified | None:
        """This GPU's entry in harness/lab/gpus.json, with how sure that is; None on the CPU."""
        return identify(self.name, self.figures) if self.type == "cuda" else None

    def describe(self) -> str:
        if self.type == "cpu":
            level = f", oneDNN at {self.onednn_level}" if self.onednn_level else ""
            return f"cpu (torch {torch.__version__}{level})"
        major, minor = self.compute_capability or (0, 0)
        return f"{self.name} (sm_{major}{minor}, torch {torch.__version__})"


def _rocm() -> bool:
    """A ROCm build answers as "cuda", but compute capabilities are NVIDIA's scale (an MI300
    reports 9.4: it would pass for a Hopper)."""
    return torch.version.hip is not None


def _driver_gpus() -> int:
    try:
        return sum(1 for _ in NVIDIA_DRIVER_GPUS.iterdir())
    except OSError:
        return 0


def _no_cuda_reason() -> str:
    build = (
        "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    )
    return f"needs CUDA: no GPU found (torch {torch.__version__} is {build})"


@functools.cache
def probe(device_type: str) -> DeviceInfo:
    """Probe one device type once per process."""
    kernels = hardware.kernels_in_force()  # first: oneDNN's header must come to the read-back
    gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device_type == "cuda":
        props = torch.cuda.get_device_properties(0)
        name, cc = props.name, (props.major, props.minor)
    else:
        name, cc = "cpu", None
    caps = {need: _run_probe(lambda fn=fn: fn(device_type)) for need, fn in PROBES.items()}
    if device_type == "cuda" and caps["bf16_autocast"].works and not native_bf16():
        # Autocast accepts bf16 on pre-Ampere GPUs and emulates it slowly: not the real thing.
        caps["bf16_autocast"] = Probe(
            False,
            f"autocast ran bfloat16, emulated: sm_{cc[0]}{cc[1]} has no bfloat16 tensor cores "
            "(torch.cuda.is_bf16_supported says no native support)",
        )
    figures = gpu_figures(0) if device_type == "cuda" else None
    return DeviceInfo(device_type, name, gpu_count, cc, caps, figures, kernels["onednn_level"])


def native_bf16() -> bool:
    """Whether the current CUDA device has bfloat16 in hardware. `is_bf16_supported()` also
    counts bf16 that merely runs, emulated (pre-Ampere GPUs), unless asked for native support;
    releases without the `including_emulation` argument (torch 2.4) answer native only."""
    check = torch.cuda.is_bf16_supported
    if "including_emulation" in inspect.signature(check).parameters:
        return bool(check(including_emulation=False))
    return bool(check())


def gpu_figures(index: int) -> GpuFigures:
    """The figures that tell variants of one GPU apart (harness/lab/gpus.json `figures`): total
    memory and SMs as CUDA reports them, the peak SM clock where this torch exposes it, and the
    board's maximum power limit from NVML where the driver's library is there."""
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
    with hardware.nvml_device(uuid) as (nvml, handle):
        if handle is None:
            return None
        low, high = ctypes.c_uint(), ctypes.c_uint()
        found = nvml.nvmlDeviceGetPowerManagementLimitConstraints(
            handle, ctypes.byref(low), ctypes.byref(high)
        )
        return high.value / 1000 if found == 0 and high.value else None  # milliwatts


def resolve(choice: str, option: str = "--amp-device") -> DeviceInfo:
    """Turn `option` auto|cpu|cuda into a probed device, or a clear error naming `option`."""
    if choice not in DEVICE_CHOICES:
        raise HarnessError(f"{option} {choice!r}: use one of {', '.join(DEVICE_CHOICES)}")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise HarnessError(
            f"{option} cuda: {_no_cuda_reason()}. Run with {option} cpu (or auto) here, "
            "or on a machine with an NVIDIA GPU and a CUDA build of torch."
        )
    return probe(choice)
