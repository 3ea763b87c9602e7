"""The device a session runs its scenarios on, probed once per process, and why it cannot run
what a test needs.

Each capability a scenario needs (`@pytest.mark.requires(...)`) is, on the session's device:
- present: its probe ran a tiny real case and saw it work;
- absent: the hardware or the build genuinely lacks it (no GPU, a CPU-only wheel, a compute
  capability or a torch release older than the feature), or the machine lacks what it is built
  with (a probe's `Probe(absent=True)`: no C++ compiler for inductor): the test skips, and the
  reason says which, so that a person can act on it;
- a capability regression: its row (harness.lab.machine.capabilities, or the team's
  declaration) says this build and hardware should have it, but the probe saw otherwise, or
  raised. The test fails at setup, naming the capability, what the probe saw and the claims it
  checks: a broken feature must never pass for a missing one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from harness.common.errors import HarnessError, closest
from harness.lab import releases
from harness.lab.machine import capabilities as table  # read at each call: tests patch it
from harness.lab.machine import cpu, gpu
from harness.lab.machine.capabilities import DEVICE_TYPES, Capability, Expected
from harness.lab.machine.gpus import GpuFigures, Identified, identify
from harness.lab.machine.levels import level_rank
from harness.lab.machine.probes import Probe, run_probe

DEVICE_CHOICES = ("auto", *DEVICE_TYPES)
TEAM_CAPABILITIES = "capabilities.py"  # beside the scenarios (the ini option amp_capabilities)


@dataclass(frozen=True)
class Lack:
    """Why this device cannot run something. `regression`: it should be able to."""

    capability: str
    reason: str
    regression: bool = False
    error: str = ""  # the probe's traceback, when it raised
    why: str = ""  # why it is not expected here, alone (the reason also quotes the probe)

    def __str__(self) -> str:
        return self.reason


class CapabilityRegression(HarnessError):
    """A capability expected here is broken: raised inside a test that uses it where present
    (DeviceInfo.optional); the plugin records the test as a capability regression."""

    def __init__(self, lack: Lack):
        self.lack = lack
        super().__init__(lack.reason)


@dataclass(frozen=True)
class DeviceInfo:
    """The device a session runs its scenarios on, with its probed capabilities."""

    type: str  # "cpu" or "cuda"
    name: str  # "cpu" or the GPU's name
    gpu_count: int
    compute_capability: tuple[int, int] | None
    capabilities: dict[str, Probe] = field(default_factory=dict, hash=False)  # hashable: a key
    figures: GpuFigures | None = None  # a GPU's variant figures (gpus.identify); None on the CPU
    onednn_level: str = ""  # the CPU kernel level oneDNN runs at (machine.levels), read back
    silicon_level: str = ""  # the highest level the CPU's instruction sets reach
    team: dict[str, Capability] = field(default_factory=dict, hash=False)  # a team's, by name

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.type)

    def missing(self, *needs: str, gpus: int = 0) -> Lack | None:
        """Why this device cannot run something that needs `needs`, or None if it can."""
        for need in needs:
            if self._text(need) is None:
                known = sorted({*table.CAPABILITY_TEXT, *self.team})
                raise HarnessError(
                    f"unknown capability {need!r}: known are {', '.join(known)} (closest: "
                    f"{closest(need, known)}); a team's own are declared in "
                    f"scenarios/{TEAM_CAPABILITIES}"
                )
            lack = self._cuda_lack() if need == "cuda" else self._lack(need)
            if lack:
                return lack
        if gpus > self.gpu_count:
            return Lack("gpus", f"needs {gpus} CUDA GPUs, found {self.gpu_count}")
        return None

    def optional(self, need: str, seen: Probe | None = None) -> Lack | None:
        """For a capability a test uses only where present (test_speed's fp8 arm): None when
        present, why not when genuinely absent; raises CapabilityRegression when expected here.
        `seen`: what a probe run elsewhere saw (inside spawned ranks), judged by the same table:
        a capability lost there must not pass for one missing."""
        lack = self._lack(need, seen) if seen else self.missing(need)
        if lack and lack.regression:
            raise CapabilityRegression(lack)
        return lack

    def _cuda_lack(self) -> Lack | None:
        if self.type == "cuda":
            return None
        if self.gpu_count:
            return Lack(
                "cuda", "needs CUDA: this session runs on the CPU (pass --amp-device cuda or auto)"
            )
        listed = gpu.driver_gpus()
        if torch.version.cuda and listed:  # the hardware and the build are there; CUDA is not
            return Lack(
                "cuda",
                f"capability regression: CUDA: the NVIDIA driver lists {listed} GPU(s) and torch "
                f"{torch.__version__} is built for CUDA {torch.version.cuda}, but "
                "torch.cuda.is_available() is False (a driver/runtime mismatch?)",
                regression=True,
            )
        return Lack("cuda", _no_cuda_reason())

    def _lack(self, need: str, seen: Probe | None = None) -> Lack | None:
        seen = seen or self._seen(need)
        if seen is not None and seen.works:
            return None
        text = self._text(need)
        saw = seen.saw if seen else "not probed"
        if seen is not None and seen.absent:
            why = "this machine lacks what it is built with"
            return Lack(need, f"needs {text}: {why} ({saw})", why=why)
        expected, why_not = self.expectation(need)
        if expected is None:
            return Lack(need, f"needs {text}: {why_not} ({saw})", why=why_not)
        what = "the probe raised" if seen and seen.raised else "the probe says no"
        return Lack(
            need,
            f"capability regression: {text} is expected on {self.describe()}, as "
            f"{expected.source}; but {what}: {saw}",
            regression=True,
            error=seen.error if seen else "",
        )

    def _seen(self, need: str) -> Probe | None:
        """What `need`'s probe saw; a deferred probe (DEFERRED_PROBES) runs now, the first time
        it is asked for, and is kept with the others."""
        if need not in self.capabilities and need in table.DEFERRED_PROBES:
            self.capabilities[need] = run_probe(lambda: table.DEFERRED_PROBES[need](self.type))
        return self.capabilities.get(need)

    def follows_hardware(self, need: str) -> bool:
        """Whether `need`'s presence here follows the hardware (its row expects it from a
        compute capability or a CPU level): a test that needs it depends on the hardware."""
        team = self.team.get(need)
        if team is None:
            return (self.type, need) in table.HARDWARE_CAPABILITIES
        row = team.expected.get(self.type)
        return row is not None and bool(row.cc or row.cpu or row.unheld_from)

    def _text(self, need: str) -> str | None:
        """What `need` is, in words: a built-in capability's, or a team's; None if unknown."""
        team = self.team.get(need)
        return team.text if team else table.CAPABILITY_TEXT.get(need)

    def expectation(self, need: str) -> tuple[Expected | None, str]:
        """(what EXPECTED, or the team's declaration, says of `need` here, or None with why it
        is not expected)."""
        team = self.team.get(need)
        expected = team.expected.get(self.type) if team else table.EXPECTED.get((self.type, need))
        if expected is None:
            return None, table.NOT_EXPECTED.get(
                (self.type, need), f"not expected on {self.describe()}"
            )
        if releases.release() < expected.torch:
            release = ".".join(map(str, expected.torch))
            return None, f"not in torch {torch.__version__}, expected from torch {release}"
        if expected.cc and _rocm():
            # ROCm reports no NVIDIA compute capability to hold the row to: which AMD GPUs have
            # TF32, bf16 or fp8 is not in the table, so an absence is a skip that says so.
            return None, (
                f"{self.name} is a ROCm GPU: the table expects this from NVIDIA compute "
                f"capability {expected.cc[0]}.{expected.cc[1]}, and holds no AMD architecture"
            )
        if expected.cc and (self.compute_capability or (0, 0)) < expected.cc:
            major, minor = expected.cc
            return None, f"{self.name} is older than compute capability {major}.{minor}"
        if expected.cpu and level_rank(self.onednn_level) < level_rank(expected.cpu):
            return None, (
                f"oneDNN runs at {self.onednn_level or 'an unknown level'} on this CPU, below "
                f"{expected.cpu}"
            )
        if self._held_below(expected.unheld_from):
            return None, (
                f"oneDNN is held at {self.onednn_level} on a CPU that reaches "
                f"{expected.unheld_from}, where it is not expected: measured {expected.held}"
            )
        return expected, ""

    def _held_below(self, level: str | None) -> bool:
        """Whether oneDNN runs below `level` on a CPU whose silicon reaches it."""
        return held_below(self.silicon_level, self.onednn_level, level)

    def datasheet(self) -> Identified | None:
        """This GPU's entry in harness/lab/machine/gpus.json, with how sure that is; None on the
        CPU."""
        return identify(self.name, self.figures) if self.type == "cuda" else None

    def describe(self) -> str:
        if self.type == "cpu":
            level = f", oneDNN at {self.onednn_level}" if self.onednn_level else ""
            return f"cpu (torch {torch.__version__}{level})"
        major, minor = self.compute_capability or (0, 0)
        return f"{self.name} (sm_{major}{minor}, torch {torch.__version__})"


def _rocm() -> bool:
    """A ROCm build answers as "cuda", but compute capabilities are NVIDIA's scale (an MI300
    reports 9.4: it would pass for a Hopper)."""
    return torch.version.hip is not None


def _no_cuda_reason() -> str:
    build = (
        "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    )
    return f"needs CUDA: no GPU found (torch {torch.__version__} is {build})"


@functools.cache
def probe(device_type: str) -> DeviceInfo:
    """Probe one device type once per process."""
    kernels = cpu.kernels_in_force()  # first: oneDNN's header must come to the read-back
    gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device_type == "cuda":
        props = torch.cuda.get_device_properties(0)
        name, cc = props.name, (props.major, props.minor)
    else:
        name, cc = "cpu", None
    caps = {need: run_probe(lambda fn=fn: fn(device_type)) for need, fn in table.PROBES.items()}
    if device_type == "cuda" and caps["bf16_autocast"].works and not gpu.native_bf16():
        # Autocast accepts bf16 on pre-Ampere GPUs and emulates it slowly: not the real thing.
        caps["bf16_autocast"] = Probe(
            False,
            f"autocast ran bfloat16, emulated: sm_{cc[0]}{cc[1]} has no bfloat16 tensor cores "
            "(torch.cuda.is_bf16_supported says no native support)",
        )
    figures = gpu.gpu_figures(0) if device_type == "cuda" else None
    silicon = cpu.best_level(cpu.instructions())
    return DeviceInfo(
        device_type, name, gpu_count, cc, caps, figures, kernels["onednn_level"], silicon
    )


def resolve(choice: str, option: str = "--amp-device") -> DeviceInfo:
    """Turn `option` auto|cpu|cuda into a probed device, or a clear error naming `option`."""
    if choice not in DEVICE_CHOICES:
        raise HarnessError(f"{option} {choice!r}: use one of {', '.join(DEVICE_CHOICES)}")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise HarnessError(
            f"{option} cuda: {_no_cuda_reason()}. Run with {option} cpu (or auto) here, "
            "or on a machine with an NVIDIA GPU and a CUDA build of torch."
        )
    return probe(choice)


def held_below(silicon: str, onednn: str, level: str | None) -> bool:
    """Whether oneDNN, running at `onednn`, is held below `level` on silicon (its best level
    `silicon`) that reaches it: the rule for a row's `unheld_from`, for a session and for a
    baseline's recorded facts alike."""
    reached = level_rank(silicon) >= level_rank(level or "")
    return level is not None and reached and level_rank(onednn) < level_rank(level)
