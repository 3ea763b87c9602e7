"""The pytest plugin's contract, through nested pytest sessions (pytester)."""

from __future__ import annotations

import json

import pytest

from harness.common.errors import HarnessError
from harness.records.record import Record

GOOD = """
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    record.metric(fp16_bytes=2)
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes, fp32 4 bytes")
"""


def run(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(**{"scenarios/test_scn": source})
    return pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={pytester.path / 'reports'}", *args,
    )  # fmt: skip


def journal_records(pytester: pytest.Pytester) -> list[dict]:
    lines = (pytester.path / "reports" / "journal.jsonl").read_text().splitlines()
    return [e["record"] for e in map(json.loads, lines) if e["type"] == "record"]


def test_passing_scenario_prints_the_verdict_table_and_journals_it(pytester):
    result = run(pytester, GOOD)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*amp-harness verdicts*", "FMT-BYTES  confirmed", "    fp16 2 bytes, fp32 4 bytes"]
    )
    (rec,) = journal_records(pytester)
    assert rec["outcome"] == "passed"
    assert rec["verdicts"] == [
        {"claim": "FMT-BYTES", "verdict": "confirmed", "evidence": "fp16 2 bytes, fp32 4 bytes"}
    ]


def test_missing_marker_is_a_collection_error_naming_file_and_test(pytester):
    result = run(pytester, "def test_unmarked(record):\n    pass\n")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        ["*ERROR collecting scenarios/test_scn.py*",
         "*scenarios/test_scn.py::test_unmarked: no claim marker*pytest.mark.claim*"]
    )  # fmt: skip


def test_unknown_claim_id_names_the_closest_valid_ids(pytester):
    source = GOOD.replace('claim("FMT-BYTES")', 'claim("SCL-NAN-INCREASE")')
    result = run(pytester, source)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        ["*test_scn.py::test_bytes: unknown claim ID 'SCL-NAN-INCREASE'*"
         "closest valid IDs: SCL-NAN-INCREASES*"]
    )  # fmt: skip


def test_markers_on_the_module_count(pytester):
    source = "import pytest\npytestmark = pytest.mark.claim('FMT-BITS')\n" + GOOD.replace(
        '@pytest.mark.claim("FMT-BYTES")', ""
    ).replace("FMT-BYTES", "FMT-BITS")
    run(pytester, source).assert_outcomes(passed=1)


def test_tests_outside_scenarios_need_no_marker(pytester):
    pytester.makepyfile(test_plain="def test_x():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--no-mlflow")
    result.assert_outcomes(passed=1)
    assert not (pytester.path / "reports").exists()  # nothing tracked for non-scenario runs


def test_a_passing_test_without_its_verdict_fails_naming_the_claim(pytester):
    source = GOOD.replace(
        'record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes, fp32 4 bytes")', "pass"
    )
    result = run(pytester, source)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*declares FMT-BYTES but recorded no verdict for FMT-BYTES*"])


def test_a_passing_test_that_records_skipped_fails(pytester):
    """A skip decided inside a passing test would bypass the capability table (a capability
    lost where it is expected would pass for one missing): the test fails, naming the claim.
    The control: the same verdict from a test that really skips is its skip reason."""
    source = GOOD.replace(
        '"confirmed", "fp16 2 bytes, fp32 4 bytes"', '"skipped", "no fp16 on this device"'
    )
    result = run(pytester, source)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*passed but recorded 'skipped' for FMT-BYTES*requires*"])
    skip = '    pytest.skip("no fp16 here")\n'
    skipping = source.replace("    record.metric(", skip + "    record.metric(")
    run(pytester, skipping).assert_outcomes(skipped=1)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ('record.verdict("FMT-BITS", "confirmed", "5 bits")', "does not declare*FMT-BITS*"),
        ('record.verdict("FMT-BYTES", "true", "2 bytes")', "unknown verdict 'true'*confirmed*"),
        ('record.verdict("FMT-BYTES", "confirmed", "it holds")', "evidence*carries no number*"),
        (
            'record.verdict("FMT-BYTES", "confirmed", "fp16 halves float32")',
            "evidence*carries no number (only inside the names fp16, float32)*",
        ),
    ],
)
def test_bad_verdicts_are_refused_with_the_fix(pytester, call, message):
    source = f"""
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    {call}
"""
    result = run(pytester, source)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{message}"])


def evidence_record(tmp_path) -> Record:
    return Record("scenarios/test_x.py::test_y", ["FMT-BYTES"], "cpu", tmp_path)


@pytest.mark.parametrize("evidence", ["fp16", "float32 and bfloat16", "sm_90", "e4m3 int8 H200"])
def test_evidence_whose_digits_are_only_inside_names_is_refused(tmp_path, evidence):
    record = evidence_record(tmp_path)
    with pytest.raises(HarnessError, match=r"FMT-BYTES carries no number \(only inside the names"):
        record.verdict("FMT-BYTES", "confirmed", evidence)
    assert record.verdicts == {}


@pytest.mark.parametrize(
    "evidence",
    ["65536 -> 32768", "2**-25", "0.19", "3 of 4", "fp16 underflows below 1e-7", "12% on sm_90"],
)
def test_evidence_with_a_number_of_its_own_is_accepted(tmp_path, evidence):
    record = evidence_record(tmp_path)
    record.verdict("FMT-BYTES", "confirmed", evidence)
    assert record.verdicts["FMT-BYTES"].evidence == evidence


def test_a_skipped_verdict_needs_no_number(tmp_path):
    record = evidence_record(tmp_path)
    record.verdict("FMT-BYTES", "skipped", "needs fp16_autocast")  # the skip reason
    assert record.verdicts["FMT-BYTES"].verdict == "skipped"


def test_a_failure_names_its_claims_and_keeps_the_measurement(pytester):
    source = GOOD + '    assert False, "FMT-BYTES: x"\n'
    result = run(pytester, source)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*amp-harness*", "claims: FMT-BYTES", "FMT-BYTES: confirmed*"])
    (rec,) = journal_records(pytester)
    assert rec["outcome"] == "failed" and rec["verdicts"][0]["verdict"] == "confirmed"
    assert "FMT-BYTES: x" in rec["message"]


def test_requires_skips_with_a_reason_a_person_can_act_on(pytester):
    source = """
import pytest

@pytest.mark.claim("FMT-SPEED")
@pytest.mark.requires("cuda")
def test_speed(record):
    raise AssertionError("must not run")

@pytest.mark.claim("PIT3-FP16-SYNC")
@pytest.mark.requires(gpus=2)
def test_two_gpus(record):
    raise AssertionError("must not run")
"""
    result = run(pytester, source, "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        ["SKIPPED * scenarios/test_scn.py:*: needs CUDA: no GPU found*",
         "SKIPPED * scenarios/test_scn.py:*: needs 2 CUDA GPUs, found 0"]
    )  # fmt: skip
    verdicts = [r["verdicts"][0] for r in journal_records(pytester)]
    assert [v["verdict"] for v in verdicts] == ["skipped", "skipped"]
    assert verdicts[0]["evidence"].startswith("needs CUDA")


def test_unknown_capability_is_an_error_listing_the_known_ones(pytester):
    source = GOOD.replace(
        '@pytest.mark.claim("FMT-BYTES")',
        '@pytest.mark.claim("FMT-BYTES")\n@pytest.mark.requires("fp8")',
    )
    result = run(pytester, source)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*unknown capability 'fp8'*bf16_autocast*"])


def test_amp_device_cuda_without_a_gpu_is_a_usage_error(pytester):
    pytester.makepyfile(**{"scenarios/test_scn": GOOD})
    result = pytester.runpytest_inprocess("scenarios", "--amp-device=cuda", "--no-mlflow")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--amp-device cuda: needs CUDA: no GPU found*--amp-device cpu*"])


def test_unwritable_reports_folder_is_a_usage_error_before_any_test_runs(pytester):
    blocker = pytester.path / "blocked"
    blocker.write_text("a file where a folder should be")
    pytester.makepyfile(**{"scenarios/test_scn": GOOD})
    result = pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", f"--amp-reports={blocker / 'reports'}"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cannot write the journal*pass --amp-reports DIR*"])


def test_figures_and_histories_reach_the_record(pytester):
    source = """
import pytest
from harness.lab.figures import training_curves

@pytest.mark.claim("PRACTICE-SMOKE")
def test_curves(record):
    history = {"loss": [3.0, 2.0, float("nan")], "scale": [65536.0] * 3}
    record.history(**history)
    record.figure("curves", training_curves({"amp-fp16": history}, "smoke"))
    record.verdict("PRACTICE-SMOKE", "confirmed", "loss 3.0 -> 2.0 over 3 steps")
"""
    run(pytester, source).assert_outcomes(passed=1)
    (rec,) = journal_records(pytester)
    assert rec["histories"]["loss"] == [3.0, 2.0, "nan"]
    assert rec["figures"] == ["curves.png"]
    png = pytester.path / "reports" / "records" / "scenarios_test_scn.py.test_curves" / "curves.png"
    assert png.read_bytes().startswith(b"\x89PNG")


# --- "Nothing lost, round 3", item 1: a test that leaves torch's global state changed fails,
# naming it, and the tests after it run as they would have ---

LEAKS = {  # what a scenario left behind, and what its failure then says
    "flush_denormal": ("torch.set_flush_denormal(True)", "torch.flush_denormal: False -> True"),
    "float16_default": ("torch.set_default_dtype(torch.float16)",
                        "torch.default_dtype: torch.float32 -> torch.float16"),
    "float64_default": ("torch.set_default_dtype(torch.float64)",
                        "torch.default_dtype: torch.float32 -> torch.float64"),
    "autocast_entered": ('torch.autocast("cpu", dtype=torch.float16).__enter__()',
                         "torch.autocast.cpu.enabled: False -> True; torch.autocast.cpu.dtype: "
                         "torch.bfloat16 -> torch.float16; torch.autocast.nesting: 0 -> 1"),
    "grad_off": ("torch.set_grad_enabled(False)", "torch.grad_enabled: True -> False"),
    "tf32_on": ("tf32.set_tf32(True)", "*precision.cuda.matmul.* -> *"),
    "matmul_precision": ('torch.set_float32_matmul_precision("medium")',
                         "precision.float32_matmul_precision: highest -> medium*"),
    "deterministic": ("torch.use_deterministic_algorithms(True)",
                      "torch.deterministic_algorithms: off -> on"),
    "threads": ("torch.set_num_threads(3)", "torch.threads: 1 -> 3"),
}  # fmt: skip

LEAKING_HEAD = """
import pytest
import torch
from harness.lab import tf32

def assert_as_before():
    assert torch.get_default_dtype() == torch.float32
    assert torch.tensor(2.0**-140).item() > 0  # FMT-RANGE's smallest subnormal, not flushed
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
    assert torch.get_float32_matmul_precision() == "highest"
    assert tf32.tf32_flags()["cuda.matmul.allow_tf32"] is False
    assert not torch.are_deterministic_algorithms_enabled() and torch.get_num_threads() == 1
"""
LEAKING_PAIR = """
@pytest.mark.claim("FMT-BITS")
def test_leaks_{name}(record):
    {code}
    record.verdict("FMT-BITS", "confirmed", "5 + 10 bits")

@pytest.mark.claim("FMT-RANGE")
def test_after_{name}(record):
    assert_as_before()
    record.verdict("FMT-RANGE", "confirmed", "2**-140 kept")
"""
LEAKING = LEAKING_HEAD + "".join(
    LEAKING_PAIR.format(name=name, code=code) for name, (code, _) in LEAKS.items()
)


def test_a_test_that_leaves_torch_state_changed_fails_naming_it_and_the_next_passes(pytester):
    result = run(pytester, LEAKING)
    result.assert_outcomes(failed=len(LEAKS), passed=len(LEAKS))
    result.stdout.fnmatch_lines_random(
        [f"*test_leaks_{name} left torch's global state changed: {said}*Put back for the tests "
         "after it*try/finally" for name, (_, said) in LEAKS.items()]
    )  # fmt: skip
    records = {r["test"].split("::")[1]: r for r in journal_records(pytester)}
    for name in LEAKS:
        assert records[f"test_leaks_{name}"]["outcome"] == "failed"
        assert "left torch's global state changed" in records[f"test_leaks_{name}"]["message"]
        assert records[f"test_after_{name}"]["outcome"] == "passed"
    # Recorded with every test: the state it started under, the precision flags among it.
    params = records["test_after_threads"]["params"]
    assert params["precision.float32_matmul_precision"] == "highest"
    assert params["torch.default_dtype"] == "torch.float32" and params["torch.threads"] == "1"


FIXTURES_AND_CONTROLS = """
import pytest
import torch

@pytest.fixture
def float64_for_this_test():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)

@pytest.fixture
def float64_left_behind():
    torch.set_default_dtype(torch.float64)
    yield

@pytest.mark.claim("FMT-BITS")
def test_changes_and_restores(record):
    torch.set_flush_denormal(True)
    try:
        flushed = torch.tensor(2.0**-140).item()
    finally:
        torch.set_flush_denormal(False)
    with torch.autocast("cpu", dtype=torch.float16), torch.no_grad():
        record.verdict("FMT-BITS", "confirmed", f"2**-140 -> {flushed} flushed")

@pytest.mark.claim("FMT-BYTES")
def test_with_a_fixture_that_restores(record, float64_for_this_test):
    assert torch.get_default_dtype() == torch.float64
    record.verdict("FMT-BYTES", "confirmed", "8 bytes a float64")

@pytest.mark.claim("FMT-RANGE")
def test_with_a_fixture_that_leaks(record, float64_left_behind):
    record.verdict("FMT-RANGE", "confirmed", "65504 max")

@pytest.mark.claim("NUM-UNDERFLOW")
def test_after(record):
    assert torch.get_default_dtype() == torch.float32
    record.verdict("NUM-UNDERFLOW", "confirmed", "2**-25 -> 0")
"""


def test_state_changed_and_put_back_passes_and_a_fixture_that_leaks_errors(pytester):
    result = run(pytester, FIXTURES_AND_CONTROLS)
    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines(
        ["*ERROR at teardown of test_with_a_fixture_that_leaks*",
         "*test_with_a_fixture_that_leaks left torch's global state changed by a fixture: "
         "torch.default_dtype: torch.float32 -> torch.float64. Put back*"]
    )  # fmt: skip
    outcomes = {r["test"].split("::")[1]: r["outcome"] for r in journal_records(pytester)}
    assert outcomes["test_with_a_fixture_that_leaks"] == "error"
    assert outcomes["test_after"] == outcomes["test_with_a_fixture_that_restores"] == "passed"


# --- item 3: a reports folder deleted during the session ---

DELETES_ITS_REPORTS = """
import pathlib, shutil
import pytest

@pytest.mark.claim("FMT-BITS")
def test_before(record):
    record.verdict("FMT-BITS", "confirmed", "5 + 10 bits")

@pytest.mark.claim("FMT-BYTES")
def test_deletes(record):
    {delete}
    record.verdict("FMT-BYTES", "confirmed", "2 bytes against 4")

@pytest.mark.claim("FMT-RANGE")
def test_after(record):
    record.verdict("FMT-RANGE", "partly", "5.96e-08 to 65504")
"""


@pytest.mark.parametrize(
    "delete", ['shutil.rmtree("reports")', 'pathlib.Path("reports/journal.jsonl").unlink()'],
    ids=["folder", "journal"],
)  # fmt: skip
def test_a_reports_folder_deleted_midway_keeps_every_record_under_its_session(pytester, delete):
    from harness.records.journal import Journal

    result = run(pytester, DELETES_ITS_REPORTS.format(delete=delete))
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=3)
    said = "\n".join(result.outlines)
    assert (
        "journal.jsonl vanished during this session (deleted, or its folder with it) and was "
        "created again: the session entry first, then 1 record(s) this process had recorded "
        "before written again: scenarios/test_scn.py::test_before; what it held of earlier "
        "sessions is gone"
    ) in said
    path = pytester.path / "reports" / "journal.jsonl"
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["type"] for e in entries] == ["session", "record", "record", "record", "session_end"]
    assert len({e["session_id"] for e in entries}) == 1
    assert entries[-1]["counts"] == {"passed": 3}
    (session,) = Journal(path).sessions().values()  # read as any reader reads it, `sync` too
    assert sorted(r.test.split("::")[1] for r in session.records) == [
        "test_after", "test_before", "test_deletes"]  # fmt: skip
