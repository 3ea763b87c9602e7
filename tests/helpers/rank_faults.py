"""Faults installed inside spawned ranks (AMP_HARNESS_RANK_SETUP=helpers.rank_faults:NAME): a
monkeypatch in the test process does not reach them. Each breaks one behaviour that
scenarios/test_distributed.py checks. Kept free of heavy imports: every rank imports it."""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks, default_hooks
from torch.nn.parallel import DistributedDataParallel


def _every_ddp_with(hook) -> None:
    """Every DDP model communicates through `hook`, and a user's comm hook cannot change that."""
    init = DistributedDataParallel.__init__
    register = DistributedDataParallel.register_comm_hook

    def init_with_hook(self, *args, **kwargs):
        init(self, *args, **kwargs)
        register(self, None, hook)

    DistributedDataParallel.__init__ = init_with_hook
    DistributedDataParallel.register_comm_hook = lambda self, state, hook: None


def ddp_fp16_by_default() -> None:
    """DDP compresses every bucket to fp16."""
    _every_ddp_with(default_hooks.fp16_compress_hook)


def fp16_hook_in_fp32() -> None:
    """fp16_compress_hook communicates in fp32: what the article's story would need to be
    harmless, and what the scenario must notice."""
    default_hooks.fp16_compress_hook = default_hooks.allreduce_hook


def ddp_without_allreduce() -> None:
    """DDP whose all-reduce never happens: torch's noop_hook hands each bucket back as it is,
    so every rank keeps its own gradients (rank 0 its zeros)."""
    _every_ddp_with(debugging_hooks.noop_hook)


def no_sync_that_syncs() -> None:
    """DDP.no_sync does nothing: gradients are all-reduced inside it as well, so the scenario's
    control (rank 0 keeps its zeros without the sync) comes out the other way."""
    DistributedDataParallel.no_sync = lambda self: contextlib.nullcontext()


def autocast_that_does_nothing() -> None:
    """torch.autocast never lowers a dtype: backward stays fp32 and rank 0's tiny gradient does
    not underflow, so the zeros the claim is about never appear."""
    torch.autocast = lambda *args, **kwargs: contextlib.nullcontext()
