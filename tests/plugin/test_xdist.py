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


CRASHES = """
import os, signal
import pytest

@pytest.fixture
def dies():
    os.kill(os.getpid(), signal.SIGKILL)

@pytest.mark.claim("FMT-BITS")
def test_killed(record):
    record.metric(measured_before=1.0)
    os.kill(os.getpid(), signal.SIGKILL)

@pytest.mark.claim("NUM-UNDERFLOW")
def test_killed_in_setup(record, dies):
    pass

@pytest.mark.claim("FMT-BYTES")
def test_fine(record):
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes, fp32 4")
"""


@pytest.mark.slow
def test_a_test_whose_worker_died_is_recorded_failed_in_table_journal_and_mlflow(pytester):
    """kill -9 of a worker (the OOM killer, a segfault) lost its test from everything but
    pytest's count; the controller now records it as --amp-isolate records a crashed worker's."""
    pytester.makepyfile(**{"scenarios/test_crash": CRASHES})
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess(
        "scenarios", "-n", "2", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={reports}",
    )  # fmt: skip
    result.assert_outcomes(failed=2, passed=1)
    died = "crashed: the worker died (pytest-xdist gw*, killed by SIGKILL)"
    result.stdout.fnmatch_lines_random(
        [f"*test_killed {died}*", f"*test_killed_in_setup {died}*",
         "FMT-BITS *failed*", "NUM-UNDERFLOW *failed*"]
    )  # fmt: skip
    entries = [json.loads(line) for line in (reports / "journal.jsonl").read_text().splitlines()]
    records = {e["record"]["test"].split("::")[1]: e["record"] for e in entries
               if e["type"] == "record"}  # fmt: skip
    outcomes = {name: r["outcome"] for name, r in records.items()}
    assert outcomes == {"test_killed": "failed", "test_killed_in_setup": "failed",
                        "test_fine": "passed"}  # fmt: skip
    assert "killed by SIGKILL" in records["test_killed"]["message"]
    assert records["test_killed"]["params"]["torch.threads"] == "1"  # its record as it started
    assert records["test_killed_in_setup"]["claims"] == ["NUM-UNDERFLOW"]  # read from its file
    assert entries[-1]["type"] == "session_end"
    assert entries[-1]["counts"] == {"failed": 2, "passed": 1} and entries[-1]["left_out"] == []

    client = MlflowClient(f"sqlite:///{reports / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("amp-harness")
    children = {r.data.tags["amp.test"].split("::")[1]: r.info.status
                for r in client.search_runs([experiment.experiment_id])
                if r.data.tags["amp.kind"] == "test"}  # fmt: skip
    assert children == {"test_killed": "FAILED", "test_killed_in_setup": "FAILED",
                        "test_fine": "FINISHED"}  # fmt: skip


LEAKS_IN_A_WORKER = """
import pytest
import torch

@pytest.mark.claim("FMT-BITS")
def test_leaks(record):
    torch.set_flush_denormal(True)
    record.verdict("FMT-BITS", "confirmed", "5 + 10 bits")

@pytest.mark.claim("FMT-RANGE")
def test_after(record):
    assert torch.tensor(2.0**-140).item() > 0
    record.verdict("FMT-RANGE", "confirmed", "2**-140 kept")
"""


@pytest.mark.slow
def test_a_test_that_leaves_torch_state_changed_fails_in_an_xdist_worker(pytester):
    pytester.makepyfile(**{"scenarios/test_leak": LEAKS_IN_A_WORKER})
    result = pytester.runpytest_inprocess(
        "scenarios", "-n", "2", "--dist", "loadfile", "--amp-device=cpu", "--no-mlflow",
        "-p", "no:cacheprovider", f"--amp-reports={pytester.path / 'reports'}",
    )  # fmt: skip
    result.assert_outcomes(failed=1, passed=1)  # both on one worker (loadfile): in that order
    result.stdout.fnmatch_lines(
        ["*test_leaks left torch's global state changed: torch.flush_denormal: False -> True*"]
    )
