"""Bad input that no other test tries (docs/bad-input.md lists every bad input tried and the
test that tries it): each gets an error naming the input and the fix, and loses nothing."""

from __future__ import annotations

import fnmatch
import time

import pytest

from harness import cli
from harness.errors import HarnessError
from harness.journal import Journal
from harness.record import Record, Verdict

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


def test_a_corrupt_journal_line_is_skipped_and_sync_replays_the_rest(tmp_path, capsys):
    from mlflow import MlflowClient

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
