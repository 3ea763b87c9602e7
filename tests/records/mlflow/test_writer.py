"""MLflow off the tests' path (issue 56): the Writer logs a session's results in a thread of its
own. The tests hand a result over and go on, whatever MLflow does; a full queue or a writer
still busy at the end's bound leaves the rest to `sync`, which logs each result once; a process
killed in the middle of a result loses nothing. Counted and ordered, never timed."""

from __future__ import annotations

import contextlib
import threading
import warnings
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
from test_warnings_as_errors import warn_from

from harness.records.journal import Journal
from harness.records.mlflow import bounds, sink
from harness.records.tracking import MlflowSink, Writer, sync

WAIT_S = 60  # a deadlock guard, far past anything the machine's load explains: never a measure


class Held:
    """MlflowSink.log_records held at each call until `release`: a server as slow as a test
    wants. `inside` is set once the writer is in the middle of its results."""

    def __init__(self, monkeypatch):
        self.inside, self.release = threading.Event(), threading.Event()
        real = MlflowSink.log_records

        def held(sink_, session, records):
            self.inside.set()
            assert self.release.wait(WAIT_S), "never released"
            return real(sink_, session, records)

        monkeypatch.setattr(sink.MlflowSink, "log_records", held)


def returns_while_busy(hand_over, held: Held, session: dict, records: list) -> bool:
    """Whether `hand_over` (a writer's log_record) returns for every result while the writer is
    held in the middle of the first: what a test waits for MLflow."""
    done = threading.Event()

    def hand_all() -> None:
        for record in records:
            hand_over(session, record)
        done.set()

    threading.Thread(target=hand_all, daemon=True).start()
    if not held.inside.wait(WAIT_S):
        return False
    returned = done.wait(2)  # the writer is held: a hand-over that waits for it never returns
    held.release.set()
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
    held = Held(monkeypatch)
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
    held = Held(monkeypatch)
    inline = MlflowSink(uri, reports=tmp_path)
    hand_over = lambda entry, record: inline.log_records(entry, [record])  # noqa: E731
    assert not returns_while_busy(hand_over, held, session.entry, session.records)


def test_a_writer_still_busy_at_the_end_s_bound_says_what_sync_sends(
    tmp_path, empty_store, monkeypatch
):
    uri, session, held, logging = a_held_writer(tmp_path, empty_store, monkeypatch)
    logging.log_record(session.entry, session.records[0])
    assert held.inside.wait(WAIT_S)  # the first in the writer's hands, the others behind it
    for record in session.records[1:]:
        logging.log_record(session.entry, record)
    assert logging.down is None  # results on their way are no failure, until the end's bound
    logging.end_session(session.entry, session.end, flush_s=0.1)  # the writer is held
    assert logging.down.startswith(
        "3 results not sent live (the writer was still sending 0.1 s after the session's end: "
        "a slow server or store): "
    ), logging.down
    assert "amp-harness sync" in logging.recovery()
    held.release.set()
    logging._thread.join(WAIT_S)  # it ends the result in hand, then stops
    counts = sync(MlflowSink(uri, reports=tmp_path), Journal(tmp_path / "journal.jsonl"))
    assert (counts["records_present"], counts["records_sent"]) == (1, 2)
    assert_each_record_once_and_whole(Journal(tmp_path / "journal.jsonl"), uri)


def test_a_full_queue_leaves_the_result_to_sync_and_the_test_goes_on(
    tmp_path, empty_store, monkeypatch
):
    uri, session, held, logging = a_held_writer(tmp_path, empty_store, monkeypatch, 4, capacity=2)
    logging.log_record(session.entry, session.records[0])
    assert held.inside.wait(WAIT_S)  # the first result in the writer's hands
    # The second and third waiting: no room for the fourth, which returns at once all the same.
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
    def full(uri, set_aside=None):
        raise OSError("database or disk is full")

    monkeypatch.setattr(bounds, "client", full)  # where the sink looks it up
    session = a_session(tmp_path)
    logging = Writer(f"sqlite:///{tmp_path}/mlflow.db", "amp-harness", tmp_path)
    logging.start_session(session.entry)
    for record in session.records:
        logging.log_record(session.entry, record)
    logging.end_session(session.entry, session.end)
    assert logging.down.startswith("cannot open the store ") and "disk is full" in logging.down
    assert "free space on the disk" in logging.recovery()


# --- the writer's warnings filter: its thread's alone ------------------------------------


def warned_in_a_test_beside_a_writer(own_filter: bool) -> list:
    """A writer's MLflow call that begins before a test and ends during it (as pytest records
    each test's warnings, with catch_warnings), then a warning of the test's (torch's): what
    the test recorded."""
    entered, test_in, left = threading.Event(), threading.Event(), threading.Event()

    def writer_call() -> None:
        bounds.ignore_foreign_in_this_thread(own_filter)
        with bounds.foreign_warnings_ignored():
            entered.set()
            test_in.wait(WAIT_S)
            warn_from("sqlalchemy.orm")  # MLflow's libraries warn: ignored in this thread
        left.set()
        bounds.ignore_foreign_in_this_thread(False)

    thread = threading.Thread(target=writer_call)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a user's -W error
        thread.start()
        assert entered.wait(WAIT_S)
        with warnings.catch_warnings(record=True) as caught:  # the test's
            warnings.simplefilter("always")
            test_in.set()
            assert left.wait(WAIT_S)
            with contextlib.suppress(
                Warning
            ):  # lost: the filters the test replaced made it an error
                warn_from("torch.amp.grad_scaler")
        thread.join(WAIT_S)
    return [str(w.filename) for w in caught]


def test_a_writer_s_warnings_filter_leaves_the_test_s_warnings_alone():
    assert warned_in_a_test_beside_a_writer(own_filter=True) == ["torch.amp.grad_scaler.py"]


def test_catch_warnings_in_the_writer_s_thread_would_lose_the_test_s_warning():
    """Sensitivity: the catch_warnings MLflow calls used (foreign_warnings_ignored without the
    thread's own filter): begun before the test, it is behind the test's filters; ended while
    the test ran, it put back the filters from before the test."""
    # The test caught the writer's warning, and its own was made an error by the filters from
    # before it.
    assert warned_in_a_test_beside_a_writer(own_filter=False) == ["sqlalchemy.orm.py"]


# --- a process killed in the middle of a result --------------------------------------------

KILL_IN_THE_WRITER = """
import os, signal
from harness.records.mlflow import sink

real = sink.MlflowSink._stage_files


def killing(record, folder):
    if record.test.endswith("test_second"):  # its files half-written, its run not
        os.kill(os.getpid(), signal.SIGKILL)
    return real(record, folder)


sink.MlflowSink._stage_files = staticmethod(killing)
"""


@pytest.mark.slow
def test_a_session_killed_mid_result_in_the_writer_loses_nothing_and_sync_logs_each_once(
    pytester,
):
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIOS})
    pytester.makeconftest(KILL_IN_THE_WRITER)
    reports = pytester.path / "reports"
    killed = pytester.runpytest_subprocess(
        "scenarios", "--amp-device=cpu", "-p", "no:cacheprovider", f"--amp-reports={reports}"
    )
    assert killed.ret == -9, killed.stdout.str()
    held = [e for e in journal(pytester).entries() if e["type"] == "record"]
    assert len(held) >= 2  # the journal first: the writer got only what it held
    synced = sync_in_a_new_process(reports)
    assert synced.returncode == 0, synced.stderr
    # Its batch was one transaction, never begun: no run half-made for sync to replace.
    assert "half-logged" not in synced.stdout, synced.stdout
    assert_each_record_once_and_whole(journal(pytester), writer_uri(reports))
    # Its run ended: from the journal's end where the tests had finished before the kill, else
    # as KILLED.
    (parent,) = [r for r in runs(writer_uri(reports)) if r.data.tags["amp.kind"] == "session"]
    assert parent.info.status in ("FINISHED", "KILLED"), parent.info.status


def writer_uri(reports) -> str:
    return f"sqlite:///{reports / 'mlflow.db'}"


def test_a_result_s_files_go_in_one_upload_where_mlflow_shows_them(tmp_path, empty_store):
    """record.json and every figure in one log_artifacts (a call each cost a request each), at
    the paths they had: record.json, figures/NAME."""
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
    for name in ("log_artifacts", "log_artifact", "log_text"):
        method = getattr(logging.client, name)
        setattr(
            logging.client,
            name,
            lambda *a, _n=name, _m=method, **k: (calls.append(_n), _m(*a, **k))[1],
        )
    logging.start_session(session.entry)
    logging.log_record(session.entry, record)
    assert logging.down is None and calls == ["log_artifacts"]
    (run,) = [r for r in MlflowClient(uri).search_runs([logging.experiment_id()])
              if r.data.tags["amp.kind"] == "test"]  # fmt: skip
    files = MlflowClient(uri).list_artifacts(run.info.run_id, "figures")
    assert sorted(f.path for f in files) == ["figures/loss.png", "figures/scale.png"]
    where = MlflowClient(uri).download_artifacts(
        run.info.run_id, "figures/scale.png", str(tmp_path)
    )
    assert Path(where).read_bytes() == b"\x89PNG scale.png"
