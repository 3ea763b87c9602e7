"""Known bugs of activation checkpointing's recomputation under autocast."""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint

from harness.lab.known_bugs.reproduction import Observed, Unavailable, reproduces


@reproduces(
    "KB-CHECKPOINT-REENTRANT-AUTOCAST-NO-GRAD",
    devices=("cpu", "cuda"),
    control="the same step with the non-reentrant checkpoint (use_reentrant=False)",
)
def checkpoint_reentrant_autocast(device: torch.device, control: bool) -> Observed:
    """A checkpointed Linear then a head, bf16 autocast, backward called inside the region (as
    a training step written all under autocast does)."""
    torch.manual_seed(0)
    block, head = torch.nn.Linear(64, 64).to(device), torch.nn.Linear(64, 1).to(device)
    x = torch.randn(8, 64, device=device, requires_grad=True)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        # The reentrant forward runs under no_grad: the block's weight cast it caches has no
        # autograd history, and the recomputation in backward, still in the region, reuses it.
        hidden = checkpoint(block, x, use_reentrant=not control)
        head(hidden).float().sum().backward()
    grad = block.weight.grad
    norm = 0.0 if grad is None else float(grad.norm())
    kind = "non-reentrant" if control else "reentrant"
    return Observed(
        harm=norm == 0.0,
        says=(
            f"a {kind} checkpointed Linear under bf16 autocast, backward inside the region: the "
            f"checkpointed weight's gradient is {'None' if grad is None else f'{norm:.4g}'} "
            f"(the head's {float(head.weight.grad.norm()):.4g})"
        ),
        numbers={"checkpointed_weight_grad_norm": norm},
    )


@reproduces(
    "KB-SAC-AUTOCAST-SHARED-WEIGHT",
    devices=("cpu", "cuda"),
    control="the same step with autocast's weight cache off (cache_enabled=False)",
)
def sac_autocast_shared_weight(device: torch.device, control: bool) -> Observed:
    """Selective activation checkpointing (save the matmuls, recompute the rest) around two
    calls of one Linear, under bf16 autocast: the second call's forward finds the weight's cast
    in autocast's cache and records no cast, its recomputation casts afresh."""
    try:
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    except ImportError as missing:
        raise Unavailable(f"selective activation checkpointing (2.5): {missing}") from None

    def policy(ctx, op, *args, **kwargs):
        saved = op == torch.ops.aten.mm.default
        return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE

    context = functools.partial(create_selective_checkpoint_contexts, policy)
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64).to(device)
    x = torch.randn(8, 64, device=device, requires_grad=True)
    with torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=not control):
        hidden = checkpoint(layer, x, use_reentrant=False, context_fn=context)
        out = checkpoint(layer, hidden, use_reentrant=False, context_fn=context)
    try:
        out.float().sum().backward()
        what, failed = f"backward ran (weight gradient {float(layer.weight.grad.norm()):.4g})", 0
    except RuntimeError as error:
        failed = 1  # a number in the evidence, whichever way it went
        what = f"backward failed ({failed} of 1): {str(error).splitlines()[0][:90]}"
    cache = "off" if control else "on"
    return Observed(
        harm=bool(failed),
        says=(
            f"one Linear called in two selectively checkpointed regions under bf16 autocast, "
            f"the weight cache {cache}: {what}"
        ),
        numbers={"backward_failed": float(failed)},
    )
