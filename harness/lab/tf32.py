"""TF32 switches, read, set and restored through whichever API this torch build has.

torch 2.9 added `fp32_precision` settings ("ieee" or "tf32"; "none" inherits
from the level above: cuda.matmul and cudnn.conv from cudnn / the global torch.backends) and
announced the deprecation of the old allow_tf32 flags; it refuses (RuntimeError) to read an old
flag once the new one was set. So a build that has the new settings is driven through them
alone, and the old flags serve only builds without them (torch 2.4-2.8).
"""

from __future__ import annotations

import torch

DEFAULT_TF32 = {"cuda.matmul.allow_tf32": False, "cudnn.allow_tf32": True}  # torch >= 1.12
_PARENTS = {  # flag -> the fp32_precision settings that decide it, most specific first
    "cuda.matmul.allow_tf32": (("cuda", "matmul"), ("",)),
    "cudnn.allow_tf32": (("cudnn", "conv"), ("cudnn",), ("",)),
}


def new_tf32_api() -> bool:
    """This build sets TF32 through torch.backends.*.fp32_precision (torch 2.9 and newer)."""
    return hasattr(torch.backends.cuda.matmul, "fp32_precision") and hasattr(
        torch.backends.cudnn, "conv"
    )


def _backend(path: tuple[str, ...]):
    """torch.backends.<path...>, e.g. ("cudnn", "conv") -> torch.backends.cudnn.conv."""
    node = torch.backends
    for name in filter(None, path):
        node = getattr(node, name)
    return node


def _precision(flag: str) -> bool:
    """Whether TF32 is on for `flag`, resolved through the fp32_precision levels."""
    for path in _PARENTS[flag]:
        setting = _backend(path).fp32_precision
        if setting != "none":
            return setting == "tf32"
    return DEFAULT_TF32[flag]


def tf32_flags() -> dict[str, bool]:
    """Whether TF32 is on for matmuls and for cuDNN convolutions: what makes an "fp32"
    measurement ambiguous, recorded with every run (the same keys whichever API set them)."""
    if new_tf32_api():
        return {flag: _precision(flag) for flag in _PARENTS}
    return {
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
    }


def tf32_settings() -> dict[str, object]:
    """The switches as they are set, to be restored exactly by `restore_tf32`."""
    if new_tf32_api():
        return {
            "matmul": torch.backends.cuda.matmul.fp32_precision,
            "conv": torch.backends.cudnn.conv.fp32_precision,
        }
    return {
        "matmul": torch.backends.cuda.matmul.allow_tf32,
        "conv": torch.backends.cudnn.allow_tf32,
    }


def restore_tf32(settings: dict[str, object]) -> None:
    if new_tf32_api():
        torch.backends.cuda.matmul.fp32_precision = settings["matmul"]
        torch.backends.cudnn.conv.fp32_precision = settings["conv"]
    else:
        torch.backends.cuda.matmul.allow_tf32 = settings["matmul"]
        torch.backends.cudnn.allow_tf32 = settings["conv"]


def set_tf32(enabled: bool) -> None:
    """TF32 on or off for matmuls and cuDNN convolutions, through this build's API."""
    if new_tf32_api():
        precision = "tf32" if enabled else "ieee"
        restore_tf32({"matmul": precision, "conv": precision})
    else:
        restore_tf32({"matmul": enabled, "conv": enabled})
