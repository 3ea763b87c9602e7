"""A reports folder on a read-only file system (issue 24, item 11): `report`, `baseline save` and
`sync` end in one line that names the folder and the fix, never a traceback or advice that
cannot work. The folder is made read-only by a bind mount in a mount namespace of its own
(`unshare -rm`), which holds for root too, as chmod does not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.tracked import run_session

# sh -c SCRIPT FOLDER COMMAND...: FOLDER read-only for COMMAND alone.
READ_ONLY = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'


def read_only(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """`amp-harness ARGS` with `folder` mounted read-only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    # A read-only store's lock falls back to the temporary folder (records.tracking._locked):
    # the test's own, so that no lock file is left in the system's.
    temporary = folder.parent / "tmp"
    temporary.mkdir(exist_ok=True)
    env["TMPDIR"] = str(temporary)
    command = [sys.executable, "-m", "harness.cli", *args]
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", READ_ONLY, str(folder), *command],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    if done.returncode != 0 and "mount" in done.stderr.split(":", 1)[0]:
        pytest.skip(f"cannot mount a folder read-only here: {done.stderr.strip()}")
    return done


def one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("amp-harness: error: ")
    return line


MADE: dict[str, Path] = {}  # the folder the fixture `reports` made, and a copy of it as made


@pytest.fixture
def reports(pytester) -> Path:
    """A reports folder with one session in MLflow and a second in the journal alone. Made once
    per process (two sessions: ~2 s); each later test gets it back as it was made, at the path
    where it was made, which the store and the journal name."""
    if not MADE:
        run_session(pytester)[0].assert_outcomes(passed=3)
        run_session(pytester, "--no-mlflow")[0].assert_outcomes(passed=3)
        made = pytester.path / "reports"
        shutil.copytree(made, pytester.path / "reports-as-made")
        MADE.update(folder=made, copy=pytester.path / "reports-as-made")
    else:
        shutil.rmtree(MADE["folder"])
        shutil.copytree(MADE["copy"], MADE["folder"])
    return MADE["folder"]


@pytest.mark.slow
def test_report_in_a_read_only_reports_folder_is_one_line(reports):
    line = one_line(read_only(reports, "report", "--reports", str(reports)))
    assert f"{reports}" in line and "Read-only file system" in line, line
    assert "writable" in line, line
    assert not (reports / "report").exists()


@pytest.mark.slow
def test_baseline_save_to_a_read_only_folder_is_one_line(reports):
    out = reports / "baselines"
    done = read_only(reports, "baseline", "save", "--partial", "--reports", str(reports),
                     "--baselines", str(out))  # fmt: skip
    line = one_line(done)
    assert f"{out}" in line and "Read-only file system" in line and "--baselines" in line, line


@pytest.mark.slow
@pytest.mark.parametrize("store", ["there", "absent"])
def test_sync_in_a_read_only_reports_folder_says_it_is_read_only(reports, store):
    if store == "absent":  # only a journal: MLflow would try to make the store, for minutes
        (reports / "mlflow.db").unlink()
        shutil.rmtree(reports / "mlartifacts")
    # Said before MLflow is asked anything: the line below is the harness's, not what MLflow
    # says after minutes of trying (read_only's timeout, 120 s, fails that, and never a loaded
    # runner's slow start: a bound of 60 s on the seconds was this test's once).
    line = one_line(read_only(reports, "sync", "--reports", str(reports)))
    assert "once MLflow is reachable" not in line, line
    assert f"{reports} is read-only. Fix: make it writable" in line, line
    assert "then run `amp-harness sync" in line, line
