"""Faults a shared GPU runner sees, survived: a scenario that segfaults, aborts or hangs in its
own worker process fails alone, with the reason, and the session goes on; Ctrl-C ends the open
runs as KILLED with the journal flushed, and a rerun starts clean."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from mlflow import MlflowClient

FAULTS = """
import os, signal, time
import pytest

pytestmark = pytest.mark.isolated

@pytest.mark.claim("FMT-BITS")
def test_segfault(record):
    print("about to segfault", flush=True)
    os.kill(os.getpid(), signal.SIGSEGV)

@pytest.mark.claim("FMT-BYTES")
def test_abort(record):
    os.abort()

@pytest.mark.claim("NUM-UNDERFLOW")
def test_fine(record):
    record.metric(edge=2.0**-25)
    record.verdict("NUM-UNDERFLOW", "partly", "2**-25 -> 0, 5e-8 -> 5.96e-08")
"""

HANG = """
import time
import pytest

@pytest.mark.isolated
@pytest.mark.claim("FMT-RANGE")
def test_hang(record):
    time.sleep(600)

@pytest.mark.claim("FMT-BYTES")
def test_after_the_hang(record):
    record.verdict("FMT-BYTES", "confirmed", "2 bytes against 4")
"""

SLOW = """
import pathlib, time
import pytest

@pytest.mark.claim("FMT-BITS")
def test_slow(record):
    pathlib.Path("started").write_text("yes")
    time.sleep(600)
"""


def journal(reports) -> list[dict]:
    return [json.loads(line) for line in (reports / "journal.jsonl").read_text().splitlines()]


def statuses(reports) -> dict[str, str]:
    client = MlflowClient(f"sqlite:///{reports / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("amp-harness")
    runs = client.search_runs([experiment.experiment_id])
    return {r.info.run_name.split(" · ")[-1]: r.info.status for r in runs}  # by test function


@pytest.mark.slow
def test_crashes_and_hangs_fail_alone_with_the_reason(pytester):
    # The timeout counts from the worker's start, its imports (torch: seconds on a loaded
    # machine) included: the tests that must not hang run under a generous one, and the hang
    # under one of a second, in a second session on the same reports (no new MLflow store): it
    # is killed as hung whether still starting or already asleep, 9 s sooner than under 10 s.
    pytester.makepyfile(**{"scenarios/test_faults": FAULTS, "scenarios/test_hang": HANG})
    reports = pytester.path / "reports"
    options = ["--amp-device=cpu", "-p", "no:cacheprovider", f"--amp-reports={reports}"]
    result = pytester.runpytest_inprocess("scenarios/test_faults.py", *options, "--amp-timeout=300")
    result.assert_outcomes(failed=2, passed=1)
    result.stdout.fnmatch_lines_random(
        [
            "*test_segfault crashed: killed by SIGSEGV; last output:*",
            "*about to segfault*",
            "*test_abort crashed: killed by SIGABRT*",
        ]
    )
    hung = pytester.runpytest_inprocess("scenarios/test_hang.py", *options, "--amp-timeout=1")
    hung.assert_outcomes(failed=1, passed=1)  # and the session went on after it
    hung.stdout.fnmatch_lines(["*test_hang hung: no result within 1 s, killed*"])
    records = {e["record"]["test"].split("::")[1]: e["record"] for e in journal(reports)
               if e["type"] == "record"}  # fmt: skip
    assert {name: r["outcome"] for name, r in records.items()} == {
        "test_segfault": "failed", "test_abort": "failed", "test_hang": "failed",
        "test_fine": "passed", "test_after_the_hang": "passed",
    }  # fmt: skip
    assert records["test_fine"]["metrics"] == {"edge": 2.0**-25}  # measured in the worker
    runs = statuses(reports)
    assert [runs[n] for n in ("test_segfault", "test_abort", "test_hang")] == ["FAILED"] * 3
    assert runs["test_fine"] == runs["test_after_the_hang"] == "FINISHED"


BENCHMARKED = """
import pytest

@pytest.mark.isolated
@pytest.mark.claim("FMT-BYTES")
def test_timed(record, benchmark):
    benchmark.extra_info["fp16_over_fp32"] = 2.5
    benchmark.pedantic(sum, args=(range(1000),), rounds=7, warmup_rounds=1)
    record.verdict("FMT-BYTES", "confirmed", "2 bytes against 4")
"""


@pytest.mark.slow
def test_benchmarks_of_an_isolated_test_reach_the_sessions_json_and_table(pytester, outside_xdist):
    # The GPU scenarios run isolated; their pytest-benchmark results live in the worker.
    pytester.makepyfile(**{"scenarios/test_timed": BENCHMARKED})
    out = pytester.path / "bench.json"
    result = pytester.runpytest_inprocess(
        "scenarios", "--amp-device=cpu", "-p", "no:cacheprovider", "--no-mlflow",
        f"--amp-reports={pytester.path / 'reports'}", f"--benchmark-json={out}",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    (saved,) = json.loads(out.read_text())["benchmarks"]
    assert saved["name"] == "test_timed" and saved["extra_info"] == {"fp16_over_fp32": 2.5}
    assert saved["stats"]["rounds"] == 7 and len(saved["stats"]["data"]) == 7
    result.stdout.fnmatch_lines(["*benchmark: 1 tests*", "test_timed *"])


@pytest.mark.slow
def test_ctrl_c_ends_the_open_runs_as_killed_and_a_rerun_starts_clean(pytester):
    pytester.makepyfile(**{"scenarios/test_slow": SLOW})
    reports = pytester.path / "reports"
    command = [sys.executable, "-m", "pytest", "scenarios", "--amp-device=cpu",
               "-p", "no:cacheprovider", f"--amp-reports={reports}"]  # fmt: skip
    # A suite started in the background (`pytest tests/ &`) inherits SIGINT ignored: the child
    # gets Python's default handler back, as a terminal's Ctrl-C would find it.
    session = subprocess.Popen(
        command, cwd=pytester.path, stdout=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (pytester.path / "started").exists():
            assert time.monotonic() < deadline and session.poll() is None, "never started"
            time.sleep(0.2)
        session.send_signal(signal.SIGINT)
        session.communicate(timeout=60)
    finally:  # never leave a session sleeping 600 s behind a failed assertion
        if session.poll() is None:
            session.kill()
            session.communicate()
    assert session.returncode == pytest.ExitCode.INTERRUPTED
    entries = journal(reports)
    assert [e["type"] for e in entries] == ["session", "record", "session_end"]
    assert entries[1]["record"]["outcome"] == "interrupted"
    assert entries[2]["exitstatus"] == pytest.ExitCode.INTERRUPTED
    runs = statuses(reports)
    assert runs["test_slow"] == "KILLED" and list(runs.values()).count("KILLED") == 2

    (pytester.path / "scenarios" / "test_slow.py").write_text(
        SLOW.replace("time.sleep(600)", 'record.verdict("FMT-BITS", "confirmed", "5 + 10 bits")')
    )
    # The rerun needs no signal of its own: in this process, it reads what the killed session
    # left on disk as a new process would, without importing torch and MLflow again (seconds).
    rerun = pytester.runpytest_inprocess(*command[3:])
    assert rerun.ret == pytest.ExitCode.OK, rerun.stdout.str()[-2000:]
    client = MlflowClient(f"sqlite:///{reports / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("amp-harness")
    after = sorted(r.info.status for r in client.search_runs([experiment.experiment_id]))
    assert after == ["FINISHED", "FINISHED", "KILLED", "KILLED"]  # the new session and its test


LEAKS = """
import pytest
import torch

@pytest.mark.isolated
@pytest.mark.claim("FMT-BITS")
def test_leaks(record):
    torch.set_default_dtype(torch.float16)
    record.verdict("FMT-BITS", "confirmed", "5 + 10 bits")
"""


@pytest.mark.slow
def test_a_test_that_leaves_torch_state_changed_fails_in_its_isolated_worker(pytester):
    pytester.makepyfile(**{"scenarios/test_leak": LEAKS})
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess(
        "scenarios", "--amp-device=cpu", "--no-mlflow", "-p", "no:cacheprovider",
        f"--amp-reports={reports}",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*test_leaks left torch's global state changed: torch.default_dtype: torch.float32 -> "
         "torch.float16*"]
    )  # fmt: skip
    (entry,) = [e for e in journal(reports) if e["type"] == "record"]
    assert entry["record"]["outcome"] == "failed"
    assert entry["record"]["params"]["torch.default_dtype"] == "torch.float32"  # from the worker
