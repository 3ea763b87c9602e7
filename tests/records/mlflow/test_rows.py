"""A run written in one transaction (harness/records/mlflow/rows.py) is the run MLflow's client
makes of the same result, as MLflow reads them back: its info, tags, params, metrics and each
metric's history, what a search by metric finds, its files. Held for the MLflow installed: a
release that changes its tables fails here, not in a user's store."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers.sessions import make_record
from helpers.tracked import store_in

from harness.records.mlflow import rows
from harness.records.mlflow.naming import HISTORY_POINTS
from harness.records.tracking import MlflowSink

SESSION = {"session_id": "s1", "name": "session 1", "started": 1_700_000_000.0, "args": ["-q"],
           "fingerprint": {"device": "cpu", "torch": "2.13.0+cpu"}}  # fmt: skip


def a_result(figures: Path):
    record = make_record("test_x.py::test_scale", ["FMT-BYTES", "NUM-UNDERFLOW"],
                         verdicts=[("FMT-BYTES", "confirmed", "fp16 2 bytes"),
                                   ("NUM-UNDERFLOW", "partly", "2**-25 -> 0")],
                         figure_dir=figures)  # fmt: skip
    record.metric(nan_metric=math.nan, inf_metric=math.inf, low=-math.inf, speed=1.25)
    record.param(seed=3, recipe="amp-fp16")
    record.history(loss=[3.0, math.nan, 1.0, 1.0], scale=[1.0 / (1 + i) for i in range(5000)])
    return record


def logged_both_ways(tmp_path, empty_store):
    """The same result logged through the client into one store, written as rows into another:
    the two sinks and the two runs' ids."""
    record = a_result(tmp_path / "figures")
    made = {}
    for way in ("client", "rows"):
        uri = store_in(tmp_path / way, empty_store)
        sink = MlflowSink(uri, reports=tmp_path / way)
        sink.start_session(SESSION)
        if way == "client":
            sink.log_record(SESSION, record)
        else:
            assert sink._table() is not None  # an SQL store, its files in a folder
            sink.log_records(SESSION, [record])
        assert sink.down is None and not sink.refused, (sink.down, sink.refused)
        (run,) = [r for r in sink.client.search_runs([sink.experiment_id()])
                  if r.data.tags["amp.kind"] == "test"]  # fmt: skip
        made[way] = (sink, run.info.run_id)
    return made


def as_read(sink: MlflowSink, run_id: str) -> dict:
    """What MLflow reads of a run, its own ids named by role."""
    client = sink.client
    run = client.get_run(run_id)
    parent = sink.parent_run_id(SESSION)
    rename = {run_id: "<run>", parent: "<parent>", sink.experiment_id(): "<experiment>"}
    tags = {k: rename.get(v, v) for k, v in run.data.tags.items()}
    location = client.get_experiment(sink.experiment_id()).artifact_location
    history = client.get_metric_history
    histories = {key: [(m.step, m.value, m.timestamp) for m in history(run_id, key)]
                 for key in run.data.metrics}  # fmt: skip
    folder = Path(client.download_artifacts(run_id, "", str(sink.reports / "read")))
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    record = json.loads((folder / "record.json").read_text())
    info = run.info
    return {
        "info": (info.status, info.start_time, info.end_time, info.lifecycle_stage,
                 info.user_id, info.run_name, rename.get(info.experiment_id),
                 info.artifact_uri.replace(location, "<location>").replace(run_id, "<run>")),
        "tags": tags,
        "params": run.data.params,
        "metrics": {k: (v if not math.isnan(v) else "nan") for k, v in run.data.metrics.items()},
        "histories": {k: [(s, "nan" if math.isnan(v) else v, t) for s, v, t in points]
                      for k, points in histories.items()},  # fmt: skip
        "found by metric": [rename.get(r.info.run_id) for r in client.search_runs(
            [sink.experiment_id()], "metrics.speed > 1 and metrics.low < 0")],
        "files": files,
        "record": record["record_id"],
    }  # fmt: skip


def test_a_run_written_as_rows_reads_back_as_the_client_s(tmp_path, empty_store):
    made = logged_both_ways(tmp_path, empty_store)
    by_client, by_rows = (as_read(*made[way]) for way in ("client", "rows"))
    assert by_rows == by_client
    # What the comparison held: the run complete, a downsampled history, its files.
    assert by_rows["tags"]["amp.complete"] == "true"
    assert len(by_rows["histories"]["scale"]) <= HISTORY_POINTS
    assert by_rows["files"] == ["figures/curve.png", "record.json"]
    assert by_rows["found by metric"] == ["<run>"]


def test_a_batch_is_one_transaction_and_a_refused_result_goes_through_the_client(
    tmp_path, empty_store
):
    uri = store_in(tmp_path, empty_store)
    sink = MlflowSink(uri, reports=tmp_path)
    sink.start_session(SESSION)
    good = [make_record(f"test_x.py::test_{i}", ["FMT-BYTES"]) for i in range(3)]
    bad = make_record("test_x.py::test_bad", ["FMT-BYTES"])
    bad.params["p" * 300] = "a key longer than MLflow takes"
    transactions = []
    table = sink._table()
    write = table.write
    table.write = lambda runs: (transactions.append(len(runs)), write(runs))[1]
    sink.log_records(SESSION, [*good, bad])
    assert transactions == [3]
    assert sink.down is None and len(sink.refused) == 1
    assert sink.refused[0].startswith("logging scenarios/test_x.py::test_bad: ")
    tests = [r for r in sink.client.search_runs([sink.experiment_id()])
             if r.data.tags["amp.kind"] == "test"]  # fmt: skip
    assert sorted(r.data.tags["amp.test"] for r in tests) == sorted(r.test for r in good)


def test_a_failed_transaction_leaves_no_run_and_turns_the_sink_off(tmp_path, empty_store):
    """Sensitivity of the all-or-nothing: a batch whose last run cannot be written leaves none
    of them (no run half-made, none complete), and the sink says why."""
    uri = store_in(tmp_path, empty_store)
    sink = MlflowSink(uri, reports=tmp_path)
    sink.start_session(SESSION)
    records = [make_record(f"test_x.py::test_{i}", ["FMT-BYTES"]) for i in range(3)]
    table = sink._table()
    write = table.write

    def clashing(runs):  # the last run's id taken by the first: the insert fails at the end
        runs[-1].run_id = runs[0].run_id
        write(runs)

    table.write = clashing
    sink.log_records(SESSION, records)
    assert sink.down and "logging 3 results failed" in sink.down
    assert [r for r in sink.client.search_runs([sink.experiment_id()])
            if r.data.tags["amp.kind"] == "test"] == []  # fmt: skip


@pytest.mark.parametrize("uri", ["http://127.0.0.1:9", "file:///nonexistent/mlruns"])
def test_no_table_where_the_store_is_not_sql(uri):
    class Client:  # a tracking server's client: no SQL store behind it
        _tracking_client = type("T", (), {"store": object()})()

    assert rows.Table.of(Client(), "1") is None
