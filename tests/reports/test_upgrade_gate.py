"""The upgrade gate: every difference between two environments sorted into its kind (predicted by
a known change of the release, gained, accepted, the hardware's, unexplained), the accepted-changes
file, the nearest baseline of a release that has none of its own, and `amp-harness upgrade`."""

from __future__ import annotations

import datetime
import json
import shutil
from pathlib import Path

import pytest

from harness import cli
from harness.catalogue import verdicts
from harness.common.errors import HarnessError
from harness.common.versions import version_key
from harness.lab import releases
from harness.records.journal import Journal
from harness.reports import accepted, baseline, compare, kinds, nearest, upgrade

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "reports" / "baselines"
TEST = "scenarios/test_norm_layers.py::test_half_batchnorm_overflows_above_std_256"
CLAIM = "PIT2-NORM-HALF"  # releases.CHANGES["half-batchnorm-cpu-variance"]: cpu, since 2.6
TODAY = datetime.date(2026, 12, 6)


def run(torch: str, threshold: float, verdict: str = "confirmed", outcome: str = "passed",
        hardware_class: str = "cpu-x86-64-avx2") -> dict:  # fmt: skip
    """A summary as harness.reports.baseline.summarize makes it: one test of CLAIM, whose key
    metric is the highest std a half BatchNorm keeps finite."""
    stands = verdict in verdicts.DECIDED and outcome == "passed"
    return {
        "format": baseline.FORMAT,
        "session_id": f"s-{torch}",
        "name": f"torch {torch}",
        "complete": True,
        "lacks": [],
        "fingerprint": {"torch": torch, "device": "cpu", "hardware_class": hardware_class},
        "verdicts": [
            {"claim": CLAIM, "verdict": verdict, "stands": stands, "evidence": "e", "test": TEST}
        ],
        "tests": {
            TEST: {
                "outcome": outcome,
                "claims": [CLAIM],
                "metrics": {"bn/half_highest_finite_std": threshold},
                "key_metrics": ["bn/half_highest_finite_std"],
            }
        },
    }


def entries(tmp_path: Path, text: str) -> list[accepted.Entry]:
    path = tmp_path / accepted.FILENAME
    path.write_text(text, encoding="utf-8")
    return accepted.read(path, {CLAIM, "FMT-BYTES"})


ENTRY = """
[[accepted]]
claim = "PIT2-NORM-HALF"
from = "{since}"
to = "{until}"
reason = "reviewed: BatchNorm's threshold moves"
who = "jane"
{end}
"""


def entry(since="2.6", until="2.9", end="expires = 2027-06-30", **fields) -> str:
    extra = "".join(f'{k} = "{v}"\n' for k, v in fields.items())
    return ENTRY.format(since=since, until=until, end=end) + extra


# --- the kinds ---------------------------------------------------------------------------------


def test_a_known_change_of_the_release_is_predicted_not_a_regression():
    result = compare.compare(run("2.5.1", 45), run("2.13.0", 256), today=TODAY)
    (change,) = [m for m in result.metrics if m.flagged]
    assert change.attribution.kind == kinds.PREDICTED
    assert "half-batchnorm-cpu-variance" in change.attribution.why
    assert result.regressions == [] and not result.fails_the_gate
    assert "1 difference predicted by a known change of the release" in result.summary_line()


@pytest.mark.parametrize(
    "before, after, why",
    [
        (run("2.6.0", 45), run("2.13.0", 256), "both releases after the change"),
        (run("2.5.1", 45), run("2.13.0", 256, outcome="failed"), "the new release's test failed"),
        (run("2.5.1", 45), run("2.13.0", 256, hardware_class="cpu-x86-64-avx512"), "cpu only"),
    ],
)
def test_a_change_no_known_change_predicts_stays_unexplained(before, after, why):
    """The controls: the same change where the known change does not lie between the releases,
    or where the new release's test did not hold its prediction."""
    if why == "cpu only":  # the change is the CPU's: on a GPU run it predicts nothing
        after["fingerprint"]["device"] = before["fingerprint"]["device"] = "cuda"
    result = compare.compare(before, after, today=TODAY)
    assert result.regressions, why
    assert all(kinds.PREDICTED not in line for line in result.regressions)


def test_decided_now_and_skipped_before_is_gained_and_the_reverse_is_a_regression():
    skipped = run("2.13.0", 256, verdict="skipped", outcome="skipped")
    gained = compare.compare(skipped, run("2.13.0", 256), today=TODAY)
    assert gained.counts() == {kinds.UNEXPLAINED: 0, kinds.GAINED: 1}
    lost = compare.compare(run("2.13.0", 256), skipped, today=TODAY)
    assert len(lost.regressions) == 1 and "skipped" in lost.regressions[0]


def test_an_accepted_change_passes_the_gate_and_says_who_accepted_it(tmp_path):
    reviewed = entries(tmp_path, entry())
    result = compare.compare(run("2.6.0", 45), run("2.9.1", 46), accepted=reviewed, today=TODAY)
    (change,) = [m for m in result.metrics if m.flagged]
    assert change.attribution.kind == kinds.ACCEPTED
    assert f"{accepted.FILENAME}:2 by jane: reviewed" in change.attribution.why
    assert result.regressions == [] and result.accepted_notes == ()


def test_an_expired_acceptance_no_longer_accepts_and_says_so(tmp_path):
    reviewed = entries(tmp_path, entry(end="expires = 2026-01-31"))
    result = compare.compare(run("2.6.0", 45), run("2.9.1", 46), accepted=reviewed, today=TODAY)
    (regression,) = result.regressions
    assert "accepted it until 2026-01-31" in regression
    (note,) = result.accepted_notes
    assert "expired on 2026-01-31: its change counts as unexplained again" in note


def test_an_acceptance_that_covers_nothing_is_said(tmp_path):
    reviewed = entries(tmp_path, entry(issue="https://example.org/1", end=""))
    result = compare.compare(run("2.6.0", 46), run("2.9.1", 46), accepted=reviewed, today=TODAY)
    assert result.counts() == {kinds.UNEXPLAINED: 0}
    (note,) = result.accepted_notes
    assert "no such change here: it no longer occurs" in note


@pytest.mark.parametrize(
    "fields, a, b",
    [
        ({"since": "2.9", "until": "2.13"}, "2.6.0", "2.9.1"),  # another step of releases
        ({"metric": "bn/other"}, "2.6.0", "2.9.1"),  # another metric
        ({"class": "cpu-x86-64-avx512"}, "2.6.0", "2.9.1"),  # another class
    ],
)
def test_an_acceptance_covers_its_own_releases_metric_and_class_only(tmp_path, fields, a, b):
    reviewed = entries(tmp_path, entry(**fields))
    result = compare.compare(run(a, 45), run(b, 46), accepted=reviewed, today=TODAY)
    assert len(result.regressions) == 1


def test_an_acceptance_spans_the_releases_either_way(tmp_path):
    (reviewed,) = entries(tmp_path, entry(since="2.6", until="2.9"))
    assert reviewed.covers("2.6.0+cpu", "2.13.0", "cpu-x86-64-avx2")  # across the step
    assert reviewed.covers("2.13.0", "2.5.1", "cpu-x86-64-avx2")  # a downgrade
    assert not reviewed.covers("2.9.1", "2.13.0", "cpu-x86-64-avx2")  # after it
    assert not reviewed.covers("2.6.0", "2.8.0", "cpu-x86-64-avx2")  # not up to it


# --- the accepted-changes file -----------------------------------------------------------------


def test_every_mistake_of_the_file_is_a_line_naming_the_file_the_line_and_the_fix(tmp_path):
    path = tmp_path / accepted.FILENAME
    path.write_text(
        entry()
        + entry(since="2.13", until="2.6")  # from after to
        + entry(until="two")  # not a release
        + entry(end='expires = "2027-01-01"')  # a date as text
        + entry(end="")  # no end
        + entry(end="expires = 2026-01-01")  # expired
        + entry().replace("PIT2-NORM-HALF", "PIT2-NORM-HLAF")  # an unknown claim
        + entry().replace('who = "jane"', 'who = "jane"\ncolour = "red"'),  # a field not one
        encoding="utf-8",
    )
    problems = accepted.problems(path, {CLAIM}, today=TODAY)
    expected = [
        ":12: from = '2.13' comes after to = '2.6'",
        ":21: to = 'two' is not a torch release",
        ":32: expires = '2027-01-01' is not a date",
        ":34: an accepted change needs an end",
        ":64: 'colour' is not a field of an accepted change",
        ":51: claim 'PIT2-NORM-HLAF' is in no catalogue",
        ":42: expires: the acceptance of PIT2-NORM-HALF ran out on 2026-01-01",
    ]
    assert len(problems) == len(expected), problems
    for text in expected:
        assert any(p.startswith(str(path)) and text in p for p in problems), (text, problems)
    with pytest.raises(HarnessError, match="comes after"):  # the gate refuses the file whole
        accepted.read(path, {CLAIM})


def test_a_file_that_is_not_toml_is_one_error_naming_it(tmp_path):
    path = tmp_path / accepted.FILENAME
    path.write_text("[[accepted]\nclaim =", encoding="utf-8")
    (problem,) = accepted.problems(path, {CLAIM})
    assert problem.startswith(f"{path}: not TOML")


def test_validate_fails_on_the_accepted_changes_file_and_passes_when_it_is_right(tmp_path, capsys):
    (tmp_path / "scenarios").mkdir()
    shutil.copy(REPO / "scenarios" / "test_norm_layers.py", tmp_path / "scenarios")
    (tmp_path / accepted.FILENAME).write_text(entry(end=""), encoding="utf-8")
    args = ["validate", "--scenarios", str(tmp_path / "scenarios"), "--baselines", str(tmp_path)]
    assert cli.main(args) == 1
    assert f"{tmp_path / accepted.FILENAME}:2: an accepted change needs an end" in (
        capsys.readouterr().out
    )
    (tmp_path / accepted.FILENAME).write_text(entry(), encoding="utf-8")
    assert cli.main(args) == 0
    assert "well formed, and no entry of it expired" in capsys.readouterr().out


# --- the nearest baseline ----------------------------------------------------------------------


def saved(folder: Path, torch: str, hardware_class: str = "cpu-x86-64-avx2") -> Path:
    summary = run(torch, 45, hardware_class=hardware_class)
    return baseline.save(summary, folder)


def this(torch: str, hardware_class: str = "cpu-x86-64-avx2") -> dict[str, str]:
    return run(torch, 45, hardware_class=hardware_class)["fingerprint"]


def test_a_release_without_a_baseline_takes_the_nearest_earlier_one_of_its_class(tmp_path):
    for torch in ("2.5.1", "2.9.1", "2.14.1"):
        saved(tmp_path, torch)
    saved(tmp_path, "2.13.0", "cpu-x86-64-avx512")  # the same release, on another class
    chosen = nearest.choose(tmp_path, this("2.13.0"))
    assert chosen.path.name == "cpu-x86-64-avx2_torch-2.9.1.json" and not chosen.exact
    assert "the nearest earlier release, 2.9.1, of its class cpu-x86-64-avx2" in chosen.why
    own = nearest.choose(tmp_path, this("2.9.1"))
    assert own.exact and own.why == ""
    older = nearest.choose(tmp_path, this("2.4.1"))
    assert older.path.name.endswith("2.5.1.json") and "nearest later release" in older.why


def test_a_class_without_a_baseline_takes_the_nearest_class_and_says_so(tmp_path):
    saved(tmp_path, "2.13.0", "cpu-x86-64-sse41")
    saved(tmp_path, "2.9.1", "cpu-x86-64-avx512")
    saved(tmp_path, "2.13.0", "cpu-x86-64-avx512-bf16")
    chosen = nearest.choose(tmp_path, this("2.13.0", "cpu-x86-64-amx"))
    assert chosen.path.name == "cpu-x86-64-avx512-bf16_torch-2.13.0.json"
    assert "on the nearest class, cpu-x86-64-avx512-bf16, there being none of cpu-x86-64-amx" in (
        chosen.why
    )


def test_a_baseline_saved_before_hardware_classes_or_of_another_device_is_never_taken(tmp_path):
    legacy = run("2.9.1", 45)
    del legacy["fingerprint"]["hardware_class"]
    legacy["fingerprint"]["cpu"] = "x86-64"
    baseline.save(legacy, tmp_path)  # cpu-x86-64_torch-2.9.1.json: its class only a name
    gpu = run("2.9.1", 45, hardware_class="NVIDIA-H200")
    gpu["fingerprint"].update(device="cuda", cuda="13.0")
    baseline.save(gpu, tmp_path)
    chosen = nearest.choose(tmp_path, this("2.13.0"))
    assert chosen.summary is None and chosen.path.name == "cpu-x86-64-avx2_torch-2.13.0.json"


# --- `amp-harness upgrade` on the committed baselines ------------------------------------------


def test_upgrade_sorts_every_committed_difference_and_none_is_unexplained(capsys):
    """The committed ledger, read as an upgrade from 2.5.1 to 2.13.0: each class that has both
    releases shows its changes by kind, and every one is predicted or gained (a new difference
    in a committed baseline must be explained in harness/lab/releases.py or accepted)."""
    code = cli.main(["upgrade", "--from", "2.5.1", "--to", "2.13.0", "--json",
                     "--baselines", str(COMMITTED), "--fail-on-regression"])  # fmt: skip
    found = {row["hardware_class"]: row for row in json.loads(capsys.readouterr().out)}
    assert code == 0
    compared = {name: row for name, row in found.items() if row["comparison"]}
    assert {"cpu-x86-64-avx2", "cpu-x86-64-avx512-bf16"} <= compared.keys()
    for row in compared.values():
        sorted_out = row["comparison"]["kinds"]
        assert sorted_out[kinds.UNEXPLAINED] == []
        assert sorted_out[kinds.PREDICTED] and sorted_out[kinds.GAINED]
    assert "no baseline of torch 2.5.1" in found["cpu-x86-64-sse41"]["missing"]


def test_upgrade_fails_on_an_unexplained_change_naming_it(tmp_path, capsys):
    for name in ("cpu-x86-64-avx2_torch-2.9.1+cu128.json", "cpu-x86-64-avx2_torch-2.13.0+cpu.json"):
        shutil.copy(COMMITTED / name, tmp_path)
    after = tmp_path / "cpu-x86-64-avx2_torch-2.13.0+cpu.json"
    content = json.loads(after.read_text())
    scaler = next(v for v in content["verdicts"] if v["claim"] == "SCL-NAN-INCREASES")
    scaler["verdict"] = "confirmed" if scaler["verdict"] != "confirmed" else "refuted"
    after.write_text(json.dumps(content))
    args = ["upgrade", "--from", "2.9", "--to", "2.13", "--baselines", str(tmp_path)]
    assert cli.main([*args, "--fail-on-regression"]) == 1
    out = capsys.readouterr().out
    assert "regressions: 1" in out and "  unexplained: 1\n    SCL-NAN-INCREASES" in out
    assert cli.main(args) == 0  # without the gate: the answer, not a failure


def test_every_upgrade_between_committed_releases_is_explained():
    """Each class's consecutive releases among the committed baselines (2.4.1 to 2.14.1): every
    difference is predicted, gained or accepted. Among them 2.4 to 2.5, where the CPU autocast
    docs were rewritten (the atlas's ops start holding to their lists: predicted by
    harness/lab/autocast/lists.toml, not a regression)."""
    releases_of: dict[str, list[str]] = {}
    for candidate in nearest.candidates(COMMITTED):
        releases_of.setdefault(candidate.hardware_class, []).append(candidate.torch)
    compared = 0
    for hardware_class, found in releases_of.items():
        ordered = sorted(found, key=version_key)
        for since, until in zip(ordered, ordered[1:], strict=False):
            reviewed = accepted.read(accepted.default_path(COMMITTED), None)
            ((step, _),) = upgrade.steps(COMMITTED, since, until, reviewed, hardware_class)
            assert step.comparison.regressions == [], (hardware_class, since, until)
            compared += 1
    assert compared >= 12


def test_an_op_whose_documented_list_moved_is_predicted_and_one_that_did_not_is_not():
    atlas_test = (
        "scenarios/test_autocast_atlas.py::test_the_documented_autocast_lists_hold[float16]"
    )
    a, b = ({"device": "cpu", "torch": t} for t in ("2.4.1", "2.5.1"))
    moved = kinds.documented_move(atlas_test, "holds/conv_transpose2d", a, b)
    assert moved and "conv_transpose2d: float32 in torch 2.4's docs, lower in 2.5's" in moved
    assert kinds.documented_move(atlas_test, "holds/mm", a, b) is None  # listed alike
    assert kinds.documented_move(TEST, "holds/conv_transpose2d", a, b) is None  # no atlas test


def test_a_decision_lost_to_a_capability_the_older_release_lacks_is_predicted():
    newer, older = run("2.13.0", 256), run("2.6.0", 256, verdict="skipped", outcome="skipped")
    newer["fingerprint"]["capability.fsdp2"] = "yes"
    result = compare.compare(newer, older, today=TODAY)
    assert result.counts() == {kinds.UNEXPLAINED: 0, kinds.PREDICTED: 1}
    assert "torch 2.6.0 lacks what torch 2.13.0 has (fsdp2)" in result.explained[0]
    older["fingerprint"]["torch"] = "2.13.0"  # the control: the same release lost it
    assert len(compare.compare(newer, older, today=TODAY).regressions) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--from", "two", "--to", "2.13"], "--from 'two' is not a torch release"),
        (["--from", "2.9", "--to", "2.11"], "no hardware class in"),
        (["--from", "2.9", "--to", "2.13", "--class", "cpu-x"], "--class 'cpu-x': no baseline"),
    ],
)
def test_upgrade_bad_input_is_one_line_naming_the_fix(capsys, args, message):
    assert cli.main(["upgrade", *args, "--baselines", str(COMMITTED)]) == 2
    assert message in capsys.readouterr().err


# --- the session's gate ------------------------------------------------------------------------

SCENARIO = """
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    record.metric(fp16_bytes=2)
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes")
"""


@pytest.fixture
def earlier(pytester: pytest.Pytester):
    """This session's baseline, saved as the earlier release 2.12.1 of its class: the one
    --amp-baseline auto takes for a release without a baseline of its own."""
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIO})
    gate(pytester).assert_outcomes(passed=1)
    journal = Journal(pytester.path / "reports" / "journal.jsonl")
    summary = baseline.summarize(journal)
    summary["fingerprint"]["torch"] = "2.12.1+cpu"
    return baseline.save(summary, pytester.path / "reports" / "baselines")


def gate(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={pytester.path / 'reports'}", "--amp-fail-on-regression", *args,
    )  # fmt: skip


def changed(path: Path) -> None:
    content = json.loads(path.read_text())
    content["verdicts"][0]["verdict"] = "refuted"
    path.write_text(json.dumps(content))


def test_a_new_release_is_gated_against_the_nearest_earlier_one_and_fails_naming_the_change(
    pytester, earlier
):
    changed(earlier)
    result = gate(pytester)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [f"baseline {earlier}: *compared with the nearest earlier release, 2.12.1+cpu, of its "
         "class*",
         "baseline *: regressions: 1 *--amp-fail-on-regression fails the session",
         "  FMT-BYTES (scenarios/test_scn.py::test_bytes): verdict refuted -> confirmed*"]
    )  # fmt: skip


def passes_as(pytester: pytest.Pytester, kind: str) -> None:
    """The gate passes, FMT-BYTES's one change shown as of `kind`."""
    result = gate(pytester)
    assert result.ret == pytest.ExitCode.OK
    title = kinds.TITLE[kind]
    result.stdout.fnmatch_lines(
        [
            f"baseline *: {title}: 1 (FMT-BYTES)",
            f"baseline *: regressions: 0; 1 difference {title}*",
        ]
    )


def test_the_gate_passes_a_change_a_known_release_change_predicts(pytester, earlier, monkeypatch):
    changed(earlier)
    known = releases.Change(
        claims=("FMT-BYTES",), device="cpu", since=releases.release(), before_seen=("2.12.1",),
        before="refuted", current="confirmed", how="a test's own change",
    )  # fmt: skip
    monkeypatch.setitem(releases.CHANGES, "test-fmt-bytes", known)
    passes_as(pytester, kinds.PREDICTED)


def test_the_gate_passes_an_accepted_change_and_fails_once_it_expired(pytester, earlier):
    changed(earlier)
    reviewed = earlier.parent / accepted.FILENAME
    text = entry(since="2.12", until="2.13").replace("PIT2-NORM-HALF", "FMT-BYTES")
    reviewed.write_text(text, encoding="utf-8")
    passes_as(pytester, kinds.ACCEPTED)
    reviewed.write_text(text.replace("2027-06-30", "2025-06-30"), encoding="utf-8")
    result = gate(pytester)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["accepted change *FMT-BYTES, 2.12 -> 2.13*: expired on 2025-06-30*"]
    )


def test_a_bad_accepted_changes_file_stops_the_session_before_it_runs(pytester, earlier):
    (earlier.parent / accepted.FILENAME).write_text(entry(until="two"), encoding="utf-8")
    result = gate(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{accepted.FILENAME}:5: to = 'two' is not a torch release*"])
