"""MLflow off the tests' path (issue 56): the Writer logs a session's results in a thread of its
own. The tests hand a result over and go on, whatever MLflow does; a full queue or a writer
still busy at the end's bound leaves the rest to `sync`, which logs each result once; a process
killed in the middle of a result loses nothing. Counted and ordered, never timed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from helpers.tracked import (
    SCENARIOS,
    assert_each_record_once_and_whole,
    journal,
    runs,
    store_in,
    sync_in_a_new_process,
    write_journal,
)
from helpers.writer import held_until_released, in_the_writer

from harness.records.journal import Journal
from harness.records.mlflow import sink
from harness.records.tracking import MlflowSink, Writer, sync

WAIT_S = 60  # a deadlock guard, far past anything the machine's load explains: never a measure


class Held:
    """Each batch of MlflowSink.log_records held until `release()`: a server as slow as a test
    wants; `entered(timeout)` once the sink is in the middle of its results. In the writer's
    process (`in_the_writer`), or in this one (`here`, for a sink called on the tests' thread)."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    @classmethod
    def in_the_writer(cls, tmp_path, monkeypatch) -> Held:
        held = cls(tmp_path / "hold")
        in_the_writer(monkeypatch, hold=str(held.folder))
        return held

    @classmethod
    def here(cls, tmp_path, monkeypatch) -> Held:
        held = cls(tmp_path / "hold")
        holding = held_until_released(MlflowSink.log_records, held.folder, WAIT_S)
        monkeypatch.setattr(sink.MlflowSink, "log_records", holding)
        return held

    def entered(self, timeout: float = WAIT_S) -> bool:
        deadline = time.monotonic() + timeout
        while not (self.folder / "inside").exists():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def release(self) -> None:
        (self.folder / "release").touch()


def returns_while_busy(hand_over, held: Held, session: dict, records: list) -> bool:
    """Whether `hand_over` (a writer's log_record) returns for every result while the writer is
    held in the middle of the first: what a test waits for MLflow."""
    done = threading.Event()

    def hand_all() -> None:
        for record in records:
            hand_over(session, record)
        done.set()

    threading.Thread(target=hand_all, daemon=True).start()
    if not held.entered():
        return False
    returned = done.wait(2)  # the writer is held: a hand-over that waits for it never returns
    held.release()
    done.wait(WAIT_S)
    return returned


def a_session(tmp_path, records: int = 3):
    (found,) = write_journal(tmp_path, records=records).sessions().values()
    return found


def a_held_writer(tmp_path, empty_store, monkeypatch, records: int = 3, **options):
    """A Writer on a copy of the empty store, its session started, its sink held (Held): the
    store's URI, the session, the hold and the writer."""
    uri = store_in(tmp_path, empty_store)
    session = a_session(tmp_path, records)
    held = Held.in_the_writer(tmp_path, monkeypatch)
    logging = Writer(uri, "amp-harness", tmp_path, **options)
    logging.start_session(session.entry)
    return uri, session, held, logging


def test_the_tests_never_wait_for_a_slow_mlflow_and_sync_completes_it(
    tmp_path, empty_store, monkeypatch
):
    uri, session, held, logging = a_held_writer(tmp_path, empty_store, monkeypatch)
    assert returns_while_busy(logging.log_record, held, session.entry, session.records)
    logging.end_session(session.entry, session.end)
    assert logging.down is None and logging.unsent == {}
    assert_each_record_once_and_whole(Journal(tmp_path / "journal.jsonl"), uri)


def test_a_logger_on_the_tests_thread_is_caught_waiting(tmp_path, empty_store, monkeypatch):
    """Sensitivity: MlflowSink itself, called on the tests' thread, fails the check above."""
    uri = store_in(tmp_path, empty_store)
    session = a_session(tmp_path)
    held = Held.here(tmp_path, monkeypatch)
    inline = MlflowSink(uri, reports=tmp_path)
    hand_over = lambda entry, record: inline.log_records(entry, [record])  # noqa: E731
    assert not returns_while_busy(hand_over, held, session.entry, session.records)


def test_a_writer_still_busy_at_the_end_s_bound_says_what_sync_sends(
    tmp_path, empty_store, monkeypatch
):
    uri, session, held, logging = a_held_writer(tmp_path, empty_store, monkeypatch)
    logging.log_record(session.entry, session.records[0])
    assert held.entered()  # the first in the writer's hands, the others behind it
    for record in session.records[1:]:
        logging.log_record(session.entry, record)
    assert logging.down is None  # results on their way are no failure, until the end's bound
    logging.end_session(session.entry, session.end, flush_s=0.1)  # the writer is held
    assert logging.down.startswith(
        "3 results not sent live (the writer was still sending 0.1 s after the session's end: "
        "a slow server or store): "
    ), logging.down
    assert "amp-harness sync" in logging.recovery()
    assert logging._process.returncode is not None  # stopped: no process left behind
    counts = sync(MlflowSink(uri, reports=tmp_path), Journal(tmp_path / "journal.jsonl"))
    assert (counts["records_present"], counts["records_sent"]) == (0, 3)
    assert_each_record_once_and_whole(Journal(tmp_path / "journal.jsonl"), uri)


def test_a_full_queue_leaves_the_result_to_sync_and_the_test_goes_on(
    tmp_path, empty_store, monkeypatch
):
    uri, session, held, logging = a_held_writer(tmp_path, empty_store, monkeypatch, 4, capacity=3)
    logging.log_record(session.entry, session.records[0])
    assert held.entered()  # the first result in the writer's hands
    # The second and third waiting: no room for the fourth (3 results handed over and not yet
    # sent), which returns at once all the same.
    assert returns_while_busy(logging.log_record, held, session.entry, session.records[1:])
    logging.end_session(session.entry, session.end)
    last = session.records[-1].test
    assert logging.down == (
        f"1 results not sent live (the writer's queue was full: MLflow is slower than the "
        f"tests): {last}"
    )
    counts = sync(MlflowSink(uri, reports=tmp_path), Journal(tmp_path / "journal.jsonl"))
    assert (counts["records_present"], counts["records_sent"]) == (3, 1)
    assert_each_record_once_and_whole(Journal(tmp_path / "journal.jsonl"), uri)


def test_a_writer_that_cannot_open_the_store_is_said_as_the_sink_said_it(tmp_path, monkeypatch):
    in_the_writer(monkeypatch, store="full")
    session = a_session(tmp_path)
    logging = Writer(f"sqlite:///{tmp_path}/mlflow.db", "amp-harness", tmp_path)
    logging.start_session(session.entry)
    for record in session.records:
        logging.log_record(session.entry, record)
    logging.end_session(session.entry, session.end)
    assert logging.down.startswith("cannot open the store ") and "disk is full" in logging.down
    assert "free space on the disk" in logging.recovery()


# --- a process killed in the middle of a result --------------------------------------------


@pytest.mark.slow
def test_a_writer_killed_mid_result_loses_nothing_and_sync_logs_each_once(pytester, monkeypatch):
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIOS})
    in_the_writer(monkeypatch, kill="test_second")  # as it writes test_second's files
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess(
        "scenarios", "--amp-device=cpu", "-p", "no:cacheprovider", f"--amp-reports={reports}"
    )
    assert result.ret == 0, result.stdout.str()  # the tests never noticed
    result.stdout.fnmatch_lines(["MLflow: * results not sent live (the writer's process ended "
                                 "with exit status -9): *amp-harness sync*"])  # fmt: skip
    synced = sync_in_a_new_process(reports)
    assert synced.returncode == 0, synced.stderr
    # Its batch was one transaction, never begun: no run half-made for sync to replace.
    assert "half-logged" not in synced.stdout, synced.stdout
    assert_each_record_once_and_whole(journal(pytester), writer_uri(reports))


KILL_THE_SESSION = """
import os, signal


def pytest_runtest_setup(item):
    if item.name == "test_third":  # test_first and test_second recorded, and handed over
        os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_a_session_killed_outright_leaves_no_writer_behind_and_sync_logs_each_once(
    pytester, monkeypatch
):
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIOS})
    pytester.makeconftest(KILL_THE_SESSION)
    pids = pytester.path / "writer.pid"
    in_the_writer(monkeypatch, pid=str(pids))
    reports = pytester.path / "reports"
    killed = pytester.runpytest_subprocess(
        "scenarios", "--amp-device=cpu", "-p", "no:cacheprovider", f"--amp-reports={reports}"
    )
    assert killed.ret == -9, killed.stdout.str()
    deadline = time.monotonic() + WAIT_S  # the writer may start after the session died
    while not pids.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    (pid,) = (int(line) for line in pids.read_text().split())
    assert gone(pid, WAIT_S)  # its stdin closed with the session: it sent what it had, and ended
    held = [e for e in journal(pytester).entries() if e["type"] == "record"]
    assert len(held) == 2
    synced = sync_in_a_new_process(reports)
    assert synced.returncode == 0, synced.stderr
    assert_each_record_once_and_whole(journal(pytester), writer_uri(reports))
    (parent,) = [r for r in runs(writer_uri(reports)) if r.data.tags["amp.kind"] == "session"]
    assert parent.info.status == "KILLED", parent.info.status  # ended by sync, saying why


def gone(pid: int, timeout: float) -> bool:
    """Whether process `pid` ended within `timeout` (a zombie no one reaped counts as ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def writer_uri(reports) -> str:
    return f"sqlite:///{reports / 'mlflow.db'}"


def test_a_result_s_files_go_in_one_upload_where_mlflow_shows_them(tmp_path, empty_store):
    """record.json and every figure in one upload (a call each cost a request each), at the
    paths they had: record.json, figures/NAME."""
    from mlflow import MlflowClient

    uri = store_in(tmp_path, empty_store)
    session = a_session(tmp_path, records=1)
    (record,) = session.records
    record.artifact_dir = tmp_path / "figures-here"
    record.artifact_dir.mkdir()
    for name in ("loss.png", "scale.png"):
        (record.artifact_dir / name).write_bytes(b"\x89PNG " + name.encode())
        record.figures.append(name)
    logging = MlflowSink(uri, reports=tmp_path)
    calls: list[str] = []
    for name in ("log_artifacts_to", "log_artifacts", "log_artifact", "log_text"):
        method = getattr(logging.client, name)
        setattr(
            logging.client,
            name,
            lambda *a, _n=name, _m=method, **k: (calls.append(_n), _m(*a, **k))[1],
        )
    logging.start_session(session.entry)
    logging.log_record(session.entry, record)
    assert logging.down is None and calls == ["log_artifacts_to"]
    (run,) = [r for r in MlflowClient(uri).search_runs([logging.experiment_id()])
              if r.data.tags["amp.kind"] == "test"]  # fmt: skip
    files = MlflowClient(uri).list_artifacts(run.info.run_id, "figures")
    assert sorted(f.path for f in files) == ["figures/loss.png", "figures/scale.png"]
    where = MlflowClient(uri).download_artifacts(
        run.info.run_id, "figures/scale.png", str(tmp_path)
    )
    assert Path(where).read_bytes() == b"\x89PNG scale.png"
