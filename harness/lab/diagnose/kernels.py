"""The device's convolution kernels, probed at the shapes the model runs them: a kernel that
returns an inf/NaN gradient from finite inputs whose fp32 gradient is finite and far from the
dtype's range is a defect of the kernel, not of the dtype, and 8 training steps may not show it.

Found on the zoo's resnet18 at 16x16 pixels (layer4 at 1x1 maps) under amp-bf16 on an AVX-512
BF16 CPU (torch 2.13.0 and 2.14.1, oneDNN 3.12.0, `jit_bf16:avx512_core_bf16` backward_weights):
a 3x3 stride-2 convolution with padding 1 on a 1x1 input gets inf/NaN (or values of 1e20) in
the eight weight taps that see only the zero padding, whose gradient is exactly 0, in about a
third of its backward passes, depending on what the memory it was given held; the parameters
went NaN after 3 to 20 steps with every loss finite, and with `torch.backends.mkldnn.enabled =
False` they did not. float16 and float32 at the same shape, and bf16 at 1x1 with stride 1 or
at 2x2, were finite in every pass. The probe repeats each convolution's backward REPEATS times
on the input the model gave it, each time after blocks of the sizes the kernel's outputs and
scratch take were filled with NaN and freed: what an unwritten entry holds is what its memory
held, so without the fill the fault showed in 8 of 16 passes in one process and in none in the
next.
"""

from __future__ import annotations

import time

import torch
from torch import nn

# Backward passes per convolution and dtype: a fault seen in a third of the passes is missed
# by 16 with a chance of (2/3)^16, 0.2%.
REPEATS = 16
# A non-finite gradient is a kernel's fault only where fp32's gradient at the same inputs is
# finite and under the dtype's largest value by this factor (no overflow of the dtype's range).
HEADROOM = 8.0
CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
# Seconds the probe may take per recipe: where the dtype's kernels are slow (fp16 convolutions
# on a CPU without fp16 support run a reference loop: resnet18 at 16x16, 50 s for all 20), the
# convolutions after the budget are not probed. A probe finds faults; it never clears a model.
BUDGET_S = 10.0


def record_inputs(model: nn.Module) -> tuple[dict[str, torch.Tensor], list]:
    """Hooks that keep each convolution's first input (as the module receives it); the inputs
    and the hooks' handles (remove them after the first step)."""
    inputs: dict[str, torch.Tensor] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, CONVOLUTIONS):

            def keep(_module, args, name=name):
                if name not in inputs and args and isinstance(args[0], torch.Tensor):
                    inputs[name] = args[0].detach().clone()

            handles.append(module.register_forward_pre_hook(keep))
    return inputs, handles


def probe(
    initial: nn.Module, inputs: dict[str, torch.Tensor], dtype: torch.dtype,
    skip: tuple[str, ...] = (),
) -> list[str]:  # fmt: skip
    """Each convolution whose backward in `dtype`, from the initial weights and the input it
    got, returned inf/NaN while fp32's was finite: one line each, naming the module, its shape
    and how often. `skip`: modules kept in fp32 (a fix)."""
    named = dict(initial.named_modules())
    limit = torch.finfo(dtype).max / HEADROOM
    faults, seen = [], {}
    start = time.perf_counter()
    for name, x in inputs.items():
        if time.perf_counter() - start > BUDGET_S:
            break
        if any(name == s or name.startswith(f"{s}.") for s in skip):
            continue
        module = named.get(name)
        if not isinstance(module, CONVOLUTIONS) or not x.is_floating_point():
            continue
        weight = module.weight.detach().to(x.device, torch.float32)
        key = (tuple(x.shape), tuple(weight.shape), module.stride, module.padding,
               module.dilation, module.groups, module.padding_mode)  # fmt: skip
        if key not in seen:
            seen[key] = _faults(module, x.float(), weight, dtype, limit)
        if seen[key]:
            faults.append(f"{name} ({_shape(module, x)}): {seen[key]} of {REPEATS} passes")
    return faults


def _faults(module, x: torch.Tensor, weight: torch.Tensor, dtype, limit: float) -> int:
    generator = torch.Generator(x.device).manual_seed(0)
    with torch.autocast(x.device.type, enabled=False):
        grads = _backward(module, x, weight, None, generator)
        if grads is None or any(float(g.abs().amax()) > limit for g in grads):
            return 0  # fp32's own gradient is not finite, or near the dtype's range
        bad = 0
        for _ in range(REPEATS):
            # Memory the gradients may be given, filled with NaN and freed first: a kernel that
            # leaves entries unwritten shows them as NaN rather than as what the memory held.
            _poison(weight, x)
            got = _backward(module, x.to(dtype), weight.to(dtype), dtype, generator)
            bad += got is None
    return bad


def _poison(weight: torch.Tensor, x: torch.Tensor) -> None:
    """Blocks of the sizes a kernel's outputs and scratch take (the weight and the input in the
    16-bit dtype and in fp32, its accumulator's), filled with NaN and freed together."""
    blocks = [
        torch.full((n * k,), torch.nan, dtype=dtype, device=x.device)
        for n in (weight.numel(), x.numel())
        for dtype in (torch.bfloat16, torch.float32)
        for k in (1, 2)
    ]
    del blocks


def _backward(module, x, weight, dtype, generator) -> tuple | None:
    """The gradients of the input and the weight for a random output gradient; None when
    either holds inf/NaN."""
    x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
    out = module._conv_forward(x, weight, None)
    grad = torch.randn(out.shape, generator=generator, device=out.device).to(out.dtype)
    grads = torch.autograd.grad(out, (x, weight), grad)
    return grads if all(bool(torch.isfinite(g).all()) for g in grads) else None


def _shape(module, x: torch.Tensor) -> str:
    kernel = "x".join(str(k) for k in module.kernel_size)
    stride = "x".join(str(s) for s in module.stride)
    spatial = "x".join(str(s) for s in x.shape[2:])
    return f"{type(module).__name__} {kernel}, stride {stride}, on {spatial} maps"
