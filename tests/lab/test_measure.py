"""measure: interleaved timing, ratio intervals, and the pytest-benchmark hand-off. On the CPU
with a wall clock, here a simulated one (Machine); the same code times CUDA with events."""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from harness.lab import measure


class Machine:
    """A clock that advances by what each arm costs times the machine's load at that call: time
    measured without a wall clock, whose seconds on a shared runner are anyone's (two sleeps of
    4 and 2 ms came out 0.77 to 1 on a loaded one). measure's CPU path reads it as perf_counter."""

    def __init__(self, load: Callable[[int], float] = lambda call: 1.0):
        self.now, self.calls, self.load = 0.0, 0, load

    def perf_counter(self) -> float:
        return self.now

    def arm(self, cost: float) -> Callable[[], None]:
        def call() -> None:
            self.now += cost * self.load(self.calls)
            self.calls += 1

        return call


@pytest.fixture
def machine(monkeypatch) -> Callable[..., Machine]:
    """Machine(load) -> a Machine whose clock measure reads."""

    def make(load: Callable[[int], float] = lambda call: 1.0) -> Machine:
        made = Machine(load)
        monkeypatch.setattr(measure, "time", SimpleNamespace(perf_counter=made.perf_counter))
        return made

    return make


def test_a_two_to_one_ratio_is_measured_and_decided(machine):
    # A machine whose load grows fivefold over the comparison: measured arm after arm, the
    # slow arm's 15 rounds would fall in the quiet half and come out no slower than the fast
    # one's; interleaved, each round's two calls see the same load.
    clock = machine(load=lambda call: 1 + call / 8)
    comparison = measure.compare(
        {"slow": clock.arm(0.004), "fast": clock.arm(0.002)}, "cpu", rounds=15, warmup=1
    )
    ratio = comparison.ratio("slow", "fast")
    assert 1.5 < ratio.value < 2.5, comparison.times
    assert ratio.low <= ratio.value <= ratio.high
    assert ratio.decide(1.1) == "above" and ratio.decide(10.0) == "below"


def test_equal_arms_claim_no_gain_either_way(machine):
    # An A/A comparison on a shared machine that grows busier (threefold over the comparison),
    # with a neighbour's bursts making about one call in five three to six times slower: arm
    # after arm, the second would come out 1.4 times slower. Its interval may still exclude 1.0
    # by a fraction of a percent (seen in CI: two 2 ms sleeps, "above" 1.0), which is why every
    # speed verdict is decided against a threshold and an A/A control (harness.lab.speedups),
    # never against 1.0.
    rng = np.random.default_rng(0)
    bursts = np.where(rng.random(64) < 0.2, rng.uniform(3, 6, 64), 1.0)
    clock = machine(load=lambda call: (1 + call / 16) * bursts[call])
    comparison = measure.compare({"a": clock.arm(0.002), "b": clock.arm(0.002)}, "cpu", rounds=15)
    ratio = comparison.ratio("a", "b")
    assert ratio.decide(1.05) != "above" and ratio.decide(1 / 1.05) != "below", ratio.describe()


def test_arms_are_interleaved_in_rotating_order():
    calls: list[str] = []
    measure.compare({n: (lambda n=n: calls.append(n)) for n in "abc"}, "cpu", rounds=3, warmup=0)
    assert calls == list("abcbcacab")


def test_the_interval_is_reproducible():
    comparison = measure.Comparison("cpu", {"a": [2.0, 2.2, 1.9, 2.1], "b": [1.0, 1.1, 0.9, 1.0]})
    assert comparison.ratio("a", "b") == comparison.ratio("a", "b")


def test_state_bytes_counts_parameters_gradients_and_adam_state():
    model = torch.nn.Linear(100, 10)  # 1010 parameters
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 100)).sum().backward()
    optimizer.step()
    counted = measure.state_bytes(model, optimizer)
    # Adam keeps two fp32 moments per parameter, plus a scalar step count per tensor.
    assert counted["params"] == counted["grads"] == 4040
    assert 8080 <= counted["optimizer"] <= 8080 + 2 * 8


def test_peak_memory_needs_cuda():
    with pytest.raises(ValueError, match="CUDA devices, not cpu"):
        measure.peak_memory(lambda: None, torch.device("cpu"))


def test_ratios_reach_the_benchmark_json(pytester, tmp_path, outside_xdist):
    pytester.makepyfile(
        """
        import time
        from harness.lab import measure

        def test_speed(benchmark):
            comparison = measure.compare({"a": lambda: time.sleep(0.002),
                                          "b": lambda: time.sleep(0.001)}, "cpu", rounds=9)
            measure.benchmark_extra_info(benchmark, a_over_b=comparison.ratio("a", "b"))
            measure.pedantic(benchmark, lambda: time.sleep(0.001), "cpu", rounds=3, warmup=1)
        """
    )
    out = tmp_path / "bench.json"
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", f"--benchmark-json={out}")
    result.assert_outcomes(passed=1)
    info = json.loads(out.read_text())["benchmarks"][0]["extra_info"]
    assert info["a_over_b.low"] <= info["a_over_b"] <= info["a_over_b.high"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: compares CUDA timers")
def test_the_event_timer_agrees_with_triton_do_bench():
    testing = pytest.importorskip("triton.testing", reason="needs Triton for do_bench")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)  # 128 MB: past the L2
    matmul = lambda: a @ a  # noqa: E731
    ours = measure.compare({"mm": matmul}, "cuda", rounds=50, warmup=10).median("mm")
    theirs = testing.do_bench(matmul, warmup=25, rep=200, return_mode="median") / 1000.0
    assert abs(ours / theirs - 1) < 0.05, f"events {ours * 1e3:.3f} ms, do_bench {theirs * 1e3:.3f}"


def test_min_rounds_is_where_the_medians_interval_leaves_the_extremes():
    # 2 P(Binomial(n, 1/2) <= 1): 8 rounds 0.070 (> 0.05), 9 rounds 0.039.
    assert [measure.min_rounds(c) for c in (0.9, 0.95, 0.99)] == [8, 9, 12]
    with pytest.raises(ValueError, match="between 0 and 1"):
        measure.min_rounds(1.0)


def test_a_ratio_from_too_few_rounds_decides_nothing():
    few, enough = (measure.Ratio(2.0, 1.9, 2.1, 0.95, n) for n in (8, 9))
    assert few.decide(1.1) == few.decide(3.0) == "undecided"
    assert "too few to decide: 9" in few.describe()
    assert enough.decide(1.1) == "above" and enough.decide(3.0) == "below"
    assert "too few" not in enough.describe()
