"""Timing and memory, measured so that a verdict can rest on them.

- Time on CUDA with events recorded around the call and a synchronisation before reading them;
  on the CPU with a wall clock. The same code runs on both, so the statistics are tested in CI.
- Warm up first (allocator, cuBLAS handles and autotuning stay out of the numbers).
- Interleave the arms of a comparison (A B C, B C A, C A B, ...) so that drift of clocks,
  temperature or neighbours falls on every arm alike; compare ratios measured side by side,
  never absolute times across runs.
- A ratio of medians comes with a bootstrap confidence interval over the paired rounds, and a
  claim is decided only when the interval excludes the threshold, and only from enough rounds
  (`min_rounds`): with fewer, a bootstrap interval of medians rests on the extreme rounds.
- Memory in a separate pass from timing: peak allocated bytes, with the parameters, gradients
  and optimizer state counted apart from the rest (activations, caches).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats


def _sync(device_type: str) -> None:
    if device_type == "cuda":
        torch.cuda.synchronize()


def time_call(fn: Callable[[], object], device_type: str) -> float:
    """Seconds one call of `fn` takes on the device (not merely to launch its work)."""
    if device_type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _sync(device_type)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


@functools.cache  # a binomial search, asked on every decision of every Ratio
def min_rounds(confidence: float = 0.95) -> int:
    """The fewest rounds whose median has a distribution-free interval at `confidence` that
    leaves out the fastest and the slowest round: the smallest n with 2 P(Binomial(n, 1/2) <= 1)
    <= 1 - confidence (9 at 95%). With fewer, any interval of the median reaches the extremes,
    and a bootstrap of 5 rounds' medians takes only a handful of distinct values."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie between 0 and 1, got {confidence}")
    n = 3
    while 2 * stats.binom.cdf(1, n, 0.5) > 1 - confidence:
        n += 1
    return n


@dataclass(frozen=True)
class Ratio:
    """median(numerator) / median(denominator) with a bootstrap interval over paired rounds."""

    value: float
    low: float
    high: float
    confidence: float
    rounds: int

    @property
    def enough_rounds(self) -> bool:
        """Measured over at least min_rounds(confidence) rounds: the interval can decide."""
        return self.rounds >= min_rounds(self.confidence)

    def decide(self, threshold: float) -> str:
        """'above' or 'below' when the whole interval is on one side of `threshold`, else
        'undecided': the measurement does not settle the claim; from too few rounds, always
        'undecided'."""
        if not self.enough_rounds:
            return "undecided"
        if self.low > threshold:
            return "above"
        if self.high < threshold:
            return "below"
        return "undecided"

    def band(self, low: float, high: float) -> str:
        """Where the interval lies against the band [low, high]: 'inside', wholly 'below' or
        'above' it, or 'straddles' an edge; from too few rounds, always 'straddles'."""
        if not self.enough_rounds:
            return "straddles"
        if low <= self.low and self.high <= high:
            return "inside"
        if self.high < low:
            return "below"
        if self.low > high:
            return "above"
        return "straddles"

    def as_metrics(self, name: str) -> dict[str, float]:
        """The ratio and its interval as flat metrics: `name`, `name.low`, `name.high`."""
        return {name: self.value, f"{name}.low": self.low, f"{name}.high": self.high}

    def describe(self) -> str:
        few = "" if self.enough_rounds else f", too few to decide: {min_rounds(self.confidence)}"
        return (
            f"{self.value:.3g}x ({self.confidence:.0%} CI {self.low:.3g}-{self.high:.3g}, "
            f"{self.rounds} interleaved rounds{few})"
        )


@dataclass(frozen=True)
class Comparison:
    """Per-call times in seconds, one list per arm, index i of each from the same round."""

    device_type: str
    times: dict[str, list[float]]

    def median(self, arm: str) -> float:
        return float(np.median(self.times[arm]))

    def ratio(self, numerator: str, denominator: str, confidence: float = 0.95) -> Ratio:
        """How many times longer `numerator` takes than `denominator` (a speed-up of
        `denominator` over `numerator`)."""
        a, b = np.asarray(self.times[numerator]), np.asarray(self.times[denominator])
        value = float(np.median(a) / np.median(b))
        result = stats.bootstrap(
            (a, b),
            lambda x, y, axis: np.median(x, axis=axis) / np.median(y, axis=axis),
            paired=True,
            vectorized=True,
            confidence_level=confidence,
            n_resamples=2000,
            method="percentile",
            random_state=np.random.default_rng(0),  # the same data gives the same interval
        )
        interval = result.confidence_interval
        return Ratio(value, float(interval.low), float(interval.high), confidence, len(a))


def compare(
    arms: dict[str, Callable[[], object]], device_type: str, rounds: int = 20, warmup: int = 3
) -> Comparison:
    """Time every arm `rounds` times, interleaved, after `warmup` untimed calls of each."""
    for fn in arms.values():
        for _ in range(warmup):
            fn()
    _sync(device_type)
    names = list(arms)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order
            times[name].append(time_call(arms[name], device_type))
    return Comparison(device_type, times)


def peak_memory(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated on a CUDA device while `fn` runs, above what was allocated before."""
    if device.type != "cuda":
        raise ValueError(f"peak memory is measured on CUDA devices, not {device.type}")
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def _bytes(tensors) -> int:
    """The bytes the tensors' storages hold, each storage once: what memory holds, read from
    the storages, not computed from shape and dtype (a tensor that views a larger buffer keeps
    all of it alive)."""
    held = {}
    for t in tensors:
        storage = t.untyped_storage()
        held[storage.data_ptr()] = storage.nbytes()
    return sum(held.values())


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """What training holds between steps: parameters, gradients, optimizer state."""
    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return {
        "params": _bytes(params),
        "grads": _bytes(p.grad for p in params if p.grad is not None),
        "optimizer": _bytes(state),
    }


def benchmark_extra_info(benchmark, **ratios: Ratio) -> None:
    """Put ratios (value and interval) where `pytest --benchmark-json` and
    `--benchmark-compare` keep them, beside the benchmark's own timing of one arm."""
    for name, ratio in ratios.items():
        benchmark.extra_info.update(ratio.as_metrics(name))


def pedantic(benchmark, fn: Callable[[], object], device_type: str, rounds: int, warmup: int):
    """pytest-benchmark's own timing of one arm; it reads a wall clock, so each call waits for
    the device (otherwise it would time the kernel launches only)."""

    def synchronized() -> None:
        fn()
        _sync(device_type)

    return benchmark.pedantic(synchronized, rounds=rounds, warmup_rounds=warmup)
