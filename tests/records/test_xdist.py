"""pytest-xdist: workers record into one session (one journal, one parent run, the SQLite store
created once by the controller), and timing scenarios refuse to share their device."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

pytest.importorskip("xdist", reason="needs pytest-xdist (the dev extra)")

SCENARIOS = """
import pytest

@pytest.mark.claim("FMT-BITS")
def test_bits(record):
    record.verdict("FMT-BITS", "confirmed", "fp16 5 + 10 bits")

@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes, fp32 4")

@pytest.mark.claim("FMT-RANGE")
def test_range(record):
    record.verdict("FMT-RANGE", "partly", "5.96e-08 to 65504")

@pytest.mark.claim("HDL-SPEED")
@pytest.mark.timing
def test_speed(record):
    record.verdict("HDL-SPEED", "confirmed", "measured 1.8x")
"""


@pytest.mark.slow
def test_workers_share_one_session_and_timing_refuses_to_share(pytester):
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIOS})
    reports = pytester.path / "reports"
    # The controller in this process (torch and MLflow imported already), its workers in theirs.
    result = pytester.runpytest_inprocess(
        "scenarios", "-n", "2", "--amp-device=cpu", "-p", "no:cacheprovider", "-rs",
        f"--amp-reports={reports}",
    )  # fmt: skip
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines_random(
        ["*timing scenario refuses to share cpu*with 1 other pytest-xdist workers*-n 0*",
         "*FMT-BITS*confirmed*"]
    )  # fmt: skip
    entries = [json.loads(line) for line in (reports / "journal.jsonl").read_text().splitlines()]
    assert [e["type"] for e in entries].count("session") == 1
    assert {e["session_id"] for e in entries} == {entries[0]["session_id"]}
    assert [e["type"] for e in entries].count("record") == 4
    assert entries[-1]["type"] == "session_end" and entries[-1]["counts"] == {
        "passed": 3, "skipped": 1}  # fmt: skip

    client = MlflowClient(f"sqlite:///{reports / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("amp-harness")
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if r.data.tags["amp.kind"] == "session"]
    children = [r for r in runs if r.data.tags["amp.kind"] == "test"]
    assert len(children) == 4 and parent.info.status == "FINISHED"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
