"""What a capability probe saw (`Probe`), how one is run (`run_probe`), and the probes of the
built-in capabilities: each runs a tiny real case on a device type ("cpu", "cuda") and says in
words what it saw. harness.lab.machine.capabilities gives each its row.

A probe's warning is what it saw (autocast's "...Disabling autocast" is how an unsupported dtype
answers), never a crash; what it raises is kept with its traceback. The probes that take
seconds import what they need inside themselves (dynamo, FSDP2, torchao): their rows defer them
to the first test that asks.
"""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util
import re
import traceback
import warnings
from dataclasses import dataclass

import torch

from harness.lab import tf32
from harness.lab.machine import cpu


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


def run_probe(fn) -> Probe:
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


def probe_autocast(device: str, dtype: torch.dtype) -> Probe:
    linear = torch.nn.Linear(4, 4).to(device)
    with torch.autocast(device_type=device, dtype=dtype):
        out = linear(torch.ones(2, 4, device=device)).dtype
    return Probe(
        out == dtype, f"under autocast({device}, {_dtype(dtype)}) a Linear output {_dtype(out)}"
    )


def probe_grad_scaler(device: str) -> Probe:
    enabled = torch.amp.GradScaler(device).is_enabled()
    return Probe(enabled, f"torch.amp.GradScaler({device!r}).is_enabled() is {enabled}")


def probe_half_training(device: str) -> Probe:
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


def probe_tf32(device: str) -> Probe:
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


def probe_fp8_scaled_mm(device: str, rowwise: bool = False) -> Probe:
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


def probe_fp8_matmul(device: str) -> Probe:
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


def probe_rnn(device: str, dtype: torch.dtype) -> Probe:
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


def probe_matmul_kernel(device: str, dtype: torch.dtype) -> Probe:
    """Which kernel runs a 16-bit CPU matmul, read from oneDNN's verbose lines: one that uses
    the CPU's own bf16/fp16 instructions, an emulated one, or none of oneDNN's (ATen's)."""
    if device != "cpu":
        return Probe(False, "a question about CPU kernels; this device is CUDA")
    a = torch.ones(64, 64, dtype=dtype)

    def matmul() -> None:
        with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
            a @ a

    ran = re.findall(r"exec,cpu,matmul,([^,]+)", cpu.stdout_of(matmul))
    kernel = ran[0] if ran else "no oneDNN kernel (ATen's own)"
    return Probe(
        bool(ran) and re.search(_NATIVE_KERNELS[dtype], kernel) is not None,
        f"a {_dtype(dtype)} 64x64 matmul ran on {kernel}",
    )


def probe_fused_optimizers(device: str) -> Probe:
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


def probe_gloo(device: str) -> Probe:
    """The distributed scenarios rehearse on gloo ranks on the CPU, whatever the session's
    device: gloo is part of every Linux, macOS and Windows wheel torch publishes."""
    import torch.distributed as dist

    works = dist.is_available() and dist.is_gloo_available()
    return Probe(
        works, f"torch.distributed.is_available() and is_gloo_available() answered {works}"
    )


def probe_fsdp2(device: str) -> Probe:
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


def probe_inductor_compile(device: str) -> Probe:
    """torch.compile with backend="inductor" of a tiny function, run and held to eager. What it
    is built with is looked up first: a machine without it lacks the capability (absent); with
    it, a compile that raises or computes otherwise is a broken one. Warnings torch gives while
    importing and compiling are counted, not fatal: they are not what is probed."""
    # Here: no torch._dynamo import until a test needs this.
    from harness.lab.autocast import torch_compile

    def tiny(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2 + 1

    with warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("always")
        if device == "cpu":
            found, looked_for = torch_compile.cpp_compiler()
            tool = f"C++ compiler {found}" if found else ""
            missing = f"no C++ compiler: {looked_for} (torch._inductor.config.cpp.cxx) not on PATH"
        else:
            spec = importlib.util.find_spec("triton")
            tool = f"triton at {spec.origin}" if spec else ""
            missing = "triton is not installed (inductor generates CUDA kernels with it)"
        if not tool:
            return Probe(False, missing, absent=True)
        x = torch.linspace(-2, 2, 8, device=device)
        with torch_compile.denormals_kept():  # torch 2.4's kernels would turn flush-to-zero on
            got, want = torch_compile.fresh(tiny, "inductor")(x), tiny(x)
    gap = float((got - want).abs().max())
    return Probe(
        torch.equal(got, want),
        f"torch.compile(backend='inductor') of relu(x) * 2 + 1 with the {tool}: "
        + ("eager's values" if gap == 0 else f"off eager's by up to {gap:g}")
        + f" for {x.numel()} inputs"
        + (f" ({len(heard)} warning(s) while compiling)" if heard else ""),
    )


def probe_torchao_float8(device: str) -> Probe:
    """torchao's float8 training: a Linear converted to its Float8Linear (tensorwise scales;
    emulated where the device has no FP8 matmul, as on the CPU), a forward and a backward, the
    output held to the plain Linear's within FP8's rounding. Not installed: absent (the `fp8`
    extra); installed and failing: a broken one."""
    if importlib.util.find_spec("torchao") is None:
        return Probe(False, "torchao is not installed: pip install -e '.[fp8]'", absent=True)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    emulate = device == "cpu" or not probe_fp8_scaled_mm(device).works
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
