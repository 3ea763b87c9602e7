"""The verdict table at the end of a session shows evidence capped: 1 MB of evidence once printed
31,791 terminal lines. The full text stays in the journal (and in record.json in MLflow)."""

from __future__ import annotations

import json

import pytest

from harness.lab import devices
from harness.reports.table import IN_THE_JOURNAL, cap

HUGE = """
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_one_long_line(record):
    record.verdict("FMT-BYTES", "confirmed", "ratio 0.5; " * 100_000)

@pytest.mark.claim("FMT-BITS")
def test_many_lines(record):
    record.verdict("FMT-BITS", "confirmed", "step 1: 0.5\\n" * 80_000)
"""


def test_a_megabyte_of_evidence_prints_a_small_table_and_stays_whole_in_the_journal(pytester):
    pytester.makepyfile(**{"scenarios/test_huge": HUGE})
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={reports}", "-v",  # the full table, where evidence is shown capped
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    assert len(result.outlines) < 150, f"{len(result.outlines)} lines printed"
    table = " ".join(" ".join(line.strip("│┃ ").split()) for line in result.outlines)
    assert table.count("more characters in the journal and record.json") == 2
    lines = (reports / "journal.jsonl").read_text().splitlines()
    evidence = {
        v["claim"]: v["evidence"]
        for e in map(json.loads, lines)
        if e["type"] == "record"
        for v in e["record"]["verdicts"]
    }
    assert evidence == {"FMT-BYTES": "ratio 0.5; " * 100_000, "FMT-BITS": "step 1: 0.5\n" * 80_000}


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("65536 -> 32768", "65536 -> 32768"),  # fits: unchanged
        ("x" * 1500, "x" * 1500),
        ("x" * 1501, "x" * 1500 + "… (1 more character in the journal and record.json)"),
        ("1\n" * 12, "1\n" * 12),  # 12 lines and an empty 13th: fits
        ("1\n" * 20, "1\n" * 11 + "1… (17 more characters in the journal and record.json)"),
    ],
)
def test_cap_keeps_what_fits_and_says_how_much_more_there_is_and_where(text, shown):
    assert cap(text, IN_THE_JOURNAL) == shown


SUMMARY = """
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    record.verdict("FMT-BYTES", "confirmed", "element_size fp16 2, fp32 4 " + "and more " * 40)

@pytest.mark.claim("FMT-BITS")
def test_bits_one(record):
    record.verdict("FMT-BITS", "partly", "first measurement 10 bits")

@pytest.mark.claim("FMT-BITS")
def test_bits_two(record):
    record.verdict("FMT-BITS", "partly", "second measurement 23 bits")
"""


def test_the_default_summary_is_one_line_per_claim_at_80_columns(pytester, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    pytester.makepyfile(**{"scenarios/test_summary": SUMMARY})
    result = pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={pytester.path / 'reports'}",
    )  # fmt: skip
    result.assert_outcomes(passed=3)
    start = result.outlines.index(f"amp-harness verdicts on {devices.probe('cpu').describe()}")
    lines = result.outlines[start : start + 4]
    assert lines[1].startswith("FMT-BITS   partly     first measurement 10 bits")  # no prefix
    assert lines[2].startswith("FMT-BYTES  confirmed  element_size fp16 2, fp32 4 and more")
    assert lines[2].endswith("\u2026") and all(len(line) <= 80 for line in lines)
    assert lines[3].startswith("2 claims: 1 confirmed, 1 partly.")
    assert "\x1b[" not in result.stdout.str()  # no colour codes when not a terminal
    assert not any(line.startswith(("│", "┃")) for line in result.outlines)  # no table
