"""How much faster is half precision on this GPU? FMT-SPEED, PIT4-SMALL-NO-GAIN, PIT4-ONLY-ABOVE-1B.

CUDA only. Every comparison is interleaved in one process (harness.lab.measure.compare) and decided
only by its interval; "fp32" is the fp32 recipe, TF32 off (recorded), "tf32" the one with it on.
Every comparison a verdict rests on has an A/A control, one arm timed twice: where it tells the
identical arms apart the test fails on it; where its interval reaches past the 1.1x a clear gain
is decided at, the verdicts resting on that comparison are inconclusive and its predictions are
not asserted (harness.lab.speedups.control_state).
- FMT-SPEED: matmul throughput (8192 x 8192 x 8192, random inputs) in fp32, tf32, fp16, bf16 and,
  where the GPU and torch have it, fp8 (torch._scaled_mm): achieved TFLOP/s, the fraction of
  the datasheet peak (harness.lab.machine.gpus), and the two ratios the article's "about 2-8x"
  can mean, fp16 over strict fp32 (~15x at peak on A100/H100/H200; the one the article means)
  and over TF32 (2x at peak), each held against 2-8x with its edges widened by 25% (1.6-10x:
  `verdict_fmt_speed`). A/A control: the fp16 matmul timed twice (the shortest arm, the noisiest
  relative to its time). Negative control: an elementwise add is bound by memory, so fp16 speeds
  it up by moving half the bytes: <= 2x.
- PIT4-SMALL-NO-GAIN, PIT4-ONLY-ABOVE-1B: one training step (forward, backward, AdamW) of the
  GPT-style transformer at 1M, 10M, 100M and 1B parameters (attention heads multiples of 8
  wide), the same tokens per step, in each recipe, timed bare (speedups.training_step: no
  gradient norm, no scale read, one synchronisation a timed call) after a warm-up that has
  created every arm's AdamW state; AMP's speed-up over fp32 and over tf32 against the size, and
  the smallest size from which it is significantly above 1.1x (`crossover` below). Negative
  control: the fp32 recipe timed against itself, which must come out at 1x.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import pytest
import torch

from harness.lab import figures, measure, models, recipes, speedups, tf32
from harness.lab.fp8 import prequantised_gemm
from harness.lab.measure import Comparison, Ratio
from harness.lab.models import TOLERANCE

# Timings and peaks: they refuse to share the GPU with other pytest-xdist workers.
pytestmark = pytest.mark.timing

# --- decisions from measured speed-ups: pure functions, tested in tests/lab/machine/test_gpus.py


def size_label(params: float) -> str:
    """1_000_000 -> '1M', 1_010_000_000 -> '1.01B'."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if params >= scale:
            return f"{params / scale:.3g}{unit}"
    return f"{params:.3g}"


def _at_least(size: float, bound: float) -> bool:
    """`size` is at or above about `bound`: a model planned for it lands within TOLERANCE."""
    return size >= bound * (1 - TOLERANCE)


def _decide(ratio: Ratio, control: Ratio | None, threshold: float) -> str:
    """ratio.decide(threshold) where the size's A/A control holds (or none is given), else
    'undecided': identical arms vary as much as the gain decided."""
    if control is not None and speedups.control_state(control, threshold) != "holds":
        return "undecided"
    return ratio.decide(threshold)


def _controls(sizes: Sequence[float], controls: Sequence[Ratio] | None) -> list[Ratio | None]:
    if controls is None:
        return [None] * len(sizes)
    if len(controls) != len(sizes):
        raise ValueError(f"{len(sizes)} sizes but {len(controls)} controls")
    return list(controls)


def crossover(
    sizes: Sequence[float],
    ratios: Sequence[Ratio],
    threshold: float = 1.1,
    controls: Sequence[Ratio] | None = None,
) -> float | None:
    """The smallest size from which on (it and every larger size) the speed-up is significantly
    above `threshold` (interval low > threshold, and the size's A/A control in `controls`
    holds); None when the largest size is not."""
    if len(sizes) != len(ratios):
        raise ValueError(f"{len(sizes)} sizes but {len(ratios)} ratios")
    found = None
    triples = zip(sizes, ratios, _controls(sizes, controls), strict=True)
    for size, ratio, control in sorted(triples, key=lambda triple: -triple[0]):
        if _decide(ratio, control, threshold) != "above":
            break
        found = size
    return found


def about(band: tuple[float, float], tolerance: float) -> tuple[float, float]:
    """The band an "about low-high x" allows: each edge widened by the factor 1 + tolerance."""
    low, high = band
    return low / (1 + tolerance), high * (1 + tolerance)


def verdict_fmt_speed(
    vs_fp32: Ratio,
    vs_tf32: Ratio | None,
    band: tuple[float, float] = (2.0, 8.0),
    control: Ratio | None = None,
    control_threshold: float = 1.1,
    tolerance: float = 0.25,
) -> tuple[str, str]:
    """FMT-SPEED, "fp16 is about 2-8x faster than fp32": (verdict, reason) from the fp16 matmul's
    speed-up over strict fp32 (the article's baseline) and over TF32 (PyTorch's other fp32).

    "About" widens each edge of `band` by the factor 1 + `tolerance` (2-8x: 1.6-10x). The
    article means strict IEEE fp32: its 2-8x are the pre-Ampere peak ratios (P100 2x, V100 8x),
    from before TF32 existed, and PyTorch's fp32 matmuls run with TF32 off by default since 1.12.
    TF32 is decided too: many an "fp32" baseline runs it (cuDNN's default, set_float32_matmul_
    precision("high")).

    confirmed: the interval over fp32 lies inside the band; inconclusive: an interval straddles
    an edge (or rests on too few rounds), or the comparison's A/A `control` does not hold against
    `control_threshold`; partly: only the interval over TF32 lies inside; refuted: both lie
    outside. `vs_tf32` None: the GPU has no TF32 (V100, T4: the GPUs the article's 2-8x
    describes), and strict fp32 decides alone."""
    decision = _fmt_speed(vs_fp32, vs_tf32, band, tolerance)
    if control is None:
        return decision
    return speedups.guarded(decision, MATMUL_CONTROL, control, control_threshold)


def _fmt_speed(
    vs_fp32: Ratio, vs_tf32: Ratio | None, band: tuple[float, float], tolerance: float
) -> tuple[str, str]:
    low, high = about(band, tolerance)
    ratios = {"fp32": vs_fp32, "tf32": vs_tf32}
    where = {base: r.band(low, high) if r else "absent" for base, r in ratios.items()}
    said = {
        base: f"fp16 over {base} {r.describe()} "
        f"{'' if where[base] == 'straddles' else 'is '}{where[base]} the {low:.3g}-{high:.3g}x band"
        for base, r in ratios.items()
        if r
    }
    reason = (
        f"the article's about {band[0]:g}-{band[1]:g}x (each edge widened by {tolerance:.0%}) "
        f"is read against strict fp32, TF32 off, the baseline it means: {said['fp32']}; "
        f"{said.get('tf32', 'no TF32 on this GPU: strict fp32 decides alone')}"
    )
    if where["fp32"] == "inside":
        return "confirmed", reason
    if where["fp32"] == "straddles" or where["tf32"] == "straddles":
        return "inconclusive", reason + ": an interval straddles an edge of the band"
    if where["tf32"] == "inside":
        return "partly", reason + ": the article's range holds against TF32 only"
    return "refuted", reason + ": outside the band against both baselines"


def _states(
    sizes: Sequence[float],
    ratios: Sequence[Ratio],
    threshold: float,
    controls: Sequence[Ratio] | None = None,
) -> dict:
    """size -> 'above' | 'below' | 'undecided' against `threshold`, in increasing size;
    'undecided' too where the size's A/A control does not hold."""
    triples = sorted(
        zip(sizes, ratios, _controls(sizes, controls), strict=True), key=lambda t: t[0]
    )
    return {size: _decide(ratio, control, threshold) for size, ratio, control in triples}


def _unsupported(
    sizes: Sequence[float], controls: Sequence[Ratio] | None, threshold: float, among=None
) -> str:
    """'' where every A/A control of `among` sizes (default: all) holds; else which do not, as
    a clause for a verdict's reason."""
    notes = [
        f"{speedups.control_state(control, threshold)} at {size_label(size)} ({control.low:.3g}-"
        f"{control.high:.3g}x)"
        for size, control in sorted(zip(sizes, _controls(sizes, controls), strict=True))
        if control is not None
        and (among is None or size in among)
        and speedups.control_state(control, threshold) != "holds"
    ]
    if not notes:
        return ""
    return (
        f"; no decision where the A/A control (fp32 over fp32) does not hold within "
        f"{1 / threshold:.3g}-{threshold:g}x: {', '.join(notes)}"
    )


def _named(sizes) -> str:
    return ", ".join(size_label(s) for s in sizes) or "none"


def verdict_small_no_gain(
    sizes: Sequence[float],
    ratios: Sequence[Ratio],
    threshold: float = 1.1,
    small_below: float = 100e6,
    controls: Sequence[Ratio] | None = None,
) -> tuple[str, str]:
    """PIT4-SMALL-NO-GAIN, "under 100M parameters AMP brings no clear gain": (verdict, reason)
    from AMP's speed-up at each size; a clear gain is an interval wholly above `threshold`.

    Over the sizes under `small_below`: inconclusive if any interval straddles the threshold
    or any size's A/A control (`controls`, one per size) does not hold; confirmed if none is
    above it, refuted if all are, partly otherwise."""
    states = _states(sizes, ratios, threshold, controls)
    small = {s: state for s, state in states.items() if not _at_least(s, small_below)}
    if not small:
        return "inconclusive", f"no size under {size_label(small_below)} was measured"
    above, below, undecided = (
        [s for s, state in small.items() if state == k] for k in ("above", "below", "undecided")
    )
    reason = (
        f"under {size_label(small_below)}: significantly above {threshold:g}x at "
        f"{_named(above)}; below at {_named(below)}; undecided at {_named(undecided)}"
        + _unsupported(sizes, controls, threshold, among=small)
    )
    if undecided:
        return "inconclusive", reason
    if not above:
        return "confirmed", reason
    if not below:
        return "refuted", reason
    return "partly", reason


def verdict_only_above_1b(
    sizes: Sequence[float],
    ratios: Sequence[Ratio],
    threshold: float = 1.1,
    large: float = 1e9,
    controls: Sequence[Ratio] | None = None,
) -> tuple[str, str]:
    """PIT4-ONLY-ABOVE-1B, "use AMP only above 1B parameters": (verdict, reason) from where
    AMP's speed-up becomes significantly larger than `threshold` (`crossover`).

    refuted: the crossover lies below about `large` (AMP pays earlier); confirmed: it lies at
    about `large` and every smaller size is decided below the threshold, or no size gains and
    the largest measured is about `large`; inconclusive otherwise (intervals that straddle the
    threshold or sizes whose A/A control, in `controls`, does not hold; or a gain that comes
    and goes with the size)."""
    states = _states(sizes, ratios, threshold, controls)
    at = crossover(sizes, ratios, threshold, controls)
    smaller = {s: state for s, state in states.items() if not _at_least(s, large)}
    unsupported = _unsupported(sizes, controls, threshold)
    if at is not None:
        reason = (
            f"the speed-up is significantly above {threshold:g}x from {size_label(at)} on"
            + unsupported
        )
        if not _at_least(at, large):
            return "refuted", reason + f": AMP pays below {size_label(large)}"
        if all(state == "below" for state in smaller.values()):
            return "confirmed", reason + f", and at no smaller size ({_named(smaller)})"
        unsure = [s for s, state in smaller.items() if state != "below"]
        return "inconclusive", reason + f", but smaller sizes are not all below ({_named(unsure)})"
    largest = max(states) if states else 0.0
    if states and all(state == "below" for state in states.values()) and _at_least(largest, large):
        return "confirmed", (
            f"no size up to {size_label(largest)} is significantly above {threshold:g}x: AMP "
            f"does not pay below about {size_label(large)} here"
        )
    return "inconclusive", (
        "no crossover: "
        + "; ".join(f"{size_label(s)} {state}" for s, state in states.items())
        + f" against {threshold:g}x"
        + unsupported
    )


# --- FMT-SPEED --------------------------------------------------------------------------------

MATMUL_N = 8192  # 2 x 8192^3 = 1.1e12 flop a product: ~1 ms in fp16 on an H200, past launch cost
MATMUL_ROUNDS, MATMUL_WARMUP = 20, 3
MATMUL_CONTROL = "fp16-again_over_fp16"  # the A/A control: the fp16 arm timed a second time
ADD_NUMEL = 2**27  # 512 MiB per fp32 tensor: far past the L2 cache, bound by memory bandwidth
ADD_ROUNDS, ADD_WARMUP = 30, 3
SPEED_BAND = (2.0, 8.0)  # the article's "about 2-8x"
# "About": each edge widened by 25% (1.6-10x), the tolerance the headline claims get too
# (test_memory_speed.py's TOTAL_MATCH and SPEED_BAND): datasheet ratios are peaks, and a GEMM
# reaches 70-90% of each format's, so a measured ratio lands within ~25% of the peak ratio.
SPEED_TOLERANCE = 0.25
# Half the bytes buys at most 2x on a memory-bound op; 2.5 leaves room for its interval. A
# compute-bound matmul that gains more than this gains from the tensor cores' math.
MEMORY_BOUND_MAX = 2.5
PEAK_FRACTION_MIN = 0.3  # a sane measurement of a cuBLAS fp16 GEMM reaches this of the datasheet


def _random(shape: tuple[int, ...], device: torch.device, seed: int) -> torch.Tensor:
    """Normal random float32 values: zeros would run faster on this hardware than real data."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=generator, device=device)


def _lowered(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """The cast every low-precision arm's inputs go through."""
    if fmt == "fp16":
        return x.half()
    if fmt == "bf16":
        return x.bfloat16()
    return x


def _matmul_arms(amp_device, fp8: bool, tf32: bool) -> dict[str, Callable[[], None]]:
    device = amp_device.torch_device
    a, b = _random((MATMUL_N, MATMUL_N), device, 0), _random((MATMUL_N, MATMUL_N), device, 1)
    # Every arm but tf32 runs with TF32 off: a half-precision arm whose cast had done nothing
    # would run in strict fp32, not borrow TF32's tensor cores.
    strict = recipes.get("fp32").bind(amp_device)
    arms = {"fp32": strict.wrap(partial(torch.mm, a, b))}
    if tf32:
        arms["tf32"] = recipes.get("tf32").bind(amp_device).wrap(partial(torch.mm, a, b))
    for fmt in ("fp16", "bf16"):
        arms[fmt] = strict.wrap(partial(torch.mm, _lowered(a, fmt), _lowered(b, fmt)))
    # The A/A control: the same fp16 product again, in its own slot of every round. fp16 is the
    # shortest arm, so its timing is the noisiest relative to its time, and cheap to repeat.
    arms["fp16-again"] = arms["fp16"]
    if fp8:
        arms["fp8"] = strict.wrap(prequantised_gemm(a, b))
    return arms


def _add_arms(amp_device) -> tuple[dict[str, Callable[[], object]], dict[str, int]]:
    """x + y into a preallocated output, in fp32 and fp16; and the bytes each call moves."""
    device = amp_device.torch_device
    arms, moved = {}, {}
    for fmt in ("fp32", "fp16"):
        x, y = (_lowered(_random((ADD_NUMEL,), device, seed), fmt) for seed in (2, 3))
        arms[fmt] = partial(torch.add, x, y, out=torch.empty_like(x))
        moved[fmt] = 3 * x.numel() * x.element_size()  # two tensors read, one written
    return arms, moved


def _of_peak(achieved: float, peak: float | None, unit: str) -> str:
    return f" ({achieved / peak:.0%} of {peak:g} {unit})" if peak else ""


@pytest.mark.claim("FMT-SPEED")
@pytest.mark.requires("cuda")
def test_half_precision_matmul_speed(record, amp_device, benchmark):
    # By name and the figures that tell variants apart (an H200 NVL has 84% of an SXM
    # H200's peaks): a datasheet's peaks are used only where the entry is sure.
    found = amp_device.datasheet()
    gpu = found.spec if found and found.sure else None
    how = found.how if found else "the CPU has no datasheet entry"
    # fp8 is timed where the GPU and torch have it; expected there (sm_89+) and broken, the
    # test fails as a capability regression (harness.lab.devices.EXPECTED).
    fp8_lack = amp_device.optional("fp8_matmul")
    fp8_reason = str(fp8_lack) if fp8_lack else None
    # TF32 likewise: a GPU without it (V100, T4) is compared against strict fp32 alone.
    tf32_lack = amp_device.optional("tf32")
    arms = _matmul_arms(amp_device, fp8=fp8_reason is None, tf32=tf32_lack is None)
    matmul = measure.compare(arms, amp_device.type, MATMUL_ROUNDS, MATMUL_WARMUP)
    # Negative control: an op bound by memory, not math, gains only what half the bytes buys.
    add_arms, moved = _add_arms(amp_device)
    add = measure.compare(add_arms, amp_device.type, ADD_ROUNDS, ADD_WARMUP)

    formats = [arm for arm in arms if arm != "fp16-again"]
    tflops = {fmt: 2 * MATMUL_N**3 / matmul.median(fmt) / 1e12 for fmt in formats}
    tbs = {fmt: moved[fmt] / add.median(fmt) / 1e12 for fmt in add_arms}
    ratios = {f"{fmt}_over_fp32": matmul.ratio("fp32", fmt) for fmt in formats if fmt != "fp32"}
    if not tf32_lack:
        ratios["fp16_over_tf32"] = matmul.ratio("tf32", "fp16")
    ratios[MATMUL_CONTROL] = control = matmul.ratio("fp16", "fp16-again")
    add_speedup = add.ratio("fp32", "fp16")
    vs_fp32, vs_tf32 = ratios["fp16_over_fp32"], ratios.get("fp16_over_tf32")
    with recipes.get("fp32").bind(amp_device):
        strict_flags = tf32.tf32_flags()
    record.param(
        gpu=amp_device.name,
        datasheet=f"{how}: {gpu.source}" if gpu else how,
        matmul_shape=f"{MATMUL_N}x{MATMUL_N}x{MATMUL_N}",
        matmul_rounds=MATMUL_ROUNDS,
        add_numel=ADD_NUMEL,
        add_rounds=ADD_ROUNDS,
        aa_control="fp16 matmul timed twice",
        speed_band="about {:g}-{:g}x, read as {:.3g}-{:.3g}x".format(
            *SPEED_BAND, *about(SPEED_BAND, SPEED_TOLERANCE)
        ),
        aa_control_threshold=THRESHOLD,
        fp8=fp8_reason
        or "torch._scaled_mm, float8_e4m3fn inputs quantised beforehand, bfloat16 output",
        tf32=str(tf32_lack) if tf32_lack else "torch.mm with TF32 allowed",
        **{f"fp32_arm.{flag}": on for flag, on in strict_flags.items()},
    )
    record.metric(
        **{f"matmul.{fmt}.tflops": value for fmt, value in tflops.items()},
        **{
            f"matmul.{fmt}.fraction_of_peak": value / gpu.peak(fmt)
            for fmt, value in tflops.items()
            if gpu and gpu.peak(fmt)
        },
        **{f"add.{fmt}.tbs": value for fmt, value in tbs.items()},
        **{
            f"add.{fmt}.fraction_of_bandwidth": value / gpu.bandwidth_tbs
            for fmt, value in tbs.items()
            if gpu
        },
        **{
            metric: value
            for name, ratio in ratios.items()
            for metric, value in ratio.as_metrics(f"matmul.{name}").items()
        },
        **add_speedup.as_metrics("add.fp16_over_fp32"),
    )

    verdict, reason = verdict_fmt_speed(
        vs_fp32, vs_tf32, SPEED_BAND, control, THRESHOLD, SPEED_TOLERANCE
    )
    peaks = ", ".join(
        f"{fmt} {value:.3g}{_of_peak(value, gpu and gpu.peak(fmt), 'peak')}"
        for fmt, value in tflops.items()
    )
    record.verdict(
        "FMT-SPEED",
        verdict,
        f"{MATMUL_N}^3 matmul on {amp_device.name}, TFLOP/s: {peaks}"
        f"{'' if gpu else f' (no datasheet peaks: {how})'}"
        f"{f'; {fp8_reason}' if fp8_reason else ''}; "
        f"{reason}; bf16 over fp32 {ratios['bf16_over_fp32'].describe()}. Negative control, "
        f"add of 2^{ADD_NUMEL.bit_length() - 1} elements: fp16 over fp32 "
        f"{add_speedup.describe()}, fp32 at {tbs['fp32']:.2f} TB/s"
        f"{_of_peak(tbs['fp32'], gpu and gpu.bandwidth_tbs, 'TB/s')}",
    )
    measure.benchmark_extra_info(
        benchmark,
        fp16_over_fp32=vs_fp32,
        add_fp16_over_fp32=add_speedup,
        **({"fp16_over_tf32": vs_tf32} if vs_tf32 else {}),
    )
    measure.pedantic(benchmark, arms["fp16"], amp_device.type, rounds=10, warmup=2)

    # A/A control: the fp16 matmul against itself is not told apart.
    state = speedups.control_state(control, THRESHOLD)
    assert state != "differs", (
        f"FMT-SPEED: negative control: predicted the fp16 matmul timed twice at 1x, got "
        f"{speedups.describe_control(MATMUL_CONTROL, control, THRESHOLD)}"
    )
    # Where the control is too wide, the matmul's speed-ups decide nothing (the verdict is
    # inconclusive): only a comparison whose control holds can contradict the predictions.
    if state == "holds":
        assert vs_fp32.decide(1.0) == "above", (
            f"FMT-SPEED: predicted the fp16 matmul faster than fp32 (TF32 off), got "
            f"{vs_fp32.describe()}"
        )
        assert vs_fp32.decide(MEMORY_BOUND_MAX) == "above", (
            f"FMT-SPEED: predicted the compute-bound matmul to gain more than "
            f"{MEMORY_BOUND_MAX}x from fp16, more than half the bytes explains, got "
            f"{vs_fp32.describe()} (the add: {add_speedup.describe()})"
        )
    if gpu and gpu.fp16:
        assert tflops["fp16"] >= PEAK_FRACTION_MIN * gpu.fp16, (
            f"FMT-SPEED: predicted at least {PEAK_FRACTION_MIN:.0%} of the {gpu.name} datasheet "
            f"fp16 peak ({gpu.fp16:g} TFLOP/s), measured {tflops['fp16']:.0f}"
        )
    # The add needs no A/A control: no verdict rests on it, and its own interval must settle
    # "below 2.5x", or this assertion fails.
    assert add_speedup.decide(MEMORY_BOUND_MAX) == "below", (
        f"FMT-SPEED: negative control: predicted the memory-bound add to gain less than "
        f"{MEMORY_BOUND_MAX}x from fp16 (half the bytes), got {add_speedup.describe()}"
    )


# --- PIT4: AMP's speed-up against model size ---------------------------------------------------

THRESHOLD = 1.1  # a clear gain: the speed-up's interval lies wholly above it
# The GPT-style transformer, 4 layers: 1M to 1B parameters by the width alone (56 to 4416),
# every attention head a multiple of 8 wide (56 at 1M, 64 from 10M on: harness.lab.models), so that
# no size falls back to slower attention kernels. 16 x 256 = 4096 tokens a step: a 1B step takes
# ~0.5 s in strict fp32 on an H200 and well under 0.1 s in AMP. Fused AdamW in every arm: with
# it GradScaler's inf check stays on the GPU; with the default one it reads it back every step.
VOCAB, SEQ_LEN, LAYERS, BATCH = 8192, 256, 4, 16
LR = 1e-4


@dataclass(frozen=True)
class Size:
    label: str
    params: int  # the target; the model is within harness.lab.models.TOLERANCE of it
    rounds: int  # interleaved rounds: many where a step is short and noisy, fewer where long,
    # never under measure.min_rounds() (tests/sensitivity/test_gpu_budget.py checks)
    warmup: int


SIZES = (
    Size("1M", 10**6, 30, 3),
    Size("10M", 10**7, 30, 3),
    Size("100M", 10**8, 15, 2),
    Size("1B", 10**9, 10, 1),  # the warm-up has run one step of each arm already
)
DECIDING = "amp-fp16_over_fp32"  # the article's AMP (fp16 + GradScaler) against its FP32


def _plan(size: Size) -> models.Plan:
    return models.plan("transformer", size.params, vocab=VOCAB, seq_len=SEQ_LEN, layers=LAYERS)


@dataclass
class Arms:
    """A size's timing arms, warmed up: per arm the step, its bound recipe, and the parameters
    still without optimizer state after the warm-up (0 where ready)."""

    steps: dict[str, Callable[[], None]]
    precisions: dict[str, recipes.Precision]
    unready: dict[str, int]


def _training_arms(size: Size, amp_device) -> Arms:
    """One closure per arm, each with its own copy of the same model and its own fused AdamW,
    warmed up until the optimizer holds its state and the scaler, if any, takes its steps (a
    step GradScaler skips creates no AdamW state)."""
    device = amp_device.torch_device
    with device:  # initialise on the GPU: 1B parameters drawn on the CPU would take seconds
        base = models.build("transformer", size.params, vocab=VOCAB, seq_len=SEQ_LEN, layers=LAYERS)
    tokens, targets = speedups.token_batch(device, VOCAB, BATCH, SEQ_LEN)
    arms = Arms({}, {}, {})
    for arm, recipe in speedups.arms(amp_device).items():  # tf32 where the GPU has it
        precision = arms.precisions[arm] = recipes.get(recipe).bind(amp_device)
        model = precision.prepare(copy.deepcopy(base))
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
        # The bare step: the gradients are freed after it, or five 1B arms would hold 20 GB.
        arms.steps[arm] = precision.wrap(
            partial(speedups.training_step, precision, model, optimizer, tokens, targets)
        )
        speedups.warm_up(arms.steps[arm], optimizer, precision.scaler)
        arms.unready[arm] = speedups.unstepped(optimizer)
    return arms


def _model_tflops(params: int, tokens: int, comparison: Comparison, arm: str) -> float:
    """Model flop (6 x parameters x tokens: forward and backward, attention left out) per
    second of the arm's median step."""
    return 6 * params * tokens / comparison.median(arm) / 1e12


def _heads_note(plans: dict[str, models.Plan]) -> str:
    """The attention head sizes of the sweep, for the evidence; where one is not a multiple of
    8, why (no width within harness.lab.models.TOLERANCE of the target allowed one)."""
    sizes = {label: models.head_size(plan) for label, plan in plans.items()}
    said = ", ".join(f"{size} at {label}" for label, size in sizes.items())
    odd = [label for label, size in sizes.items() if size % models.HEAD_MULTIPLE]
    if not odd:
        return f"attention heads {said} wide, multiples of {models.HEAD_MULTIPLE} at every size"
    return (
        f"attention heads {said} wide; not a multiple of {models.HEAD_MULTIPLE} at "
        f"{', '.join(odd)}: no such width lands within {models.TOLERANCE:.0%} of the target, so "
        "the fused attention kernels may fall back there"
    )


def _line(sizes: tuple[Size, ...], ratios: list[Ratio] | None) -> str:
    if ratios is None:
        return speedups.NOT_TIMED
    return ", ".join(f"{s.label} {r.value:.2f}x" for s, r in zip(sizes, ratios, strict=True))


@pytest.mark.claim("PIT4-SMALL-NO-GAIN", "PIT4-ONLY-ABOVE-1B")
@pytest.mark.requires("cuda", "fp16_autocast", "grad_scaler", "bf16_autocast")
def test_amp_training_step_speedup_by_model_size(record, amp_device, benchmark):
    plans = {size.label: _plan(size) for size in SIZES}  # a target out of reach fails here
    comparisons: dict[str, Comparison] = {}
    unready: dict[str, dict[str, int]] = {}
    skipped: dict[str, dict[str, tuple[float, float]]] = {}
    for size in SIZES:
        arms = _training_arms(size, amp_device)
        unready[size.label] = arms.unready
        scales = speedups.scales(arms.precisions)
        comparisons[size.label] = measure.compare(
            arms.steps, amp_device.type, size.rounds, size.warmup
        )
        skipped[size.label] = speedups.skipped_while_timed(scales, arms.precisions)
        if size == SIZES[-1]:
            measure.pedantic(benchmark, arms.steps["amp-bf16"], amp_device.type, rounds=3, warmup=1)
        del arms  # five models with their AdamW states: ~60 GB at 1B
        torch.cuda.empty_cache()

    by_size = [speedups.speedups(comparisons[size.label]) for size in SIZES]
    series = {name: [ratios[name] for ratios in by_size] for name in by_size[0]}
    nominal = [size.params for size in SIZES]
    counts = [plans[size.label].params for size in SIZES]
    tokens = BATCH * SEQ_LEN
    record.param(
        model="transformer",
        vocab=VOCAB,
        seq_len=SEQ_LEN,
        layers=LAYERS,
        batch=BATCH,
        tokens_per_step=tokens,
        optimizer="adamw (fused)",
        timed_step="bare: the recipe's verbs, no gradient norm or scale read, one sync a round",
        lr=LR,
        **{f"size.{label}.params": plan.params for label, plan in plans.items()},
        **{f"size.{label}.width": plan.width for label, plan in plans.items()},
        **{f"size.{label}.heads": plan.options["heads"] for label, plan in plans.items()},
        **{f"size.{label}.head_size": models.head_size(plan) for label, plan in plans.items()},
        **{f"size.{s.label}.rounds": s.rounds for s in SIZES},
        aa_control_threshold=THRESHOLD,
        **speedups.tf32_flags(amp_device),
    )
    record.metric(
        **{
            metric: value
            for name, ratios in series.items()
            for size, ratio in zip(SIZES, ratios, strict=True)
            for metric, value in ratio.as_metrics(f"{size.label}/{name}").items()
        },
        **{
            f"{size.label}/{arm}.tflops": _model_tflops(count, tokens, comparisons[size.label], arm)
            for size, count in zip(SIZES, counts, strict=True)
            for arm in comparisons[size.label].times
        },
    )
    record.figure(
        "speedup_by_size",
        figures.speedups(
            counts, series, "parameters", "speed-up of one training step",
            f"AMP speed-up against model size ({BATCH}x{SEQ_LEN} tokens a step, AdamW)",
            lines={THRESHOLD: f"{THRESHOLD}x"}, dashed={speedups.CONTROL},
        ),
    )  # fmt: skip

    deciding, controls = series[DECIDING], series[speedups.CONTROL]
    small, small_reason = verdict_small_no_gain(nominal, deciding, THRESHOLD, controls=controls)
    large, large_reason = verdict_only_above_1b(nominal, deciding, THRESHOLD, controls=controls)
    crossovers = {
        name.replace("_over_", " over "): crossover(nominal, ratios, THRESHOLD, controls)
        for name, ratios in series.items()
        if name != speedups.CONTROL
    }
    aa_note = "; A/A control fp32 over fp32: " + ", ".join(
        f"{s.label} {r.value:.3g}x ({r.low:.3g}-{r.high:.3g})"
        for s, r in zip(SIZES, controls, strict=True)
    )
    measured = "; ".join(
        f"{s.label} ({count:,} params) {r.describe()}"
        for s, count, r in zip(SIZES, counts, deciding, strict=True)
    )
    heads = _heads_note(plans)
    record.verdict(
        "PIT4-SMALL-NO-GAIN",
        small,
        f"amp-fp16 over fp32 (TF32 off), one AdamW step of {tokens} tokens: {measured}; "
        f"{small_reason}. amp-bf16 over fp32: {_line(SIZES, series['amp-bf16_over_fp32'])}; "
        f"amp-fp16 over tf32: {_line(SIZES, series.get('amp-fp16_over_tf32'))}{aa_note}; "
        f"{heads}",
    )
    record.verdict(
        "PIT4-ONLY-ABOVE-1B",
        large,
        f"amp-fp16 over fp32: {large_reason}. Smallest size from which each speed-up is "
        f"significantly above {THRESHOLD}x: "
        + ", ".join(f"{name} {size_label(at) if at else 'none'}" for name, at in crossovers.items())
        + f"; at {SIZES[-1].label}: amp-bf16 over fp32 "
        f"{series['amp-bf16_over_fp32'][-1].describe()}, over tf32 "
        f"{speedups.described({k: v[-1] for k, v in series.items()}, 'amp-bf16_over_tf32')}"
        f"{aa_note}; {heads}",
    )
    measure.benchmark_extra_info(
        benchmark,
        **{f"{SIZES[-1].label}.{name}": ratios[-1] for name, ratios in series.items()},
    )

    # A step GradScaler skipped in the warm-up would create AdamW's state inside the timing.
    for label, arms_unready in unready.items():
        assert not any(arms_unready.values()), (
            f"PIT4-ONLY-ABOVE-1B: predicted every arm's AdamW state to exist after "
            f"{speedups.WARMUP_STEPS_MAX} warm-up steps at {label}, parameters without it: "
            f"{arms_unready}"
        )
    for label, fell in skipped.items():
        assert not fell, (
            f"PIT4-ONLY-ABOVE-1B: predicted no step skipped by GradScaler in the timed rounds at "
            f"{label} (a skipped step is timed without its update), scale before -> after: {fell}"
        )
    # Negative control: fp32 timed against itself shows no speed-up at any size.
    for size, control in zip(SIZES, controls, strict=True):
        assert speedups.control_state(control, THRESHOLD) != "differs", (
            f"PIT4-SMALL-NO-GAIN: negative control: predicted fp32 over fp32 at 1x at "
            f"{size.label}, got {speedups.describe_control(speedups.CONTROL, control, THRESHOLD)}"
        )
    # Where the largest size's control is too wide, its speed-ups decide nothing (the verdicts
    # say inconclusive): only a comparison whose control holds can contradict the prediction.
    if speedups.control_state(controls[-1], THRESHOLD) == "holds":
        # The deciding series (amp-fp16, the verdicts' own) first, then amp-bf16.
        for name in (DECIDING, "amp-bf16_over_fp32"):
            top = series[name][-1]
            assert top.decide(THRESHOLD) == "above", (
                f"PIT4-ONLY-ABOVE-1B: predicted {name.split('_over_')[0]} more than "
                f"{THRESHOLD}x faster than fp32 (TF32 off) at {SIZES[-1].label} parameters, got "
                f"{top.describe()}"
            )
