"""scripts/gpu-check is sized to finish in under 5 minutes on one H200, its scenarios in under 3
(the issue's budget): their arithmetic, counted here on the meta device (no memory, no
compute), at rates well under what an H200 reaches, and the small models' steps at a pessimistic
cost each, stay within two thirds of each budget, leaving the rest for process and CUDA start-up
and model initialisation. Everything the script runs is counted: the scenario modules and the
CUDA-only tests, the sensitivity reruns among them, whose broken torch makes fast arms slow. A
guard against a size raised carelessly, not a measurement: the GPU run's wall time is that."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import load_scenario
from test_sensitivity_memory_speed import SPEED_WIDTHS
from test_sensitivity_speed import KEPT_SIZES
from torch.utils.flop_counter import FlopCounterMode

from harness.lab import measure, memory_model, models, speedups
from harness.lab.machine import gpus

SCENARIOS_BUDGET_S = 120.0  # of the 180 s the issue allows for every scenario module
CHECK_BUDGET_S = 200.0  # of the 300 s it allows for the whole of scripts/gpu-check
GPU_CHECK = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check"
H200 = gpus.spec("NVIDIA H200")
# Pessimistic rates: a third of the datasheet for strict fp32 matmuls, a tenth of the fp16
# tensor-core peak for everything else (TF32, fp16, bf16, fp8, and whole training steps).
STRICT_FP32 = H200.fp32 * 1e12 / 3
TENSOR_CORES = H200.fp16 * 1e12 / 10
BENCHMARK_SHARE = 1.25  # pytest-benchmark's own rounds of one arm on top of the comparison
# Small models are bound by kernel launches, not by arithmetic: a pessimistic cost of one
# training step (harness.lab.train's monitored loop reads the loss, scale and norm back each step).
SMALL_STEP_S = 0.003
LAUNCH_S = 0.0002  # one small GEMM and the kernels that quantise its inputs, launched from Python
# tests/lab/test_measure.py's one CUDA test: an 8192^2 fp16 matmul, 60 timed calls and Triton's
# do_bench (0.2 s of repetitions), well under this.
MEASURE_S = 2.0


def _step_flops(spec: models.Plan, batch: int) -> int:
    """Forward and backward of one transformer training step, counted on the meta device."""
    with torch.device("meta"):
        model = models.FAMILIES["transformer"].make(spec.width, **spec.options)
        tokens = torch.zeros(batch, spec.options["seq_len"], dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    return counter.get_total_flops()


def _seconds(flops: dict[str, float]) -> float:
    """flops by arm kind ('strict' or 'fast') -> seconds at the pessimistic rates."""
    return flops["strict"] / STRICT_FP32 + flops["fast"] / TENSOR_CORES


def _arms(arms: dict[str, str], broken_autocast: bool = False) -> dict[str, int]:
    """How many arms run strict fp32 and how many anything faster; with autocast broken (a
    sensitivity rerun), every AMP arm runs strict fp32 too (the AMP recipes set TF32 off)."""
    strict = sum(
        recipe == "fp32" or (broken_autocast and "amp" in recipe) for recipe in arms.values()
    )
    return {"strict": strict, "fast": len(arms) - strict}


def _training_calls(rounds: int, warmup: int) -> int:
    """Calls of each arm: warm-up until AdamW's state exists (one step where nothing is skipped),
    the comparison's own warm-up, and its rounds."""
    return 1 + warmup + rounds


def speed_seconds(broken: str | None = None) -> dict[str, float]:
    """scenarios/test_speed.py; `broken`: a sensitivity rerun's part and patch, 'matmul' (the
    fp16 cast keeps fp32: the fp16 arms run strict) or 'training' (autocast does nothing)."""
    speed = load_scenario("test_speed.py")
    seconds = {}
    if broken in (None, "matmul"):
        matmul = 2 * speed.MATMUL_N**3 * (speed.MATMUL_ROUNDS + speed.MATMUL_WARMUP)
        strict = 3 if broken else 1  # fp32, and fp16 and its A/A repeat when broken
        seconds["FMT-SPEED matmuls"] = _seconds(
            {"strict": strict * matmul, "fast": (6 - strict) * matmul}
        )
    if broken in (None, "training"):
        arms = _arms(speedups.ARMS, broken_autocast=broken == "training")
        sizes = [s for s in speed.SIZES if broken is None or s.label in KEPT_SIZES]
        for size in sizes:
            calls = _training_calls(size.rounds, size.warmup)
            step = _step_flops(speed._plan(size), speed.BATCH) * calls
            seconds[f"PIT4 {size.label}"] = _seconds({k: n * step for k, n in arms.items()})
    return seconds


def memory_speed_seconds(broken: str | None = None) -> dict[str, float]:
    """scenarios/test_memory_speed.py; `broken`: 'memory' (AdamW keeps a third state tensor)
    or 'speed' (autocast does nothing) for a sensitivity rerun of that test alone."""
    scenario = load_scenario("test_memory_speed.py")
    seconds = {}
    if broken in (None, "memory"):
        for width in scenario.WIDTHS:  # the memory pass: a warm-up step and a measured one
            step = 2 * _step_flops(memory_model.transformer_plan(width, **scenario.OPTIONS), 4)
            fast = len(scenario.MEMORY_RECIPES) - 1
            seconds[f"HDL-MEMORY width {width}"] = _seconds({"strict": step, "fast": fast * step})
    if broken in (None, "speed"):
        width = SPEED_WIDTHS[-1] if broken else scenario.WIDTHS[-1]  # the rerun's width
        spec = memory_model.transformer_plan(width, **scenario.OPTIONS)
        calls = _training_calls(scenario.ROUNDS, scenario.WARMUP)
        step = _step_flops(spec, scenario.BATCH) * calls
        arms = _arms(speedups.ARMS, broken_autocast=broken == "speed")
        seconds["HDL-SPEED"] = _seconds({k: n * step for k, n in arms.items()})
    return seconds


def convergence_seconds() -> dict[str, float]:
    """Every training step of scenarios/test_convergence.py on CUDA: the tiny models of
    PIT4-SMALL-CONVERGENCE (and their negative control, the MLP again), and HDL-ACCURACY's."""
    scenario = load_scenario("test_convergence.py")
    runs = len(scenario.SEEDS) * len(scenario.RECIPES)
    small = sum(setup.steps for setup in scenario.SMALL) + scenario.SMALL[0].steps
    return {
        "PIT4-SMALL-CONVERGENCE": small * runs * SMALL_STEP_S,
        "HDL-ACCURACY": scenario.LARGE["cuda"].steps * runs * SMALL_STEP_S,
    }


def fp8_speed_seconds() -> dict[str, float]:
    """scenarios/test_fp8_speed.py: per shape, four arms (two bf16, two FP8) of `repeats` GEMMs
    a call, over the warm-up and the rounds: their arithmetic, and a pessimistic LAUNCH_S for
    each GEMM with its quantisation (about ten kernels), which is what the small shapes cost."""
    scenario = load_scenario("test_fp8_speed.py")
    calls = len(scenario.ARMS) * (scenario.WARMUP + scenario.ROUNDS)
    return {
        f"FP8-SPEEDUP-BY-SHAPE {n}": calls
        * scenario.repeats(n)
        * (2 * n**3 / TENSOR_CORES + LAUNCH_S)
        for n in scenario.SHAPES
    }


def scenario_seconds() -> dict[str, float]:
    return {
        **{f"speed: {n}": BENCHMARK_SHARE * s for n, s in speed_seconds().items()},
        **{f"fp8_speed: {n}": BENCHMARK_SHARE * s for n, s in fp8_speed_seconds().items()},
        **{f"memory_speed: {n}": BENCHMARK_SHARE * s for n, s in memory_speed_seconds().items()},
        **{f"convergence: {n}": s for n, s in convergence_seconds().items()},
    }


# The tests/ files scripts/gpu-check runs, and what each costs beyond the scenario modules: the
# sensitivity tests rerun parts of a module under a broken torch (their unpatched reruns are
# deselected by the script: scenarios/ has just run the same modules unpatched).
RERUNS = {
    "tests/lab/test_measure.py": lambda: {"event timer vs do_bench": MEASURE_S},
    "tests/sensitivity/test_sensitivity_speed.py": lambda: {
        **speed_seconds("training"),
        **speed_seconds("matmul"),
    },
    "tests/sensitivity/test_sensitivity_memory_speed.py": lambda: {
        **memory_speed_seconds("speed"),
        **memory_speed_seconds("memory"),
    },
}


def gpu_check_runs() -> tuple[list[str], list[str]]:
    """The paths and the --deselect'ed node ids of every pytest call in scripts/gpu-check."""
    script = GPU_CHECK.read_text(encoding="utf-8").replace("\\\n", " ")
    calls = [line for line in script.splitlines() if re.search(r'"\$py" -m pytest ', line)]
    assert calls, f"no pytest call found in {GPU_CHECK}"
    words = [w for call in calls for w in shlex.split(call.split("2>&1")[0])]
    deselected = [words[i + 1] for i, w in enumerate(words) if w == "--deselect"]
    paths = [w for w in words if re.match(r"(scenarios|tests)/\S*$", w) and w not in deselected]
    return paths, deselected


def test_the_gpu_scenarios_fit_the_budget_at_pessimistic_rates():
    seconds = scenario_seconds()
    total = sum(seconds.values())
    assert total <= SCENARIOS_BUDGET_S, (
        f"an estimated {total:.0f} s on an H200 at pessimistic rates, over "
        f"{SCENARIOS_BUDGET_S:.0f} s: " + ", ".join(f"{n} {s:.1f} s" for n, s in seconds.items())
    )


@pytest.mark.slow
def test_the_whole_gpu_check_fits_its_budget_counting_every_rerun():
    paths, deselected = gpu_check_runs()
    assert "scenarios/" in paths
    uncounted = [p for p in paths if p.startswith("tests/") and p not in RERUNS]
    assert not uncounted, f"scripts/gpu-check runs {uncounted}: count them in RERUNS"
    # The unpatched reruns are left to scenarios/, which runs the same modules.
    assert {d.split("::")[1] for d in deselected} == {"test_module_passes_unpatched"}
    seconds = {**scenario_seconds()}
    for path in paths:
        if path in RERUNS:
            seconds.update({f"{path}: {n}": BENCHMARK_SHARE * s for n, s in RERUNS[path]().items()})
    total = sum(seconds.values())
    assert total <= CHECK_BUDGET_S, (
        f"scripts/gpu-check: an estimated {total:.0f} s on an H200 at pessimistic rates, over "
        f"{CHECK_BUDGET_S:.0f} s: " + ", ".join(f"{n} {s:.1f} s" for n, s in seconds.items())
    )


def test_every_timed_comparison_has_the_rounds_its_interval_needs():
    speed, memory_speed = load_scenario("test_speed.py"), load_scenario("test_memory_speed.py")
    rounds = {
        "FP8-SPEEDUP-BY-SHAPE ROUNDS": load_scenario("test_fp8_speed.py").ROUNDS,
        "MATMUL_ROUNDS": speed.MATMUL_ROUNDS,
        "ADD_ROUNDS": speed.ADD_ROUNDS,
        **{f"SIZES {s.label}": s.rounds for s in speed.SIZES},
        "HDL-SPEED ROUNDS": memory_speed.ROUNDS,
    }
    few = {name: n for name, n in rounds.items() if n < measure.min_rounds()}
    assert not few, f"fewer rounds than measure.min_rounds() = {measure.min_rounds()}: {few}"


def test_the_estimate_counts_what_the_sizes_cost():
    # The count follows the model: about 6 x parameters x tokens (an embedding lookup is no
    # matmul; attention adds its own), and it grows with the tokens.
    spec = models.plan("transformer", 10**8, vocab=8192, seq_len=256, layers=4)
    flops = _step_flops(spec, 16)
    assert 0.8 <= flops / (6 * spec.params * 16 * 256) <= 1.2
    assert _step_flops(spec, 32) == pytest.approx(2 * flops, rel=1e-6)


def test_a_broken_autocast_makes_the_amp_arms_strict():
    # The sensitivity reruns cost more than the scenario's own run: their AMP arms run fp32.
    assert _arms(speedups.ARMS) == {"strict": 2, "fast": 3}
    assert _arms(speedups.ARMS, broken_autocast=True) == {"strict": 4, "fast": 1}
    broken, whole = speed_seconds("training"), speed_seconds()
    assert broken.keys() == {f"PIT4 {label}" for label in KEPT_SIZES}  # the rerun's sizes only
    assert all(broken[name] > whole[name] for name in broken)
