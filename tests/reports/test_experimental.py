"""Issue 50, item 4: a session marked experimental is no part of the team's record. `baseline
save` refuses it, naming it and how to unmark it; `last` (`compare last`, the report's
comparison) is the last session of record, and says which experiments after it it passed over.
The report's ledger: tests/reports/test_report.py; the mark itself: test_sessions.py."""

from __future__ import annotations

import json

import pytest
from helpers.tracked import write_journal

from harness import cli

A, B, C = "a" * 32, "b" * 32, "c" * 32  # oldest first; C is marked experimental


@pytest.fixture
def reports(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # no store: the journal alone
    for sid in (A, B, C):
        write_journal(tmp_path, sid)
    assert cli.main(["sessions", "mark", "cccc", "experimental", "--reason", "a new driver",
                     "--reports", str(tmp_path)]) == 0  # fmt: skip
    return tmp_path


def test_baseline_save_refuses_an_experimental_session_and_says_how_to_unmark_it(reports, capsys):
    out = reports / "baselines"
    capsys.readouterr()
    for chosen in ([], ["--session", "cccc"]):  # the last session, or named
        assert cli.main(["baseline", "save", "--reports", str(reports), "--baselines", str(out),
                         *chosen]) == 2  # fmt: skip
        error = " ".join(capsys.readouterr().err.split())
        assert (f"session cccccccccccc (session {C}) is marked experimental: a new driver. Not "
                "saved as a baseline: an experiment is no part of the team's record. If it is "
                "one after all, unmark it with `amp-harness sessions mark cccccccccccc record`, "
                f"then save it again; the last session of record is bbbbbbbbbbbb (session {B}): "
                "`amp-harness baseline save --session bbbbbbbbbbbb`") in error  # fmt: skip
        assert not out.exists()
    assert cli.main(["baseline", "save", "--reports", str(reports), "--baselines", str(out),
                     "--session", "bbbb"]) == 0  # fmt: skip
    (saved,) = out.iterdir()
    assert json.loads(saved.read_text())["session_id"] == B
    assert cli.main(["sessions", "mark", "cccc", "record", "--reports", str(reports)]) == 0
    assert cli.main(["baseline", "save", "--reports", str(reports), "--baselines", str(out),
                     "--force"]) == 0  # fmt: skip
    assert json.loads(saved.read_text())["session_id"] == C


PASSED_OVER = (
    f"amp-harness: `last` is session bbbbbbbbbbbb (session {B}), the last of record: passed "
    f"over 1 later session(s) marked experimental: cccccccccccc (session {C}), experimental: a "
    "new driver"
)


def test_compare_last_is_the_last_session_of_record_and_says_what_it_passed_over(reports, capsys):
    capsys.readouterr()
    assert cli.main(["compare", "aaaa", "last", "--reports", str(reports)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(PASSED_OVER + "\n")
    assert f"B: session bbbbbbbbbbbb (session {B})" in " ".join(out.split())
    assert cli.main(["compare", "aaaa", "last", "--reports", str(reports), "--json"]) == 0
    said = capsys.readouterr()
    assert said.err == PASSED_OVER + "\n"  # JSON on stdout stays JSON
    assert json.loads(said.out)["b"] == f"session bbbbbbbbbbbb (session {B})"
    assert cli.main(["compare", "aaaa", "bbbb", "--reports", str(reports)]) == 0
    assert "passed over" not in capsys.readouterr().out  # `last` named nowhere: nothing said


def test_the_reports_comparison_is_of_the_last_session_of_record(reports, capsys):
    out = reports / "baselines"
    assert cli.main(["baseline", "save", "--reports", str(reports), "--baselines", str(out),
                     "--session", "aaaa"]) == 0  # fmt: skip
    (saved,) = out.iterdir()
    found = cli.report.baseline_comparison(reports, str(saved), out)
    assert found.startswith(f"session bbbbbbbbbbbb (session {B}) against {saved}: ")
    assert found.endswith(" " + PASSED_OVER.removeprefix("amp-harness: "))


def test_last_with_every_session_experimental_is_an_error_saying_so(reports, capsys):
    for sid in ("aaaa", "bbbb"):
        assert cli.main(["sessions", "mark", sid, "experimental", "--reports", str(reports)]) == 0
    capsys.readouterr()
    assert cli.main(["compare", "aaaa", "last", "--reports", str(reports)]) == 2
    assert (f"every session is marked experimental, 3 of them (the last: cccccccccccc (session "
            f"{C})): none is of the team's record. Mark one of record with `amp-harness sessions "
            "mark ID record`") in " ".join(capsys.readouterr().err.split())  # fmt: skip
    found = cli.report.baseline_comparison(reports, "auto", reports / "baselines")
    assert found.startswith("no comparison: ") and "every session is marked experimental" in found
