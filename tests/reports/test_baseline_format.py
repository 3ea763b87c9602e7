"""A baseline file is untrusted input, held to one schema (harness.reports.baseline_format) where
it is read and where it is written: each field typed, the verdict and outcome words closed and
read from harness.catalogue.verdicts, names one line. A bad one is a usage error (exit 2 from a
command, pytest's 4 from a session), never a regression's exit 1, and stops a session before it
records anything. Issue 55, faults 10 to 13."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import cli
from harness.catalogue import verdicts
from harness.common.errors import HarnessError
from harness.records.journal import Journal
from harness.reports import baseline, baseline_format, compare

COMMITTED = sorted(Path(__file__).parents[2].glob("reports/baselines/**/*.json"))
TEST = "scenarios/test_scn.py::test_bytes"
SCENARIO = """
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes, fp32 4 bytes")
"""


def good() -> dict:
    """A small baseline, as summarize writes one."""
    return {
        "format": baseline.FORMAT, "session_id": "s1", "name": "n", "started": 1.0,
        "complete": True, "lacks": [],
        "fingerprint": {"torch": "2.13.0+cpu", "hardware_class": "cpu-x86-64-avx2"},
        "verdicts": [{"claim": "FMT-BYTES", "verdict": "confirmed", "stands": True,
                      "evidence": "fp16 2 bytes\nfp32 4 bytes", "test": TEST}],
        "tests": {TEST: {"outcome": "passed", "claims": ["FMT-BYTES"], "metrics": {"b": 2.0},
                         "key_metrics": ["b"], "depends_on_hardware": [],
                         "scenario_sha256": "ab12"}},
    }  # fmt: skip


def compared(tmp_path: Path, capsys, change) -> tuple[int, str, str]:
    """`amp-harness compare` of a good baseline with one `change`d."""
    bad = good()
    change(bad)
    (tmp_path / "a.json").write_text(json.dumps(good()))
    (tmp_path / "b.json").write_text(json.dumps(bad))
    argv = ["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    code = cli.main([*argv, "--reports", str(tmp_path)])
    out, err = capsys.readouterr()
    return code, out, err


def _verdict(**fields):
    return lambda b: b["verdicts"][0].update(fields)


def _test(**fields):
    return lambda b: b["tests"][TEST].update(fields)


def _fact(**fields):
    return lambda b: b["fingerprint"].update(fields)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_verdict(verdict="pwned"),
         'verdicts[0]: field "verdict" is \'pwned\', not a verdict: use \'confirmed\''),
        (_fact(hardware_class=123), 'fingerprint["hardware_class"] is 123, not text'),
        (_fact(torch=None), 'fingerprint["torch"] is None, not text'),
        (_test(outcome=7), f'tests["{TEST}"]: field "outcome" is 7, not a test outcome: use'),
        (_test(key_metrics="b"), f'tests["{TEST}"]: field "key_metrics" is \'b\', not a list'),
        (_test(key_metrics=["c"]), f"tests[\"{TEST}\"].key_metrics: 'c' is not one of its"),
        (_verdict(stands=True, verdict="skipped"),
         "verdicts[0]: field \"stands\" is True, but a 'skipped' verdict does not stand"),
        (lambda b: b.update(colour="red"), "field 'colour' is not a baseline field (known:"),
        (_verdict(claim="FMT-BYTES\nbaseline a.json: no verdict changed"),
         "verdicts[0]: field \"claim\" is 'FMT-BYTES\\nbaseline a.json: no verdict changed': a "
         "name is one line"),
        (lambda b: b["tests"].update({"t\x1b[2J": {"metrics": {}}}),
         "tests: a key is 't\\x1b[2J': a name is one line of printable text"),
    ],
    ids=["verdict-out-of-vocabulary", "hardware-class-a-number", "torch-null", "outcome-a-number",
         "key-metrics-a-string", "key-metric-not-a-metric", "skipped-that-stands",
         "unknown-field", "newline-in-a-claim-id", "escape-in-a-test-id"],
)  # fmt: skip
def test_a_bad_baseline_is_a_one_line_usage_error_never_a_regression(
    tmp_path, capsys, change, message
):
    code, out, err = compared(tmp_path, capsys, change)
    assert code == 2, out + err  # 1 is a regression's: CI must tell them apart
    assert out == "" and "Traceback" not in err
    assert err.count("\n") == 1, err  # one line: the text from the file is escaped
    assert err.startswith(f"amp-harness: error: {tmp_path / 'b.json'}: {message}"), err
    assert err.rstrip().endswith("`amp-harness baseline save` writes a valid one")


def test_the_good_baseline_compares_and_its_regression_exits_1(tmp_path, capsys):
    """The control of the cases above: the unchanged file compares (exit 0), and a real
    regression exits 1 with --fail-on-regression, apart from a bad file's 2."""
    assert compared(tmp_path, capsys, lambda b: None)[0] == 0
    (tmp_path / "b.json").write_text(json.dumps({**good(), "verdicts": [
        {**good()["verdicts"][0], "verdict": "refuted"}]}))  # fmt: skip
    argv = ["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--fail-on-regression"]
    assert cli.main([*argv, "--reports", str(tmp_path)]) == 1


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.parent.name + "/" + p.name)
def test_every_committed_baseline_holds_to_the_schema(path):
    assert baseline_format.problem(json.loads(path.read_text())) is None


def test_the_vocabulary_is_read_from_the_verdicts_module(monkeypatch):
    """Never a copy: a word the verdicts module knows (issue 53's "cannot compile") is one a
    baseline may hold, with the labels `status` makes of it, and one it drops is refused."""
    summary = good()
    summary["verdicts"][0].update(verdict="cannot compile", stands=False)
    assert baseline_format.problem(summary) is None
    monkeypatch.setattr(verdicts, "RECORDABLE", verdicts.DECIDED)
    assert "not a verdict" in baseline_format.problem(summary)
    summary = good()
    summary["tests"][TEST]["outcome"] = "timed-out"
    assert "not a test outcome" in baseline_format.problem(summary)
    monkeypatch.setattr(verdicts, "OUTCOMES", (*verdicts.OUTCOMES, "timed-out"))
    assert baseline_format.problem(summary) is None


def test_save_refuses_a_summary_that_would_not_read_back(tmp_path):
    summary = good()
    summary["verdicts"][0]["verdict"] = "pwned"
    with pytest.raises(HarnessError, match=r"no valid baseline \(verdicts\[0\]: .*nothing written"):
        baseline.save(summary, tmp_path)
    assert list(tmp_path.iterdir()) == []


def session(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIO})
    return pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={pytester.path / 'reports'}", *args,
    )  # fmt: skip


def journal_types(pytester: pytest.Pytester) -> list[str]:
    return [e["type"] for e in Journal(pytester.path / "reports" / "journal.jsonl").entries()]


def test_a_gated_session_with_a_bad_baseline_stops_before_it_records(pytester):
    """It ran and journalled its tests, then ended in a traceback with no session_end."""
    bad = good()
    bad["verdicts"][0]["verdict"] = "pwned"
    (pytester.path / "bad.json").write_text(json.dumps(bad))
    result = session(pytester, "--amp-baseline=bad.json", "--amp-fail-on-regression")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: *bad.json: verdicts[[]0]: field \"verdict\" is 'pwned'*"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert journal_types(pytester) == []


def test_a_comparison_that_breaks_still_records_the_sessions_end(pytester, monkeypatch):
    """Nothing recorded is lost to the comparison: whatever it raises, the end is journalled
    first (its exit status, its counts), then the error goes on."""
    session(pytester).assert_outcomes(passed=1)
    saved = baseline.save(
        baseline.summarize(Journal(pytester.path / "reports" / "journal.jsonl")), pytester.path
    )

    def broken(*args, **kwargs):
        raise RuntimeError("a comparison that breaks")

    monkeypatch.setattr(compare, "compare", broken)
    result = session(pytester, f"--amp-baseline={saved}", "--amp-fail-on-regression")
    assert "a comparison that breaks" in result.stdout.str() + result.stderr.str()
    assert journal_types(pytester) == ["session", "record", "session_end"] * 2
    *_, end = Journal(pytester.path / "reports" / "journal.jsonl").entries()
    assert end["counts"] == {"passed": 1}
