"""Text from catalogues, evidence and baselines is data wherever it is shown (harness.common.shown):
never rich markup, never terminal control, never live Markdown; and an ASCII terminal shows it
escaped instead of ending in a UnicodeEncodeError or printing the table on one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from helpers.sessions import CPU, log_session, make_record

from harness import cli
from harness.common import shown
from harness.records.journal import Journal
from harness.records.record import Record, Verdict
from harness.records.tracking import MlflowSink, default_uri
from harness.reports import baseline, report

# What a catalogue, a scenario or a baseline may hold: markup that crashed rich (`[/bold]`), text
# it swallowed (`[lo, hi]`), a terminal link, an escape that clears the screen and one that sets
# the window title, a Markdown link and raw HTML.
MARKUP = "[/bold] interval [lo, hi] [link=javascript:alert(1)]click[/link]"
CONTROL = "\x1b[2J\x1b]0;pwned\x07"
MARKDOWN = "[x](javascript:alert(1)) <img src=x onerror=alert(1)>"
HOSTILE = f"{MARKUP} {CONTROL} {MARKDOWN} 2 bytes"


def no_control(text: str) -> bool:
    return "\x1b" not in text and "\x07" not in text


def live_markdown(text: str) -> bool:
    """A link Markdown would follow (an unescaped `](`) or raw HTML."""
    return bool(re.search(r"(?<!\\)\]\(javascript", text)) or "<img" in text


def test_shown_text_is_data():
    assert shown.visible(CONTROL) == r"\x1b[2J\x1b]0;pwned\x07"
    assert shown.visible("a\n\tb\u202ec\r") == "a\n\tb\\u202ec\\r"  # new lines and tabs stay
    assert shown.text(MARKUP).plain == MARKUP  # no markup read
    assert shown.markdown(MARKDOWN + " a|b") == (
        r"\[x\](javascript:alert(1)) &lt;img src=x onerror=alert(1)> a\|b"
    )


def write_project(folder: Path) -> None:
    (folder / "scenarios").mkdir()
    (folder / "scenarios" / "claims.toml").write_text(
        f'[[claim]]\nid = "TEAM-HOSTILE"\nstatement = {json.dumps(HOSTILE)}\n'
        f"source = {json.dumps(MARKUP)}\n",
        encoding="utf-8",
    )


def test_list_shows_a_catalogue_as_written(tmp_path, monkeypatch, capsys):
    """`[/bold]` in a project's statement made `list` crash; `[lo, hi]` vanished."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "1000")  # each row on one line
    write_project(tmp_path)
    assert cli.main(["list", "--reports", str(tmp_path / "reports")]) == 0
    out = capsys.readouterr().out
    assert no_control(out)
    assert shown.visible(HOSTILE) in out and MARKUP in out


def hostile_journal(folder: Path) -> Journal:
    journal = Journal(folder / "journal.jsonl")
    journal.append({"type": "session", "session_id": "s1", "name": "n [/bold]",
                    "started": time.time(), "args": [], "fingerprint": dict(CPU)})  # fmt: skip
    record = Record("scenarios/test_x.py::test_0", ["FMT-BYTES"], "cpu", folder,
                    outcome="passed", ended=time.time())  # fmt: skip
    record.verdicts["FMT-BYTES"] = Verdict("FMT-BYTES", "confirmed", "[/bold] 2 bytes" + CONTROL)
    journal.append({"type": "record", "session_id": "s1", "record": record.to_dict()})
    journal.append({"type": "session_end", "session_id": "s1", "ended": time.time(),
                    "exitstatus": 0, "counts": {"passed": 1}})  # fmt: skip
    return journal


def test_baseline_save_shows_evidence_as_written(tmp_path, capsys):
    """`[/bold]` in evidence made `baseline save` crash after writing its file."""
    hostile_journal(tmp_path)
    code = cli.main(["baseline", "save", "--reports", str(tmp_path), "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "n [/bold]" in out and "[/bold] 2 bytes" in out and no_control(out)


def test_pytest_v_shows_escape_codes_in_evidence_visibly(pytester):
    pytester.makepyfile(
        **{
            "scenarios/test_scn": f"""
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    record.verdict("FMT-BYTES", "confirmed", {HOSTILE!r})
"""
        }
    )
    for verbose in ("-q", "-v"):
        result = pytester.runpytest_inprocess(
            "scenarios", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider",
            f"--amp-reports={pytester.path / 'reports'}", verbose,
        )  # fmt: skip
        assert result.ret == 0
        out = result.stdout.str()
        assert no_control(out) and "[/bold] interval [lo, hi]" in out, out
    assert r"\x1b[2J\x1b]0;pwned\x07" in out  # -v: the evidence in full, each escape shown


@pytest.mark.slow
def test_summary_md_and_the_changes_page_keep_no_link_or_html(tmp_path):
    reports = tmp_path / "reports"
    sink = MlflowSink(default_uri(reports), reports=reports)
    log_session(sink, CPU, time.time() - 60, [
        make_record("test_f.py::test_bits", ["FMT-BITS"],
                    verdicts=[("FMT-BITS", "confirmed", f"{MARKDOWN} 5 bits")]),
    ])  # fmt: skip
    summary = report.build(default_uri(reports), tmp_path / "out").parent / "summary.md"
    text = summary.read_text()
    assert not live_markdown(text) and shown.markdown(MARKDOWN) in text

    folder = tmp_path / "baselines"
    folder.mkdir()
    for torch, verdict in (("2.4.1", "refuted"), ("2.6.0", "confirmed")):
        facts = {**CPU, "torch": torch}
        content = {"format": baseline.FORMAT, "session_id": torch, "name": torch,
                   "started": 0.0, "complete": True, "lacks": [], "fingerprint": facts,
                   "verdicts": [{"claim": "FMT-BITS", "verdict": verdict, "stands": True,
                                 "evidence": f"{MARKDOWN} 5 bits", "test": "t"}],
                   "tests": {"t": {"outcome": "passed", "claims": ["FMT-BITS"],
                                   "metrics": {}, "key_metrics": []}}}  # fmt: skip
        (folder / f"{torch}.json").write_text(json.dumps(content))
    page = tmp_path / "page.md"
    assert cli.main(["baseline", "changes", "--baselines", str(folder), "--page", str(page)]) == 0
    text = page.read_text()
    assert "FMT-BITS" in text and not live_markdown(text) and shown.markdown(MARKDOWN) in text


ASCII = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
ASCII.pop("PYTHONIOENCODING", None)


@pytest.mark.slow
def test_an_ascii_terminal_lists_the_claims_escaped():
    """The article's statements are Chinese: `list` ended in a UnicodeEncodeError."""
    found = subprocess.run(
        [sys.executable, "-m", "harness.cli", "list", "--reports", "/nonexistent"],
        cwd=REPO, env=ASCII, capture_output=True, text=True, encoding="ascii", timeout=120,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr[-2000:]
    assert "UnicodeEncodeError" not in found.stderr
    assert "FMT-BITS" in found.stdout and "\\u" in found.stdout  # the article's text, escaped


@pytest.mark.slow
def test_an_ascii_terminal_prints_the_verdict_table_on_its_lines(pytester):
    """pytest escapes a whole text its stream cannot encode, new lines included: the table
    came out as one line with literal \\n."""
    pytester.makepyfile(
        **{
            "scenarios/test_scn": """
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes \u2192 fp32 4 bytes")
"""
        }
    )
    for verbose in ("-v", "-q"):
        found = subprocess.run(
            [sys.executable, "-m", "pytest", "scenarios", "--no-mlflow", "--amp-device=cpu",
             "-p", "no:cacheprovider", f"--amp-reports={pytester.path / 'reports'}", verbose],
            cwd=pytester.path, env=ASCII, capture_output=True, timeout=300,
        )  # fmt: skip
        out = found.stdout.decode("ascii")
        assert found.returncode == 0, out[-3000:]
        lines = out.splitlines()  # a log: the claim's block, its evidence on the next line
        line = lines[lines.index("FMT-BYTES  confirmed") + 1]
        assert line.startswith("    ") and "\\n" not in line and "\\u2192" in line, line
