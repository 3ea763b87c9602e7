"""SIGTERM and SIGHUP are Ctrl-C (issue 24, item 3): `timeout`, a CI cancel, `docker stop` and a
closed terminal stop a session as Ctrl-C does: the running test recorded as interrupted, the
session ended in the journal, every worker process ended and its /tmp/amp-worker-* folder gone.
Real signals to real processes, each run bounded; whatever a run leaves is ended here."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.records.journal import Journal

# The test says where it runs (its pid, its command line), then waits to be stopped.
SLOW_SCENARIO = """
import json, os, sys, time
from pathlib import Path
import pytest

@pytest.mark.claim("FMT-BYTES")
{marker}
def test_waits_to_be_stopped(record):
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes, fp32 4 bytes")
    Path(os.environ["AMP_TEST_STARTED"]).write_text(json.dumps({{"pid": os.getpid(),
                                                                 "argv": sys.argv}}))
    time.sleep(120)
"""


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended and not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(path: Path, process: subprocess.Popen, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text():
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, f"the test did not start in {timeout_s} s"
        time.sleep(0.1)
    return json.loads(path.read_text())


def default_stop_signals() -> None:
    """The session under test starts with SIGTERM and SIGHUP at their defaults, whatever this
    process inherited: under `nohup` (a CI job started with it) SIGHUP is ignored, and the
    harness rightly leaves an ignored signal ignored, so the signal sent would do nothing."""
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, signal.SIG_DFL)


def worker_folder(test: dict) -> Path:
    """The isolated worker's folder: --amp-worker-output=/tmp/amp-worker-XXXX/result.json."""
    (option,) = [a for a in test["argv"] if a.startswith("--amp-worker-output=")]
    folder = Path(option.split("=", 1)[1]).parent
    assert folder.name.startswith("amp-worker-")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stop", "isolated"),
    [
        (signal.SIGTERM, True),
        (signal.SIGHUP, True),
        (signal.SIGTERM, False),
        (signal.SIGKILL, True),
    ],
    ids=["SIGTERM-isolated", "SIGHUP-isolated", "SIGTERM-in-process", "SIGKILL-isolated"],
)
def test_a_stop_signal_is_ctrl_c(tmp_path, stop, isolated):
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    marker = "@pytest.mark.isolated" if isolated else ""
    (scenarios / "test_slow.py").write_text(SLOW_SCENARIO.format(marker=marker))
    started = tmp_path / "started.json"
    reports = tmp_path / "reports"
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "scenarios", "--amp-device=cpu", "--no-mlflow",
         "-p", "no:cacheprovider", f"--amp-reports={reports}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env={**os.environ, "AMP_TEST_STARTED": str(started)},
        preexec_fn=default_stop_signals,
    )  # fmt: skip
    test = None
    try:
        test = wait_for(started, session)
        session.send_signal(stop)
        output, _ = session.communicate(timeout=60)
        ended = time.monotonic()
        while alive(test["pid"]) and time.monotonic() < ended + 10:
            time.sleep(0.1)
        assert not alive(test["pid"]), "the test's process runs on"
    finally:
        if session.poll() is None:
            os.killpg(session.pid, signal.SIGKILL)
            session.communicate()
        if test and alive(test["pid"]):
            os.killpg(os.getpgid(test["pid"]), signal.SIGKILL)
        folder = worker_folder(test) if test and isolated else None
        left = folder is not None and folder.exists()
        if left:
            shutil.rmtree(folder)
    if stop == signal.SIGKILL:  # nothing can record or clean up after it: the worker ends
        return
    assert session.returncode == pytest.ExitCode.INTERRUPTED, output
    assert not left, f"{folder} was left behind"
    (recorded,) = Journal(reports / "journal.jsonl").sessions().values()
    (record,) = recorded.records
    assert record.outcome == "interrupted", record
    assert signal.Signals(stop).name in record.message, record.message
    assert recorded.end is not None and recorded.end["exitstatus"] == 2
