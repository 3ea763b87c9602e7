"""FP8's speed-up over bf16 by GEMM shape: FP8-SPEEDUP-BY-SHAPE (harness/catalogue/claims_fp8.toml).

CUDA with FP8 tensor cores only (sm_89+); rehearsed on the CPU by
tests/sensitivity/test_gpu_scenarios_on_cpu.py. Square GEMMs (M = N = K) from SHAPES[0] to
SHAPES[-1], each timed in one interleaved comparison (harness.lab.measure.compare) of four arms:
- bf16: torch.mm of bfloat16 inputs;
- bf16-again: the same call again, the A/A control;
- fp8: torch._scaled_mm on inputs quantised beforehand (E4M3, one scale per tensor, bfloat16 out):
  the FP8 kernel alone, Transformer Engine's "pre-quantized" number;
- fp8-quantising: the same product from the bfloat16 inputs, each call taking both inputs' amax,
  scale and cast first (harness.lab.fp8.quantising_gemm): what a training step with dynamic
  tensorwise scaling pays per GEMM, TE's "autocast" number. Unfused, as eager runs it: torch.compile
  fuses the casts (torchao's advice), so this is the overhead's upper end.
A timed call repeats its GEMM until it has done CALL_FLOPS of work, so that the smallest shapes
are timed over more than a few microseconds; the launches between the repeats are part of what
such a GEMM costs in a model.

The prediction: with its quantisation counted, FP8 is slower than bf16 at the smallest shape (the
interval of the speed-up lies below 1x), and its kernel alone reaches LARGE_SHARE of the
datasheet's FP8-over-bf16 peak ratio at the largest (2x on every FP8 GPU in
harness/lab/machine/gpus.json).
Each decision rests on its shape's A/A control (harness.lab.speedups.control_state): where the
control tells the identical arms apart, the test fails; where it is too wide, the verdict is
inconclusive. The crossover, the smallest shape from which FP8 with its quantisation is faster,
is recorded, not predicted.
"""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from harness.lab import figures, measure, speedups
from harness.lab.fp8 import prequantised_gemm, quantising_gemm

# Timings: they refuse to share the GPU with other pytest-xdist workers.
pytestmark = pytest.mark.timing

SHAPES = (256, 512, 1024, 2048, 4096, 8192)
ROUNDS, WARMUP = 15, 3
CALL_FLOPS = 2 * 1024**3  # the least work one timed call does: 64 GEMMs at 256, one from 1024
THRESHOLD = 1.1  # the A/A control must lie within 1/1.1-1.1x for a shape's speed-ups to decide
LARGE_SHARE = 0.75  # "toward 2x": three quarters of the peak ratio, as a GEMM reaches 70-90%
PEAK_RATIO = 2.0  # FP8 over bf16 dense peaks where no sure datasheet entry gives the ratio
ARMS = ("bf16", "bf16-again", "fp8", "fp8-quantising")
CONTROL = "bf16-again_over_bf16"


def repeats(n: int) -> int:
    """How many n^3 GEMMs one timed call runs: at least CALL_FLOPS of work."""
    return max(1, math.ceil(CALL_FLOPS / (2 * n**3)))


def _repeated(fn, times: int):
    def call() -> None:
        for _ in range(times):
            fn()

    return call


def gemm_arms(n: int, device: torch.device) -> dict[str, object]:
    """The four arms at one shape, from the same normal random inputs."""
    generator = torch.Generator(device=device).manual_seed(n)
    a, b = (torch.randn(n, n, generator=generator, device=device) for _ in range(2))
    a, b = a.bfloat16(), b.bfloat16()
    bf16 = partial(torch.mm, a, b)
    calls = {
        "bf16": bf16,
        "bf16-again": bf16,
        "fp8": prequantised_gemm(a, b),
        "fp8-quantising": quantising_gemm(a, b),
    }
    return {arm: _repeated(fn, repeats(n)) for arm, fn in calls.items()}


def decide(small: str, large: str) -> str:
    """The verdict from the two decisions ('below', 'above' or 'undecided'): the smallest
    shape's FP8-with-quantisation speed-up predicted below 1x, the largest's kernel above the
    target."""
    predicted = (small == "below", large == "above")
    if all(predicted):
        return "confirmed"
    if "undecided" in (small, large):
        return "inconclusive"
    return "partly" if any(predicted) else "refuted"


def peak_ratio(amp_device) -> tuple[float, str]:
    """FP8 over bf16 dense peaks from this GPU's datasheet entry, where it is sure."""
    found = amp_device.datasheet()
    if found and found.sure and found.spec.fp8 and found.spec.bf16:
        spec = found.spec
        return spec.fp8 / spec.bf16, f"{spec.name}'s datasheet ({spec.fp8:g}/{spec.bf16:g} TFLOP/s)"
    how = found.how if found else "no datasheet entry for this device"
    return PEAK_RATIO, f"{PEAK_RATIO:g}x as on Hopper and Ada; {how}"


@pytest.mark.claim("FP8-SPEEDUP-BY-SHAPE")
@pytest.mark.requires("cuda", "fp8_matmul")
def test_fp8_speedup_over_bf16_grows_with_the_gemm_shape(record, amp_device, benchmark):
    device = amp_device.torch_device
    timed = {n: measure.compare(gemm_arms(n, device), amp_device.type, ROUNDS, WARMUP)
             for n in SHAPES}  # fmt: skip
    kernel = [timed[n].ratio("bf16", "fp8") for n in SHAPES]
    quantising = [timed[n].ratio("bf16", "fp8-quantising") for n in SHAPES]
    controls = [timed[n].ratio("bf16", "bf16-again") for n in SHAPES]
    ratio, ratio_source = peak_ratio(amp_device)
    target = LARGE_SHARE * ratio
    states = {
        n: speedups.control_state(c, THRESHOLD) for n, c in zip(SHAPES, controls, strict=True)
    }

    small = quantising[0].decide(1.0) if states[SHAPES[0]] == "holds" else "undecided"
    large = kernel[-1].decide(target) if states[SHAPES[-1]] == "holds" else "undecided"
    crossover = next((n for n, r in zip(SHAPES, quantising, strict=True)
                      if states[n] == "holds" and r.decide(1.0) == "above"), None)  # fmt: skip
    top = SHAPES[-1]
    tflops = {arm: 2 * top**3 * repeats(top) / timed[top].median(arm) / 1e12
              for arm in ("bf16", "fp8", "fp8-quantising")}  # fmt: skip

    record.param(
        shapes=", ".join(map(str, SHAPES)) + " (M = N = K)",
        rounds=ROUNDS,
        call_flops=CALL_FLOPS,
        arms=", ".join(ARMS),
        peak_ratio=ratio_source,
        target=f"{LARGE_SHARE:g} x {ratio:g} = {target:g}x",
        aa_control_threshold=THRESHOLD,
    )
    record.history(
        **{"fp8_over_bf16": [r.value for r in kernel],
           "fp8_quantising_over_bf16": [r.value for r in quantising],
           "control": [r.value for r in controls]}
    )  # fmt: skip
    record.metric(**{f"at_{top}.{arm}.tflops": value for arm, value in tflops.items()})
    record.key_metric(crossover=crossover or 0)
    record.figure(
        "fp8_speedup_by_shape",
        figures.speedups(
            list(SHAPES),
            {"fp8 kernel over bf16": kernel, "fp8 with quantisation over bf16": quantising,
             CONTROL: controls},
            "M = N = K", "speed-up over bf16", f"FP8 GEMM speed-up on {amp_device.name}",
            lines={target: f"target {target:g}x"}, dashed={CONTROL},
        ),
    )  # fmt: skip
    measure.benchmark_extra_info(
        benchmark, **{f"fp8_over_bf16_at_{top}": kernel[-1],
                      f"fp8_quantising_over_bf16_at_{SHAPES[0]}": quantising[0]}
    )  # fmt: skip
    measure.pedantic(benchmark, gemm_arms(top, device)["fp8"], amp_device.type, 10, 2)

    def at(n: int) -> str:
        i = SHAPES.index(n)
        return (f"{n}: fp8 {kernel[i].describe()}, with quantisation {quantising[i].describe()}; "
                f"{speedups.describe_control(CONTROL, controls[i], THRESHOLD)}")  # fmt: skip

    verdict = decide(small, large)
    record.verdict(
        "FP8-SPEEDUP-BY-SHAPE",
        verdict,
        f"{amp_device.describe()}, square bf16 GEMMs against E4M3 (one scale per tensor, "
        f"bfloat16 out), speed-up of FP8 over bf16 by M = N = K: kernel alone "
        + ", ".join(f"{n} {r.value:.2f}x" for n, r in zip(SHAPES, kernel, strict=True))
        + "; with the quantisation of both inputs each call (unfused, eager) "
        + ", ".join(f"{n} {r.value:.2f}x" for n, r in zip(SHAPES, quantising, strict=True))
        + f". Smallest, {at(SHAPES[0])}: predicted below 1x: {small}. Largest, {at(top)}: "
        f"predicted above {target:g}x ({LARGE_SHARE:g} of the peak ratio, {ratio_source}): "
        f"{large}; {tflops['fp8']:.3g} TFLOP/s in FP8, {tflops['bf16']:.3g} in bf16. FP8 with "
        f"its quantisation is faster than bf16 "
        + (f"from {crossover} on" if crossover else "at none of the shapes"),
    )
    # Negative control: at no shape are the identical bf16 arms told apart.
    differs = [n for n, state in states.items() if state == "differs"]
    assert not differs, "FP8-SPEEDUP-BY-SHAPE: negative control: " + "; ".join(
        at(n) for n in differs
    )
    assert small != "above", (
        f"FP8-SPEEDUP-BY-SHAPE: predicted FP8 with its quantisation slower than bf16 at "
        f"{SHAPES[0]}, measured {quantising[0].describe()}"
    )
    assert large != "below", (
        f"FP8-SPEEDUP-BY-SHAPE: predicted the FP8 kernel above {target:g}x bf16's speed at "
        f"{top}, measured {kernel[-1].describe()}"
    )
