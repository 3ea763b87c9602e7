"""Hardware as a cause: `compare` attributes each change to what differs between the two runs'
environments, and a change the hardware explains (the classes differ in a capability the test
depends on, or in the class itself for a timing or statistical metric) is shown, never a
regression; `amp-harness baseline changes` groups baselines by class and sets one torch release's
classes side by side. Every positive has its negative control: the same change where the hardware
does not explain it fails the gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from harness import cli
from harness.reports import baseline, changes, compare, comparison_view, differences, kinds
from harness.reports.comparison import Comparison, MetricChange

TEST = "scenarios/test_autocast_atlas.py::test_the_documented_autocast_lists_hold[bfloat16]"
TIMING = "scenarios/test_speed.py::test_amp_is_faster"
CLAIM = "AUTOCAST-LOWER-LIST"
EVIDENCE = {"confirmed": "every op on the lower list ran in bfloat16 (lstm included)",
            "partly": "41 of 42 ops ran in bfloat16; lstm raises: no bf16 RNN kernel"}  # fmt: skip
XEON = {
    "device": "cpu", "cpu": "x86_64", "torch": "2.13.0+cpu", "git_commit": "0123456789ab",
    "hardware_class": "cpu-x86-64-avx512-bf16", "capability.bf16_rnn": "yes",
    "capability.fp16_rnn": "yes", "cpu.model": "Intel Xeon Platinum 8480+",
    "cpu.instructions": "avx2 avx512 avx512-bf16 amx", "onednn": "3.7.1",
}  # fmt: skip
EPYC = {**XEON, "hardware_class": "cpu-x86-64-avx2", "capability.bf16_rnn": "no",
        "cpu.model": "AMD EPYC 7763", "cpu.instructions": "avx2"}  # fmt: skip
XEON_NEXT = {**XEON, "torch": "2.14.1+cu130"}  # the same class, the next torch release
CLASSES = "cpu-x86-64-avx512-bf16 vs cpu-x86-64-avx2"


def summary(facts: dict, verdict: str = "confirmed", depends=("bf16_rnn",), **metrics) -> dict:
    """A baseline summary of the atlas test (baseline.summarize's shape), its verdict on the
    lower list, its hardware dependencies and `metrics` (names in `key` are key metrics)."""
    key = metrics.pop("key", ())
    return {
        "format": baseline.FORMAT,
        "session_id": baseline.filename(facts),
        "name": baseline.filename(facts),
        "started": 0,
        "complete": True,
        "lacks": [],
        "fingerprint": facts,
        "verdicts": [
            {
                "claim": CLAIM,
                "verdict": verdict,
                "stands": True,
                "evidence": EVIDENCE[verdict],
                "test": TEST,
            }
        ],  # fmt: skip
        "tests": {
            TEST: {
                "outcome": "passed",
                "claims": [CLAIM],
                "metrics": metrics,
                "key_metrics": list(key),
                "depends_on_hardware": list(depends),
            }
        },
    }


def rendered(comparison: Comparison) -> list[str]:
    console = Console(record=True, width=160)
    comparison_view.render(comparison, console)
    return console.export_text().splitlines()


# --- a changed verdict ------------------------------------------------------------------------


def test_a_verdict_that_follows_a_capability_the_classes_differ_in_is_explained():
    """The issue: an AVX2 runner has no bf16 LSTM, so the lower list is `partly` there."""
    result = compare.compare(summary(XEON), summary(EPYC, "partly"))
    (change,) = result.verdicts
    assert change.attribution.explained
    assert change.attribution.why == (
        "explained by the hardware: cpu-x86-64-avx512-bf16 and cpu-x86-64-avx2 differ in what "
        "the test depends on: bf16_rnn: yes vs no"
    )
    assert result.regressions == [] and not result.fails_the_gate
    assert result.explained == [change.describe()]
    assert change.describe().endswith(change.attribution.why)
    assert result.summary_line() == (
        f"regressions: 0; 1 difference explained by the hardware ({CLASSES}) "
        "(1 verdicts, 0 metrics compared)"
    )
    lines = rendered(result)
    assert lines[0].startswith(
        "across hardware classes: cpu-x86-64-avx512-bf16 (A) vs cpu-x86-64-avx2 (B)"
    )
    assert any("why: explained by the hardware" in line for line in lines)
    document = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert document["across_hardware"] is True
    assert document["hardware_classes"] == ["cpu-x86-64-avx512-bf16", "cpu-x86-64-avx2"]
    assert document["regressions"] == [] and len(document["explained"]) == 1
    assert document["verdict_changes"][0]["attribution"]["kind"] == kinds.HARDWARE


def test_the_same_change_on_one_class_is_a_regression_of_the_torch_release():
    """Negative control: only torch differs, so the same verdict change fails the gate, with
    the evidence that names the op."""
    result = compare.compare(summary(XEON), summary(XEON_NEXT, "partly"))
    (line,) = result.regressions
    assert result.fails_the_gate and result.explained == []
    assert "lstm raises" in line
    assert line.endswith(
        "not explained by the hardware; differs: the torch release "
        "(torch 2.13.0+cpu -> 2.14.1+cu130)"
    )
    assert result.summary_line().startswith("regressions: 1 (")
    assert not rendered(result)[0].startswith("across hardware classes")
    assert result.to_json()["across_hardware"] is False


@pytest.mark.parametrize(
    ("depends", "said"),
    [
        (("fp16_rnn",), "but not what the test depends on (fp16_rnn)"),  # yes on both
        ((), "and the test depends on no capability of it"),
    ],
)
def test_across_classes_a_change_the_tests_dependencies_do_not_explain_fails(depends, said):
    """Negative control: the classes differ, but in nothing this test depends on."""
    result = compare.compare(summary(XEON, depends=depends), summary(EPYC, "partly", depends))
    (line,) = result.regressions
    assert result.fails_the_gate and result.explained == []
    assert line.endswith(
        "not explained by the hardware; differs: the hardware class "
        f"(cpu-x86-64-avx512-bf16 -> cpu-x86-64-avx2), {said}"
    )


def test_a_change_with_nothing_different_says_so_and_names_a_new_commit():
    result = compare.compare(summary(XEON), summary(XEON, "partly"))
    assert result.regressions[0].endswith(
        " -- nothing in the environment differs: the harness or noise"
    )
    edited = {**XEON, "git_commit": "fedcba987654"}
    (line,) = compare.compare(summary(XEON), summary(edited, "partly")).regressions
    assert line.endswith(
        "nothing in the environment differs: the harness or noise; the commit changed "
        "(0123456789ab -> fedcba987654)"
    )


# --- lost decisions ---------------------------------------------------------------------------


BITS = "scenarios/test_formats.py::test_bits"


def lost(facts: dict, depends: tuple[str, ...]) -> Comparison:
    """The claim decided on the Xeon, skipped on `facts` by a test of its own; both runs
    share another verdict, so that they overlap."""
    before, after = summary(XEON, depends=depends), summary(facts, depends=depends)
    after["verdicts"][0].update(verdict="skipped", stands=False, evidence="needs bf16", test=TIMING)
    after["tests"] = {TIMING: {**after["tests"].pop(TEST), "outcome": "skipped"}}
    for run in (before, after):
        run["verdicts"].append({"claim": "FMT-BITS", "verdict": "confirmed", "stands": True,
                                "evidence": "5/10 bits", "test": BITS})  # fmt: skip
        run["tests"][BITS] = {"outcome": "passed", "claims": ["FMT-BITS"], "metrics": {}}
    return compare.compare(before, after)


def test_a_decision_lost_with_a_capability_of_its_tests_is_explained():
    result = lost(EPYC, ("bf16_rnn",))
    (decision,) = result.lost
    assert decision.attribution.explained and result.overlapped and not result.fails_the_gate
    # Negative controls: on the same class, or without that dependency, it is a regression.
    for regressed in (lost(XEON_NEXT, ("bf16_rnn",)), lost(EPYC, ())):
        (line,) = regressed.regressions
        assert line.startswith(f"{CLAIM}: decided (confirmed) before, skipped now: needs bf16")


# --- metrics ----------------------------------------------------------------------------------

SEEDS = {f"seed{i}/ratio": v for i, v in enumerate((1.0, 1.1, 1.05))}
SLOWER = {f"seed{i}/ratio": v for i, v in enumerate((2.0, 2.1, 2.05))}


def metric(before: dict, after: dict, depends=(), key=()) -> MetricChange:
    a = summary(XEON, depends=depends, key=key, **before)
    b = summary(after.pop("_facts"), depends=depends, key=key, **after)
    (change,) = compare.compare(a, b).metrics
    assert change.flagged
    return change


def test_a_timing_tests_key_metric_across_classes_is_explained_by_the_class():
    change = metric({"speedup": 2.0}, {"_facts": EPYC, "speedup": 1.2}, ("class",), ("speedup",))
    assert change.attribution.why == (
        f"explained by the hardware: measured on another hardware class ({CLASSES})"
    )
    # Negative control: a key metric without a dependency is the behaviour changing.
    change = metric({"speedup": 2.0}, {"_facts": EPYC, "speedup": 1.2}, (), ("speedup",))
    assert not change.attribution.explained
    assert "the test depends on no capability of it" in change.attribution.why


def test_a_statistical_metric_across_classes_is_explained_whatever_the_test_depends_on():
    change = metric(SEEDS, {"_facts": EPYC, **SLOWER})
    assert change.attribution == kinds.Attribution(
        kinds.HARDWARE,
        f"explained by the hardware: measured on another hardware class ({CLASSES}): the "
        "kernels of another instruction set round differently",
    )
    # Negative control: on one class the same shift is a regression of the torch release.
    change = metric(SEEDS, {"_facts": XEON_NEXT, **SLOWER})
    assert not change.attribution.explained and "the torch release" in change.attribution.why


# --- fingerprints from before hardware classes ------------------------------------------------


def test_a_legacy_fingerprints_class_is_only_a_name_and_differs_only_by_it():
    legacy = {k: v for k, v in XEON.items() if k != "hardware_class"}
    result = compare.compare(summary(legacy), summary(EPYC, "partly"))
    notes = result.hardware_notes()
    assert result.classes == ("cpu-x86-64", "cpu-x86-64-avx2") and result.across_hardware
    assert notes[1].startswith("hardware class only a name: A's cpu-x86-64 (a fingerprint")
    first, second = rendered(result)[:2]  # the notes first, before A and B
    assert first == notes[0] and notes[1].startswith(second)
    same = compare.compare(summary(legacy), summary(legacy, "partly"))
    assert not same.across_hardware and same.legacy == ("A", "B")
    assert len(same.hardware_notes()) == 1 and same.fails_the_gate


# --- the report's comparison rows -------------------------------------------------------------


def test_the_reports_comparison_rows_carry_the_attribution(monkeypatch, tmp_path):
    path = tmp_path / "base.json"
    path.write_text(json.dumps(summary(XEON)))
    last = summary(EPYC, "partly", depends=("bf16_rnn",), **SLOWER)
    monkeypatch.setattr(baseline, "load", lambda spec, journal: ("session x", last))
    base = summary(XEON, **SEEDS)
    monkeypatch.setattr(baseline, "read_baseline", lambda given: base)
    rows = cli.report.baseline_comparison(tmp_path, str(path), tmp_path)
    assert [row["change"] for row in rows] == [
        "hardware",
        "verdict, explained by the hardware",
        "metric, flagged, explained by the hardware",
    ]
    assert rows[1]["what"].startswith(f"{CLAIM} ({TEST}): verdict confirmed -> partly")
    assert "bf16_rnn: yes vs no" in rows[1]["why"]
    # Negative control: on one class both are regressions, listed first as such.
    on_one_class = {**last, "fingerprint": XEON}
    monkeypatch.setattr(baseline, "load", lambda spec, journal: ("x", on_one_class))
    rows = cli.report.baseline_comparison(tmp_path, str(path), tmp_path)
    assert [row["change"] for row in rows] == ["verdict", "metric, flagged"]


# --- differences: the report's ledger and `baseline changes` ----------------------------------


def column(label: str, facts: dict, verdict: str, depends=("bf16_rnn",)) -> differences.Column:
    return differences.Column(
        label, "cpu", facts["torch"], {CLAIM: verdict}, {TEST: ([CLAIM], {})}, facts,
        {TEST: set(depends)},
    )  # fmt: skip


def test_a_difference_across_classes_names_the_hardware_and_its_columns():
    columns = [column("xeon", XEON, "confirmed"), column("epyc", EPYC, "partly"),
               column("next", XEON_NEXT, "confirmed")]  # fmt: skip
    found = differences.find([CLAIM], columns)[CLAIM]
    assert found.hardware == [  # once for both pairs: the classes in order
        "cpu-x86-64-avx2 and cpu-x86-64-avx512-bf16 differ in what the test depends on: "
        "bf16_rnn: no vs yes"
    ]
    assert found.hardware_columns == ["xeon", "epyc", "next"]  # each disagrees with epyc
    assert "Differs with the hardware: cpu-x86-64-avx2 and" in found.summary()
    # Negative control: without the dependency, the same difference has no hardware reason.
    columns = [column("xeon", XEON, "confirmed", ()), column("epyc", EPYC, "partly", ())]
    found = differences.find([CLAIM], columns)[CLAIM]
    assert (found.hardware, found.hardware_columns) == ([], [])


def write(folder: Path, facts: dict, verdict: str, depends=("bf16_rnn",)) -> None:
    (folder / baseline.filename(facts)).write_text(json.dumps(summary(facts, verdict, depends)))


def test_the_changes_page_has_a_section_per_class_and_one_across_classes(tmp_path):
    write(tmp_path, XEON, "confirmed")
    write(tmp_path, XEON_NEXT, "partly")  # a torch change on one class
    write(tmp_path, EPYC, "partly")
    legacy = {k: v for k, v in {**XEON, "torch": "2.4.1"}.items() if k != "hardware_class"}
    write(tmp_path, legacy, "confirmed")
    page = changes.page(tmp_path)
    assert page == changes.page(tmp_path)  # deterministic
    sections = [line for line in page.splitlines() if line.startswith("## ")]
    assert sections == [
        "## cpu-x86-64: torch 2.4.1",
        "## cpu-x86-64-avx2: torch 2.13.0+cpu",
        "## cpu-x86-64-avx512-bf16: torch 2.13.0+cpu, 2.14.1+cu130",
        "## Across hardware classes",
    ]
    legacy_section = page.split("## cpu-x86-64: torch 2.4.1")[1].split("\n## ")[0]
    assert "The class cpu-x86-64 is only a name for these baselines" in legacy_section
    xeon = page.split("## cpu-x86-64-avx512-bf16")[1].split("\n## ")[0]
    assert f"| {CLAIM} | 2.13.0+cpu → 2.14.1+cu130 |" in xeon
    assert "only a name" not in xeon
    across = page.split("## Across hardware classes")[1]
    (row,) = [line for line in across.splitlines() if line.startswith(f"| {CLAIM}")]
    assert row.startswith(
        f"| {CLAIM} | 2.13.0+cpu | cpu-x86-64-avx2, cpu-x86-64-avx512-bf16 | "
        "verdict partly (cpu-x86-64-avx2) vs confirmed (cpu-x86-64-avx512-bf16) |"
    )
    assert row.endswith("differ in what the test depends on: bf16_rnn: no vs yes |")


def test_across_classes_a_difference_without_a_dependency_is_said_unexplained(tmp_path):
    write(tmp_path, XEON, "confirmed", ())
    write(tmp_path, EPYC, "partly", ())
    across = changes.page(tmp_path).split("## Across hardware classes")[1]
    (row,) = [line for line in across.splitlines() if line.startswith(f"| {CLAIM}")]
    assert row.endswith("| not explained by a capability the tests depend on |")
    # And where the classes agree, the section says so.
    write(tmp_path, EPYC, "confirmed", ())
    assert "No claim's verdict or key metric differs between the hardware classes." in (
        changes.page(tmp_path)
    )
