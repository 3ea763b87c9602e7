"""FP8 training as teams run it: torchao's Float8Linear (claims_fp8.toml, FP8-TORCHAO-COMPILED).

torchao is an optional extra (`pip install -e '.[fp8]'`); the capability torchao_float8 skips
with that reason where it is absent, and fails as a regression where it is installed and broken.
Its version is in each session's fingerprint (`env.torchao`), beside torch's: its API moves
between releases.

A small MLP (Linear 64 -> 128, GELU, Linear 128 -> 32) converted to Float8Linear (tensorwise
dynamic scales; emulated where the device has no FP8 matmul, as on the CPU, where the numerics
run but nothing is faster) runs one forward and backward eager, then compiled from the same
weights and batch: with aot_eager, and with inductor with emulate_precision_casts off and on
(where the machine has what inductor builds with). Outputs and weight gradients are held to
eager's within TOLERANCE of the largest entry: float32 reordering, far below one E4M3 step
(1/16 of a value near 1).

Negative control: the same comparison of the FP8 model against the plain float32 one sees
FP8's rounding, beyond the tolerance.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from harness.lab import devices
from harness.lab.autocast import torch_compile

# torchao's float8 training compiled: seconds of tracing on a CPU, so `amp-harness run` leaves
# it out unless --all (the plugin's `slow` marker).
pytestmark = pytest.mark.slow

TOLERANCE = 1e-4  # of the largest entry: float32 reorderings, not one FP8 rounding (2**-4)


def _model(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)
    ).to(device)


def _float8(model: torch.nn.Module, emulate: bool) -> torch.nn.Module:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    return convert_to_float8_training(
        copy.deepcopy(model), config=Float8LinearConfig(emulate=emulate)
    )


def _run(model: torch.nn.Module, x: torch.Tensor, call=None) -> list[torch.Tensor]:
    """The output and each Linear's weight gradient, one forward and backward."""
    out = (call or model)(x)
    out.float().pow(2).sum().backward()
    return [out.detach()] + [m.weight.grad.clone() for m in model if hasattr(m, "weight")]


def _gap(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(float((g - w).abs().max() / w.abs().max()) for g, w in zip(got, want, strict=True))


# name -> (backend, inductor's emulate_precision_casts, None where it does not apply)
ARMS = {
    "aot_eager": ("aot_eager", None),
    "inductor": ("inductor", False),
    "inductor with emulate_precision_casts": ("inductor", True),
}


def _compiled_gap(plain, x, eager, emulate: bool, backend: str, casts: bool | None) -> float:
    """A fresh FP8 copy of `plain`, compiled (on its first call, inside the setting), off eager."""
    model = _float8(plain, emulate)
    setting = (
        contextlib.nullcontext()
        if casts is None
        else torch._inductor.config.patch(emulate_precision_casts=casts)
    )
    with setting, torch_compile.denormals_kept():  # torch 2.4's inductor kernels turn FTZ on
        return _gap(_run(model, x, torch_compile.fresh(model, backend)), eager)


@pytest.mark.claim("FP8-TORCHAO-COMPILED")
@pytest.mark.requires("torchao_float8")
def test_torchao_float8_compiled_keeps_eager_numerics(record, amp_device):
    device = amp_device.torch_device
    emulate = device.type == "cpu" or amp_device.optional("fp8_scaled_mm") is not None
    # Inductor's capability is asked for only where an arm compiles with it (its probe compiles).
    inductor = any(backend == "inductor" for backend, _casts in ARMS.values())
    lack = amp_device.optional("inductor_compile") if inductor else None
    plain = _model(device)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1)).to(device)
    eager = _run(_float8(plain, emulate), x)
    gaps = {
        name: _compiled_gap(plain, x, eager, emulate, backend, casts)
        for name, (backend, casts) in ARMS.items()
        if backend != "inductor" or lack is None
    }
    # Negative control: the FP8 model against the float32 one it was converted from: the same
    # comparison sees FP8's rounding, so a gap of 0 above is not a comparison that sees nothing.
    control = _gap(eager, _run(copy.deepcopy(plain), x))

    version = devices.installed_version("torchao")
    record.param(emulated=emulate, torchao=version)
    record.metric(**{f"gap/{name.replace(' ', '_')}": gap for name, gap in gaps.items()})
    record.metric(fp8_against_float32=control)
    record.key_metric(arms_off_eager=sum(gap > TOLERANCE for gap in gaps.values()))
    held = all(gap <= TOLERANCE for gap in gaps.values())
    record.verdict(
        "FP8-TORCHAO-COMPILED",
        "confirmed" if held else "refuted",
        f"torchao {version} Float8Linear"
        f"{' (emulated: no FP8 matmul here, so nothing about speed)' if emulate else ''} on "
        f"{amp_device.type}, an MLP's output and weight gradients against eager's (tolerance "
        f"{TOLERANCE:g} of the largest entry): "
        + "; ".join(f"{name} off by {gap:.3g}" for name, gap in gaps.items())
        + (f"; inductor not measured: {lack.reason}" if lack else "")
        + f"; control, the FP8 model against float32's: off by {control:.3g}.",
    )
    assert held, "FP8-TORCHAO-COMPILED: predicted every compiled arm within " + (
        f"{TOLERANCE:g} of eager, got "
        + "; ".join(f"{name} off by {gap:.3g}" for name, gap in gaps.items() if gap > TOLERANCE)
    )
    assert control > TOLERANCE, (
        f"FP8-TORCHAO-COMPILED: control: FP8's rounding must show against float32's, got a "
        f"gap of {control:.3g} (tolerance {TOLERANCE:g})"
    )
