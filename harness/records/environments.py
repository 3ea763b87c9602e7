"""What an environment is, read from its fingerprint facts (harness.records.fingerprint collects
them): plain strings, no torch, for the readers of MLflow and of baselines (the report, `amp-harness
baseline changes`). A fact a fingerprint lacks reads "n/a"."""

from __future__ import annotations

from collections.abc import Mapping

# Facts about the run, not about what decides its behaviour: the code under test and the
# kernel's release. Two sessions that differ only in these are one environment (one ledger
# column), and the facts are shown with each entry instead.
RUN_FACTS = ("git_commit", "harness", "platform")


def fact(facts: Mapping[str, str], name: str) -> str:
    """One fact, as text; "n/a" where the fingerprint lacks it (another version named it
    otherwise, or a hand-written baseline left it out)."""
    value = facts.get(name) if isinstance(facts, Mapping) else None
    return "n/a" if value is None else str(value)


def identity(facts: Mapping[str, str]) -> dict[str, str]:
    """The facts that make an environment: device, GPU, driver, CUDA, cuDNN, NCCL, torch,
    Python, CPU, the TF32 and reduced-precision flags."""
    return {k: v for k, v in facts.items() if k not in RUN_FACTS}


def hardware(facts: Mapping[str, str]) -> str:
    """What an environment runs on: its GPU's name, or "cpu <architecture>"."""
    if fact(facts, "device") == "cuda":
        return fact(facts, "gpu_name")
    return f"cpu {fact(facts, 'cpu')}"


def label(facts: Mapping[str, str]) -> str:
    """A short name for an environment: 'NVIDIA H200 / torch 2.11.0 / CUDA 12.8'."""
    cuda = f" / CUDA {fact(facts, 'cuda')}" if fact(facts, "device") == "cuda" else ""
    return f"{hardware(facts)} / torch {fact(facts, 'torch')}{cuda}"
