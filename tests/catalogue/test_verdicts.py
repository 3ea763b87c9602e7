"""A verdict counts only when its test passed, and one claim's verdict across several tests
follows one written rule (harness.catalogue.verdicts), the same in the verdict table, `amp-harness
list` and baselines (the report's ledger: tests/reports/test_report.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness import cli
from harness.catalogue import verdicts
from harness.records.journal import Journal
from harness.records.record import Record
from harness.reports import baseline, table


def status(recorded, outcome, message=""):
    return verdicts.status(recorded, "65536 -> 32768", outcome, message, "scenarios/t.py::t")


@pytest.mark.parametrize(
    ("recorded", "outcome", "label", "stands"),
    [
        ("partly", "passed", "partly", True),
        ("partly", "failed", "failed (was: partly)", False),
        ("refuted", "error", "failed (was: refuted)", False),
        (None, "failed", "failed (no verdict)", False),
        ("confirmed", "interrupted", "interrupted (was: confirmed)", False),
        ("skipped", "skipped", "skipped", False),
        ("skipped", "passed", "skipped", False),  # a claim the passing test could not decide
        (None, verdicts.CAPABILITY_REGRESSION, "capability regression", False),
        (verdicts.CANNOT_COMPILE, "passed", "cannot compile", False),  # apart, never a verdict
    ],
)
def test_a_verdict_stands_only_when_its_test_passed(recorded, outcome, label, stands):
    found = status(recorded, outcome, "AssertionError: SCL-SCALE: x")
    assert (found.label, found.stands) == (label, stands)
    if outcome in ("failed", "error") and recorded:
        assert found.evidence == (
            f"test {outcome}: AssertionError: SCL-SCALE: x; recorded before that: 65536 -> 32768"
        )


@pytest.mark.parametrize(
    ("statuses", "label"),
    [
        ([("refuted", "passed"), ("refuted", "passed"), ("skipped", "skipped")], "refuted"),
        ([("skipped", "skipped"), ("refuted", "passed")], "refuted"),  # decided beats skipped
        ([("partly", "passed"), ("refuted", "passed")], "mixed (refuted, partly)"),
        ([("refuted", "passed"), ("partly", "failed")], "failed (1 of 2 tests)"),  # never hides
        (
            [("refuted", "passed"), (None, verdicts.CAPABILITY_REGRESSION)],
            "capability regression (1 of 2 tests)",
        ),
        ([(None, verdicts.CAPABILITY_REGRESSION), (None, "failed")], "failed (1 of 2 tests)"),
        ([("partly", "failed")], "failed (was: partly)"),  # one test: its own status
        ([("skipped", "skipped"), ("skipped", "skipped")], "skipped"),
        ([(verdicts.CANNOT_COMPILE, "passed"), ("refuted", "passed")], "refuted"),
        ([(verdicts.CANNOT_COMPILE, "passed"), ("skipped", "skipped")], "cannot compile"),
        ([(verdicts.CANNOT_COMPILE, "failed")], "failed (was: cannot compile)"),
    ],
)
def test_one_claim_across_tests_follows_the_written_rule(statuses, label):
    found = verdicts.aggregate(status(recorded, outcome) for recorded, outcome in statuses)
    assert found.label == label
    assert found.stands == (label in verdicts.DECIDED or label.startswith("mixed"))
    assert verdicts.aggregate([]) is None


@pytest.mark.parametrize(
    ("failed", "verdict"),
    [
        ({"aot_eager": False, "inductor": None}, "confirmed"),  # the arm that compiled decides
        ({"aot_eager": True, "inductor": None}, "refuted"),
        ({"aot_eager": False, "inductor": True}, "partly"),
        ({"aot_eager": None, "inductor": None}, verdicts.CANNOT_COMPILE),
    ],
)
def test_an_arm_that_cannot_compile_never_decides_a_verdict(failed, verdict):
    assert verdicts.over_arms(failed) == verdict


def test_cannot_compile_is_kept_apart_through_a_summary():
    found = verdicts.from_label(verdicts.CANNOT_COMPILE, False, "AssertionError", "t.py::t")
    assert (found.kind, found.stands) == (verdicts.UNCOMPILED, False)


# --- through a real session -------------------------------------------------------------------

MODULE = """
import pytest

@pytest.mark.claim("NUM-OVERFLOW")
def test_cpu_one(record):
    record.verdict("NUM-OVERFLOW", "refuted", "65520 -> inf")

@pytest.mark.claim("NUM-OVERFLOW")
def test_cpu_two(record):
    record.verdict("NUM-OVERFLOW", "refuted", "65519 -> 65504")

@pytest.mark.claim("NUM-OVERFLOW")
@pytest.mark.requires("cuda")
def test_gpu_only(record):
    raise AssertionError("must not run")

@pytest.mark.claim("FMT-BYTES")
def test_decided_then_failed(record):
    record.verdict("FMT-BYTES", "partly", "2 bytes for 3 of 4 tensors")
    assert False, "FMT-BYTES: predicted 4 of 4"
"""


@pytest.fixture
def ran(pytester: pytest.Pytester) -> pytest.RunResult:
    pytester.makepyfile(**{"scenarios/test_scn": MODULE})
    return pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={pytester.path / 'reports'}",
    )  # fmt: skip


def test_the_table_shows_a_failed_tests_verdict_as_failed_and_aggregates_the_rest(ran):
    ran.assert_outcomes(passed=2, skipped=1, failed=1)
    # A block's first line (in a log, as here): "CLAIM  verdict", two spaces apart.
    cells = [re.split(r"\s{2,}", line) for line in ran.outlines if line[:4] in ("NUM-", "FMT-")]
    verdict_of = {row[0]: row[1] for row in cells if len(row) == 2}
    assert verdict_of["NUM-OVERFLOW"] == "refuted"  # the GPU-only skip does not hide it
    assert verdict_of["FMT-BYTES"] == "failed (was: partly)"
    assert "partly" not in verdict_of.values()
    ran.stdout.fnmatch_lines(["2 claims: 1 refuted, 1 failed (*"])


def test_list_shows_the_claims_verdict_across_the_last_sessions_tests(ran, pytester, capsys):
    reports = str(pytester.path / "reports")
    assert cli.main(["list", "--json", "--reports", reports, "--scenarios", "nowhere"]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    overflow = rows["NUM-OVERFLOW"]
    assert overflow["last_verdict"] == "refuted"  # was "skipped": the test that ran last
    assert [t["status"] for t in overflow["last_tests"]] == ["refuted", "refuted", "skipped"]
    assert rows["FMT-BYTES"]["last_verdict"] == "failed (was: partly)"
    assert rows["FMT-BYTES"]["last_tests"][0]["status"] == "failed (was: partly)"


def test_list_passes_over_an_experimental_session(ran, pytester, capsys):
    reports = str(pytester.path / "reports")
    pytester.makepyfile(**{"scenarios/test_scn": EXPERIMENT})
    pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={reports}", "--amp-experimental-reason", "an injected change",
    ).assert_outcomes(passed=1)  # fmt: skip
    capsys.readouterr()
    assert cli.main(["list", "--json", "--reports", reports, "--scenarios", "nowhere"]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["FMT-BYTES"]["last_verdict"] == "failed (was: partly)"  # the session of record's
    (sid,) = list(Journal(pytester.path / "reports" / "journal.jsonl").index())[-1:]
    assert cli.main(["sessions", "--reports", reports, "mark", sid, "record"]) == 0
    capsys.readouterr()
    assert cli.main(["list", "--json", "--reports", reports, "--scenarios", "nowhere"]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["FMT-BYTES"]["last_verdict"] == "confirmed"  # of record again: the latest


EXPERIMENT = """
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_injected(record):
    record.verdict("FMT-BYTES", "confirmed", "2 bytes for 4 of 4 tensors")
"""


def test_a_failed_tests_verdict_never_enters_a_baseline_as_valid(ran, pytester):
    summary = baseline.summarize(Journal(pytester.path / "reports" / "journal.jsonl"))
    by_test = {v["test"].split("::")[-1]: v for v in summary["verdicts"]}
    failed = by_test["test_decided_then_failed"]
    assert (failed["verdict"], failed["stands"]) == ("failed (was: partly)", False)
    assert by_test["test_cpu_one"]["stands"] and not by_test["test_gpu_only"]["stands"]
    assert not summary["complete"]
    assert summary["lacks"] == ["1 test(s) failed: test_decided_then_failed"]


def test_the_summary_counts_cannot_compile_apart_from_the_verdicts():
    records = []
    for claim, recorded in (
        ("CMP-BLOCK-DTYPES", "confirmed"),
        ("CMP-LOSS-CURVE", "cannot compile"),
    ):
        record = Record(f"scenarios/t.py::{claim}", [claim], "cpu", Path("/nonexistent"))
        record.verdict(claim, recorded, "aot_eager: 0 mismatches; inductor raised at 1 call")
        record.outcome = "passed"
        records.append(record)
    assert "2 claims: 1 confirmed, 1 cannot compile" in table.counts_line(records)
