"""The CUDA-only scenarios, rehearsed on the CPU at toy sizes, so that a GPU session never finds a
typo: scenarios/test_speed.py and test_memory_speed.py skip without a GPU, and GPU time is short.

Every line of their measurement, records, figures, verdicts and benchmarks runs here, with three
stand-ins for what only CUDA has: the `cuda` and `tf32` requirements are waived (the tf32 recipe
then only sets flags), times come from the wall clock (harness.lab.measure's CPU path), and peak
memory from torch's tensor-level MemTracker instead of the CUDA allocator's statistics. The
verdicts mean nothing at these sizes. What is checked: each test reaches a verdict for every
claim it declares, and if it fails, it fails on a prediction, an assertion starting with its
claim ID, never on an error of its own code. And, with synthetic timings in place of the wall
clock's, that the verdicts follow each comparison's A/A control: decided where it holds,
inconclusive where it is too wide, a failure naming the claim where it tells identical arms apart.
"""

from __future__ import annotations

import gc
import re

import numpy as np
import pytest
import torch
from conftest import Toy, assert_failed_on, assert_fails_naming, load_scenario

from harness.lab import devices, fp8, measure
from harness.records.journal import JOURNAL_NAME, Journal

# torch's tensor-level memory tracker (torch 2.5 and newer): the CPU's stand-in for the CUDA
# allocator's peak statistics.
MemTracker = pytest.importorskip("torch.distributed._tools.mem_tracker").MemTracker

WAIVED = ("cuda", "tf32")


@pytest.fixture
def cuda_waived(monkeypatch):
    _waive(monkeypatch, WAIVED)


def _waive(monkeypatch, waived: tuple[str, ...]) -> None:
    missing = devices.DeviceInfo.missing

    def missing_but_cuda(self, *needs, gpus=0):
        return missing(self, *(n for n in needs if n not in waived), gpus=gpus)

    monkeypatch.setattr(devices.DeviceInfo, "missing", missing_but_cuda)
    monkeypatch.setattr(measure, "peak_memory", _peak_memory_on_cpu)


def _peak_memory_on_cpu(fn, device: torch.device) -> int:
    """measure.peak_memory's meaning (the most allocated above what stays allocated) counted by
    torch's MemTracker: its peak total less its total once `fn` has returned."""
    tracker = MemTracker()
    with tracker:
        fn()
    peak, after = (
        tracker.get_tracker_snapshot(kind)[device]["Total"] for kind in ("peak", "current")
    )
    return int(peak - after)


@pytest.fixture
def frozen_heap():
    """The objects that exist before the nested run, left out of the garbage collector's
    passes (gc.freeze) until the test ends. scenarios/test_memory_speed.py calls gc.collect()
    after each of its 15 measurements, to free a model before the next: in this process, which
    holds pytest's, torch's and earlier nested sessions' objects, each such pass took 0.3-0.4 s
    traversing them. What the scenario makes and drops is collected as before."""
    gc.freeze()
    yield
    gc.unfreeze()


# The fewest rounds whose intervals decide (measure.min_rounds): the decision paths run too.
FEW = measure.min_rounds()
SPEED = Toy(
    MATMUL_N=128,
    MATMUL_ROUNDS=FEW,
    MATMUL_WARMUP=1,
    ADD_NUMEL=2**14,
    ADD_ROUNDS=FEW,
    ADD_WARMUP=1,
    VOCAB=256,
    SEQ_LEN=16,
    LAYERS=2,
    BATCH=2,
    SIZES=lambda m: (m.Size("30k", 30_000, FEW, 1), m.Size("200k", 200_000, FEW, 1)),
)
MEMORY_SPEED = Toy(
    OPTIONS={"layers": 2, "vocab": 512, "seq_len": 32},
    WIDTHS=(64, 128, 192),
    BATCH=2,
    ROUNDS=FEW,
    WARMUP=1,
)
FP8_SPEED = Toy(SHAPES=(32, 64), ROUNDS=FEW, WARMUP=1, CALL_FLOPS=2 * 64**3)
TOYS = {
    "test_speed.py": SPEED,
    "test_memory_speed.py": MEMORY_SPEED,
    "test_fp8_speed.py": FP8_SPEED,
}


def _reached_verdicts(result: pytest.RunResult, pytester: pytest.Pytester, tests: int) -> None:
    """Every test ran to a verdict per declared claim; a failure is a claim's prediction."""
    outcomes = result.parseoutcomes()
    assert outcomes.get("error", 0) == 0 and outcomes.get("skipped", 0) == 0, result.outlines
    assert outcomes.get("passed", 0) + outcomes.get("failed", 0) == tests, outcomes
    (session,) = Journal(pytester.path / "reports" / JOURNAL_NAME).sessions().values()
    assert len(session.records) == tests
    for record in session.records:
        assert record.claims and not record.missing_verdicts(), (record.test, record.verdicts)
    errors = [line for line in result.outlines if line.startswith("E  ")]
    raised = [line for line in errors if re.match(r"E\s+\w+(Error|Exception):", line)]
    assert all(re.match(r"E\s+AssertionError: [A-Z0-9]+(-[A-Z0-9]+)+: ", x) for x in raised), (
        "a rehearsed scenario failed on something other than a prediction:\n" + "\n".join(errors)
    )


def test_speed_scenarios_run_to_their_verdicts(run_scenario, pytester, cuda_waived):
    result = run_scenario("test_speed.py", plugins=(SPEED,))
    _reached_verdicts(result, pytester, tests=2)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "toy", "tests"),
    [("test_speed.py", SPEED, 2), ("test_memory_speed.py", MEMORY_SPEED, 3)],
    ids=["speed", "memory_speed"],
)
def test_speed_claims_are_decided_on_a_gpu_without_tf32(
    run_scenario, pytester, monkeypatch, frozen_heap, module, toy, tests
):
    """A V100 or T4 (no TF32: the GPUs the article's speed-ups describe) still decides every
    speed claim, against strict fp32 alone: here the CPU, whose TF32 is genuinely absent,
    stands in for one."""
    _waive(monkeypatch, ("cuda",))
    result = run_scenario(module, plugins=(toy,))
    _reached_verdicts(result, pytester, tests=tests)
    (session,) = Journal(pytester.path / "reports" / JOURNAL_NAME).sessions().values()
    timed = [v for r in session.records for v in r.verdicts.values() if "SPEED" in v.claim]
    timed += [v for r in session.records for v in r.verdicts.values() if "PIT4" in v.claim]
    assert timed and all("no TF32 on this GPU" in v.evidence for v in timed), timed


@pytest.mark.slow
def test_memory_and_speed_scenarios_run_to_their_verdicts(
    run_scenario, pytester, cuda_waived, frozen_heap
):
    # Two CUDA-only tests, and the static-bytes test of HDL-MEMORY, which runs anywhere.
    result = run_scenario("test_memory_speed.py", plugins=(MEMORY_SPEED,))
    _reached_verdicts(result, pytester, tests=3)


@pytest.fixture
def fp8_gemms_waived(monkeypatch):
    """`cuda` and `fp8_matmul` waived, where the CPU has a _scaled_mm to rehearse on."""
    if devices.probe("cpu").missing("fp8_scaled_mm"):
        pytest.skip("this torch has no CPU _scaled_mm (from 2.9): nothing to rehearse on")
    _waive(monkeypatch, (*WAIVED, "fp8_matmul"))


def test_fp8_speed_scenario_runs_to_its_verdict(run_scenario, pytester, fp8_gemms_waived):
    result = run_scenario("test_fp8_speed.py", plugins=(FP8_SPEED,))
    _reached_verdicts(result, pytester, tests=1)


def test_fp8_gpu_claims_run_to_their_verdicts_and_fail_only_on_predictions(
    run_scenario, pytester, fp8_gemms_waived
):
    """FP8-CUDA-SCALED-MM-CONTRACT and FP8-FAST-ACCUM, rehearsed on the CPU's _scaled_mm: it
    accepts what CUDA refuses and has no short accumulator, so both predictions fail here,
    each naming its claim, and every line of the GPU path ran."""
    result = run_scenario("test_fp8.py", "-k", "cuda_refuses or fast_accumulation")
    _reached_verdicts(result, pytester, tests=2)
    assert_fails_naming(result, "FP8-CUDA-SCALED-MM-CONTRACT", failed=2)
    assert_failed_on(result, "E *FP8-FAST-ACCUM: fast accumulation's error did not grow*")


# Synthetic timings: seconds per call relative to the arm "fp32", roughly what a GPU shows. The
# A/A arms ("<arm>-again") take their twin's time.
TRAINING_STEP = {"fp32": 1.0, "tf32": 0.6, "amp-fp16": 0.5, "amp-bf16": 0.5}  # AMP 2x
MATMUL = {"fp32": 1.0, "tf32": 0.5, "fp16": 0.25, "bf16": 0.25, "fp8": 0.125}  # fp16 4x: 2-8x
ADD = {"fp32": 1.0, "fp16": 0.5}  # half the bytes: 2x
# FP8 over bf16: the kernel 2x (the peak ratio), with its quantisation 1.5x bf16's time.
FP8_BY_SHAPE = {"bf16": 1.0, "fp8": 0.5, "fp8-quantising": 1.5}
ROUNDS = 15


def _synthetic_compare(control: str):
    """measure.compare's stand-in: calls no arm; every arm's times lie within 1% of its relative
    time, but the A/A arm's follow `control`: 'tight' like every arm, 'wide' spread over
    0.6-1.4x of its twin's (centred on it: identical arms, noisy), 'apart' 1.3x its twin's."""

    def compare(arms, device_type, rounds=20, warmup=3):
        rng = np.random.default_rng(len(arms))
        relative = (
            ADD if set(arms) == set(ADD)
            else MATMUL if "fp16" in arms
            else FP8_BY_SHAPE if "fp8-quantising" in arms
            else TRAINING_STEP
        )  # fmt: skip
        times = {}
        for arm in arms:
            base = relative[arm.removesuffix("-again")] * (1 + 0.01 * rng.standard_normal(ROUNDS))
            if arm.endswith("-again") and control == "wide":
                base = base * rng.permutation(np.linspace(0.6, 1.4, ROUNDS))
            elif arm.endswith("-again") and control == "apart":
                base = base * 1.3
            times[arm] = [0.01 * t for t in base]
        return measure.Comparison(device_type, times)

    return compare


TIMED = {  # module, its timing test, the claims it records, the one its control assertion names
    "matmul": ("test_speed.py", "matmul", ("FMT-SPEED",), "FMT-SPEED"),
    "training step": (
        "test_speed.py",
        "training_step",
        ("PIT4-SMALL-NO-GAIN", "PIT4-ONLY-ABOVE-1B"),
        "PIT4-SMALL-NO-GAIN",
    ),
    "HDL-SPEED": ("test_memory_speed.py", "speedup", ("HDL-SPEED",), "HDL-SPEED"),
    "FP8 by shape": (
        "test_fp8_speed.py",
        "shape",
        ("FP8-SPEEDUP-BY-SHAPE",),
        "FP8-SPEEDUP-BY-SHAPE",
    ),
}


@pytest.mark.parametrize("comparison", TIMED)
@pytest.mark.parametrize("control", ["tight", "wide", "apart"])
def test_timing_verdicts_follow_the_a_a_control(
    run_scenario, pytester, cuda_waived, monkeypatch, request, comparison, control
):
    module, test, claims, named = TIMED[comparison]
    if module == "test_fp8_speed.py":
        request.getfixturevalue("fp8_gemms_waived")
    monkeypatch.setattr(measure, "compare", _synthetic_compare(control))
    result = run_scenario(module, "-k", test, plugins=(TOYS[module],))
    (session,) = Journal(pytester.path / "reports" / JOURNAL_NAME).sessions().values()
    (record,) = session.records
    verdicts = {claim: record.verdicts[claim] for claim in claims}
    if control == "tight":  # every AMP arm clearly faster, the control within 1%: decided
        result.assert_outcomes(passed=1)
        assert all(v.verdict != "inconclusive" for v in verdicts.values()), verdicts
        return
    # Too wide or apart, the control supports no decision, and the evidence says why.
    assert all(v.verdict == "inconclusive" for v in verdicts.values()), verdicts
    said = {  # per size for PIT4, of the one comparison otherwise
        "wide": "too wide at" if named.startswith("PIT4") else "reaches past",
        "apart": "differs at" if named.startswith("PIT4") else "tells identical arms apart",
    }[control]
    assert all("A/A control" in v.evidence for v in verdicts.values()), verdicts
    assert any(said in v.evidence for v in verdicts.values()), verdicts
    if control == "wide":  # noise is no regression: the test passes, its verdicts undecided
        result.assert_outcomes(passed=1)
    else:  # identical arms told apart: the negative control fails, naming the claim
        assert_fails_naming(result, named)


def test_an_amp_fp16_without_gain_at_the_largest_size_fails(run_scenario, cuda_waived, monkeypatch):
    """The deciding series of the size sweep, amp-fp16 over fp32, is asserted at the largest
    size, not only amp-bf16's: an fp16 step as slow as fp32's, bf16 still 2x, fails there."""
    monkeypatch.setitem(TRAINING_STEP, "amp-fp16", 1.0)
    monkeypatch.setattr(measure, "compare", _synthetic_compare("tight"))
    result = run_scenario("test_speed.py", "-k", "training_step", plugins=(SPEED,))
    assert_fails_naming(result, "PIT4-ONLY-ABOVE-1B")
    assert_failed_on(result, "*predicted amp-fp16 more than 1.1x faster than fp32*")


@pytest.mark.parametrize(
    ("arm", "relative", "said"),
    [
        ("fp8", 1.0, "*predicted the FP8 kernel above 1.5x bf16's speed at 64*"),
        ("fp8-quantising", 0.8, "*predicted FP8 with its quantisation slower than bf16 at 32*"),
    ],
    ids=["kernel no faster", "quantisation free"],
)
def test_fp8_by_shape_fails_where_its_prediction_breaks(
    run_scenario, fp8_gemms_waived, monkeypatch, arm, relative, said
):
    """An FP8 kernel as slow as bf16 at the largest shape, or FP8 with its quantisation faster
    than bf16 at the smallest, fails the scenario naming the claim (with its control holding)."""
    monkeypatch.setitem(FP8_BY_SHAPE, arm, relative)
    monkeypatch.setattr(measure, "compare", _synthetic_compare("tight"))
    result = run_scenario("test_fp8_speed.py", plugins=(FP8_SPEED,))
    assert_fails_naming(result, "FP8-SPEEDUP-BY-SHAPE")
    assert_failed_on(result, said)


def _fp8_on_cpu() -> str | None:
    try:
        torch._scaled_mm(
            torch.zeros(16, 16).to(torch.float8_e4m3fn),
            torch.zeros(16, 16).to(torch.float8_e4m3fn).t(),
            scale_a=torch.ones(()),
            scale_b=torch.ones(()),
        )
    except (AttributeError, RuntimeError, NotImplementedError) as exc:
        return f"torch {torch.__version__} has no fp8 matmul on the CPU: {exc!s:.120}"
    return None


GEMMS = {"prequantised": fp8.prequantised_gemm, "quantising": fp8.quantising_gemm}


@pytest.mark.parametrize("gemm", GEMMS)
def test_the_fp8_arms_are_valid_scaled_mms_at_full_size(gemm):
    # torch's meta kernel checks what cuBLASLt needs (float8 inputs, the second operand
    # column-major, sizes multiple of 16, float32 scales) without computing anything: at
    # FMT-SPEED's size and at every shape of FP8-SPEEDUP-BY-SHAPE.
    sizes = (load_scenario("test_speed.py").MATMUL_N, *load_scenario("test_fp8_speed.py").SHAPES)
    for n in sizes:
        a = torch.empty(n, n, device="meta", dtype=torch.bfloat16)
        out = GEMMS[gemm](a, a)()
        assert out.shape == (n, n) and out.dtype == torch.bfloat16, (n, out)


@pytest.mark.skipif(_fp8_on_cpu() is not None, reason=str(_fp8_on_cpu()))
@pytest.mark.parametrize("gemm", GEMMS)
def test_the_fp8_arms_multiply_a_by_b(gemm):
    # Timing would not tell a @ b from a @ b.T, nor a wrong scale; the product's values do
    # (e4m3: 3 mantissa bits). Inputs far from 1, so that a scale left out shows.
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(64, 64, generator=generator) * 1e-3 for _ in range(2))
    error = (GEMMS[gemm](a, b)().float() - a @ b).norm() / (a @ b).norm()
    assert error < 0.1, f"fp8 product off by {error:.2f} of a @ b"
