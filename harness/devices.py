"""What this machine can do, probed at run time (never inferred from version numbers), and the
skip reasons a person can act on when a scenario needs something the machine lacks."""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field

import torch

from harness.errors import HarnessError

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def _works(fn) -> bool:
    """True when a tiny probe runs and returns True; any error or warning means unsupported."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "...Disabling autocast" warnings mean: not supported
            return bool(fn())
    except Exception:
        return False


def _probe_autocast(device: str, dtype: torch.dtype) -> bool:
    linear = torch.nn.Linear(4, 4).to(device)
    with torch.autocast(device_type=device, dtype=dtype):
        return linear(torch.ones(2, 4, device=device)).dtype == dtype


def _probe_grad_scaler(device: str) -> bool:
    return torch.amp.GradScaler(device).is_enabled()


def _probe_half_training(device: str) -> bool:
    """`model.half()` needs half kernels for linear, batch/layer norm, forward and backward."""
    model = (
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.LayerNorm(4))
        .to(device)
        .half()
    )
    model(torch.ones(3, 4, device=device, dtype=torch.half)).sum().backward()
    return model[0].weight.grad.dtype == torch.half


@dataclass(frozen=True)
class DeviceInfo:
    """The device a session runs its scenarios on, with its probed capabilities."""

    type: str  # "cpu" or "cuda"
    name: str  # "cpu" or the GPU's name
    gpu_count: int
    compute_capability: tuple[int, int] | None
    capabilities: dict[str, bool] = field(default_factory=dict, hash=False)  # hashable: a key

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.type)

    def missing(self, *needs: str, gpus: int = 0) -> str | None:
        """Why this device cannot run something that needs `needs`, or None if it can."""
        for need in needs:
            if need not in CAPABILITY_TEXT:
                raise HarnessError(
                    f"unknown capability {need!r}: known are {', '.join(sorted(CAPABILITY_TEXT))}"
                )
            if need == "cuda":
                if self.type != "cuda" and self.gpu_count == 0:
                    return _no_cuda_reason()
                if self.type != "cuda":
                    return (
                        "needs CUDA: this session runs on the CPU (pass --amp-device cuda or auto)"
                    )
            elif not self.capabilities.get(need, False):
                return f"needs {CAPABILITY_TEXT[need]}: not available on {self.describe()}"
        if gpus > self.gpu_count:
            return f"needs {gpus} CUDA GPUs, found {self.gpu_count}"
        return None

    def describe(self) -> str:
        if self.type == "cpu":
            return f"cpu (torch {torch.__version__})"
        major, minor = self.compute_capability or (0, 0)
        return f"{self.name} (sm_{major}{minor}, torch {torch.__version__})"


CAPABILITY_TEXT = {
    "cuda": "CUDA",
    "fp16_autocast": "float16 autocast",
    "bf16_autocast": "bfloat16 autocast",
    "grad_scaler": "a working torch.amp.GradScaler for this device",
    "half_training": "float16 kernels to train a .half() model (linear, batch and layer norm)",
    "tf32": "TF32 tensor cores (an NVIDIA GPU of compute capability 8.0 or newer)",
}


def _no_cuda_reason() -> str:
    build = (
        "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    )
    return f"needs CUDA: no GPU found (torch {torch.__version__} is {build})"


@functools.cache
def probe(device_type: str) -> DeviceInfo:
    """Probe one device type once per process."""
    gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device_type == "cuda":
        props = torch.cuda.get_device_properties(0)
        name, cc = props.name, (props.major, props.minor)
    else:
        name, cc = "cpu", None
    caps = {
        "fp16_autocast": _works(lambda: _probe_autocast(device_type, torch.float16)),
        "bf16_autocast": _works(lambda: _probe_autocast(device_type, torch.bfloat16)),
        "grad_scaler": _works(lambda: _probe_grad_scaler(device_type)),
        "half_training": _works(lambda: _probe_half_training(device_type)),
        "tf32": device_type == "cuda" and cc >= (8, 0),
    }
    if device_type == "cuda":
        # Autocast accepts bf16 on pre-Ampere GPUs and emulates it slowly; ask the driver.
        caps["bf16_autocast"] = caps["bf16_autocast"] and torch.cuda.is_bf16_supported()
    return DeviceInfo(device_type, name, gpu_count, cc, caps)


def resolve(choice: str) -> DeviceInfo:
    """Turn --amp-device auto|cpu|cuda into a probed device, or a clear error."""
    if choice not in DEVICE_CHOICES:
        raise HarnessError(f"--amp-device {choice!r}: use one of {', '.join(DEVICE_CHOICES)}")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise HarnessError(
            f"--amp-device cuda: {_no_cuda_reason()}. Run with --amp-device cpu (or auto) here, "
            "or on a machine with an NVIDIA GPU and a CUDA build of torch."
        )
    return probe(choice)
