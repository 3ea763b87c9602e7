"""`amp-harness sync` at the scale of a year of CI (issue 24, item 14; issue 56): a rebuilt
store of 50,000 entries in minutes, not hours. What it cost: 5 MLflow calls a record, each a
transaction SQLite made durable with its own fsync (8 a record): 8 records a second; then four
calls a record without the fsync: 43 a second. A session's records now go in one transaction
(rows.Table), past MLflow's client."""

from __future__ import annotations

import time

import pytest
from helpers.tracked import assert_each_record_once_and_whole, write_journal

from harness.records.journal import Journal
from harness.records.mlflow import rows
from harness.records.tracking import MlflowSink, default_uri, sync

WRITES = ("create_run", "log_batch", "log_artifacts_to", "log_artifacts", "set_terminated",
          "set_tag")  # fmt: skip


@pytest.mark.slow
def test_sync_writes_a_session_s_records_in_one_transaction_without_an_fsync(tmp_path, monkeypatch):
    journal = write_journal(tmp_path, "s1", records=5)
    sink = MlflowSink(default_uri(tmp_path), reports=tmp_path)
    sink.experiment_id()
    calls: list[str] = []
    written: list[int] = []
    write = rows.Table.write
    monkeypatch.setattr(
        rows.Table, "write", lambda table, runs: (written.append(len(runs)), write(table, runs))[1]
    )

    def counted(name: str):
        method = getattr(sink.client, name)

        def call(*args, **kwargs):
            calls.append(name)
            return method(*args, **kwargs)

        return call

    for name in WRITES:
        setattr(sink.client, name, counted(name))
    sync(sink, journal)
    # The records in one transaction; through the client only the session's run: created,
    # then ended in two.
    assert written == [5]
    assert sorted(calls) == ["create_run", "log_batch", "set_terminated"], calls
    engine = sink.client._tracking_client.store.engine
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 0  # OFF
    assert_each_record_once_and_whole(journal, default_uri(tmp_path))


@pytest.mark.slow
def test_sync_benchmark_at_a_few_thousand_entries(benchmark, tmp_path, stated_scale):
    """The rate is in benchmark's extra_info and the README (measured on 2 shared cores, with
    --stated-scale: 10 sessions of 200 records; 2 of them without, the same rate in a fifth of
    the time)."""
    sessions, records = (10 if stated_scale else 2), 200
    journal = Journal(tmp_path / "journal.jsonl")
    for i in range(sessions):
        write_journal(tmp_path, f"s{i}", records=records)
    sink = MlflowSink(default_uri(tmp_path), reports=tmp_path)
    started = time.perf_counter()
    counts = benchmark.pedantic(sync, args=(sink, journal), rounds=1, iterations=1)
    seconds = time.perf_counter() - started
    assert counts["records_sent"] == sessions * records
    entries = sessions * (records + 2)  # each session's start and end, and its records
    benchmark.extra_info.update(
        entries=entries,
        seconds=round(seconds, 1),
        records_per_s=round(sessions * records / seconds, 1),
    )
    print(
        f"sync: {entries} entries in {seconds:.1f} s, {sessions * records / seconds:.1f} records/s"
    )
