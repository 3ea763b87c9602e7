"""Faults installed inside spawned ranks (AMP_HARNESS_RANK_SETUP=rank_faults:NAME): a
monkeypatch in the test process does not reach them. Each breaks one behaviour that
scenarios/test_distributed.py checks. Kept free of heavy imports: every rank imports it."""

from __future__ import annotations

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel


def ddp_fp16_by_default() -> None:
    """DDP compresses every bucket to fp16, and a user's comm hook cannot change that."""
    init = DistributedDataParallel.__init__
    register = DistributedDataParallel.register_comm_hook

    def fp16_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        register(self, None, default_hooks.fp16_compress_hook)

    DistributedDataParallel.__init__ = fp16_init
    DistributedDataParallel.register_comm_hook = lambda self, state, hook: None


def fp16_hook_in_fp32() -> None:
    """fp16_compress_hook communicates in fp32: what the article's story would need to be
    harmless, and what the scenario must notice."""
    default_hooks.fp16_compress_hook = default_hooks.allreduce_hook
