"""The known bugs read back: `amp-harness known-bugs` (this environment's last session, a
committed release's baselines, one entry, an upgrade, JSON), the report's table of bugs x
environments, and `compare`'s kinds (a change the ledger's bounds predict is predicted; a bug
come back is not)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers.sessions import CPU, log_session, make_record

from harness import cli
from harness.catalogue import claims
from harness.records.tracking import MlflowSink, default_uri
from harness.reports import baseline, compare, known_bugs, report

SGD = "KB-FUSED-SGD-SKIPPED-MOMENTUM"  # present from 2.4 on, open
NORM = "KB-HALF-BATCHNORM-CPU-VARIANCE"  # present before 2.6, fixed in 2.6
TEST = "scenarios/test_known_bugs.py::test_known_bug[{}]"


def summary(torch: str, states: dict[str, str], hardware_class: str = "cpu-x86-64-avx2") -> dict:
    """A baseline summary of a session of the reproductions: each bug's verdict."""
    return {
        "format": baseline.FORMAT,
        "session_id": f"s-{torch}",
        "name": f"torch {torch}",
        "started": 0.0,
        "complete": False,
        "lacks": ["scenario modules not run: the others"],
        "fingerprint": {"torch": torch, "device": "cpu", "hardware_class": hardware_class},
        "verdicts": [
            {
                "claim": bug,
                "verdict": verdict,
                "stands": not verdict.startswith("failed"),
                "evidence": f"{bug} measured 1 time",
                "test": TEST.format(bug),
            }  # fmt: skip
            for bug, verdict in states.items()
        ],
        "tests": {
            TEST.format(bug): {
                "outcome": "passed",
                "claims": [bug],
                "metrics": {},
                "key_metrics": [],
                "depends_on_hardware": [],
            }  # fmt: skip
            for bug in states
        },
    }


@pytest.fixture
def committed(tmp_path) -> Path:
    """A baselines folder: two releases of the reproductions, in known-bugs/."""
    folder = tmp_path / "baselines" / known_bugs.FOLDER
    folder.mkdir(parents=True)
    for torch, states in {
        "2.5.1": {SGD: "confirmed", NORM: "confirmed"},
        "2.13.0+cpu": {SGD: "confirmed", NORM: "refuted"},
    }.items():
        (folder / f"cpu-x86-64-avx2_torch-{torch}.json").write_text(
            json.dumps(summary(torch, states)), encoding="utf-8"
        )
    return folder.parent


def test_a_release_is_read_from_the_committed_baselines_in_the_ledgers_words(committed, capsys):
    assert cli.main(["known-bugs", "--release", "2.5", "--baselines", str(committed)]) == 0
    out = capsys.readouterr().out
    assert f"{NORM}  [norm-loss-numerics]  present" in out
    assert cli.main(["known-bugs", "--release", "2.13.0", "--baselines", str(committed)]) == 0
    assert f"{NORM}  [norm-loss-numerics]  absent (fixed)" in capsys.readouterr().out


def test_an_upgrade_says_what_it_fixes_introduces_and_keeps(committed, capsys):
    args = ["known-bugs", "--from", "2.5.1", "--to", "2.13.0", "--baselines", str(committed)]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert f"Upgrading from 2.5.1 to 2.13.0+cpu on cpu-x86-64-avx2 fixes {NORM}" in out
    assert f"keeps {SGD}" in out and "introduces none" in out
    assert cli.main([*args, "--json"]) == 0
    (found,) = json.loads(capsys.readouterr().out)
    assert found["fixes"] == [NORM] and found["keeps"] == [SGD]


def test_one_entry_shows_its_bounds_workaround_and_evidence(committed, capsys):
    args = ["known-bugs", NORM, "--release", "2.5", "--baselines", str(committed)]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    bug = claims.ledger()[NORM]
    assert f"affects: {bug.affects}" in out and f"workaround: {bug.workaround}" in out
    assert f"present: {NORM} measured 1 time" in out


@pytest.mark.parametrize(
    "args, said",
    [
        (["KB-NO-SUCH"], "no such entry in the ledger"),
        (["--from", "2.5.1"], "--from and --to go together"),
        (["--release", "2.7"], "no committed baseline holds known-bug verdicts for torch 2.7"),
        (["--from", "2.5.1", "--to", "2.13", "--class", "cpu-x86-64-sse41"], "for torch 2.5.1"),
    ],
)
def test_a_question_it_cannot_answer_is_a_usage_error_saying_why(committed, capsys, args, said):
    assert cli.main(["known-bugs", *args, "--baselines", str(committed)]) == 2
    assert said in capsys.readouterr().err


def test_without_a_session_of_the_reproductions_it_shows_the_prediction_marked(tmp_path, capsys):
    empty = ["--reports", str(tmp_path), "--baselines", str(tmp_path / "none")]
    assert cli.main(["known-bugs", *empty]) == 0
    out = capsys.readouterr().out
    assert "No session here ran their reproductions" in out and "not a measurement" in out
    assert f"{len(claims.ledger())} known bugs" in out


def test_the_installed_releases_baselines_stand_beside_the_session(committed, capsys, monkeypatch):
    from harness.cli import known_bugs as command

    monkeypatch.setattr(command, "_installed_torch", lambda: "2.13.0+cpu")
    assert cli.main(["known-bugs", "--reports", "/nonexistent", "--baselines", str(committed)]) == 0
    out = capsys.readouterr().out
    assert "cpu-x86-64-avx2 / torch 2.13.0+cpu: " in out and "known-bugs/cpu-x86-64-avx2" in out
    assert f"{NORM}  [norm-loss-numerics]  absent (fixed)" in out


def test_a_change_the_bounds_predict_is_predicted_and_a_bug_come_back_is_not():
    fixed = compare.compare(
        summary("2.5.1", {NORM: "confirmed"}), summary("2.13.0+cpu", {NORM: "refuted"})
    )
    assert fixed.regressions == [] and "known-bug ledger" in json.dumps(fixed.to_json())
    back = compare.compare(
        summary("2.9.1", {NORM: "refuted"}), summary("2.13.0+cpu", {NORM: "confirmed"})
    )
    assert len(back.regressions) == 1 and NORM in back.regressions[0]


@pytest.mark.slow
def test_the_report_has_a_table_of_bugs_by_environment_with_present_marked(tmp_path):
    reports = tmp_path / "reports"
    sink = MlflowSink(default_uri(reports), reports=reports)
    log_session(sink, CPU, time.time() - 60, [
        make_record(f"test_known_bugs.py::test_known_bug[{SGD}]", [SGD],
                    verdicts=[(SGD, "confirmed", "weights off by up to 1e+35")]),
        make_record(f"test_known_bugs.py::test_known_bug[{NORM}]", [NORM],
                    verdicts=[(NORM, "refuted", "running_var finite up to std 256")]),
    ])  # fmt: skip
    built = report.build(default_uri(reports), report.report_dir(reports)).parent
    page = (built / "index.html").read_text()
    section = page.split('<section id="known-bugs">')[1].split("</section>")[0]
    sgd_row = section.split(f'<tr id="bug-{SGD}">')[1].split("</tr>")[0]
    assert '<td class="bug-present">present</td>' in sgd_row
    assert claims.ledger()[SGD].workaround.split(",")[0] in sgd_row
    norm_row = section.split(f'<tr id="bug-{NORM}">')[1].split("</tr>")[0]
    assert "<td>absent (fixed)</td>" in norm_row
    markdown = (built / "summary.md").read_text()
    assert f"| {SGD}: " in markdown and "| **present** |" in markdown
