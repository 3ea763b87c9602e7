"""Bad input that no other test tries (docs/bad-input.md lists every bad input tried and the
test that tries it): each gets an error naming the input and the fix, and loses nothing."""

from __future__ import annotations

import fnmatch
import json
import time
from pathlib import Path

import pytest
from helpers.tracked import store_in

from harness import cli
from harness.common.errors import HarnessError
from harness.records.journal import Journal
from harness.records.record import Record, Verdict
from harness.reports import baseline

SCENARIO = """
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes, fp32 4 bytes")
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIO})
    return pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "-p", "no:cacheprovider",
        f"--amp-reports={pytester.path / 'reports'}", *args,
    )  # fmt: skip


def test_an_unknown_amp_device_is_a_usage_error_listing_the_choices(pytester):
    result = run(pytester, "--amp-device=gpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--amp-device: invalid choice: 'gpu'*auto*cpu*cuda*"])
    assert not (pytester.path / "reports").exists()  # stopped before anything was recorded


def test_a_thread_count_below_one_is_a_usage_error(pytester):
    result = run(pytester, "--amp-device=cpu", "--amp-cpu-threads=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--amp-cpu-threads*"])


@pytest.mark.parametrize(
    ("option", "environment", "message"),
    [
        (["--tracking-uri", "mlruns"], None, "--tracking-uri='mlruns': *scheme '(none)'*"),
        ([], "ftp://example/x", "MLFLOW_TRACKING_URI='ftp://example/x': *scheme 'ftp'*"),
    ],
    ids=["option-without-scheme", "environment"],
)
def test_sync_to_an_unknown_tracking_scheme_names_where_it_came_from(
    tmp_path, capsys, monkeypatch, option, environment, message
):
    if environment:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", environment)
    else:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert cli.main(["sync", "--reports", str(tmp_path), *option]) == 2
    err = capsys.readouterr().err
    assert fnmatch.fnmatch(err, f"*{message}Use one of sqlite://*"), err


def test_a_corrupt_journal_line_is_skipped_and_sync_replays_the_rest(tmp_path, capsys, empty_store):
    from mlflow import MlflowClient

    store_in(tmp_path, empty_store)
    journal = Journal(tmp_path / "journal.jsonl")
    session = {"type": "session", "session_id": "s1", "name": "n", "started": time.time(),
               "args": [], "fingerprint": {"device": "cpu"}}  # fmt: skip
    journal.append(session)
    for index, claim in enumerate(("FMT-BYTES", "FMT-BITS")):
        record = Record(f"scenarios/test_x.py::test_{index}", [claim], "cpu", tmp_path,
                        outcome="passed", ended=time.time())  # fmt: skip
        record.verdicts[claim] = Verdict(claim, "confirmed", "2 bytes")
        journal.append({"type": "record", "session_id": "s1", "record": record.to_dict()})
        if index == 0:
            with journal.path.open("a") as f:
                f.write('{"type": "record", "session_id": "s1", "rec\n')  # cut by a crash
    journal.append({"type": "session_end", "session_id": "s1", "ended": time.time(),
                    "exitstatus": 0, "counts": {"passed": 2}})  # fmt: skip
    before = journal.path.read_text()

    with pytest.warns(UserWarning, match=r"journal.jsonl:3: skipped a corrupt journal line"):
        assert cli.main(["sync", "--reports", str(tmp_path)]) == 0
    assert "2 results sent, 0 already there" in capsys.readouterr().out
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("amp-harness").experiment_id])
    tests = sorted(r.data.tags["claims"] for r in runs if r.data.tags["amp.kind"] == "test")
    assert tests == ["FMT-BITS", "FMT-BYTES"]
    assert journal.path.read_text() == before  # the corrupt line is kept, nothing rewritten


def test_a_metric_name_mlflow_refuses_is_an_error_before_anything_is_logged(tmp_path):
    record = Record("scenarios/test_x.py::test_y", ["FMT-BYTES"], "cpu", tmp_path)
    with pytest.raises(HarnessError, match=r"metric name 'bytes:fp16': use letters, digits"):
        record.metric(**{"bytes:fp16": 2})
    assert record.metrics == {}


# --- the journal: a cut line, an unusable entry, a name MLflow refuses
# (tests/records/test_journal.py tries each in detail) ---


def test_a_session_after_a_cut_journal_line_is_synced_and_compared(pytester, capsys, empty_store):
    """A full disk or a crash cut the journal's last line; the next session is read whole:
    `sync` sends it, `compare last` and `baseline save` act on it."""
    reports = pytester.path / "reports"
    store_in(reports, empty_store)
    assert run(pytester, "--amp-device=cpu").ret == 0
    journal = Journal(reports / "journal.jsonl")
    with journal.path.open("a") as f:
        f.write('{"type": "record", "session_id": "abc", "rec')  # cut: no newline
    assert run(pytester, "--amp-device=cpu").ret == 0
    corrupt = r"journal.jsonl:4: skipped a corrupt journal line"

    with pytest.warns(UserWarning, match=corrupt):
        first, second = journal.sessions()
    with pytest.warns(UserWarning, match=corrupt):
        assert cli.main(["sync", "--reports", str(reports)]) == 0
    assert "2 results sent, 0 already there" in capsys.readouterr().out
    with pytest.warns(UserWarning, match=corrupt):
        assert cli.main(["compare", "last", first, "--reports", str(reports), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["a"].startswith(f"session {second[:12]} ")
    with pytest.warns(UserWarning, match=corrupt):
        code = cli.main(["baseline", "save", "--reports", str(reports), "--out", str(reports)])
    assert code == 0
    (saved,) = reports.glob("cpu-*.json")
    assert json.loads(saved.read_text())["session_id"] == second


@pytest.fixture
def broken_record(pytester: pytest.Pytester) -> Path:
    """A session and its baseline; then a record of that session loses its "verdicts" (well-formed
    JSON, a field missing). Returns the baseline."""
    reports = pytester.path / "reports"
    assert run(pytester, "--amp-device=cpu").ret == 0
    journal = Journal(reports / "journal.jsonl")
    saved = baseline.save(baseline.summarize(journal), reports / "baselines")
    lines = journal.path.read_text().splitlines()
    broken = json.loads(lines[1])
    del broken["record"]["verdicts"]
    journal.path.write_text("\n".join([lines[0], json.dumps(broken), *lines[1:]]) + "\n")
    return saved


def test_a_record_no_reader_can_use_does_not_stop_a_session_compared_with_its_baseline(
    pytester, broken_record
):
    """The reader's warning is shown under the verdict table; the comparison is made."""
    result = run(pytester, "--amp-device=cpu", f"--amp-baseline={broken_record}",
                 "-W", "default::UserWarning")  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "journal: *journal.jsonl:2: skipped a journal entry it cannot use: record: field "
            '"verdicts" is missing*',
            f"baseline {broken_record}: no verdict changed*",
        ]
    )


def test_a_record_no_reader_can_use_does_not_stop_a_session_where_warnings_are_errors(
    pytester, broken_record
):
    result = run(pytester, "--amp-device=cpu", f"--amp-baseline={broken_record}",
                 "-W", "error::UserWarning")  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*journal.jsonl:2: skipped a journal entry it cannot use*"])


def test_a_full_disk_mid_session_stops_it_with_one_line_and_keeps_what_was_recorded(
    pytester, monkeypatch
):
    """The journal cannot take the second test's record: the session stops there, saying why
    and what to do, instead of an INTERNALERROR; the first record and the session entry stay."""
    import errno
    import os

    real_write, calls = os.write, []

    def full_after_two(fd, data):
        calls.append(1)
        if len(calls) > 2:  # the session entry and the first record went in
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    two = SCENARIO + SCENARIO.replace("import pytest", "").replace("test_bytes", "test_more")
    pytester.makepyfile(**{"scenarios/test_two": two})
    monkeypatch.setattr("harness.records.journal.os.write", full_after_two)
    result = pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={pytester.path / 'reports'}",
    )  # fmt: skip
    monkeypatch.setattr("harness.records.journal.os.write", real_write)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    text = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in text
    assert "No space left on device" in text and "free space on the disk of" in text
    lines = (pytester.path / "reports" / "journal.jsonl").read_text().splitlines()
    assert [json.loads(line)["type"] for line in lines] == ["session", "record"]


def test_a_journal_line_nested_too_deeply_is_skipped_by_every_reader(pytester, capsys, empty_store):
    """`{"type": "record", "record": ` and 100,000 `[`: json.loads would raise RecursionError in
    every reader; each skips the line with the warning other unreadable lines get, and reads the
    rest: list, sync, compare last, baseline save, and a session's end with --amp-baseline."""
    reports = pytester.path / "reports"
    store_in(reports, empty_store)
    assert run(pytester, "--amp-device=cpu").ret == 0
    journal = Journal(reports / "journal.jsonl")
    saved = baseline.save(baseline.summarize(journal), reports / "baselines")
    with journal.path.open("a") as f:
        f.write('{"type": "record", "record": ' + "[" * 100_000 + "\n")
    deep = r"journal.jsonl:4: skipped a corrupt journal line \(nested too deeply"

    result = run(pytester, "--amp-device=cpu", f"--amp-baseline={saved}",
                 "-W", "default::UserWarning")  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*journal.jsonl:4: skipped a corrupt journal line*",
                                 f"baseline {saved}: no verdict changed*"])  # fmt: skip
    capsys.readouterr()
    with pytest.warns(UserWarning, match=deep):
        assert cli.main(["list", "--reports", str(reports), "--json"]) == 0
    assert any(row["last_verdict"] for row in json.loads(capsys.readouterr().out))
    with pytest.warns(UserWarning, match=deep):
        assert cli.main(["sync", "--reports", str(reports)]) == 0
    assert "2 results sent" in capsys.readouterr().out
    with pytest.warns(UserWarning, match=deep):
        assert cli.main(["compare", str(saved), "last", "--reports", str(reports)]) == 0
    with pytest.warns(UserWarning, match=deep):
        assert cli.main(["baseline", "save", "--reports", str(reports), "--out",
                         str(reports / "again")]) == 0  # fmt: skip


@pytest.mark.parametrize(
    ("lacks", "name"),
    [
        ("cpu", "cpu-n-a_torch-2.13.0+cpu.json"),
        ("device", "cpu-x86-64_torch-2.13.0+cpu.json"),  # not cuda
        ("torch", "cpu-x86-64_torch-n-a.json"),
    ],
)
def test_a_fingerprint_without_a_fact_reads_it_as_n_a(tmp_path, capsys, lacks, name, empty_store):
    """A session fingerprint from another version, without `cpu` (a renamed field): `report`
    and `baseline save` read the missing fact as n/a instead of ending in a KeyError."""
    journal = Journal(tmp_path / "journal.jsonl")
    facts = {"device": "cpu", "cpu": "x86_64", "torch": "2.13.0+cpu"}
    del facts[lacks]
    store_in(tmp_path, empty_store)
    journal.append({"type": "session", "session_id": "s1", "name": "n", "started": time.time(),
                    "args": [], "fingerprint": facts})  # fmt: skip
    record = Record("scenarios/test_x.py::test_0", ["FMT-BYTES"], "cpu", tmp_path,
                    outcome="passed", ended=time.time())  # fmt: skip
    record.verdicts["FMT-BYTES"] = Verdict("FMT-BYTES", "confirmed", "2 bytes")
    journal.append({"type": "record", "session_id": "s1", "record": record.to_dict()})
    journal.append({"type": "session_end", "session_id": "s1", "ended": time.time(),
                    "exitstatus": 0, "counts": {"passed": 1}})  # fmt: skip
    out = tmp_path / "baselines"
    reports = ["--reports", str(tmp_path)]
    assert cli.main(["baseline", "save", *reports, "--out", str(out)]) == 0
    assert [p.name for p in out.glob("*.json")] == [name]
    assert cli.main(["baseline", "changes", "--baselines", str(out)]) == 0
    assert cli.main(["sync", *reports]) == 0
    assert cli.main(["report", *reports, "--baseline", "auto"]) == 0, capsys.readouterr().err
    assert "report written" in capsys.readouterr().out


LATIN1 = """
import os

import pytest

PATH = os.fsdecode(b"/data/caf\\xe9.bin")  # what a Latin-1 file name gives: caf\\udce9


@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    record.param(path=PATH)
    record.verdict("FMT-BYTES", "confirmed", f"2 bytes read from {PATH}")


@pytest.mark.claim("FMT-BITS")
def test_bits(record):
    pytest.skip(f"no data at {PATH}")
"""


def test_text_that_is_not_utf8_is_escaped_and_the_session_goes_on(pytester, empty_store):
    """Evidence, a param and a skip reason holding a file name decoded with surrogateescape,
    in a folder whose own name is not UTF-8 (the test's name): each is kept escaped (caf\\xe9)
    in the journal and in MLflow, and every test runs (before: INTERNALERROR, that record in
    neither, the next test never run)."""
    import os

    from mlflow import MlflowClient

    folder = pytester.path / "scenarios" / os.fsdecode(b"caf\xe9")
    folder.mkdir(parents=True)
    (folder / "test_latin.py").write_text(LATIN1)
    reports = pytester.path / "reports"
    store_in(reports, empty_store)
    result = pytester.runpytest_inprocess(
        "scenarios", "--amp-device=cpu", "-p", "no:cacheprovider", f"--amp-reports={reports}",
        "-v",
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=1, skipped=1)
    assert "INTERNALERROR" not in result.stdout.str()
    (session,) = Journal(reports / "journal.jsonl").sessions().values()
    assert session.end["counts"] == {"passed": 1, "skipped": 1}
    by_name = {r.test.split("::")[-1]: r for r in session.records}
    assert by_name["test_bytes"].test.startswith("scenarios/caf\\xe9/")
    assert by_name["test_bytes"].params["path"] == "/data/caf\\xe9.bin"
    assert by_name["test_bytes"].verdicts["FMT-BYTES"].evidence.endswith("/data/caf\\xe9.bin")
    assert by_name["test_bits"].message == "no data at /data/caf\\xe9.bin"
    client = MlflowClient(f"sqlite:///{reports / 'mlflow.db'}")
    runs = client.search_runs(
        [client.get_experiment_by_name("amp-harness").experiment_id], "tags.outcome = 'passed'"
    )
    assert [run.data.params["path"] for run in runs] == ["/data/caf\\xe9.bin"]
    assert runs[0].data.tags["evidence.FMT-BYTES"].endswith("/data/caf\\xe9.bin")


def test_a_claim_statement_that_is_not_utf8_is_escaped_by_new(pytester, capsys):
    import os

    statement = os.fsdecode(b"reads caf\xe9 files in 2 passes")  # typed in a Latin-1 terminal
    (pytester.path / "scenarios").mkdir()
    code = cli.main(["new", "latin", "--claim", "TEAM-LATIN", statement, "--source",
                     os.fsdecode(b"ticket \xe9 1")])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    text = (pytester.path / "scenarios" / "claims.toml").read_text(encoding="utf-8")
    assert "reads caf\\\\xe9 files" in text and "ticket \\\\xe9 1" in text  # TOML escapes \\


@pytest.mark.parametrize(
    "mlflow",
    [pytest.param([], marks=pytest.mark.slow), ["--no-mlflow"]],  # MLflow: a store, a report
    ids=["with-mlflow", "no-mlflow"],
)
def test_run_that_selects_no_test_names_only_what_is_there(pytester, capsys, mlflow):
    """Issue 55, fault 16: `amp-harness run -k no_such_test` pointed at a journal never written
    and said to "run `amp-harness run` first"; now it says no test was selected, and where to
    look next names only what exists."""
    pytester.makepyfile(**{"scenarios/test_run_none": SCENARIO})
    pytester.makeini("[pytest]\n")  # the rootdir: scenarios/ is in it
    code = cli.main(["run", "--amp-device=cpu", "-k", "no_such_test", "-p", "no:cacheprovider",
                     *mlflow])  # fmt: skip
    assert code == pytest.ExitCode.NO_TESTS_COLLECTED
    out = capsys.readouterr().out
    assert (
        "no session recorded: no scenario test was selected by -k 'no_such_test': "
        "`amp-harness list` names the claims and the tests that check them"
    ) in out
    assert "journal.jsonl" not in out and "amp-harness run` first" not in out
    assert "amp-harness ui" not in out and "report:" not in out  # no store, no report to write
    assert not (pytester.path / "reports" / "journal.jsonl").is_file()
    # The control: once a session recorded, the journal is named.
    assert cli.main(["run", "--amp-device=cpu", "-p", "no:cacheprovider", *mlflow]) == 0
    assert "reports/journal.jsonl  every result, as recorded" in capsys.readouterr().out
