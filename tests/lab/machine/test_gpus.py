"""gpus: the datasheet table (lookup by CUDA device name, validation of the file) and the
decisions the speed scenarios (scenarios/test_speed.py) take from measured ratios, on synthetic
numbers."""

from __future__ import annotations

import json

import pytest
from conftest import load_scenario

from harness.common.errors import HarnessError
from harness.lab.machine import gpus
from harness.lab.machine.gpus import GpuTableError
from harness.lab.measure import Ratio

speed = load_scenario("test_speed.py")  # its decision functions, tested without a GPU

M, B = 10**6, 10**9
SIZES = [M, 10 * M, 100 * M, B]


def ratio(low: float, high: float) -> Ratio:
    return Ratio((low + high) / 2, low, high, 0.95, 10)


BELOW = ratio(0.9, 1.0)  # against 1.1: decided below
UNSURE = ratio(1.0, 1.2)  # straddles 1.1
ABOVE = ratio(1.3, 1.5)


# --- the table ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_name", "entry"),
    [
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),  # not the SXM part: 84% of its tensor math
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM5 80GB"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),  # the longer match wins over "H100"
        ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("NVIDIA L4", "L4"),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
    ],
)
def test_a_device_name_finds_its_entry(device_name, entry):
    assert gpus.spec(device_name).name == entry


@pytest.mark.parametrize(
    "device_name", ["NVIDIA L40S", "Tesla V100S-PCIE-32GB", "NVIDIA GeForce RTX 4090", "cpu"]
)
def test_an_unknown_gpu_has_no_entry(device_name):
    # "L4" and "V100" are matched as whole words only: an L40S is not an L4.
    assert gpus.spec(device_name) is None


def test_h200_reads_its_own_datasheet_not_h100s():
    h200, h100 = gpus.spec("NVIDIA H200"), gpus.spec("NVIDIA H100 80GB HBM3")
    assert (h200.fp32, h200.tf32, h200.fp16, h200.bf16, h200.fp8) == (67, 495, 989, 989, 1979)
    assert (h200.bandwidth_tbs, h100.bandwidth_tbs) == (4.8, 3.35)


def test_the_table_holds_dense_numbers():
    # Dense tensor-core math doubles from tf32 to fp16 and again to fp8, and is never below the
    # CUDA cores' plain fp32; a sparse number slipped in would break the doubling.
    for gpu in gpus.table():
        assert gpu.source.strip() and gpu.match
        if gpu.tf32:
            assert gpu.fp32 < gpu.tf32 and gpu.fp16 == pytest.approx(2 * gpu.tf32, rel=0.02)
        if gpu.bf16:
            assert gpu.bf16 == gpu.fp16
        if gpu.fp8:
            assert gpu.fp8 == pytest.approx(2 * gpu.fp16, rel=0.01)
        assert gpu.fp32 < gpu.fp16


def test_peak_names_the_formats():
    assert gpus.spec("NVIDIA A100-SXM4-80GB").peak("fp8") is None
    with pytest.raises(HarnessError, match="unknown format 'int8'.*fp32, tf32"):
        gpus.spec("NVIDIA H200").peak("int8")


GOOD = {
    "name": "X100",
    "match": ["X100"],
    "tflops": {"fp32": 10, "tf32": 20, "fp16": 40, "bf16": 40, "fp8": None},
    "bandwidth_tbs": 1.0,
    "source": "a datasheet",
}


def write(tmp_path, doc):
    path = tmp_path / "gpus.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return path


def test_a_valid_file_loads(tmp_path):
    (gpu,) = gpus.load_table(write(tmp_path, {"gpus": [GOOD]}))
    assert (gpu.name, gpu.match, gpu.peak("fp16"), gpu.fp8) == ("X100", ("X100",), 40, None)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"match": []}, r'gpus\[0\] \(X100\): field "match" must be a non-empty list'),
        ({"source": " "}, r'gpus\[0\] \(X100\): field "source" must be non-empty'),
        ({"bandwidth_tbs": "fast"}, r'field "bandwidth_tbs" must be a positive number'),
        ({"tflops": {**GOOD["tflops"], "fp16": -1}}, r'field "tflops.fp16" must be a positive'),
        ({"tflops": {**GOOD["tflops"], "fp32": None}}, r'"tflops.fp32" must be a positive number,'),
        ({"tflops": {**GOOD["tflops"], "fp16": True}}, r'"tflops.fp16" must be .* got True'),
        ({"tflops": {"fp32": 1}}, r'field "tflops" must be an object with exactly the formats'),
        ({"speed": 1}, r"unknown field\(s\) \['speed'\]"),
    ],
)
def test_a_bad_entry_names_file_entry_and_field(tmp_path, change, message):
    path = write(tmp_path, {"gpus": [{**GOOD, **change}]})
    with pytest.raises(GpuTableError, match=message) as caught:
        gpus.load_table(path)
    assert str(caught.value).startswith(f"{path}: gpus[0]")


def test_a_missing_field_is_named(tmp_path):
    entry = {k: v for k, v in GOOD.items() if k != "tflops"}
    with pytest.raises(GpuTableError, match=r"missing field\(s\) \['tflops'\]"):
        gpus.load_table(write(tmp_path, {"gpus": [entry]}))


def test_a_match_claimed_twice_is_ambiguous(tmp_path):
    other = {**GOOD, "name": "X100 PCIe", "match": ["X100 PCIe", "x100"]}
    with pytest.raises(GpuTableError, match=r'gpus\[1\] \(X100 PCIe\).*"x100" is already a match'):
        gpus.load_table(write(tmp_path, {"gpus": [GOOD, other]}))


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("{not json", "cannot read the GPU table"),
        ({"gpus": []}, 'a non-empty "gpus" list'),
        ([GOOD], 'a non-empty "gpus" list'),
        ({"gpus": [GOOD, GOOD]}, r'gpus\[1\]: name "X100" appears twice'),
        ({"gpus": ["X100"]}, r"gpus\[0\]: expected an object"),
    ],
)
def test_a_bad_file_names_itself(tmp_path, doc, message):
    path = write(tmp_path, doc)
    with pytest.raises(GpuTableError, match=message) as caught:
        gpus.load_table(path)
    assert str(caught.value).startswith(str(path))


def test_the_most_specific_match_wins_whatever_the_order(tmp_path):
    pcie = {**GOOD, "name": "X100 PCIe", "match": ["X100 PCIe"]}
    table = gpus.load_table(write(tmp_path, {"gpus": [pcie, GOOD]}))
    assert gpus.spec("Vendor X100 PCIe", table).name == "X100 PCIe"
    assert gpus.spec("Vendor X100-SXM", table).name == "X100"
    assert gpus.spec("Vendor X1000", table) is None


# --- telling variants apart: the name, then the figures the device reports -----------------

SXM_H200 = gpus.GpuFigures(140.4, 132, 1980, 700)  # what an SXM H200 reports
NVL_H200 = gpus.GpuFigures(140.4, 132, 1785, 600)


def test_an_h200_nvl_reads_its_own_datasheet():
    sxm, nvl = gpus.spec("NVIDIA H200"), gpus.spec("NVIDIA H200 NVL")
    assert (nvl.fp32, nvl.tf32, nvl.fp16, nvl.bf16, nvl.fp8) == (60, 417.5, 835.5, 835.5, 1670.5)
    assert nvl.bandwidth_tbs == sxm.bandwidth_tbs == 4.8 and nvl.fp16 < sxm.fp16


@pytest.mark.parametrize(
    ("name", "figures", "entry"),
    [
        ("NVIDIA H200", SXM_H200, "H200 SXM"),
        ("NVIDIA H200 NVL", NVL_H200, "H200 NVL"),
        ("NVIDIA H200", gpus.GpuFigures(140.4, 132, max_power_w=700), "H200 SXM"),  # no clock
        ("NVIDIA H200", gpus.GpuFigures(140.4, 132, max_sm_clock_mhz=1980), "H200 SXM"),  # no NVML
        ("NVIDIA H100 80GB HBM3", gpus.GpuFigures(79.6, 132), "H100 SXM5 80GB"),
        ("NVIDIA H100 PCIe", gpus.GpuFigures(79.6, 114), "H100 PCIe"),
        ("NVIDIA L4", None, "L4"),  # no variants in the table: by name
    ],
)
def test_the_figures_confirm_the_name(name, figures, entry):
    found = gpus.identify(name, figures)
    assert (found.spec.name, found.sure) == (entry, True), found.how


def test_an_nvl_named_like_the_sxm_part_is_told_by_its_power_limit():
    found = gpus.identify("NVIDIA H200", gpus.GpuFigures(140.4, 132, max_power_w=600))
    assert (found.spec.name, found.sure) == ("H200 NVL", True)
    assert "the name reads H200 SXM" in found.how and "600 W maximum power limit" in found.how


@pytest.mark.parametrize("figures", [gpus.GpuFigures(140.4, 132), None])
def test_figures_that_cannot_tell_the_variants_apart_leave_it_unsure(figures):
    # Memory and SMs are the same on both H200s: only the power limit or the clock decides.
    found = gpus.identify("NVIDIA H200", figures)
    assert (found.spec.name, found.sure) == ("H200 SXM", False)
    assert "by name only" in found.how and "H200 SXM and H200 NVL alike" in found.how


def test_figures_that_fit_no_variant_give_no_entry():
    # A MIG slice of an H200: a fraction of the memory and SMs, none of the datasheet's peaks.
    found = gpus.identify("NVIDIA H200", gpus.GpuFigures(17.8, 16))
    assert (found.spec, found.sure) == (None, False)
    assert "fit none of H200 SXM and H200 NVL" in found.how
    assert gpus.identify("NVIDIA GeForce RTX 4090", None).spec is None


@pytest.mark.parametrize(
    ("figures", "message"),
    [
        ({"max_power_w": [700]}, r'field "figures.max_power_w" must be a range \[low, high\]'),
        ({"max_power_w": [750, 650]}, r'"figures.max_power_w" must be .* low <= high'),
        ({"watts": [1, 2]}, r'"figures.watts" is not a known figure: use total_memory_gib'),
        ([1, 2], r'field "figures" must be an object of \[low, high\] ranges'),
    ],
)
def test_bad_figures_name_the_field(tmp_path, figures, message):
    with pytest.raises(GpuTableError, match=message):
        gpus.load_table(write(tmp_path, {"gpus": [{**GOOD, "figures": figures}]}))


# --- crossover -----------------------------------------------------------------------------


def test_crossover_is_where_the_gain_starts_and_stays():
    assert speed.crossover(SIZES, [BELOW, UNSURE, ABOVE, ABOVE]) == 100 * M
    # A lone significant gain at 1M, lost at 10M, is not where AMP starts to pay.
    assert speed.crossover(SIZES, [ABOVE, BELOW, ABOVE, ABOVE]) == 100 * M
    assert speed.crossover(SIZES, [ABOVE] * 4) == M


def test_no_crossover_unless_the_largest_size_gains():
    assert speed.crossover(SIZES, [ABOVE, ABOVE, ABOVE, UNSURE]) is None
    assert speed.crossover(SIZES, [BELOW] * 4) is None
    assert speed.crossover([], []) is None


def test_crossover_sorts_by_size_and_takes_a_threshold():
    assert speed.crossover(SIZES[::-1], [ABOVE, ABOVE, BELOW, BELOW]) == 100 * M
    assert speed.crossover(SIZES, [ABOVE, ABOVE, ABOVE, ratio(2.6, 3.0)], threshold=2.5) == B
    with pytest.raises(ValueError, match="4 sizes but 3 ratios"):
        speed.crossover(SIZES, [ABOVE] * 3)


def test_size_label():
    assert [speed.size_label(n) for n in (500, 2_000, M, 1_006_894, B, 1_010_000_000)] == [
        "500",
        "2k",
        "1M",
        "1.01M",
        "1B",
        "1.01B",
    ]


# --- FMT-SPEED -----------------------------------------------------------------------------
# "About 2-8x": each edge widened by 25%, 1.6-10x, against strict fp32 (the article's baseline)
# and TF32. An H200's fp16 matmul is ~14x strict fp32 and ~1.8x TF32: partly, not refuted.


@pytest.mark.parametrize(
    ("vs_fp32", "vs_tf32", "verdict", "words"),
    [
        (ratio(3, 5), ratio(1.0, 1.2), "confirmed", "inside the 1.6-10x band"),  # a V100-era GPU
        (ratio(12, 14), ratio(2.2, 2.5), "partly", "against TF32 only"),
        (ratio(12, 14), ratio(1.7, 1.9), "partly", "against TF32 only"),  # H200
        (ratio(12, 14), ratio(1.3, 1.5), "refuted", "outside the band against both"),
        (ratio(1.2, 1.5), ratio(0.9, 1.1), "refuted", "below the 1.6-10x band"),
        (ratio(9, 11), ratio(1.7, 1.9), "inconclusive", "straddles"),
        (ratio(12, 14), ratio(1.5, 1.7), "inconclusive", "straddles"),
    ],
)
def test_fmt_speed_verdict(vs_fp32, vs_tf32, verdict, words):
    decided, reason = speed.verdict_fmt_speed(vs_fp32, vs_tf32)
    assert decided == verdict
    assert words in reason and f"{vs_fp32.describe()}" in reason
    assert "strict fp32, TF32 off, the baseline it means" in reason


ABOVE_BAND, BELOW_BAND = ratio(12, 14), ratio(1.0, 1.3)


@pytest.mark.parametrize(
    ("vs_fp32", "vs_tf32", "verdict"),
    [
        # The lower edge, 2 / 1.25 = 1.6, against TF32 (strict fp32 far above the band).
        (ABOVE_BAND, ratio(1.6, 1.9), "partly"),  # touching the edge is inside
        (ABOVE_BAND, ratio(1.599, 1.9), "inconclusive"),  # reaching past it straddles
        (ABOVE_BAND, ratio(1.3, 1.599), "refuted"),  # wholly below
        # The upper edge, 8 x 1.25 = 10, against strict fp32.
        (ratio(9, 10), BELOW_BAND, "confirmed"),
        (ratio(9, 10.01), BELOW_BAND, "inconclusive"),
        (ratio(10.01, 12), BELOW_BAND, "refuted"),
        # The lower edge against strict fp32 decides alone once it is inside.
        (ratio(1.6, 2.0), ratio(0.8, 0.9), "confirmed"),
        (ratio(1.599, 2.0), ratio(0.8, 0.9), "inconclusive"),
    ],
)
def test_fmt_speed_band_edges(vs_fp32, vs_tf32, verdict):
    assert speed.verdict_fmt_speed(vs_fp32, vs_tf32)[0] == verdict


@pytest.mark.parametrize(
    ("vs_fp32", "verdict"),
    [
        (ratio(3, 5), "confirmed"),  # a V100's fp16 tensor cores against strict fp32
        (ratio(12, 14), "refuted"),
        (ratio(1.2, 1.5), "refuted"),
        (ratio(9, 11), "inconclusive"),
    ],
)
def test_fmt_speed_without_tf32_reads_strict_fp32_alone(vs_fp32, verdict):
    decided, reason = speed.verdict_fmt_speed(vs_fp32, None)
    assert decided == verdict and "no TF32 on this GPU: strict fp32 decides alone" in reason


def test_fmt_speed_tolerance_is_stated_and_an_interval_needs_its_rounds():
    h200 = (ratio(12, 14), ratio(1.7, 1.9))
    assert speed.about((2.0, 8.0), 0.25) == (1.6, 10.0)
    assert speed.verdict_fmt_speed(*h200, tolerance=0.0)[0] == "refuted"  # strict 2-8x
    decided, reason = speed.verdict_fmt_speed(*h200)
    assert decided == "partly" and "each edge widened by 25%" in reason
    # The module's rule is this one: the band and its tolerance as the scenario passes them.
    assert (speed.SPEED_BAND, speed.SPEED_TOLERANCE) == ((2.0, 8.0), 0.25)
    # An interval of too few rounds decides no side of an edge, however narrow it is.
    few = Ratio(4.0, 3.9, 4.1, 0.95, 5)
    assert speed.verdict_fmt_speed(few, ratio(1.0, 1.2))[0] == "inconclusive"


# --- PIT4 ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("small", "verdict", "words"),
    [
        ([BELOW, BELOW], "confirmed", "above 1.1x at none"),
        ([ABOVE, ABOVE], "refuted", "above 1.1x at 1M, 10M; below at none"),
        ([BELOW, ABOVE], "partly", "above 1.1x at 10M; below at 1M"),
        ([BELOW, UNSURE], "inconclusive", "undecided at 10M"),
        ([ABOVE, UNSURE], "inconclusive", "undecided at 10M"),
    ],
)
def test_small_no_gain_verdict_reads_sizes_under_100m(small, verdict, words):
    # 100M and 1B do not count, whatever they show.
    decided, reason = speed.verdict_small_no_gain(SIZES, [*small, UNSURE, ABOVE])
    assert decided == verdict
    assert words in reason


def test_small_no_gain_takes_real_counts():
    # A model planned for 100M lands within 10% of it: 98.6M is the 100M size, not a small one.
    sizes = [1_006_894, 9_945_810, 98_600_000]
    assert speed.verdict_small_no_gain(sizes, [BELOW, BELOW, ABOVE])[0] == "confirmed"
    assert speed.verdict_small_no_gain([100 * M, B], [BELOW, ABOVE])[0] == "inconclusive"


@pytest.mark.parametrize(
    ("ratios", "verdict", "words"),
    [
        ([BELOW, BELOW, ABOVE, ABOVE], "refuted", "from 100M on: AMP pays below 1B"),
        ([BELOW, BELOW, BELOW, ABOVE], "confirmed", "from 1B on, and at no smaller size"),
        ([BELOW, BELOW, BELOW, BELOW], "confirmed", "no size up to 1B"),
        ([BELOW, UNSURE, BELOW, ABOVE], "inconclusive", "not all below (10M)"),
        ([ABOVE, BELOW, BELOW, ABOVE], "inconclusive", "not all below (1M)"),
        ([BELOW, BELOW, ABOVE, UNSURE], "inconclusive", "no crossover: 1M below"),
        ([UNSURE] * 4, "inconclusive", "1B undecided"),
    ],
)
def test_only_above_1b_verdict_follows_the_crossover(ratios, verdict, words):
    decided, reason = speed.verdict_only_above_1b(SIZES, ratios)
    assert decided == verdict
    assert words in reason


def test_only_above_1b_needs_a_size_near_1b_to_confirm_no_gain():
    assert speed.verdict_only_above_1b(SIZES[:3], [BELOW] * 3)[0] == "inconclusive"
    assert speed.verdict_only_above_1b([*SIZES[:3], 985_000_000], [BELOW] * 4)[0] == "confirmed"
