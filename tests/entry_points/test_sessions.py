"""`amp-harness sessions` (issue 36, item 2): `compare` takes session ids, and nothing listed
them. Each session with its id, start, commit, hardware class, whether it ran the whole suite,
and its tests' outcomes, read from the journal's index: two lines a session at 80 columns."""

from __future__ import annotations

import json
import time

import pytest
from journals import write_history
from sessions import CPU

from harness import cli
from harness.records import journal_index
from harness.records.record import Record

STARTED = 1.7e9


def entry(kind: str, sid: str, **fields) -> str:
    return json.dumps({"type": kind, "session_id": sid, **fields}) + "\n"


def opening(sid: str, hours: int, commit: str = "0123456789ab") -> str:
    return entry("session", sid, name=f"session {hours}", started=STARTED + hours * 3600,
                 args=["scenarios"], fingerprint={**CPU, "git_commit": commit})  # fmt: skip


def ending(sid: str, counts: dict, left_out: list[str]) -> str:
    return entry("session_end", sid, ended=STARTED, exitstatus=0, counts=counts, left_out=left_out)


@pytest.fixture
def reports(tmp_path):
    """Three sessions: the whole suite, part of it (-k), and one that never ended."""
    whole, part, killed = "a" * 32, "b" * 32, "c" * 32
    (tmp_path / "journal.jsonl").write_text(
        opening(whole, 0)
        + ending(whole, {"skipped": 5, "passed": 54}, [])
        + opening(part, 1, "0123456789ab-dirty")
        + ending(part, {"passed": 2, "failed": 1}, ["tests selected with -k 'scaler'"])
        + opening(killed, 2)
    )
    return tmp_path


def listed(capsys, *args: str) -> list[str]:
    assert cli.main(["sessions", *args]) == 0
    return capsys.readouterr().out.splitlines()


def when(hours: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(STARTED + hours * 3600))


def test_sessions_in_a_log_are_two_lines_each_with_the_id_compare_takes(reports, capsys,
                                                                        monkeypatch):  # fmt: skip
    monkeypatch.setenv("COLUMNS", "80")
    title, *lines = listed(capsys, "--reports", str(reports))
    while not lines[0].startswith("aaaa"):  # a long path: the title wraps, the path whole
        title += f" {lines.pop(0).strip()}"
    assert title == f"3 sessions in {reports / 'journal.jsonl'}, oldest first"
    assert lines == [
        f"aaaaaaaaaaaa  {when(0)}  whole suite  54 passed, 5 skipped",
        "    commit 0123456789ab, cpu-x86-64",
        f"bbbbbbbbbbbb  {when(1)}  partial  2 passed, 1 failed",
        "    commit 0123456789ab-dirty, cpu-x86-64; tests selected with -k 'scaler'",
        f"cccccccccccc  {when(2)}  unfinished  0 recorded",
        "    commit 0123456789ab, cpu-x86-64; it did not end: killed, or still running",
    ]
    assert all(len(line) <= 80 for line in lines)
    last = " ".join(" ".join(listed(capsys, "--reports", str(reports), "--last", "1")).split())
    assert "oldest first; the last 1 (--last 0: every one) cccccccccccc " in last
    assert "aaaaaaaaaaaa" not in last


def test_sessions_json_holds_every_field(reports, capsys):
    rows = json.loads("\n".join(listed(capsys, "--reports", str(reports), "--json")))
    assert [row["id"] for row in rows] == ["a" * 32, "b" * 32, "c" * 32]
    assert rows[1] == {
        "id": "b" * 32, "name": "session 1", "started": STARTED + 3600,
        "commit": "0123456789ab-dirty", "hardware_class": "cpu-x86-64", "run": "partial",
        "left_out": ["tests selected with -k 'scaler'"], "counts": {"passed": 2, "failed": 1},
    }  # fmt: skip


def test_sessions_of_an_empty_folder_and_of_one_that_is_not_there(tmp_path, capsys):
    assert listed(capsys, "--reports", str(tmp_path)) == [
        f"no session recorded in {tmp_path / 'journal.jsonl'} yet: `amp-harness run` records one"
    ]
    typo = tmp_path / "reprots"
    assert cli.main(["sessions", "--reports", str(typo)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"--reports {typo}: no such folder" in line and "e.g. --reports reports" in line


@pytest.mark.parametrize("last", ["-1", "two"])
def test_sessions_last_is_a_whole_number(last, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["sessions", "--last", last])
    assert exit_.value.code == 2
    assert f"--last: {last!r}: give a whole number, 0 or more (0: all)" in capsys.readouterr().err


@pytest.mark.slow
def test_sessions_read_the_index_not_the_journal_at_50000_entries(tmp_path, capsys,
                                                                  monkeypatch):  # fmt: skip
    """A year of CI history (50,000 entries, 59 MB): once the index is built (by any reader),
    `sessions` parses no record of the journal, whatever its size: its work is the index's
    sessions, not the journal's entries (timed beside `list` in tests/reports/test_list_speed.py).
    """
    count = write_history(tmp_path / "journal.jsonl", 50_000)
    first = listed(capsys, "--reports", str(tmp_path), "--last", "0", "--json")

    def never(*_args, **_kwargs):
        raise AssertionError("a record of the journal was read")

    monkeypatch.setattr(Record, "from_dict", never)
    monkeypatch.setattr(journal_index, "records", never)
    again = json.loads("\n".join(listed(capsys, "--reports", str(tmp_path), "--last", "0",
                                        "--json")))  # fmt: skip
    assert len(again) == count and json.loads("\n".join(first)) == again
    assert again[0]["run"] == "whole suite" and again[0]["counts"] == {"passed": 48}
