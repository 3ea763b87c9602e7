"""The journal keeps every result: a line cut by a crash or a full disk, an entry a reader cannot
use, or one written by a newer version never hides the entries around it, and an append that
fails leaves nothing for the next one to trip on."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sys
import time
import warnings
from pathlib import Path

import pytest

import harness.records.record
from harness.common.errors import HarnessError
from harness.records.journal import Journal
from harness.records.journal_index import (
    EXPERIMENTAL,
    MARK,
    RECORD,
    is_experimental,
    mark_entry,
    mark_of,
)
from harness.records.record import Record, Verdict
from harness.reports import baseline

CUT = '{"type": "record", "session_id": "abc", "rec'  # a line cut by a crash, no newline


def record(tmp_path: Path, index: int, claim: str = "FMT-BYTES") -> Record:
    found = Record(f"scenarios/test_x.py::test_{index}", [claim], "cpu", tmp_path,
                   outcome="passed", ended=time.time())  # fmt: skip
    found.param(type="mlp")  # a nested object that starts with "type", as entries do
    found.metric(loss=0.5, overflow=float("inf"))
    found.verdicts[claim] = Verdict(claim, "confirmed", f"2 bytes → {index} ✓")  # not ASCII
    return found


def write_session(journal: Journal, tmp_path: Path, sid: str, tests: int = 2, end: bool = True):
    journal.append(
        {
            "type": "session",
            "session_id": sid,
            "name": f"session {sid}",
            "started": time.time(),
            "args": [],
            "fingerprint": {"device": "cpu"},
        }
    )
    for index in range(tests):
        entry = {"type": "record", "session_id": sid, "record": record(tmp_path, index).to_dict()}
        journal.append(entry)
    if end:
        journal.append({"type": "session_end", "session_id": sid, "ended": time.time(),
                        "exitstatus": 0, "counts": {"passed": tests}})  # fmt: skip


def cut_at_4096_bytes(tmp_path: Path) -> bytes:
    """The first 4096 bytes of a real record line, ending inside a UTF-8 character, as a full
    disk left one (a write takes whole pages)."""
    entry = record(tmp_path, 0).to_dict()
    for pad in range(2):  # "é" is two bytes: one of two paddings puts byte 4096 inside one
        entry["message"] = "x" * pad + "é" * 3000
        line = json.dumps({"type": "record", "session_id": "old", "record": entry},
                          ensure_ascii=False).encode()  # fmt: skip
        try:
            line[:4096].decode("utf-8")
        except UnicodeDecodeError:
            return line[:4096]
    raise AssertionError("no cut inside a character")


# --- item 1: a cut last line no longer swallows the next session ---


@pytest.mark.parametrize("cut", ["hand", "4096"])
def test_a_session_appended_after_a_cut_last_line_is_read_whole(tmp_path, cut):
    journal = Journal(tmp_path / "journal.jsonl")
    write_session(journal, tmp_path, "old")
    damage = CUT.encode() if cut == "hand" else cut_at_4096_bytes(tmp_path)
    with journal.path.open("ab") as f:
        f.write(damage)
    write_session(journal, tmp_path, "new", tests=3)

    lines = journal.path.read_bytes().split(b"\n")
    assert lines[4] == damage  # the cut line is kept, as it was, on a line of its own
    assert json.loads(lines[5])["session_id"] == "new"  # the next entry starts a fresh line
    with pytest.warns(UserWarning, match=r"journal.jsonl:5: skipped a corrupt journal line"):
        sessions = journal.sessions()
    assert list(sessions) == ["old", "new"]
    assert len(sessions["new"].records) == 3 and sessions["new"].end is not None
    with pytest.warns(UserWarning, match=r"journal.jsonl:5: skipped a corrupt journal line"):
        assert baseline.summarize(journal)["session_id"] == "new"


@pytest.mark.parametrize("cut", ["hand", "4096", "two cut lines"])
def test_a_complete_entry_glued_after_a_cut_line_is_read(tmp_path, cut):
    """What older versions wrote: the next entry glued onto the cut line. The line's start is
    skipped, with a warning; the complete entry at its end is read."""
    journal = Journal(tmp_path / "journal.jsonl")
    write_session(journal, tmp_path, "old")
    session = {"type": "session", "session_id": "new", "name": "n", "started": time.time(),
               "args": [], "fingerprint": {"device": "cpu"}}  # fmt: skip
    damage = {"hand": CUT.encode(), "4096": cut_at_4096_bytes(tmp_path),
              "two cut lines": CUT.encode() + b'{"type": "sess'}[cut]  # fmt: skip
    with journal.path.open("ab") as f:
        f.write(damage + json.dumps(session).encode() + b"\n")
    for index in range(3):
        entry = {"type": "record", "session_id": "new", "record": record(tmp_path, index).to_dict()}
        journal.append(entry)

    message = (
        rf"journal.jsonl:5: skipped a corrupt start of a journal line \({len(damage)} bytes: "
        r".*\) and read the complete session entry after it"
    )
    with pytest.warns(UserWarning, match=message):
        sessions = journal.sessions()
    assert list(sessions) == ["old", "new"]
    assert [r.test for r in sessions["new"].records] == [
        f"scenarios/test_x.py::test_{i}" for i in range(3)
    ]
    with pytest.warns(UserWarning, match=message):
        assert baseline.summarize(journal)["session_id"] == "new"


def test_a_line_that_is_garbage_throughout_is_skipped_and_nothing_else(tmp_path):
    journal = Journal(tmp_path / "journal.jsonl")
    write_session(journal, tmp_path, "s", end=False)
    with journal.path.open("a") as f:
        f.write('garbage {"type": "record", "nested": {"type": "x"} and more garbage\n')
    journal.append({"type": "session_end", "session_id": "s", "ended": 1.0, "exitstatus": 0,
                    "counts": {"passed": 2}})  # fmt: skip
    with pytest.warns(UserWarning, match=r"journal.jsonl:4: skipped a corrupt journal line"):
        sessions = journal.sessions()
    assert len(sessions["s"].records) == 2 and sessions["s"].end["counts"] == {"passed": 2}


# --- item 4: an entry a reader cannot use is skipped and named; the others are read ---


def _drop(field):
    return lambda entry: entry["record"].pop(field)


def _set(field, value):
    return lambda entry: entry["record"].__setitem__(field, value)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_drop("verdicts"), r'record: field "verdicts" is missing'),
        (_drop("record_id"), r'record: field "record_id" is missing'),
        (
            _set("verdicts", "confirmed"),
            r"record: field \"verdicts\" is text 'confirmed', not a list of objects",
        ),
        (
            _set("metrics", {"loss": "low"}),
            r"record: field \"metrics\"\['loss'\] is text 'low', not a number",
        ),
        (
            _set("histories", {"loss": [1.0, None]}),
            r"record: field \"histories\"\['loss'\]\[1\] is null, not a number",
        ),
        (_set("started", True), r'record: field "started" is a boolean, not a number'),
        (
            lambda e: e["record"]["verdicts"][0].pop("evidence"),
            r'record: verdicts\[0\]: field "evidence" is missing',
        ),
        (
            lambda e: e.__setitem__("record", None),
            r'record entry: field "record" is null, not an object',
        ),
        (lambda e: e.pop("session_id"), r'record entry: field "session_id" is missing'),
    ],
    ids=[
        "no-verdicts",
        "no-record-id",
        "verdicts-text",
        "metric-text",
        "history-null",
        "started-boolean",
        "verdict-no-evidence",
        "record-null",
        "no-session-id",
    ],  # fmt: skip
)
def test_a_record_a_reader_cannot_use_is_skipped_naming_line_and_field(tmp_path, damage, message):
    journal = Journal(tmp_path / "journal.jsonl")
    write_session(journal, tmp_path, "s", tests=1, end=False)
    entry = {"type": "record", "session_id": "s", "record": record(tmp_path, 7).to_dict()}
    damage(entry)
    journal.append(entry)
    journal.append({"type": "record", "session_id": "s", "record": record(tmp_path, 8).to_dict()})
    journal.append({"type": "session_end", "session_id": "s", "ended": 1.0, "exitstatus": 0,
                    "counts": {"passed": 3}})  # fmt: skip

    where = re.escape(f"{journal.path}:3: skipped a journal entry it cannot use: ")
    with pytest.warns(UserWarning, match=where + message) as caught:
        sessions = journal.sessions()
    assert len(caught) == 1
    assert [r.test.split("::")[1] for r in sessions["s"].records] == ["test_0", "test_8"]
    assert sessions["s"].end is not None
    with pytest.warns(UserWarning, match=where + message):
        summary = baseline.summarize(journal)
    assert [v["test"].split("::")[1] for v in summary["verdicts"]] == ["test_0", "test_8"]


@pytest.mark.parametrize(
    ("bad", "message", "left_out"),
    [
        (
            {"type": "session", "session_id": "s", "started": 0.0, "args": [], "fingerprint": {}},
            r'session entry: field "name" is missing',
            True,
        ),  # fmt: skip
        (
            {
                "type": "session_end",
                "session_id": "s",
                "ended": 0.0,
                "exitstatus": "0",
                "counts": {},
            },
            r"session_end entry: field \"exitstatus\" is text '0', not a whole "
            r"number",
            False,
        ),  # fmt: skip
    ],
    ids=["session-without-name", "end-with-text-status"],
)
def test_a_session_entry_a_reader_cannot_use_is_skipped_and_its_records_said(
    tmp_path, bad, message, left_out
):
    journal = Journal(tmp_path / "journal.jsonl")
    write_session(journal, tmp_path, "before", tests=1)
    journal.append(bad)
    if bad["type"] == "session":
        entry = {"type": "record", "session_id": "s", "record": record(tmp_path, 1).to_dict()}
        journal.append(entry)
    else:
        write_session(journal, tmp_path, "s", tests=1, end=False)
        journal.append(bad)
    write_session(journal, tmp_path, "after", tests=1)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sessions = journal.sessions()
    said = [str(w.message) for w in caught]
    assert any(re.search(rf"journal.jsonl:4: .*cannot use: {message}", s) for s in said), said
    assert list(sessions)[0] == "before" and list(sessions)[-1] == "after"
    assert all(len(s.records) == 1 for s in sessions.values())
    if left_out:  # the record of the session whose entry is unusable: read, and named
        assert any("read 1 records of sessions whose session entry is missing or unusable "
                   "(lines 5) under a session rebuilt" in s for s in said), said  # fmt: skip
        assert list(sessions) == ["before", "s", "after"]
        assert sessions["s"].entry["rebuilt"]
    else:
        assert sessions["s"].end is None


def test_fields_from_a_newer_version_are_ignored_and_said_once(tmp_path):
    journal = Journal(tmp_path / "journal.jsonl")
    journal.append({"type": "session", "session_id": "s", "name": "n", "started": 0.0,
                    "args": [], "fingerprint": {}, "cluster": "a"})  # fmt: skip
    for index in range(3):
        entry = record(tmp_path, index).to_dict()
        entry["gpu_seconds"] = 1.5
        entry["verdicts"][0]["confidence"] = 0.9
        journal.append({"type": "record", "session_id": "s", "record": entry})
    journal.append({"type": "annotation", "session_id": "s", "text": "rerun"})

    with pytest.warns(UserWarning) as caught:
        sessions = journal.sessions()
    (said,) = [str(w.message) for w in caught]
    assert said == (
        f"{journal.path}: ignored what this version of amp-harness does not know (written by a "
        "newer one? upgrade to read it): record.gpu_seconds (lines 2, 3, 4), "
        "record.verdicts[].confidence (lines 2, 3, 4), entry type 'annotation' (lines 5)"
    )
    assert len(sessions["s"].records) == 3
    assert sessions["s"].entry["cluster"] == "a"  # kept: readers pass the entry on whole


# --- item 5: names MLflow refuses are refused when recorded, with MLflow's rule ---

HOSTILE = ["a//b", "../../x", "/abs", "trailing/", ".", "..", "a/./b", "a/../b", "./x", "x/.",
           "..x", "...", "", "bytes:fp16", "a\tb", "a\\b", "a\n", "a" * 251]  # fmt: skip
FINE = ["loss", "rank0/grad norm", "x..", "a/..b", "a.b-c_d", "é", " a", "fp16/step 3"]


@pytest.mark.parametrize("kind", ["metric", "history", "param"])
@pytest.mark.parametrize("name", HOSTILE, ids=repr)
def test_a_name_mlflow_refuses_is_refused_when_recorded(tmp_path, monkeypatch, kind, name):
    monkeypatch.delitem(sys.modules, "mlflow.utils.validation", raising=False)  # no MLflow here
    found = Record("scenarios/test_x.py::test_y", ["FMT-BYTES"], "cpu", tmp_path)
    call = {"metric": found.metric, "history": lambda **v: found.history(**v),
            "param": found.param}[kind]  # fmt: skip
    value = [1.0] if kind == "history" else 1.0
    with pytest.raises(HarnessError, match=rf"^{kind} name {re.escape(repr(name))}: ") as error:
        call(**{name: value})
    assert "MLflow" in str(error.value) or "non-empty" in str(error.value)
    assert (found.metrics, found.histories, found.params) == ({}, {}, {})


def test_the_path_rule_says_what_the_name_resolves_to_and_a_name_that_works(tmp_path):
    found = Record("scenarios/test_x.py::test_y", ["FMT-BYTES"], "cpu", tmp_path)
    with pytest.raises(HarnessError) as error:
        found.metric(**{"../../rank0//loss/": 1.0})
    assert str(error.value) == (
        "metric name '../../rank0//loss/': MLflow treats names as file paths and refuses one "
        "that would resolve to another ('../../rank0/loss') or leave its folder: no empty, '.' "
        "or '..' parts, no leading or trailing '/', no leading '..' (MLflow's rule); use e.g. "
        "'rank0/loss'"
    )


def test_the_local_rule_agrees_with_mlflows_own(monkeypatch):
    """The rule `record` applies without MLflow against MLflow's validator, on hostile names and
    fine ones. The local rule is stricter in two places, on purpose: no ':' (MLflow refuses it on
    Windows, and a journal may be synced to any server) and no trailing newline (MLflow's
    re.match(...$) lets one through); MLflow checks the length when it logs."""
    validation = pytest.importorskip("mlflow.utils.validation")
    monkeypatch.delitem(sys.modules, "mlflow.utils.validation")

    def mlflow_refuses(name: str) -> bool:
        try:
            validation._validate_metric_name(name)
            validation._validate_param_name(name)
            validation._validate_length_limit("name", validation.MAX_ENTITY_KEY_LENGTH, name)
        except validation.MlflowException:
            return True
        return False

    stricter = {"bytes:fp16", "a\n"}
    for name in HOSTILE + FINE:
        local = harness.records.record.key_problem(name) is not None
        assert local == (mlflow_refuses(name) or name in stricter), name
    assert [n for n in HOSTILE if not mlflow_refuses(n)] == sorted(stricter, reverse=True)


def test_mlflows_own_rule_applies_too_when_mlflow_is_loaded(monkeypatch):
    validation = pytest.importorskip("mlflow.utils.validation")

    def newer_rule(name):
        raise validation.MlflowException(f"Invalid value {name!r}: a rule of a newer MLflow")

    monkeypatch.setattr(validation, "_validate_metric_name", newer_rule)
    said = harness.records.record.key_problem("loss")
    assert "refuses it: Invalid value 'loss': a rule of a newer MLflow" in said
    monkeypatch.delitem(sys.modules, "mlflow.utils.validation")
    assert harness.records.record.key_problem("loss") is None


# --- a full disk: the append fails clearly and leaves the journal as it was ---


def test_a_full_disk_is_an_error_naming_the_journal_and_the_fix_and_leaves_no_cut_line(
    tmp_path, monkeypatch
):
    journal = Journal(tmp_path / "journal.jsonl")
    write_session(journal, tmp_path, "s", tests=1, end=False)
    before = journal.path.read_bytes()
    inode = os.stat(journal.path).st_ino
    real_write = os.write
    calls = []

    def full_disk(fd, data):  # takes part of the line, then the disk is full
        if os.fstat(fd).st_ino != inode:
            return real_write(fd, data)
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full_disk)
    entry = {"type": "record", "session_id": "s", "record": record(tmp_path, 1).to_dict()}
    with pytest.raises(HarnessError) as error:
        journal.append(entry)
    assert str(error.value) == (
        f"cannot append to the journal {journal.path}: No space left on device (the record of "
        "scenarios/test_x.py::test_1 was not recorded; the journal is as it was before this "
        f"entry). Fix: free space on the disk of {tmp_path}, or pass --amp-reports DIR for a "
        "folder on another disk, then run again"
    )
    assert len(calls) == 2  # the first write took half the line
    assert journal.path.read_bytes() == before  # the half line is gone

    monkeypatch.setattr(os, "write", real_write)  # space again
    journal.append(entry)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing damaged: no warning
        sessions = journal.sessions()
    assert [r.test for r in sessions["s"].records] == [
        "scenarios/test_x.py::test_0",
        "scenarios/test_x.py::test_1",
    ]


# --- the index (issue 24, item 14): a reading parses what was appended since the last one, and
# says what a full reading would ---


def fresh_reading(journal: Journal) -> dict:
    """What a reading without the index finds: (entry, end, records as dicts) per session."""
    journal.path.with_name(".journal.jsonl.index").unlink(missing_ok=True)
    return {sid: (s.entry, s.end, [r.to_dict() for r in s.records])
            for sid, s in journal.sessions().items()}  # fmt: skip


def test_a_reading_parses_only_what_was_appended_since_the_last(tmp_path, monkeypatch):
    from harness.records import journal_index

    journal = Journal(tmp_path / "journal.jsonl")
    write_session(journal, tmp_path, "s1", tests=3)
    assert list(journal.sessions()) == ["s1"]
    assert journal.path.with_name(".journal.jsonl.index").is_file()
    write_session(journal, tmp_path, "s2", tests=2)
    judged = []
    real_add = journal_index.Index.add

    def add(self, number, *args):
        judged.append(number)
        return real_add(self, number, *args)

    monkeypatch.setattr(journal_index.Index, "add", add)
    sessions = journal.sessions()
    assert judged == [6, 7, 8, 9]  # s2's session entry, 2 records, its end: nothing of s1
    assert [len(s.records) for s in sessions.values()] == [3, 2]
    monkeypatch.undo()
    assert {sid: (s.entry, s.end, [r.to_dict() for r in s.records])
            for sid, s in sessions.items()} == fresh_reading(journal)  # fmt: skip


@pytest.mark.parametrize(
    "edit",
    [
        lambda text: text.replace('"2 bytes', '"3 bytes', 1),  # same length, in place
        lambda text: text.replace('"name": "session s1"', '"name": "s1 renamed by hand"'),
        lambda text: "".join(text.splitlines(keepends=True)[:3]),  # truncated
        lambda text: text.replace('{"type": "record"', "garbage", 1),  # a line broken by hand
    ],
    ids=["same-length", "longer", "truncated", "broken"],
)
def test_an_edit_of_what_was_indexed_is_read_as_it_is_now(tmp_path, edit):
    """A hand edit (the fix the warnings suggest), a truncation: the part of the journal the
    index covers has changed, so it is read again whole."""
    journal = Journal(tmp_path / "journal.jsonl")
    write_session(journal, tmp_path, "s1", tests=2)
    write_session(journal, tmp_path, "s2", tests=2)
    journal.sessions()
    journal.path.write_text(edit(journal.path.read_text(encoding="utf-8")), encoding="utf-8")
    with warnings.catch_warnings(record=True) as indexed:
        warnings.simplefilter("always")
        found = {sid: (s.entry, s.end, [r.to_dict() for r in s.records])
                 for sid, s in journal.sessions().items()}  # fmt: skip
    with warnings.catch_warnings(record=True) as fresh:
        warnings.simplefilter("always")
        assert found == fresh_reading(journal)
    assert [str(w.message) for w in indexed] == [str(w.message) for w in fresh]


def test_what_a_reading_found_is_said_at_every_reading(tmp_path):
    journal = Journal(tmp_path / "journal.jsonl")
    write_session(journal, tmp_path, "s", tests=1)
    with journal.path.open("a") as f:
        f.write(CUT + "\n" + json.dumps({"type": "record", "session_id": "s", "record": {}}) + "\n")
        f.write(json.dumps({"type": "record", "session_id": "nobody", "record": {}}) + "\n")
        f.write(json.dumps({"type": "later", "session_id": "s"}) + "\n")
    said = []
    for _ in range(3):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            journal.sessions()
        said.append([str(w.message) for w in caught])
    assert said[0] == said[1] == said[2] and len(said[0]) == 4, said[0]
    assert said[0][0].endswith("journal.jsonl:4: skipped a corrupt journal line (Invalid control "
                               "character at: line 1 column 45 (char 44))")  # fmt: skip


def test_a_last_line_without_its_new_line_is_read_and_judged_again_once_ended(tmp_path):
    journal = Journal(tmp_path / "journal.jsonl")
    write_session(journal, tmp_path, "s1", tests=1, end=False)
    text = journal.path.read_text(encoding="utf-8")
    journal.path.write_text(text.rstrip("\n"), encoding="utf-8")  # written by hand, or mid-write
    assert len(journal.sessions()["s1"].records) == 1
    journal.append({"type": "session_end", "session_id": "s1", "ended": 1.0, "exitstatus": 0,
                    "counts": {"passed": 1}})  # fmt: skip
    (session,) = journal.sessions().values()
    assert len(session.records) == 1 and session.end is not None


def test_a_folder_the_index_cannot_be_kept_in_is_read_all_the_same(tmp_path, monkeypatch):
    journal = Journal(tmp_path / "journal.jsonl")
    write_session(journal, tmp_path, "s1", tests=2)

    def refused(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(Path, "write_text", refused)
    assert [len(s.records) for s in journal.sessions().values()] == [2]
    assert [len(s.records) for s in journal.sessions().values()] == [2]
    assert not list(tmp_path.glob(".journal.jsonl.index*"))


def test_list_reads_each_claim_from_the_last_session_that_declares_it(tmp_path, capsys):
    """Only those sessions' records are read; the verdicts are the full reading's."""
    from harness import cli

    journal = Journal(tmp_path / "journal.jsonl")
    for sid, claims in (("s1", ["FMT-BITS", "FMT-BYTES"]), ("s2", ["FMT-BITS"]), ("s3", [])):
        journal.append({"type": "session", "session_id": sid, "name": sid, "started": 1.0,
                        "args": [], "fingerprint": {}})  # fmt: skip
        for index, claim in enumerate(claims):
            found = record(tmp_path, index, claim)
            found.verdicts[claim].evidence = f"{sid}: 2 bytes"
            journal.append({"type": "record", "session_id": sid, "record": found.to_dict()})
    assert cli.main(["list", "--json", "--reports", str(tmp_path)]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["FMT-BITS"]["last_evidence"] == "s2: 2 bytes"
    assert rows["FMT-BYTES"]["last_evidence"] == "s1: 2 bytes"
    assert rows["FMT-RANGE"]["last_verdict"] is None


def _shift_offsets(text: str) -> str:
    index = json.loads(text)
    for session in index["sessions"].values():
        session["records"] = [[n, offset + 1, length] for n, offset, length in session["records"]]
    return json.dumps(index)


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: "not json",
        lambda text: "[" * 100_000,
        lambda text: text.replace('"covered": ', '"covered": "x", "was": ', 1),
        _shift_offsets,  # the digest still matches the journal: the offsets are wrong
    ],
    ids=["not-json", "too-deep", "wrong-type", "wrong-offsets"],
)
def test_a_damaged_index_costs_a_full_reading_and_nothing_else(tmp_path, damage):
    journal = Journal(tmp_path / "journal.jsonl")
    write_session(journal, tmp_path, "s1", tests=2)
    write_session(journal, tmp_path, "s2", tests=1)
    expected = fresh_reading(journal)
    kept = tmp_path / ".journal.jsonl.index"
    kept.write_text(damage(kept.read_text(encoding="utf-8")), encoding="utf-8")
    found = {sid: (s.entry, s.end, [r.to_dict() for r in s.records])
             for sid, s in journal.sessions().items()}  # fmt: skip
    assert found == expected


# --- "Nothing lost, round 3", item 3: a journal deleted while its session runs, and records
# whose session entry is missing ---


def session_entry(sid: str) -> dict:
    return {"type": "session", "session_id": sid, "name": f"session {sid}",
            "started": time.time(), "args": [], "fingerprint": {"device": "cpu"}}  # fmt: skip


def record_entry(tmp_path: Path, sid: str, index: int) -> dict:
    return {"type": "record", "session_id": sid, "record": record(tmp_path, index).to_dict()}


def lines_of(journal: Journal) -> list[tuple]:
    """Each entry as (type, test index or None)."""
    entries = map(json.loads, journal.path.read_text(encoding="utf-8").splitlines())
    return [(e["type"], e["record"]["test"][-1] if "record" in e else None) for e in entries]


def test_records_whose_session_entry_is_missing_are_read_under_a_rebuilt_session(tmp_path):
    # What a journal deleted mid-session used to become: the later records, no session entry.
    journal = Journal(tmp_path / "journal.jsonl")
    for index in (1, 2):
        journal.append(record_entry(tmp_path, "0123456789abcdef", index))
    journal.append({"type": "session_end", "session_id": "gone", "ended": 0.0,
                    "exitstatus": 0, "counts": {}})  # fmt: skip
    write_session(journal, tmp_path, "next", tests=1)

    with pytest.warns(UserWarning) as caught:
        sessions = journal.sessions()
    said = [str(w.message) for w in caught]
    assert list(sessions) == ["0123456789abcdef", "next"]
    rebuilt = sessions["0123456789abcdef"]
    assert [r.test[-1] for r in rebuilt.records] == ["1", "2"]
    assert rebuilt.entry["rebuilt"] and rebuilt.entry["name"].startswith("session 0123456789ab (")
    assert rebuilt.entry["started"] == rebuilt.records[0].started and rebuilt.end is None
    assert any("read 2 records of sessions whose session entry is missing or unusable (lines 1, "
               "2) under a session rebuilt" in s for s in said), said  # fmt: skip
    assert any("left out 1 session ends" in s and "(lines 3)" in s for s in said), said


def test_a_session_entry_written_after_its_records_takes_them(tmp_path):
    """A journal re-created by a process of the session whose entry another one writes later
    (an xdist controller, at its end): one session, its own entry, nothing said."""
    journal = Journal(tmp_path / "journal.jsonl")
    journal.append(record_entry(tmp_path, "s", 1))
    journal.append(session_entry("s"))
    journal.append(record_entry(tmp_path, "s", 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sessions = journal.sessions()
    assert list(sessions) == ["s"] and "rebuilt" not in sessions["s"].entry
    assert [r.test[-1] for r in sessions["s"].records] == ["1", "2"]


@pytest.mark.slow
def test_sync_sends_the_records_of_a_rebuilt_session(tmp_path, empty_store):
    from helpers.tracked import runs, store_in

    from harness.records.tracking import MlflowSink, sync

    journal = Journal(tmp_path / "journal.jsonl")
    for index in (1, 2):
        journal.append(record_entry(tmp_path, "lost", index))
    uri = store_in(tmp_path, empty_store)
    with pytest.warns(UserWarning, match="rebuilt"):
        counts = sync(MlflowSink(uri, reports=tmp_path), journal)
    assert (counts["sessions"], counts["records_sent"]) == (1, 2)
    kinds = sorted(r.data.tags["amp.kind"] for r in runs(uri))
    assert kinds == ["session", "test", "test"]
    (parent,) = [r for r in runs(uri) if r.data.tags["amp.kind"] == "session"]
    assert "not its session entry" in parent.data.tags["amp.rebuilt"]  # said in MLflow too


@pytest.mark.parametrize("deleted", ["journal", "folder"])
def test_a_kept_journal_deleted_between_appends_is_made_again_session_entry_first(
    tmp_path, deleted
):
    journal = Journal(tmp_path / "reports" / "journal.jsonl")
    journal.check_writable()
    journal.keep(session_entry("s"))
    journal.append(session_entry("s"))
    for index in (0, 1):
        journal.append(record_entry(tmp_path, "s", index))
    assert not journal.vanished()
    if deleted == "journal":
        journal.path.unlink()
    else:
        shutil.rmtree(journal.path.parent)
    assert journal.vanished()

    journal.append(record_entry(tmp_path, "s", 2))
    assert lines_of(journal) == [("session", None), ("record", "0"), ("record", "1"),
                                 ("record", "2")]  # fmt: skip
    (said,) = journal.rewritten
    assert said == (
        f"{journal.path} vanished during this session (deleted, or its folder with it) and was "
        "created again: the session entry first, then 2 record(s) this process had recorded "
        "before written again: scenarios/test_x.py::test_0, scenarios/test_x.py::test_1; what "
        "it held of earlier sessions is gone"
    )
    journal.append({"type": "session_end", "session_id": "s", "ended": 0.0, "exitstatus": 0,
                    "counts": {"passed": 3}})  # fmt: skip
    assert lines_of(journal)[-1] == ("session_end", None) and len(lines_of(journal)) == 5
    assert len(journal.rewritten) == 1  # the journal made again is the one kept from then on
    journal.close()


def test_the_processes_of_one_session_make_a_deleted_journal_again_once(tmp_path):
    """pytest-xdist: each worker keeps its own records and the session entry; the first to
    notice writes the entry, each writes its own records, the controller adds nothing twice."""
    path = tmp_path / "reports" / "journal.jsonl"
    controller, one, two = (Journal(path) for _ in range(3))
    controller.check_writable()
    for journal in (controller, one, two):
        journal.keep(session_entry("s"))
    controller.append(session_entry("s"))
    one.append(record_entry(tmp_path, "s", 1))
    two.append(record_entry(tmp_path, "s", 2))
    shutil.rmtree(path.parent)

    one.append(record_entry(tmp_path, "s", 3))
    two.write_kept()  # a worker's end: nothing more to append, its records kept all the same
    two.write_kept()  # and only once
    controller.append({"type": "session_end", "session_id": "s", "ended": 0.0, "exitstatus": 0,
                       "counts": {"passed": 3}})  # fmt: skip
    assert lines_of(controller) == [("session", None), ("record", "1"), ("record", "3"),
                                    ("record", "2"), ("session_end", None)]  # fmt: skip
    assert [len(j.rewritten) for j in (controller, one, two)] == [1, 1, 1]
    assert "created again: 0 record(s)" in controller.rewritten[0]
    for journal in (controller, one, two):
        journal.close()


def test_a_journal_whose_folder_is_gone_is_an_error_naming_it_when_not_kept(tmp_path):
    """A journal no session keeps (a reader's, a tool's) is not made again behind its back."""
    journal = Journal(tmp_path / "gone" / "journal.jsonl")
    with pytest.raises(HarnessError, match=r"cannot append to the journal .*gone/journal.jsonl: "
                       r"No such file or directory\. Fix: make .*gone writable"):  # fmt: skip
        journal.append(session_entry("s"))
    assert not journal.path.parent.exists()


# --- issue 50, item 4: a session marked experimental, after the fact ---


def test_a_mark_is_an_entry_of_its_own_folded_into_its_session_the_last_standing(tmp_path):
    """The journal is never edited: each mark is appended (and fsync'ed, as every entry), and
    the index folds the last one into its session's entry, as a reading from scratch does."""
    journal = Journal(tmp_path / "journal.jsonl")
    write_session(journal, tmp_path, "s1")
    write_session(journal, tmp_path, "s2")
    assert not any(map(is_experimental, (s.entry for s in journal.index().values())))  # kept
    before = journal.path.read_bytes()
    journal.append(mark_entry("s1", EXPERIMENTAL, "trying bf16", 1.0))
    assert journal.path.read_bytes().startswith(before)
    index = journal.index()  # the index kept before the mark, and the line appended since
    assert index["s1"].entry[MARK] == {"state": EXPERIMENTAL, "reason": "trying bf16",
                                       "marked": 1.0}  # fmt: skip
    assert is_experimental(index["s1"].entry) and not is_experimental(index["s2"].entry)
    assert len(journal.load([index["s1"]])["s1"].records) == 2 and index["s1"].end is not None
    journal.append(mark_entry("s1", RECORD, "it was fine", 2.0))
    assert mark_of(journal.sessions()["s1"].entry) == {"state": RECORD, "reason": "it was fine",
                                                      "marked": 2.0}  # fmt: skip
    entry, _end, _records = fresh_reading(journal)["s1"]
    assert mark_of(entry)["state"] == RECORD


def test_a_mark_read_before_its_session_entry_stays_with_it(tmp_path):
    """A journal re-created mid-session (its entry written again after its records): the mark
    appended in between is the session's still."""
    journal = Journal(tmp_path / "journal.jsonl")
    journal.append(record_entry(tmp_path, "s", 1))
    journal.append(mark_entry("s", EXPERIMENTAL, "", 1.0))
    journal.append(session_entry("s"))
    assert is_experimental(journal.sessions()["s"].entry)


@pytest.mark.parametrize(
    "change, said",
    [
        ({"state": "retracted"}, "ignored what this version of amp-harness does not know "
                                 "(written by a newer one? upgrade to read it): session_mark "
                                 "state 'retracted' (lines 5)"),
        ({"session_id": "gone"}, "left out 1 session ends or marks of sessions whose session "
                                 "entry is missing or unusable (lines 5)"),
        ({"marked": "yesterday"}, 'journal.jsonl:5: skipped a journal entry it cannot use: '
                                  'session_mark entry: field "marked" is text'),
    ],
    ids=["state", "session", "field"],
)  # fmt: skip
def test_a_mark_a_reader_cannot_use_is_said_and_marks_nothing(tmp_path, change, said):
    journal = Journal(tmp_path / "journal.jsonl")
    write_session(journal, tmp_path, "s1")
    journal.append({**mark_entry("s1", EXPERIMENTAL, "", 1.0), **change})
    with pytest.warns(UserWarning) as caught:
        (session,) = journal.index().values()
    assert any(said in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert not is_experimental(session.entry)


def test_an_index_kept_before_marks_existed_is_read_again(tmp_path):
    """An index of format 2 took a mark for an entry type it did not know: a reading of this
    version reads the journal again, and finds the mark."""
    journal = Journal(tmp_path / "journal.jsonl")
    write_session(journal, tmp_path, "s1")
    journal.append(mark_entry("s1", EXPERIMENTAL, "", 1.0))
    journal.index()
    kept = journal.path.with_name(".journal.jsonl.index")
    index = json.loads(kept.read_text())
    del index["sessions"]["s1"]["entry"][MARK]
    kept.write_text(json.dumps({**index, "format": 2}))
    assert is_experimental(journal.index()["s1"].entry)
