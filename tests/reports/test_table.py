"""The verdict table at the end of a session shows evidence capped: 1 MB of evidence once printed
31,791 terminal lines. The full text stays in the journal (and in record.json in MLflow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.lab import devices
from harness.records.journal import Journal
from harness.records.record import Record
from harness.reports import table
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
        ("x" * 4000, "x" * 4000),
        ("x" * 4001, "x" * 4000 + "… (1 more character in the journal and record.json)"),
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


def run_summary(pytester, *args: str) -> pytest.RunResult:
    """The SUMMARY module's session, as a CI log gets it: no terminal, 80 columns."""
    pytester.makepyfile(**{"scenarios/test_summary": SUMMARY})
    return pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={pytester.path / 'reports'}", *args,
    )  # fmt: skip


@pytest.mark.parametrize("verbose", [(), ("-v",)])
def test_a_log_at_80_columns_shows_every_claims_evidence_in_full_under_its_verdict(
    pytester, monkeypatch, verbose
):
    """A CI log has no terminal and 80 columns: the summary cut each claim's evidence to about
    25 characters, and -v squeezed it into a column 20 wide. Each claim is a block: its ID and
    verdict on one line, its evidence in full under it, wrapped at the width."""
    monkeypatch.setenv("COLUMNS", "80")
    result = run_summary(pytester, *verbose)
    result.assert_outcomes(passed=3)
    lines = result.outlines
    start = lines.index(f"amp-harness verdicts on {devices.probe('cpu').describe()}")
    block = lines[start + 1 : lines.index("", start)]
    assert block[0] == "FMT-BITS  partly"
    assert block[1].startswith("    [partly] test_bits_one: first measurement 10 bits")
    assert block[2].startswith("    [partly] test_bits_two: second measurement 23 bits")
    at = block.index("FMT-BYTES  confirmed")
    evidence = " ".join(line.strip() for line in block[at + 1 :])
    assert evidence.endswith("element_size fp16 2, fp32 4 " + "and more " * 39 + "and more")
    assert all(len(line) <= 80 for line in block) and "\u2026" not in "".join(block)
    assert "\x1b[" not in result.stdout.str()  # no colour codes when not a terminal
    assert not any(line.startswith(("│", "┃")) for line in lines)  # no table


def test_the_last_lines_say_the_counts_the_session_and_where_the_report_is(pytester):
    """After pytest's short test summary (-rs lists the skip), before its final line: what a
    CI log's tail must say."""
    pytester.makepyfile(**{"scenarios/test_summary": SUMMARY + SKIPPED})
    reports = pytester.path / "out"  # not the commands' default, reports/: named in them
    result = pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider", "-rs",
        f"--amp-reports={reports}", "-k", "not bits_two",
    )  # fmt: skip
    result.assert_outcomes(passed=2, skipped=1, deselected=1)
    (session,) = Journal(reports / "journal.jsonl").index()
    lines = result.outlines
    tail = lines[next(i for i, x in enumerate(lines) if "short test summary" in x) + 1 :]
    assert tail[0].startswith("SKIPPED [1]") and " 1 deselected in " in tail[-1]
    said = " ".join(" ".join(tail[1:-1]).split())  # the lines wrap at the width
    assert said.startswith(
        "3 claims: 1 confirmed, 1 partly, 1 skipped (one verdict per claim, across its tests). "
        f"session {session[:12]}: partial (tests selected with -k 'not bits_two') "
    )
    assert f"`amp-harness compare ID {session[:12]} --reports {reports}`" in said
    assert said.endswith(
        f"report: `amp-harness sync --reports {reports}`, then `amp-harness report --reports "
        f"{reports}` writes it from MLflow"
    )


SKIPPED = """

@pytest.mark.claim("FMT-SPEED")
@pytest.mark.requires("cuda")
def test_gpu_only(record):
    raise AssertionError("must not run")
"""


def records_of(verdicts: list[tuple[str, str, str]]) -> list[Record]:
    found = []
    for test, claim, evidence in verdicts:
        record = Record(f"scenarios/test_x.py::{test}", [claim], "cpu", Path("/nonexistent"))
        record.verdict(claim, "confirmed", evidence)
        record.outcome = "passed"
        found.append(record)
    return found


LONG = "element_size fp16 2, fp32 4 " + "and more " * 40


@pytest.mark.parametrize(
    ("verbose", "width", "drawn"),
    [(False, 80, "line a claim"), (True, 80, "blocks"), (True, 160, "table")],
)
def test_a_terminal_gets_a_line_a_claim_and_under_v_a_table_only_where_it_is_wide(
    verbose, width, drawn
):
    records = records_of([("test_bytes", "FMT-BYTES", LONG)])
    text = table.for_terminal(records, width, False, "utf-8", verbose=verbose, tty=True)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines)
    if drawn == "line a claim":
        assert lines[1].startswith("FMT-BYTES  confirmed  element_size") and lines[1][-1] == "…"
        assert lines[2].startswith("The evidence in full: pytest -v")
    elif drawn == "blocks":
        assert lines[1] == "FMT-BYTES  confirmed" and lines[2].startswith("    [confirmed] test_b")
    else:
        assert any(line.startswith(("┏", "┃")) for line in lines)
