"""Provenance that holds (issue 36, item 3): runs of a new, untracked scenario file were tagged
with a commit that does not contain it, and no dirty mark. A file under the scenario folder or
the project's catalogue that git does not track makes the commit `-dirty`, and each record
carries its scenario file's digest (`compare` says when two sessions ran other code for a test).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from harness.records import fingerprint
from harness.records.journal import Journal
from harness.reports import baseline

pytestmark = pytest.mark.skipif(
    subprocess.run(["git", "--version"], capture_output=True).returncode != 0,
    reason="needs git",
)


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A repository whose one commit holds a scenario; caches and reports/ ignored."""
    root = tmp_path / "project"
    (root / "scenarios").mkdir(parents=True)
    (root / "scenarios" / "test_old.py").write_text("# committed\n")
    (root / ".gitignore").write_text("__pycache__/\nreports/\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    return root


def commit_of(root: Path) -> str:
    return fingerprint._git_commit(
        root, (root / "scenarios", root / "scenarios" / "claims.toml", root / "team.toml")
    )


@pytest.mark.parametrize(
    ("new_file", "dirty"),
    [
        ("scenarios/test_new.py", True),  # a new scenario: the commit lacks it
        ("scenarios/claims.toml", True),  # the project's claims
        ("team.toml", True),  # a catalogue named elsewhere (amp_claims)
        ("notes.txt", False),  # untracked, but not what ran
        ("scenarios/__pycache__/test_old.pyc", False),  # ignored
        ("reports/journal.jsonl", False),  # ignored
    ],
)
def test_an_untracked_scenario_or_catalogue_makes_the_commit_dirty(checkout, new_file, dirty):
    clean = commit_of(checkout)
    assert len(clean) == 12 and not clean.endswith("-dirty")
    (checkout / new_file).parent.mkdir(parents=True, exist_ok=True)
    (checkout / new_file).write_text("x = 1\n")
    assert commit_of(checkout) == clean + ("-dirty" if dirty else "")


def test_a_changed_tracked_scenario_makes_the_commit_dirty(checkout):
    clean = commit_of(checkout)
    (checkout / "scenarios" / "test_old.py").write_text("# edited\n")
    assert commit_of(checkout) == f"{clean}-dirty"


SCENARIO = """
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes, fp32 4 bytes")
"""


def test_each_record_carries_its_scenario_files_digest_into_the_baseline(pytester):
    path = pytester.makepyfile(**{"scenarios/test_scn": SCENARIO})
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={reports}",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    lines = (reports / "journal.jsonl").read_text().splitlines()
    (record,) = [e["record"] for e in map(json.loads, lines) if e["type"] == "record"]
    assert record["params"]["scenario_sha256"] == digest
    (test,) = baseline.summarize(Journal(reports / "journal.jsonl"))["tests"].values()
    assert test["scenario_sha256"] == digest
