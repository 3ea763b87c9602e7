"""`amp-harness sessions` (issue 36, item 2): `compare` takes session ids, and nothing listed
them. Each session with its id, start, commit, hardware class, whether it ran the whole suite,
and its tests' outcomes, read from the journal's index: two lines a session at 80 columns."""

from __future__ import annotations

import json
import time

import pytest
from helpers.journals import write_history
from helpers.servers import free_port
from helpers.sessions import CPU
from helpers.tracked import journal, run_session, runs, store_in, write_journal

from harness import cli
from harness.records import journal_index
from harness.records.journal_index import MARK
from harness.records.record import Record
from harness.records.tracking import EXPERIMENTAL, EXPERIMENTAL_REASON, MlflowSink, sync

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
        "experimental": False, "mark": None,
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


# --- issue 50, item 4: a session marked experimental, and of record again ---


def marked(capsys, *args: str) -> list[str]:
    assert cli.main(["sessions", *args]) == 0
    return capsys.readouterr().out.splitlines()


def test_a_session_marked_experimental_after_the_fact_and_back(reports, capsys, monkeypatch):
    """The mark is an entry appended to the journal (never an edit), which `sessions` folds into
    its session; `record` undoes it. The store is not there yet: sync tags the runs it logs."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    path = reports / "journal.jsonl"
    before = path.read_bytes()
    said = marked(capsys, "--reports", str(reports), "mark", "bbbb", "experimental",
                  "--reason", "trying bf16")  # fmt: skip
    assert said == [
        "session bbbbbbbbbbbb (session 1) marked experimental: trying bf16; it is kept out of the "
        "report's ledger, `baseline save` and the comparisons of `last` (`amp-harness sessions "
        "mark bbbbbbbbbbbb record` undoes it)",
        f"MLflow: no store at {reports / 'mlflow.db'} yet: the mark is in the journal, and "
        "`amp-harness sync` logs the session's runs tagged with it",
    ]
    assert not (reports / "mlflow.db").exists()  # no store made only to say nothing is in it
    assert path.read_bytes().startswith(before)
    mark = json.loads(path.read_text().splitlines()[-1])
    assert mark == {"type": "session_mark", "session_id": "b" * 32, "state": "experimental",
                    "reason": "trying bf16", "marked": mark["marked"]}  # fmt: skip
    lines = listed(capsys, "--reports", str(reports))
    at = next(i for i, line in enumerate(lines) if line.startswith("bbbb"))  # the title wraps
    marked_at = time.strftime("%Y-%m-%d %H:%M", time.localtime(mark["marked"]))
    assert lines[at : at + 3] == [
        f"bbbbbbbbbbbb  {when(1)}  partial, experimental  2 passed, 1 failed",
        "    commit 0123456789ab-dirty, cpu-x86-64; tests selected with -k 'scaler';",
        f"      experimental: trying bf16 (marked {marked_at})",
    ]
    row = json.loads("\n".join(listed(capsys, "--reports", str(reports), "--json")))[1]
    assert row["experimental"] is True and row["mark"] == {
        "state": "experimental", "reason": "trying bf16", "marked": mark["marked"]}  # fmt: skip

    again = marked(capsys, "mark", "bbbb", "experimental", "--reports", str(reports))
    assert again[0] == ("session bbbbbbbbbbbb (session 1) is marked so already (experimental: "
                        "trying bf16): the journal is left as it was")  # fmt: skip
    undone = marked(capsys, "mark", "b" * 32, "record", "--reports", str(reports))
    assert undone[0] == ("session bbbbbbbbbbbb (session 1) marked of record: part of the team's "
                         "record again")  # fmt: skip
    assert len(path.read_text().splitlines()) == len(before.splitlines()) + 2
    assert listed(capsys, "--reports", str(reports))[at].endswith("  partial  2 passed, 1 failed")


@pytest.mark.parametrize(
    "args, error",
    [
        (["zzzz", "experimental"], "no session 'zzzz'; the latest: cccccccccccc (session 2), "),
        (["bbbb", "maybe"], "argument state: invalid choice: 'maybe'"),
    ],
)  # fmt: skip
def test_a_mark_of_no_session_or_no_state_is_refused(reports, capsys, args, error):
    before = (reports / "journal.jsonl").read_bytes()
    try:
        code = cli.main(["sessions", "mark", *args, "--reports", str(reports)])
    except SystemExit as exit_:  # argparse's own
        code = exit_.code
    assert code == 2 and error in capsys.readouterr().err
    assert (reports / "journal.jsonl").read_bytes() == before


def test_a_mark_tags_the_runs_in_mlflow_and_sync_tags_those_it_could_not(tmp_path, empty_store,
                                                                          capsys):  # fmt: skip
    """Where MLflow answers, the session's parent and test runs are tagged at once; where it
    does not, the mark waits in the journal and `amp-harness sync` tags them."""
    written = write_journal(tmp_path, "d" * 32)
    uri = store_in(tmp_path, empty_store)
    sync(MlflowSink(uri, reports=tmp_path), written)
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    said = marked(capsys, "mark", "dddd", "experimental", "--reason", "a try", "--reports",
                  str(tmp_path), "--tracking-uri", down)  # fmt: skip
    assert said[1].startswith("MLflow: its runs are not tagged (")
    assert "; the mark is in the journal: " in said[1]  # and what to do (MlflowSink.recovery)
    assert f"`amp-harness sync --reports {tmp_path} --tracking-uri {down}`" in said[1]
    assert said[1].endswith(", which tags them")
    assert {run.data.tags.get(EXPERIMENTAL) for run in runs(uri)} == {None}

    assert cli.main(["sync", "--reports", str(tmp_path), "--tracking-uri", uri]) == 0
    assert "4 runs tagged with their session's mark" in capsys.readouterr().out
    assert {(run.data.tags[EXPERIMENTAL], run.data.tags[EXPERIMENTAL_REASON]) for run in
            runs(uri)} == {("true", "a try")}  # fmt: skip
    assert cli.main(["sync", "--reports", str(tmp_path), "--tracking-uri", uri]) == 0
    assert "tagged" not in capsys.readouterr().out  # tagged once

    said = marked(capsys, "mark", "dddd", "record", "--reports", str(tmp_path), "--tracking-uri",
                  uri)  # fmt: skip
    assert said[1] == (f"MLflow: 4 runs of the session tagged amp.experimental=false at {uri} "
                       "(experiment 'amp-harness')")  # fmt: skip
    assert {run.data.tags[EXPERIMENTAL] for run in runs(uri)} == {"false"}


@pytest.mark.slow
def test_a_session_run_with_amp_experimental_is_marked_from_its_start(pytester):
    """pytest's --amp-experimental-reason (implying --amp-experimental): the mark is in the
    session's entry, and its parent and test runs carry it in MLflow."""
    result, _ = run_session(pytester, "--amp-experimental-reason", "bf16 on a new driver")
    result.assert_outcomes(passed=3)
    (session,) = journal(pytester).index().values()
    assert session.entry[MARK] == {"state": "experimental", "reason": "bf16 on a new driver",
                                   "marked": session.entry["started"]}  # fmt: skip
    found = runs(f"sqlite:///{pytester.path / 'reports' / 'mlflow.db'}")
    assert sorted(run.data.tags["amp.kind"] for run in found) == ["session", "test", "test", "test"]
    assert {(run.data.tags[EXPERIMENTAL], run.data.tags[EXPERIMENTAL_REASON]) for run in
            found} == {("true", "bf16 on a new driver")}  # fmt: skip
