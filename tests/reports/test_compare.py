"""Comparing runs: changed verdicts, metric changes flagged only when significant and large,
`amp-harness compare`, and the plugin's --amp-baseline / --amp-fail-on-regression."""

from __future__ import annotations

import fnmatch
import io
import json
import re

import pytest
from scipy import stats

from harness import cli
from harness.catalogue import verdicts
from harness.common.errors import HarnessError
from harness.records.journal import Journal, Session
from harness.reports import (
    attribution,
    baseline,
    compare,
    comparison,
    comparison_view,
    kinds,
    significance,
)

TEST = "scenarios/test_scn.py::test_bytes"
ACCURACY = {"mlp/amp-fp16/seed0/val_accuracy": 90.0, "mlp/amp-fp16/seed1/val_accuracy": 92.0,
            "mlp/amp-fp16/seed2/val_accuracy": 91.0}  # fmt: skip
# How a change between two runs of one environment ends (compare's attribution).
SAME_ENVIRONMENT = " -- nothing in the environment differs: the harness or noise"


def summary(metrics: dict, verdict: str = "confirmed") -> dict:
    """The shape harness.reports.baseline.summarize makes (the plugin tests below use the real
    one)."""
    return {
        "format": baseline.FORMAT,
        "session_id": "s",
        "name": "n",
        "fingerprint": {"torch": "2.13.0"},
        "verdicts": [
            {
                "claim": "FMT-BYTES",
                "verdict": verdict,
                "stands": verdict in verdicts.DECIDED,
                "evidence": "fp16 2 bytes",
                "test": TEST,
            }
        ],  # fmt: skip
        "tests": {TEST: {"outcome": "passed", "metrics": metrics}},
    }


def scaled(metrics: dict, factor: float, only: str = "") -> dict:
    return {k: v * factor if only in k else v for k, v in metrics.items()}


def test_identical_runs_have_nothing_to_report():
    run = summary({**ACCURACY, "bytes": 2.0, "overflow": "inf", "loss": "nan"})
    result = compare.compare(run, json.loads(json.dumps(run)))
    assert (result.verdicts, result.metrics, result.regressions) == ([], [], [])
    assert result.compared == {"verdicts": 1, "metrics": 4}  # the 3 seeds are one quantity


def test_a_changed_verdict_is_a_regression_with_its_evidence():
    result = compare.compare(summary(ACCURACY, "refuted"), summary(ACCURACY, "confirmed"))
    (change,) = result.verdicts
    assert (change.claim, change.test, change.before, change.after) == (
        "FMT-BYTES", TEST, "refuted", "confirmed",
    )  # fmt: skip
    assert result.regressions == [
        f"FMT-BYTES ({TEST}): verdict refuted -> confirmed: fp16 2 bytes{SAME_ENVIRONMENT}"
    ]
    assert change.attribution == kinds.Attribution(kinds.UNEXPLAINED, attribution.NOTHING_DIFFERS)


def test_seed_repetitions_shifted_by_half_are_flagged_naming_claim_and_metric():
    result = compare.compare(summary(ACCURACY), summary(scaled(ACCURACY, 1.5)))
    (change,) = result.metrics
    assert change.metric == "mlp/amp-fp16/seed*/val_accuracy"
    assert change.flagged and change.relative == pytest.approx(0.5)
    welch = stats.ttest_ind(list(ACCURACY.values()), [v * 1.5 for v in ACCURACY.values()],
                            equal_var=False).pvalue  # fmt: skip
    assert change.p_value == pytest.approx(welch)
    (line,) = result.regressions
    assert line.startswith(f"FMT-BYTES ({TEST}): metric mlp/amp-fp16/seed*/val_accuracy 91 ")
    assert "+50.0%" in line and "n=3 vs 3" in line


@pytest.mark.parametrize(
    ("after", "why"),
    [
        (scaled(ACCURACY, 1.05), "significant, but within the 10% threshold"),
        ({**ACCURACY, "mlp/amp-fp16/seed2/val_accuracy": 200.0}, "large, but within the noise"),
    ],
)
def test_a_change_must_be_both_significant_and_large(after, why):
    (change,) = compare.compare(summary(ACCURACY), summary(after)).metrics
    assert not change.flagged, why
    assert change.p_value is not None


def test_the_threshold_is_a_parameter():
    (change,) = compare.compare(summary(ACCURACY), summary(scaled(ACCURACY, 1.05)), 0.02).metrics
    assert change.flagged


def test_a_metric_without_repetitions_is_listed_but_never_flagged():
    result = compare.compare(summary({"bytes": 2.0}), summary({"bytes": 4.0}))
    (change,) = result.metrics
    assert (change.note, change.p_value, change.flagged) == ("no repetitions", None, False)
    assert change.relative == 1.0
    assert result.regressions == []


def test_repetitions_are_seed_round_and_rank_path_components_only():
    grouped = significance.quantities(
        {"rank0/scale": 1, "rank1/scale": 1, "a/round3/x": 1, "lr0.1/loss": 1, "seed": 1,
         "seed0_loss": 1}
    )  # fmt: skip
    assert list(grouped) == ["rank*/scale", "a/round*/x", "lr0.1/loss", "seed", "seed0_loss"]
    assert list(grouped["rank*/scale"]) == ["rank0/scale", "rank1/scale"]


def test_constant_repetitions_that_move_are_flagged():
    """The same count on every rank: no spread, so any move beyond the threshold is real."""
    ranks = {f"rank{r}/optimizer_steps": 10.0 for r in range(4)}
    (change,) = compare.compare(summary(ranks), summary(scaled(ranks, 0.5))).metrics
    assert (change.p_value, change.flagged) == (0.0, True)


def test_tests_and_metrics_of_one_run_only_are_listed_not_compared():
    a = summary({"bytes": 2.0, "gone": 1.0})
    b = summary({"bytes": 2.0, "new": 1.0})
    b["tests"]["scenarios/test_scn.py::test_other"] = {"outcome": "passed", "metrics": {}}
    result = compare.compare(a, b)
    assert result.only_a == [f"{TEST} :: metric gone"]
    assert result.only_b == [f"{TEST} :: metric new", "scenarios/test_scn.py::test_other"]
    assert result.regressions == []


def test_json_output_is_standard_json():
    a = summary({"bytes": 0.0, "loss": 1.0})
    b = summary({"bytes": 2.0, "loss": "nan"})
    document = json.dumps(compare.compare(a, b).to_json(), allow_nan=False)
    changes = {m["metric"]: m for m in json.loads(document)["metric_changes"]}
    assert changes["bytes"]["relative"] == "inf"
    assert changes["loss"]["after"] == ["nan"]


def test_a_missing_baseline_names_the_file_and_how_to_make_one(tmp_path):
    path = tmp_path / "baselines" / "cpu_torch-2.13.0.json"
    with pytest.raises(baseline.MissingBaseline) as missing:
        baseline.read_baseline(path)
    assert str(path) in str(missing.value)
    assert f"amp-harness baseline save --baselines {path.parent}" in str(missing.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        ('{"format": 99}', 'field "format" is 99'),
        (json.dumps({**summary({}), "verdicts": [{"claim": "X"}]}), 'verdicts[0]: field "verdict"'),
        (
            json.dumps(summary({"bytes": "two"})),
            f'tests["{TEST}"].metrics["bytes"] is \'two\', not a number',
        ),
    ],
)
def test_a_malformed_baseline_names_the_file_the_field_and_the_fix(tmp_path, content, message):
    path = tmp_path / "base.json"
    path.write_text(content)
    with pytest.raises(HarnessError) as error:
        baseline.read_baseline(path)
    text = str(error.value)
    assert text.startswith(f"{path}: ") and message in text
    assert "amp-harness baseline save" in text


@pytest.mark.parametrize("opening", ["[", '{"a": '])
def test_a_baseline_nested_too_deeply_is_one_line_naming_the_file(tmp_path, opening):
    """json.loads recurses once per level: 100,000 of them raised RecursionError."""
    path = tmp_path / "deep.json"
    path.write_text(opening * 100_000)
    with pytest.raises(HarnessError) as error:
        baseline.read_baseline(path)
    text = str(error.value)
    assert text == (
        f"{path}: nested too deeply to be a baseline (a baseline is 4 levels deep); "
        "`amp-harness baseline save` writes a valid one"
    )


# --- through pytest and the command line: real sessions, real journal, real baseline files ---

SCENARIO = """
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    record.metric(fp16_bytes=2)
    for seed, accuracy in enumerate([90.0, 92.0, 91.0]):
        record.metric(**{f"mlp/amp-fp16/seed{seed}/val_accuracy": accuracy})
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes, fp32 4 bytes")
"""


def session(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={pytester.path / 'reports'}", *args,
    )  # fmt: skip


@pytest.fixture
def saved(pytester: pytest.Pytester):
    """A session's baseline, saved where --amp-baseline auto looks for it; edit it to taste."""
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIO})
    session(pytester).assert_outcomes(passed=1)
    journal = Journal(pytester.path / "reports" / "journal.jsonl")
    path = baseline.save(baseline.summarize(journal), pytester.path / "reports" / "baselines")

    def edit(change) -> dict:
        content = json.loads(path.read_text())
        change(content)
        path.write_text(json.dumps(content))
        return content

    edit.path = path
    return edit


def last_exitstatus(pytester: pytest.Pytester) -> int:
    lines = (pytester.path / "reports" / "journal.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == "session_end"][-1]["exitstatus"]


def test_the_same_behaviour_as_the_baseline_passes(pytester, saved):
    result = session(pytester, "--amp-fail-on-regression")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            f"baseline {saved.path}: no verdict changed, no decision lost, no metric flagged "
            "(1 verdicts, 2 metrics compared)"
        ]  # fmt: skip
    )


def test_a_changed_verdict_fails_the_session_naming_the_claim(pytester, saved):
    def refuted(content):
        content["verdicts"][0]["verdict"] = "refuted"

    saved(refuted)
    result = session(pytester, "--amp-fail-on-regression")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1)  # the test itself passed: the regression fails the session
    result.stdout.fnmatch_lines(
        ["baseline *: regressions: 1 *--amp-fail-on-regression fails the session",
         f"  FMT-BYTES ({TEST}): verdict refuted -> confirmed: fp16 2 bytes, fp32 4 bytes"
         f"{SAME_ENVIRONMENT}"]
    )  # fmt: skip
    assert last_exitstatus(pytester) == pytest.ExitCode.TESTS_FAILED  # so MLflow says FAILED


def test_seed_metrics_shifted_by_half_fail_naming_the_metric(pytester, saved):
    def shifted(content):
        metrics = content["tests"][TEST]["metrics"]
        content["tests"][TEST]["metrics"] = {k: v / 1.5 for k, v in metrics.items()}

    saved(shifted)  # fp16_bytes moved by 50% too, but it has no repetitions: listed, not flagged
    result = session(pytester, "--amp-baseline=auto", "--amp-fail-on-regression")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["baseline *: regressions: 1 *",
         f"  FMT-BYTES ({TEST}): metric mlp/amp-fp16/seed*/val_accuracy 60.67 (mean of 3) -> "
         f"91 (mean of 3) (+50.0%, Welch p=*, n=3 vs 3){SAME_ENVIRONMENT}"]
    )  # fmt: skip


def test_without_fail_on_regression_the_regressions_are_shown_and_the_session_passes(
    pytester, saved
):
    saved(lambda content: content["verdicts"][0].update(verdict="refuted"))
    result = session(pytester, f"--amp-baseline={saved.path}")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["baseline *: regressions: 1 *", "  FMT-BYTES *refuted*"])


def test_no_baseline_for_this_environment_is_a_line_not_a_failure(pytester):
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIO})
    result = session(pytester, "--amp-fail-on-regression")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [f"amp-harness: no baseline at {pytester.path}/reports/baselines/cpu-*_torch-*.json: "
         "nothing compared*amp-harness baseline save*"]
    )  # fmt: skip


@pytest.mark.parametrize(
    ("write", "message"),
    [(None, "*no baseline at *typo.json*"), ("[]", "*typo.json: expected a JSON object*")],
)
def test_a_named_baseline_that_is_absent_or_bad_stops_the_session_before_it_runs(
    pytester, write, message
):
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIO})
    if write is not None:
        (pytester.path / "typo.json").write_text(write)
    result = session(pytester, "--amp-baseline=typo.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    journal = Journal(pytester.path / "reports" / "journal.jsonl")
    assert list(journal.entries()) == []  # no session half-recorded


def test_cli_compares_a_baseline_file_with_the_last_session(pytester, saved, capsys):
    saved(lambda content: content["verdicts"][0].update(verdict="refuted"))
    reports = str(pytester.path / "reports")
    assert cli.main(["compare", str(saved.path), "last", "--reports", reports]) == 0
    out = capsys.readouterr().out
    assert "verdicts changed: 1" in out and "refuted -> confirmed" in out

    argv = ["compare", str(saved.path), "--reports", reports, "--json", "--fail-on-regression"]
    assert cli.main(argv) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["a"] == str(saved.path) and document["b"].startswith("session ")
    assert [v["claim"] for v in document["verdict_changes"]] == ["FMT-BYTES"]
    assert document["metric_changes"] == []


def test_cli_compares_two_sessions_by_id(pytester, saved, capsys):
    session(pytester).assert_outcomes(passed=1)
    capsys.readouterr()  # the nested session's output
    journal = Journal(pytester.path / "reports" / "journal.jsonl")
    first, second = [e["session_id"] for e in journal.entries() if e["type"] == "session"]
    argv = ["compare", first, second, "--reports", str(pytester.path / "reports"), "--json"]
    assert cli.main([*argv, "--fail-on-regression"]) == 0
    assert json.loads(capsys.readouterr().out)["compared"] == {"verdicts": 1, "metrics": 2}


def test_cli_reports_a_missing_baseline_and_exits_0(tmp_path, capsys):
    path = tmp_path / "baselines" / "NVIDIA-H200_torch-2.13.0_cuda-13.0.json"
    assert cli.main(["compare", str(path), "--reports", str(tmp_path), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["missing_baseline"] == str(path)
    assert "amp-harness baseline save" in document["message"]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("baselines/X.jsno", "*--fail-on-regression: no baseline at *X.jsno: nothing compared*"),
        ("/dev/zero", "*/dev/zero: not a baseline file (a folder or a device)*"),
        (".", "*: not a baseline file (a folder or a device)*"),
    ],
    ids=["typo", "device", "folder"],
)
def test_a_gate_that_compares_nothing_fails_with_one_line(pytester, saved, capsys, given, message):
    """`compare TYPO last --fail-on-regression` said "nothing compared" and exited 0: a CI
    regression gate passed without comparing."""
    reports = str(pytester.path / "reports")
    capsys.readouterr()
    code = cli.main(["compare", given, "last", "--reports", reports, "--fail-on-regression"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert fnmatch.fnmatch(err, message), err


def test_a_baseline_that_overlaps_nothing_fails_the_gate(pytester, saved, capsys):
    """A baseline none of whose verdicts this suite records: compared, nothing in common; under
    --fail-on-regression (the command's and the plugin's), a failure that says so."""
    saved(lambda content: content["verdicts"][0].update(claim="FMT-BITS"))
    reports = str(pytester.path / "reports")
    result = session(pytester, "--amp-fail-on-regression")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["baseline *: no verdict of one run is in the other: nothing compared *; "
         "--amp-fail-on-regression fails the session"]
    )  # fmt: skip
    capsys.readouterr()
    argv = ["compare", str(saved.path), "last", "--reports", reports]
    assert cli.main(argv) == 0  # without the gate: said, not a failure
    assert cli.main([*argv, "--fail-on-regression", "--json"]) == 1
    err = capsys.readouterr().err
    assert "--fail-on-regression: " in err and "a gate that compared nothing fails" in err


def test_cli_unknown_session_is_an_error_saying_what_else_to_give(pytester, saved, capsys):
    assert cli.main(["compare", "nosuchsession", "--reports", str(pytester.path / "reports")]) == 2
    assert "no session 'nosuchsession'" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "value"), [("0.2", 0.2), ("20%", 0.2)])
def test_cli_threshold_is_a_fraction_or_a_percentage(text, value):
    assert cli.parser().parse_args(["compare", "last", "--threshold", text]).threshold == value


@pytest.mark.parametrize("text", ["0", "-5%", "ten"])
def test_cli_bad_threshold_is_a_usage_error(text):
    with pytest.raises(SystemExit) as exit_:
        cli.parser().parse_args(["compare", "last", "--threshold", text])
    assert exit_.value.code == 2


# --- what a comparison says it compared (verdicts as they count, decisions lost, overlap) -------


def with_verdict(verdict: str, stands: bool, test: str = TEST, lacks=()) -> dict:
    run = summary(ACCURACY)
    run["verdicts"] = [{"claim": "FMT-BYTES", "verdict": verdict, "stands": stands,
                        "evidence": "65536 -> 32768", "test": test}]  # fmt: skip
    run["tests"] = {test: {"outcome": "passed", "metrics": ACCURACY}}
    run["lacks"] = list(lacks)
    return run


@pytest.mark.parametrize(
    ("after", "stands"),
    [
        ("skipped", False),
        ("failed (was: confirmed)", False),
        ("capability regression", False),
        ("cannot compile", False),  # shown as itself: the compiler's, not the claim's
    ],
)
def test_a_decision_skipped_or_failed_now_is_a_regression(after, stands):
    result = compare.compare(with_verdict("confirmed", True), with_verdict(after, stands))
    assert result.regressions == [
        f"FMT-BYTES ({TEST}): verdict confirmed -> {after}: 65536 -> 32768{SAME_ENVIRONMENT}"
    ]


def test_a_decision_missing_now_is_a_regression_unless_the_run_was_partial():
    renamed = "scenarios/test_scn.py::test_renamed"
    result = compare.compare(
        with_verdict("confirmed", True), with_verdict("skipped", False, renamed)
    )
    same = kinds.Attribution(kinds.UNEXPLAINED, attribution.NOTHING_DIFFERS)
    assert result.lost == [
        comparison.LostDecision("FMT-BYTES", "confirmed", "skipped", "65536 -> 32768", same)
    ]
    assert "FMT-BYTES: decided (confirmed) before, skipped now" in result.regressions[0]

    gone = with_verdict("confirmed", True)
    gone["verdicts"], gone["tests"] = [], {}
    result = compare.compare(with_verdict("confirmed", True), gone)
    assert [d.after for d in result.lost] == ["missing"] and result.regressions

    partial = {**gone, "lacks": ["tests selected with -k 'scaler'"]}
    result = compare.compare(with_verdict("confirmed", True), partial)
    assert result.regressions == [] and result.not_compared == ["FMT-BYTES"]


def test_a_comparison_without_a_common_verdict_says_nothing_was_compared():
    other = with_verdict("confirmed", True, "scenarios/test_scn.py::test_other")
    other["verdicts"][0]["claim"] = "FMT-BITS"
    result = compare.compare(with_verdict("confirmed", True), other)
    assert not result.overlapped
    assert result.summary_line().startswith("no verdict of one run is in the other: nothing")
    same = compare.compare(with_verdict("confirmed", True), with_verdict("confirmed", True))
    assert same.overlapped and same.summary_line().startswith("no verdict changed")


def test_cli_compare_takes_the_short_session_ids_it_prints(pytester, saved, capsys):
    session(pytester).assert_outcomes(passed=1)
    capsys.readouterr()
    journal = Journal(pytester.path / "reports" / "journal.jsonl")
    first, second = [e["session_id"] for e in journal.entries() if e["type"] == "session"]
    reports = str(pytester.path / "reports")
    assert cli.main(["compare", first[:8], second[:8], "--reports", reports, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["a"].startswith(f"session {first[:8]}") and document["overlapped"]


def test_a_session_prefix_must_name_one_session(tmp_path):
    sessions = {sid: Session({"name": sid}) for sid in ("abc123", "abd456")}
    assert baseline.find_session(sessions, "abc", tmp_path) == "abc123"
    with pytest.raises(HarnessError, match="'ab' is ambiguous: it starts abc123, abd456"):
        baseline.find_session(sessions, "ab", tmp_path)
    with pytest.raises(HarnessError, match="no session 'x'; the latest: abd456 .abd456., abc123"):
        baseline.find_session(sessions, "x", tmp_path)


def test_an_id_that_names_no_session_lists_the_latest_few_not_a_years_history(tmp_path):
    sessions = {f"{n:012x}ffff": Session({"name": f"run {n}"}) for n in range(50_000)}
    with pytest.raises(HarnessError) as error:
        baseline.find_session(sessions, "nosuch", tmp_path)
    message = str(error.value)
    assert message.count("(run ") == baseline.LISTED_IN_ERRORS, message
    assert f"{49_999:012x} (run 49999)" in message and "and 49995 older" in message
    assert "`amp-harness sessions` lists them all" in message and len(message) < 500


LONG_EVIDENCE = "scale 65536 -> 32768 after an injected inf at step 3; " * 6


def rendered(result: comparison.Comparison, width: int, terminal: bool) -> list[str]:
    from rich.console import Console

    out = io.StringIO()
    comparison_view.render(result, Console(file=out, width=width, force_terminal=terminal))
    return [ansi.sub("", line) for line in out.getvalue().splitlines()]


ansi = re.compile(r"\x1b\[[0-9;]*m")


def test_compare_at_80_columns_prints_blocks_with_every_word_of_the_evidence():
    """At 80 columns, `compare`'s table left its evidence column one letter wide: a changed
    verdict's evidence came out a letter a line. Below a wide terminal, each change is a block:
    claim, A -> B and test on a line, the evidence and why under it, wrapped at the width."""
    before, after = summary(ACCURACY), summary(scaled(ACCURACY, 0.5), "refuted")
    after["verdicts"][0]["evidence"] = LONG_EVIDENCE
    lines = rendered(compare.compare(before, after), 80, terminal=False)
    assert all(len(line) <= 80 for line in lines)
    at = lines.index("FMT-BYTES  confirmed -> refuted  test_scn.py::test_bytes")
    assert lines[at + 1].startswith("    B: scale 65536 -> 32768 after an injected inf")
    said = " ".join(" ".join(lines).split())
    assert f"B: {' '.join(LONG_EVIDENCE.split())} A: fp16 2 bytes why: nothing" in said
    assert "FLAGGED  FMT-BYTES  mlp/amp-fp16/seed*/val_accuracy" in lines
    assert "91 -> 45.5 (means, n=3 vs 3), -50.0%, p " in said
    assert min(len(line.strip()) for line in lines if line.strip()) > 3  # no column of letters


def test_compare_on_a_wide_terminal_keeps_its_tables():
    result = compare.compare(summary(ACCURACY), summary(ACCURACY, "refuted"))
    lines = rendered(result, 160, terminal=True)
    assert any(line.startswith("┏") for line in lines)
    assert any("confirmed -> refuted" in line and "│" in line for line in lines)


def with_scenario(run: dict, digest: str) -> dict:
    run["tests"][TEST]["scenario_sha256"] = digest
    return run


def test_a_change_of_a_test_whose_scenario_file_changed_says_so():
    """Two sessions that ran other code for one test: `compare` says the scenario changed, in
    the change's why and in a line of its own, and not where the file is the same or one run
    (a baseline from before digests) does not say."""
    a = with_scenario(summary(ACCURACY), "1111111111111111")
    b = with_scenario(summary(ACCURACY, "refuted"), "2222222222222222")
    result = compare.compare(a, b)
    (change,) = result.verdicts
    assert change.attribution.why.startswith(
        "the scenario changed (its file's sha256 1111111111111111 -> 2222222222222222); "
    )
    assert result.scenarios_changed == (TEST,) and result.to_json()["scenarios_changed"] == [TEST]
    said = " ".join(rendered(result, 80, terminal=False))
    assert f"scenario changed (other code ran in A and B): {TEST}" in said
    same = compare.compare(a, with_scenario(summary(ACCURACY, "refuted"), "1111111111111111"))
    older = compare.compare(summary(ACCURACY), b)  # A recorded no digest
    for unchanged in (same, older):
        assert not unchanged.scenarios_changed
        assert "scenario changed" not in unchanged.verdicts[0].attribution.why
