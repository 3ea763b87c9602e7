"""The environment fingerprint recorded with every run: what a result depends on.

Only named facts are collected; the process environment is never copied (it holds secrets).
"""

from __future__ import annotations

import hashlib
import platform
import shutil
import subprocess
from pathlib import Path

import torch

import harness
from harness.lab.machine import cpu, gpu
from harness.lab.machine.device import DeviceInfo
from harness.lab.machine.probes import installed_version
from harness.lab.tf32 import tf32_flags
from harness.records import torch_state


def _run(args: list[str], cwd: Path | None = None) -> str:
    """First line of a command's output, or "" when it is absent, fails or takes over 5 s."""
    if shutil.which(args[0]) is None:
        return ""
    try:
        out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""


def _git_commit(root: Path, watched: tuple[Path, ...] = ()) -> str:
    """HEAD's commit, `-dirty` where what ran is not what it holds: a tracked file changed, or
    a file under `watched` (the scenario folder, the project's catalogue) is new and untracked
    (a new scenario's verdicts were tagged with a commit that did not contain it)."""
    commit = _run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root)
    if not commit:
        return "unknown"
    changed = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    inside = [str(path) for path in watched if path.resolve().is_relative_to(root.resolve())]
    if not changed and inside:
        # Untracked files there, but not those .gitignore names (caches, the reports folder).
        changed = _run(["git", "status", "--porcelain", "--untracked-files=all", "--", *inside],
                       cwd=root)  # fmt: skip
    return commit + ("-dirty" if changed else "")


def file_digest(path: Path) -> str:
    """The first 16 hex digits of the SHA-256 of the file at `path` (a scenario's, recorded
    with each of its tests: `compare` says when two sessions ran different code for one test);
    "" where it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return ""


def precision_flags() -> dict[str, str]:
    """The precision switches of this process as `precision.<torch.backends path>`:
    float32_matmul_precision, the fp32_precision settings (mkldnn's included) or the legacy
    TF32 flags, the reduced-precision reductions, each where this torch has it; one torch
    refuses to read (the legacy and new TF32 APIs mixed) reads as such, never an error
    (harness.records.torch_state reads them, as it does before each scenario test)."""
    state = torch_state.snapshot()
    return {name: str(value) for name, value in state.items() if name.startswith("precision.")}


def collect(device: DeviceInfo, root: Path, watched: tuple[Path, ...] = ()) -> dict[str, str]:
    """Flat string facts, logged as `env.<key>` tags: the software, the hardware that decides
    behaviour (harness.lab.machine.cpu and .gpu: the CPU and the kernel levels in force, the
    GPU), the hardware class, and what each capability probe saw (`capability.<name>`: yes or no).
    `watched`: where an untracked file makes the commit dirty (_git_commit)."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    nccl = ""
    if device.type == "cuda" and torch.distributed.is_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # a build without NCCL
            nccl = ""
    facts = {
        "device": device.type,
        "gpu_name": device.name if device.type == "cuda" else "",
        "gpu_count": str(device.gpu_count),
        "compute_capability": ".".join(map(str, device.compute_capability or ())),
        "driver": _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        if device.type == "cuda"
        else "",
        "cuda": torch.version.cuda or "",
        "cudnn": str(cudnn or ""),
        "nccl": nccl,
        "torch": torch.__version__,
        # torchao's float8 API moves between its releases (0.18 removed delayed scaling): the
        # FP8 claims it decides hold for this pair, so it is pinned beside torch.
        "torchao": installed_version("torchao"),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "cpu": platform.processor() or platform.machine(),
        "harness": harness.__version__,
        "git_commit": _git_commit(root, watched),
    }
    facts.update(cpu.cpu_facts())
    if device.type == "cuda":
        facts.update(gpu.gpu_facts())
        facts["hardware_class"] = gpu.gpu_class(device.name, facts)
    else:
        facts["hardware_class"] = facts["cpu.class"]
    facts.update(
        {f"capability.{need}": "yes" if seen.works else "no" for need, seen in
         device.capabilities.items()}
    )  # fmt: skip
    facts.update({f"tf32.{k}": str(v) for k, v in tf32_flags().items()})
    facts.update(precision_flags())
    return {k: str(v) or "n/a" for k, v in facts.items()}  # plain str: TorchVersion is not
