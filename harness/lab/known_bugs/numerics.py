"""Known bugs of norm layers, reductions and losses in half precision."""

from __future__ import annotations

import torch

from harness.lab.known_bugs.reproduction import Observed, Unavailable, reproduces


def _batchnorm_after_one_step(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """A BatchNorm1d in `dtype`: one training step on `x`, then eval on it; returns its
    running_var and eval output in fp32."""
    norm = torch.nn.BatchNorm1d(x.shape[1]).to(x.device, dtype).train()
    with torch.no_grad():
        norm(x.to(dtype))
        norm.eval()
        out = norm(x.to(dtype))
    return norm.running_var.float(), out.float()


@reproduces(
    "KB-HALF-BATCHNORM-CPU-VARIANCE",
    devices=("cpu",),
    control="the same BatchNorm and batch in fp32",
)
def half_batchnorm_cpu_variance(device: torch.device, control: bool) -> Observed:
    """One training step of a BatchNorm1d on a batch of 32 with std 100, then eval: the sum of
    squared deviations, about 32 * 100**2, is past fp16's 65504 if accumulated in fp16."""
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(32, 4, generator=generator) * 100.0).to(device)
    dtype = torch.float32 if control else torch.float16
    try:
        running_var, out = _batchnorm_after_one_step(x, dtype)
    except RuntimeError as error:
        raise Unavailable(f"half BatchNorm on {device.type}: {error}") from None
    _, reference = _batchnorm_after_one_step(x, torch.float32)
    inf_var = int(torch.isinf(running_var).sum())
    error = float((out - reference).abs().max())
    error = error if error == error else float("inf")  # NaN: as far off as it gets
    spread = float(reference.abs().max())
    return Observed(
        harm=inf_var > 0 or error > 0.01 * spread,
        says=(
            f"{str(dtype).removeprefix('torch.')} BatchNorm1d on {device.type}, batch 32 of std "
            f"100, one training step: {inf_var} of 4 running_var entries inf; its eval output is "
            f"off the fp32 module's by up to {error:.3g} (outputs reach {spread:.3g})"
        ),
        numbers={"running_var_inf": float(inf_var), "eval_output_error": error},
    )


@reproduces(
    "KB-HALF-BATCHNORM-BWD-CHANNELS-LAST",
    devices=("cpu",),
    control="the same fp16 BatchNorm2d backward on a contiguous (NCHW) input",
)
def half_batchnorm_backward_channels_last(device: torch.device, control: bool) -> Observed:
    # 4 x 256 x 256 = 262144 positions a channel: the gradient sum a channel, about 131000,
    # is beyond fp16's 65504 if it is accumulated in fp16.
    generator = torch.Generator().manual_seed(0)
    layout = torch.contiguous_format if control else torch.channels_last
    x = torch.rand(4, 2, 256, 256, generator=generator).to(device, torch.float16)
    x = x.contiguous(memory_format=layout).requires_grad_()
    upstream = torch.rand(4, 2, 256, 256, generator=generator).to(device, torch.float16)
    norm = torch.nn.BatchNorm2d(2).to(device, torch.float16)
    try:
        norm(x).backward(upstream)  # the upstream gradient as the next layer hands it: NCHW
    except RuntimeError as error:
        raise Unavailable(f"half BatchNorm2d backward on {device.type}: {error}") from None
    nan = float(torch.isnan(x.grad).float().mean())
    name = "contiguous" if control else "channels_last"
    return Observed(
        harm=nan > 0,
        says=(
            f"fp16 BatchNorm2d on {device.type}, a {name} input of 4x2x256x256: {nan:.0%} of "
            f"the input gradient NaN"
        ),
        numbers={"grad_nan_fraction": nan},
    )


@reproduces(
    "KB-HALF-NLL-LOSS-MEAN-NAN",
    devices=("cpu",),
    control="the same loss with reduction='sum' divided by the batch size",
)
def half_nll_loss_mean(device: torch.device, control: bool) -> Observed:
    """nll_loss's mean in fp16 over 70000 targets: the weight total it divides by, 70000, is
    accumulated in the input's dtype and passes fp16's 65504."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(70000, 4, generator=generator).to(device, torch.float16)
    target = torch.randint(0, 4, (70000,), generator=generator).to(device)
    log_probs = torch.log_softmax(logits, dim=1)
    if control:
        loss = torch.nn.functional.nll_loss(log_probs.float(), target, reduction="sum") / 70000
    else:
        loss = torch.nn.functional.nll_loss(log_probs, target)
    reference = float(torch.nn.functional.nll_loss(log_probs.float(), target))
    value = float(loss)
    how = "as a sum divided by 70000" if control else "with reduction='mean'"
    return Observed(
        harm=not abs(value - reference) <= 0.01 * abs(reference),
        says=(
            f"fp16 nll_loss over 70000 targets on {device.type} {how}: {value:.4g}, where the "
            f"fp32 mean is {reference:.4g}"
        ),
        numbers={"loss": value, "fp32_loss": reference},
    )


@reproduces(
    "KB-HALF-CROSS-ENTROPY-LABEL-SMOOTHING-INF",
    devices=("cpu",),
    control="the same fp16 logits given to the loss upcast to fp32",
)
def half_cross_entropy_label_smoothing(device: torch.device, control: bool) -> Observed:
    """cross_entropy(label_smoothing=0.1) on fp16 logits of 1000 classes with std 10: the
    smoothing term sums -log_softmax over the classes, about 1000 * 40, beyond fp16's 65504."""
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(8, 1000, generator=generator) * 10).to(device, torch.float16)
    target = torch.randint(0, 1000, (8,), generator=generator).to(device)
    given = logits.float() if control else logits
    loss = float(torch.nn.functional.cross_entropy(given, target, label_smoothing=0.1))
    plain = float(torch.nn.functional.cross_entropy(given, target))
    what = "upcast to fp32" if control else "in fp16"
    return Observed(
        harm=loss != loss or abs(loss) == float("inf"),
        says=(
            f"cross_entropy on logits {what} ({device.type}, 8 x 1000 classes, std 10): "
            f"{loss:.4g} with label_smoothing=0.1, {plain:.4g} without"
        ),
        numbers={"loss_smoothed": loss, "loss_plain": plain},
    )


@reproduces(
    "KB-HALF-NORMALIZE-ZERO-NAN",
    devices=("cpu", "cuda"),
    control="the same call with eps=torch.finfo(torch.float16).tiny, which fp16 can hold",
)
def half_normalize_zero_nan(device: torch.device, control: bool) -> Observed:
    """F.normalize of an fp16 batch whose first row is all zeros: max(norm, eps) is 0 when eps
    (1e-12) rounds to 0 in fp16, and 0 / 0 is NaN."""
    x = torch.ones(2, 4, device=device, dtype=torch.float16)
    x[0] = 0.0
    x.requires_grad_()
    eps = torch.finfo(torch.float16).tiny if control else 1e-12
    out = torch.nn.functional.normalize(x, dim=1, eps=eps)
    out.sum().backward()
    nan_out = int(torch.isnan(out).sum())
    nan_grad = int((~torch.isfinite(x.grad)).sum())
    return Observed(
        harm=nan_out + nan_grad > 0,
        says=(
            f"F.normalize(fp16, dim=1, eps={eps:.3g}) of a 2x4 batch with one all-zero row: "
            f"{nan_out} of 8 outputs NaN, {nan_grad} of 8 input gradients not finite"
        ),
        numbers={"nan_outputs": float(nan_out), "nonfinite_grads": float(nan_grad)},
    )


@reproduces(
    "KB-CLIP-GRAD-NORM-FP16-INF",
    devices=("cpu", "cuda"),
    control="the same gradients and clip_grad_norm_ in fp32",
)
def clip_grad_norm_fp16_inf(device: torch.device, control: bool) -> Observed:
    """Two gradients of 1000 entries of 1500: each norm is 47434 (fp16 holds it), the total
    67082 does not, so the norm of the norms is inf in fp16 and the clip coefficient 0."""
    dtype = torch.float32 if control else torch.float16
    params = [torch.nn.Parameter(torch.zeros(1000, device=device, dtype=dtype)) for _ in range(2)]
    for p in params:
        p.grad = torch.full((1000,), 1500.0, device=device, dtype=dtype)
    total = float(torch.nn.utils.clip_grad_norm_(params, max_norm=1.0))
    after = float(params[0].grad[0])
    expected = 1500.0 / 67082.04  # max_norm / total norm
    return Observed(
        harm=abs(after - expected) > 0.01 * expected,
        says=(
            f"clip_grad_norm_(max_norm=1) over two {str(dtype).removeprefix('torch.')} "
            f"gradients of 1000 entries of 1500 (total norm 67082): it returns {total:.6g} and "
            f"leaves the gradients at {after:.3g} where clipping gives {expected:.3g}"
        ),
        numbers={"total_norm": total, "grad_after": after},
    )
