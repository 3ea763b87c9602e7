"""What an environment is, read from its fingerprint facts (harness.records.fingerprint collects
them): plain strings, no torch, for the readers of MLflow and of baselines (the report, `compare`,
`amp-harness baseline changes`). A fact a fingerprint lacks reads "n/a".

Behaviour has three causes: the torch release, the libraries under it, and the hardware, which
counts through its class (harness.lab.machine.cpu and .gpu: `cpu-x86-64-avx2`, `NVIDIA-H200`).
`causes` names which of them differ between two environments, so that a difference can be
attributed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Facts about the run, not about what decides its behaviour: the code under test and the
# kernel's release. Two sessions that differ only in these are one environment (one ledger
# column), and the facts are shown with each entry instead.
RUN_FACTS = ("git_commit", "harness", "platform")
# Facts that describe the machine without deciding behaviour beyond its class: two runners of one
# class with other core counts or clocks are one environment.
DESCRIPTIVE_FACTS = re.compile(
    r"cpu\.(vendor|model|cores|usable_cores|held_by)|gpu\.(.*clock.*|memory_gib|sm_count)"
)

# The causes a difference between environments can have, each with the facts that make it.
TORCH = "the torch release"
LIBRARIES = "the libraries under torch"
HARDWARE = "the hardware class"
SETTINGS = "the precision settings"
_LIBRARY_FACTS = ("cuda", "cudnn", "nccl", "driver", "cublas", "cublaslt", "onednn", "mkl")
CLASS = "class"  # a test's hardware dependency on the class as a whole (timing: any class differs)
CAPABILITY = "capability."  # the prefix of a probed capability's fact: capability.bf16_rnn = yes


def fact(facts: Mapping[str, str], name: str) -> str:
    """One fact, as text; "n/a" where the fingerprint lacks it (another version named it
    otherwise, or a hand-written baseline left it out)."""
    value = facts.get(name) if isinstance(facts, Mapping) else None
    return "n/a" if value is None else str(value)


def identity(facts: Mapping[str, str]) -> dict[str, str]:
    """The facts that make an environment: device, hardware class and what the kernels in
    force can do, GPU, driver, CUDA, cuDNN, NCCL, oneDNN, torch, Python, the TF32 and
    reduced-precision flags. Not the probed capabilities (`capability.*`): they follow from
    those, and which of them a fingerprint holds changes with the harness (a probe added, or
    deferred until a test asks), which must not split one environment in two."""
    return {
        k: v for k, v in facts.items()
        if k not in RUN_FACTS and not DESCRIPTIVE_FACTS.fullmatch(k)
        and not k.startswith(CAPABILITY)
    }  # fmt: skip


def capabilities(facts: Mapping[str, str]) -> dict[str, str]:
    """The probed capabilities among `facts` (`capability.bf16_rnn`: yes)."""
    return {k: v for k, v in facts.items() if k.startswith(CAPABILITY)}


def hardware_class(facts: Mapping[str, str]) -> str:
    """The class of hardware an environment ran on: `cpu-x86-64-avx2`, `NVIDIA-H200`. A
    fingerprint from before classes (no `hardware_class` fact) reads as its old name: the GPU's
    name, or `cpu-<architecture>`, which says nothing of the CPU's instruction sets."""
    recorded = fact(facts, "hardware_class")
    if recorded != "n/a":
        return recorded
    if fact(facts, "device") == "cuda":
        name = fact(facts, "gpu_name")
    else:
        name = f"cpu-{fact(facts, 'cpu')}"
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", name).strip("-")


def is_legacy(facts: Mapping[str, str]) -> bool:
    """Whether a fingerprint predates hardware classes (its class is only a name)."""
    return fact(facts, "hardware_class") == "n/a"


def hardware(facts: Mapping[str, str]) -> str:
    """What an environment runs on, for people: its GPU's name, or its CPU class."""
    if fact(facts, "device") == "cuda":
        return fact(facts, "gpu_name")
    return hardware_class(facts)


def label(facts: Mapping[str, str]) -> str:
    """A short name for an environment: 'NVIDIA H200 / torch 2.11.0 / CUDA 12.8'."""
    cuda = f" / CUDA {fact(facts, 'cuda')}" if fact(facts, "device") == "cuda" else ""
    return f"{hardware(facts)} / torch {fact(facts, 'torch')}{cuda}"


def causes(a: Mapping[str, str], b: Mapping[str, str]) -> dict[str, list[str]]:
    """Which causes differ between environments `a` and `b`, each with its differing facts in
    words ("torch 2.13.0+cpu -> 2.14.1+cu130"); {} when none does."""
    found: dict[str, list[str]] = {}

    def differs(cause: str, name: str, shown: str | None = None) -> None:
        before, after = (fact(a, name), fact(b, name))
        if before != after:
            found.setdefault(cause, []).append(f"{shown or name} {before} -> {after}")

    differs(TORCH, "torch")
    for name in _LIBRARY_FACTS:
        differs(LIBRARIES, name)
    if hardware_class(a) != hardware_class(b):
        found[HARDWARE] = [f"{hardware_class(a)} -> {hardware_class(b)}"]
    # A switch one fingerprint does not name (recorded by another version) is unknown there,
    # not different.
    for name in sorted(a.keys() & b.keys()):
        if name.startswith(("tf32.", "precision.")):
            differs(SETTINGS, name)
    return found


def hardware_explains(
    a: Mapping[str, str], b: Mapping[str, str], depends_on: set[str]
) -> str | None:
    """Why the hardware explains a difference of a test that depends on `depends_on`: its
    classes differ and so does a capability the test depends on (or the class as a whole, for a
    timing test). None when the hardware does not explain it."""
    if hardware_class(a) == hardware_class(b):
        return None
    if CLASS in depends_on:
        return f"measured on another hardware class ({hardware_class(a)} vs {hardware_class(b)})"
    # A capability a fingerprint does not record (one from before capabilities were) explains
    # nothing: only two probes that saw differently do.
    seen = {
        need: (fact(a, CAPABILITY + need), fact(b, CAPABILITY + need))
        for need in sorted(depends_on - {CLASS})
    }
    differing = [
        f"{need}: {before} vs {after}"
        for need, (before, after) in seen.items()
        if before != after and "n/a" not in (before, after)
    ]
    if not differing:
        return None
    return (
        f"{hardware_class(a)} and {hardware_class(b)} differ in what the test depends on: "
        f"{'; '.join(differing)}"
    )


def depends_on(value: str | list[str] | None) -> set[str]:
    """A test's hardware dependencies, from the record param (comma-separated) or a list."""
    if not value:
        return set()
    items = value.split(",") if isinstance(value, str) else value
    return {item.strip() for item in items if item.strip()}
