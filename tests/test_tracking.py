"""Tracking: the journal first, MLflow second, bounded calls, and a replay without duplicates."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest
from servers import MlflowServer, free_port

from harness.journal import Journal
from harness.record import Record
from harness.tracking import MlflowSink

SCENARIOS = """
import os, signal
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_first(record):
    record.param(recipe="fp32", seed=0)
    record.history(loss=[3.0, 2.5, 2.0], scale=[65536.0, 65536.0, 32768.0])
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes, fp32 4 bytes")

@pytest.mark.claim("FMT-BITS")
def test_second(record):
    pid = os.environ.get("KILL_SERVER_PID")
    if pid:  # the tracking server dies in the middle of the session
        os.killpg(int(pid), signal.SIGKILL)
    record.verdict("FMT-BITS", "confirmed", "fp16 5+10 bits")

@pytest.mark.claim("NUM-UNDERFLOW")
def test_third(record):
    record.verdict("NUM-UNDERFLOW", "partly", "2**-25 -> 0 but 5e-8 -> 5.96e-08")
"""
ENV_KEYS = (
    "gpu_name",
    "compute_capability",
    "driver",
    "cuda",
    "cudnn",
    "torch",
    "python",
    "harness",
    "git_commit",
    "tf32.cuda.matmul.allow_tf32",
    "tf32.cudnn.allow_tf32",
)


@pytest.fixture
def mlflow_server(tmp_path):
    server = MlflowServer(tmp_path, free_port())
    yield server
    server.stop()


def run_session(pytester, *args: str) -> tuple[pytest.RunResult, float]:
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIOS})
    started = time.monotonic()
    result = pytester.runpytest_inprocess(
        "scenarios", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={pytester.path / 'reports'}", *args,
    )  # fmt: skip
    return result, time.monotonic() - started


def runs(uri: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("amp-harness")
    return client.search_runs([experiment.experiment_id]) if experiment else []


def journal(pytester) -> Journal:
    return Journal(pytester.path / "reports" / "journal.jsonl")


def test_embedded_store_gets_one_parent_and_one_child_per_test(pytester):
    result, _ = run_session(pytester)
    result.assert_outcomes(passed=3)
    uri = f"sqlite:///{pytester.path / 'reports' / 'mlflow.db'}"
    all_runs = runs(uri)
    (parent,) = [r for r in all_runs if r.data.tags["amp.kind"] == "session"]
    children = {r.info.run_name: r for r in all_runs if r.data.tags["amp.kind"] == "test"}
    assert sorted(children) == ["test_first", "test_second", "test_third"]
    assert parent.info.status == "FINISHED" and parent.data.metrics["tests.passed"] == 3
    first = children["test_first"]
    assert first.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert first.data.tags["claims"] == "FMT-BYTES"
    assert first.data.tags["verdict.FMT-BYTES"] == "confirmed"
    assert first.data.tags["outcome"] == "passed"
    assert first.data.tags["status.FMT-BYTES"] == "confirmed"  # what counts, beside the outcome
    assert {f"env.{k}" for k in ENV_KEYS} <= set(first.data.tags)
    assert first.data.params["recipe"] == "fp32" and "device" in first.data.params
    assert children["test_third"].data.tags["verdict.NUM-UNDERFLOW"] == "partly"

    from mlflow import MlflowClient

    client = MlflowClient(uri)
    history = client.get_metric_history(first.info.run_id, "scale")
    assert [(m.step, m.value) for m in history] == [(0, 65536.0), (1, 65536.0), (2, 32768.0)]
    recorded = json.loads(
        client.download_artifacts(first.info.run_id, "record.json", str(pytester.path))
        and Path(pytester.path, "record.json").read_text()
    )
    assert recorded["verdicts"][0]["claim"] == "FMT-BYTES"


def test_dead_server_costs_seconds_loses_nothing_and_sync_replays_once(
    pytester, mlflow_server, monkeypatch
):
    """One story, because each start of a real server costs ~15 s on two cores: a session
    against a port where nothing listens, then one whose server is killed after its first test,
    then the server comes back and `sync` sends exactly what it lacks, once."""
    uri = mlflow_server.uri
    result, seconds = run_session(pytester, f"--tracking-uri={uri}")  # nothing listens yet
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["MLflow: * failed after *amp-harness sync*"])
    assert seconds < 20, f"an unreachable server blocked the session for {seconds:.1f} s"

    mlflow_server.start()
    monkeypatch.setenv("KILL_SERVER_PID", str(mlflow_server.process.pid))
    result, seconds = run_session(pytester, f"--tracking-uri={uri}")
    result.assert_outcomes(passed=3)
    assert seconds < 30, f"a server killed mid-session blocked it for {seconds:.1f} s"
    records = [e for e in journal(pytester).entries() if e["type"] == "record"]
    assert len(records) == 6  # every result of both sessions is in the journal

    mlflow_server.stop()
    mlflow_server.start()  # back, on the same database
    assert sorted(r.info.run_name for r in runs(uri))[-1] == "test_first"  # only what got there
    assert len(runs(uri)) == 2  # the second session's parent and its first child
    first = MlflowSink(uri).sync(journal(pytester))
    again = MlflowSink(uri).sync(journal(pytester))
    assert (first["records_present"], first["records_sent"]) == (1, 5)
    assert (again["records_present"], again["records_sent"]) == (6, 0)
    all_runs = runs(uri)
    assert len(all_runs) == 8  # two parents, six children: nothing missing, nothing twice
    parents = [r for r in all_runs if r.data.tags["amp.kind"] == "session"]
    assert {p.info.status for p in parents} == {"FINISHED"}  # ended from the journal


def test_a_hanging_server_costs_one_bounded_call(pytester):
    """A server that accepts connections and never answers: the first call times out, the
    session goes on without MLflow, and the journal has everything."""
    with socket.socket() as hanging:
        hanging.bind(("127.0.0.1", 0))
        hanging.listen(16)  # the kernel completes the handshakes; nobody ever reads
        uri = f"http://127.0.0.1:{hanging.getsockname()[1]}"
        result, seconds = run_session(pytester, f"--tracking-uri={uri}")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["MLflow: creating the session run failed after *"])
    assert seconds < 15, f"a hanging server blocked the session for {seconds:.1f} s"
    assert len([e for e in journal(pytester).entries() if e["type"] == "record"]) == 3


def test_an_mlflow_that_cannot_be_imported_leaves_the_journal(pytester, monkeypatch):
    """An incomplete install (seen: a GPU runner's wheelhouse without protobuf) is said once,
    with the fix; the session runs on the journal alone instead of stopping with an internal
    error, and `amp-harness sync` sends it later."""
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `from mlflow import ...` raises
    result, _ = run_session(pytester)
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        ["MLflow: MLflow cannot be imported (*): install it with its requirements*--no-mlflow*"]
    )
    assert "INTERNALERROR" not in result.stdout.str()
    assert len([e for e in journal(pytester).entries() if e["type"] == "record"]) == 3


def test_corrupt_journal_line_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "journal.jsonl"
    good = Journal(path)
    good.append({"type": "session", "session_id": "a"})
    with path.open("a") as f:
        f.write('{"type": "record", "sess\n')  # a line cut by a crash
    good.append({"type": "session_end", "session_id": "a"})
    with pytest.warns(UserWarning, match=r"journal.jsonl:2: skipped a corrupt journal line"):
        entries = list(good.entries())
    assert [e["type"] for e in entries] == ["session", "session_end"]


def test_unknown_tracking_scheme_is_a_usage_error(pytester):
    result, _ = run_session(pytester, "--tracking-uri=ftp://example/x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unsupported tracking URI scheme 'ftp'*sqlite:///*"])


def test_one_batch_per_test_beats_per_step_logging(tmp_path):
    """Why histories go in one log_batch: measured side by side, in one process."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'bench.db'}"
    steps = 1000  # the history length the issue prices: 27.8 s per-step vs 0.7 s batched
    record = Record(
        "scenarios/x.py::t",
        ["PRACTICE-SMOKE"],
        "cpu",
        tmp_path,
        outcome="passed",
        ended=time.time(),
        histories={"loss": [float(i) for i in range(steps)]},
    )
    session = {
        "session_id": "s",
        "name": "bench",
        "started": time.time(),
        "args": [],
        "fingerprint": {},
    }
    sink = MlflowSink(uri, reports=tmp_path)
    sink.start_session(session)
    started = time.perf_counter()
    sink.log_record(session, record)
    batched = time.perf_counter() - started
    client = MlflowClient(uri)
    run_id = client.create_run(sink._experiment()).info.run_id
    started = time.perf_counter()
    for step, value in enumerate(record.histories["loss"]):
        client.log_metric(run_id, "loss", value, step=step)
    per_step = time.perf_counter() - started
    assert sink.down is None
    print(f"{steps}-step history: one log_batch {batched:.2f} s, per-step calls {per_step:.2f} s")
    assert per_step > 3 * batched, (
        f"{steps} steps: per-step {per_step:.2f} s, batch {batched:.2f} s"
    )
