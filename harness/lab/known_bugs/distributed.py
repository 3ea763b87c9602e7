"""Known bugs of gradient reduction across ranks under mixed precision (DDP, FSDP2), run on two
gloo ranks on the CPU through harness.lab.distributed's launcher (a run takes a few seconds)."""

from __future__ import annotations

import torch

from harness.lab.distributed import RankContext, RankError, run_ranks
from harness.lab.known_bugs.reproduction import Observed, Unavailable, reproduces

WORLD_SIZE = 2


def _fsdp2():
    """fully_shard and MixedPrecisionPolicy, wherever this release keeps them."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError as exc:
            raise Unavailable(f"no FSDP2 (fully_shard) in torch {torch.__version__}") from exc
    return fully_shard, MixedPrecisionPolicy


def _frozen_first_forward(ctx: RankContext, control: bool) -> list:
    """One rank: two bf16/fp32-reduce FSDP2 layers; a first forward with the parameters frozen
    (control: under no_grad, still trainable), then unfrozen, a training forward and backward.
    Returns ["raised", message] or ["ok", the gradient's dtype]."""
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard, MixedPrecisionPolicy = _fsdp2()
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(ctx.device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    x = torch.randn(4, 8, device=ctx.device)
    if control:
        with torch.no_grad():
            model(x)
    else:
        model.requires_grad_(False)
        model(x)
        model.requires_grad_(True)
    try:
        model(x).float().sum().backward()
    except RuntimeError as exc:
        return ["raised", str(exc).splitlines()[0][:200]]
    return ["ok", str(model[0].weight.grad.dtype)]


@reproduces(
    "KB-FSDP2-FROZEN-FIRST-FORWARD-REDUCE-DTYPE",
    devices=("cpu",),
    control="the same first forward under torch.no_grad() with the parameters left trainable",
)
def fsdp2_frozen_first_forward(device: torch.device, control: bool) -> Observed:
    if tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 7):
        # 2.6.0 measured: FSDP2 on CPU ranks fails ('Stream' object has no attribute
        # 'record_event'); 2.4.1 and 2.5.1 call into CUDA.
        raise Unavailable(f"FSDP2 does not run on CPU (gloo) ranks in torch {torch.__version__}")
    _fsdp2()
    try:
        results = run_ranks(_frozen_first_forward, WORLD_SIZE, device.type, args=(control,),
                            timeout_s=60.0)  # fmt: skip
    except RankError as exc:
        raise Unavailable(f"FSDP2 on {WORLD_SIZE} gloo ranks did not run: {exc}") from exc
    outcome, detail = results[0]
    first = "under no_grad (trainable)" if control else "with requires_grad_(False)"
    if outcome == "raised":
        says = (f"fully_shard, param_dtype bfloat16, reduce_dtype float32, {WORLD_SIZE} gloo "
                f"ranks, first forward {first}, then unfrozen: the first backward raises "
                f"({detail})")  # fmt: skip
    else:
        says = (f"fully_shard, param_dtype bfloat16, reduce_dtype float32, {WORLD_SIZE} gloo "
                f"ranks, first forward {first}, then unfrozen: the backward runs, gradients "
                f"{detail}")  # fmt: skip
    harm = outcome == "raised" or detail != "torch.float32"
    return Observed(harm=harm, says=says, numbers={"raised": float(outcome == "raised")})
