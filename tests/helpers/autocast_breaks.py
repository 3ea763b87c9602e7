"""One op's autocast rule broken at the dispatcher, what a torch release that dropped the op
from autocast's lists would do: for tests/lab/autocast/test_atlas_measurement.py and
tests/sensitivity/test_sensitivity_autocast_atlas.py."""

from __future__ import annotations

import contextlib
import warnings

import torch


@contextlib.contextmanager
def without_autocast_rule(op: str):
    """aten::`op`'s AutocastCPU kernel replaced by one that casts nothing, until the block ends."""

    def uncast(*args, **kwargs):
        keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
        with torch._C._ExcludeDispatchKeyGuard(keys):
            return getattr(torch.ops.aten, op)(*args, **kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
        library = torch.library.Library("aten", "IMPL")
        library.impl(op, uncast, "AutocastCPU")
    try:
        yield
    finally:
        library._destroy()  # the original kernel is back


def mm_without_autocast():
    """aten::mm's AutocastCPU kernel replaced by one that casts nothing, until the block ends."""
    return without_autocast_rule("mm")
