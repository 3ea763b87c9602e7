"""Known bugs of autocast's op policy and its cache of weights cast to the low dtype."""

from __future__ import annotations

import torch

from harness.lab.known_bugs.reproduction import Observed, Unavailable, reproduces

_LOW = torch.bfloat16  # the CPU and CUDA autocast both take it on every supported release


def _fit_losses(device: torch.device, one_region: bool, steps: int = 10) -> list[float]:
    """A linear regression trained by SGD under autocast; returns the loss of every step."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=generator)
    y = x @ torch.randn(16, 1, generator=generator)
    x, y = x.to(device), y.to(device)
    layer = torch.nn.Linear(16, 1).to(device)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.05)
    dtype = _LOW
    losses = []

    def step() -> None:
        loss = ((layer(x).float() - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))

    if one_region:
        # The whole loop in one region: the cast of the weight is cached at the first forward
        # and kept until the region exits, so every later forward reads the first weights.
        with torch.autocast(device.type, dtype=dtype):
            for _ in range(steps):
                step()
    else:
        for _ in range(steps):
            with torch.autocast(device.type, dtype=dtype):  # the region exits: cache cleared
                step()
    return losses


@reproduces(
    "KB-AUTOCAST-CACHE-STALE-WEIGHT",
    devices=("cpu", "cuda"),
    control="the same loop entering autocast once per step instead of once around the loop",
)
def autocast_cache_stale_weight(device: torch.device, control: bool) -> Observed:
    losses = _fit_losses(device, one_region=not control)
    spread = max(losses) - min(losses)
    where = "per step" if control else "around the whole loop"
    return Observed(
        harm=spread < 1e-6,
        says=(
            f"bf16 autocast entered {where}, 10 SGD steps of a linear fit: the loss goes "
            f"{losses[0]:.4g} -> {losses[-1]:.4g} (spread {spread:.3g})"
        ),
        numbers={"first_loss": losses[0], "last_loss": losses[-1], "loss_spread": spread},
    )


def _grad_after_gradless_forward(device: torch.device, mode) -> tuple[str, float]:
    """In one autocast region, a forward under `mode` (torch.no_grad or torch.inference_mode;
    None: no such forward) and then a training forward of the same layer; returns what
    backward did and the weight's gradient norm (0 where it got none)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 8).to(device)
    x = torch.randn(4, 8, device=device)
    with torch.autocast(device.type, dtype=_LOW):
        if mode is not None:
            with mode():  # an evaluation or logging pass inside the training region
                layer(x)
        out = layer(x)
    try:
        out.float().pow(2).sum().backward()
    except RuntimeError as error:  # the output has no grad_fn: the cached cast had no history
        return f"backward raised ({str(error).splitlines()[0][:60]})", 0.0
    grad = layer.weight.grad
    return "backward ran", 0.0 if grad is None else float(grad.norm())


@reproduces(
    "KB-AUTOCAST-NOGRAD-CACHE-DROPS-GRAD",
    devices=("cpu", "cuda"),
    control="the same training forward without the no_grad forward before it",
)
def autocast_nograd_cache(device: torch.device, control: bool) -> Observed:
    return _gradless_first(device, control, torch.no_grad)


@reproduces(
    "KB-AUTOCAST-INFERENCE-MODE-CACHE-DROPS-GRAD",
    devices=("cpu", "cuda"),
    control="the same training forward without the inference_mode forward before it",
)
def autocast_inference_mode_cache(device: torch.device, control: bool) -> Observed:
    return _gradless_first(device, control, torch.inference_mode)


def _gradless_first(device: torch.device, control: bool, mode) -> Observed:
    what, norm = _grad_after_gradless_forward(device, None if control else mode)
    first = "no earlier forward" if control else f"a torch.{mode.__name__} forward first"
    return Observed(
        harm=norm == 0.0,
        says=(
            f"bf16 autocast, {first} in the same region, then a training forward: {what}, the "
            f"weight's gradient norm {norm:.4g}"
        ),
        numbers={"weight_grad_norm": norm},
    )


@reproduces(
    "KB-RMSNORM-MIXED-DTYPE-OUTPUT",
    devices=("cpu",),
    control="the same RMSNorm without its fp32 weight (elementwise_affine=False)",
)
def rmsnorm_mixed_dtype_output(device: torch.device, control: bool) -> Observed:
    if not hasattr(torch.nn, "RMSNorm"):
        raise Unavailable("torch.nn.RMSNorm (added in 2.4)")
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 16).to(device)
    # rms_norm is on no CPU autocast list: it runs on the fp16 activations as they come, and
    # the fp32 weight is multiplied last, where type promotion makes the product float32.
    norm = torch.nn.RMSNorm(16, elementwise_affine=not control).to(device)
    try:
        with torch.autocast(device.type, dtype=torch.float16):
            hidden = layer(torch.randn(4, 8, device=device))
            out = norm(hidden)
    except RuntimeError as error:
        raise Unavailable(f"fp16 autocast on {device.type}: {error}") from None
    weight = "without a weight" if control else "with its fp32 weight"
    return Observed(
        harm=out.dtype != hidden.dtype,
        says=(
            f"fp16 autocast on {device.type}: nn.Linear gives {hidden.dtype}, nn.RMSNorm "
            f"{weight} turns it into {out.dtype} ({out.element_size()} bytes an element)"
        ),
        numbers={"output_bytes_per_element": float(out.element_size())},
    )


@reproduces(
    "KB-TRANSFORMER-FASTPATH-CPU-AUTOCAST",
    devices=("cpu",),
    control="the same layer in training mode (dropout 0), which takes the slow path",
)
def transformer_fastpath_cpu_autocast(device: torch.device, control: bool) -> Observed:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).to(device)
    layer.train(control)  # eval + no_grad: the fused inference fast path
    x = torch.randn(2, 5, 8, device=device)
    mode = "training" if control else "eval"
    try:
        with torch.no_grad(), torch.autocast(device.type, dtype=_LOW):
            out = layer(x)
        raised, what = 0, f"output {str(out.dtype).removeprefix('torch.')}"
    except RuntimeError as error:
        raised, what = 1, str(error).splitlines()[0][:120]
    return Observed(
        harm=bool(raised),
        says=(
            f"TransformerEncoderLayer in {mode} mode under no_grad and {device.type} bf16 "
            f"autocast: {raised} of 1 calls raised ({what})"
        ),
        numbers={"raised": float(raised)},
    )
