"""`amp-harness new` and `amp-harness validate`: the template keeps the contract and can fail;
each breach of the contract is one line naming the file, the line, the test and the fix."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, assert_fails_naming

from harness import cli, contract, devices

GOOD = '''
import pytest


def measure():
    """Negative control: the fp32 row, which a probe answering 2 for everything fails."""
    return {"fp16": 2, "fp32": 4}


@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    sizes = measure()
    record.verdict("FMT-BYTES", "confirmed", f"fp16 {sizes['fp16']} bytes")
    assert sizes["fp16"] == 2, "FMT-BYTES: predicted 2 bytes"
'''


def scenarios(tmp_path: Path, **modules: str) -> Path:
    folder = tmp_path / "scenarios"
    folder.mkdir(exist_ok=True)
    for name, source in modules.items():
        (folder / f"{name}.py").write_text(source)
    return folder


def problems(folder: Path) -> list[str]:
    return [str(p) for p in contract.check(folder)]


# --- new ---------------------------------------------------------------------------------------


def run_generated(pytester: pytest.Pytester) -> pytest.RunResult:
    assert cli.main(["new", "demo", "--scenarios", str(pytester.mkdir("scenarios"))]) == 0
    devices.probe("cpu")  # before a test patches torch, as conftest's run_scenario does
    return pytester.runpytest_inprocess(
        "scenarios/test_demo.py", "--no-mlflow", "--amp-device=cpu", "-p", "no:cacheprovider",
        f"--amp-reports={pytester.path / 'reports'}",
    )  # fmt: skip


def test_new_writes_a_scenario_that_passes_and_keeps_the_contract(pytester, capsys):
    result = run_generated(pytester)
    assert "wrote " in capsys.readouterr().out
    result.assert_outcomes(passed=1)
    lines = (pytester.path / "reports" / "journal.jsonl").read_text().splitlines()
    (record,) = [e["record"] for e in map(json.loads, lines) if e["type"] == "record"]
    (verdict,) = record["verdicts"]
    assert (verdict["claim"], verdict["verdict"]) == ("FMT-BYTES", "confirmed")
    assert record["metrics"]["half/bytes_per_param"] == 2.0
    assert contract.check(pytester.path / "scenarios") == []


def test_the_template_fails_naming_its_claim_when_fp16_takes_four_bytes(pytester, monkeypatch):
    element_size = torch.Tensor.element_size
    monkeypatch.setattr(
        torch.Tensor,
        "element_size",
        lambda self: 4 if self.dtype == torch.float16 else element_size(self),
    )
    assert_fails_naming(run_generated(pytester), "FMT-BYTES")


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is a dev extra")
def test_the_generated_file_is_lint_clean(tmp_path):
    path = contract.new_scenario("lint_me", scenarios(tmp_path))
    for command in (["check", "--no-cache"], ["format", "--check", "--no-cache"]):
        ran = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "--line-length", "100", str(path)],
            cwd=REPO, capture_output=True, text=True, timeout=120,  # REPO: harness is first-party
        )  # fmt: skip
        assert ran.returncode == 0, ran.stdout + ran.stderr


def test_new_never_overwrites(tmp_path, capsys):
    folder = scenarios(tmp_path, test_demo="# mine\n")
    assert cli.main(["new", "demo", "--scenarios", str(folder)]) == 2
    assert "test_demo.py exists: pick another NAME" in capsys.readouterr().err
    assert (folder / "test_demo.py").read_text() == "# mine\n"


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("my-claim", "my_claim"),
        ("test_bytes", "bytes"),
        ("Big Claim!", "big_claim"),
        ("", "my_claim"),
    ],
)
def test_new_refuses_a_name_that_is_no_module_name_and_suggests_one(
    tmp_path, capsys, name, suggestion
):
    folder = scenarios(tmp_path)
    assert cli.main(["new", name, "--scenarios", str(folder)]) == 2
    assert f"e.g. `amp-harness new {suggestion}`" in capsys.readouterr().err
    assert list(folder.iterdir()) == []


def test_new_without_a_scenario_folder_says_where_to_run(tmp_path, capsys):
    assert cli.main(["new", "demo", "--scenarios", str(tmp_path / "nowhere")]) == 2
    assert "no scenario folder" in capsys.readouterr().err


# --- validate: what passes ---------------------------------------------------------------------

PYTESTMARK_AND_CONSTANT = """
import pytest

CLAIM = "FMT-BYTES"
pytestmark = [pytest.mark.claim(CLAIM)]


def test_bytes(record):
    record.verdict(CLAIM, "confirmed", "fp16 2 bytes")
    # Negative control: fp32 takes 4.
"""

HELPERS = """
import pytest


def run(step, record):
    step(record)


def decide(record):
    # negative control: the fp32 row
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes")


@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    run(decide, record)  # the helper is passed on, as run_ranks(rank_experiments) does
"""

COMPUTED_VERDICT = """
import pytest


@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    for claim in record.claims:  # left to the plugin's run-time check
        record.verdict(claim, "confirmed", "fp16 2 bytes")
    # Negative control: fp32 takes 4.
"""

PARAM_MARKS_IN_A_CLASS = """
import pytest


class TestBytes:
    @pytest.mark.parametrize("n", [pytest.param(2, marks=[pytest.mark.claim("FMT-BYTES")])])
    def test_bytes(self, record, n):
        record.verdict("FMT-BYTES", "confirmed", f"fp16 {n} bytes")
        # Negative control: fp32 takes 4.
"""


@pytest.mark.parametrize(
    "source", [GOOD, PYTESTMARK_AND_CONSTANT, HELPERS, COMPUTED_VERDICT, PARAM_MARKS_IN_A_CLASS]
)
def test_scenarios_that_keep_the_contract_pass(tmp_path, capsys, source):
    folder = scenarios(tmp_path, test_scn=source)
    assert cli.main(["validate", "--scenarios", str(folder)]) == 0
    assert (
        capsys.readouterr().out == f"validate: the 1 scenario files in {folder} keep the contract\n"
    )


def test_validate_reads_the_files_without_importing_them(tmp_path, monkeypatch):
    monkeypatch.setattr(contract, "_collect", lambda paths: pytest.fail(f"collected {paths}"))
    folder = scenarios(tmp_path, test_scn=GOOD + "\nraise SystemExit('imported')\n")
    assert problems(folder) == []


# --- validate: one line per problem, with the fix ----------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            '@pytest.mark.claim("FMT-BYTES")\n',
            "",
            ':10: test_bytes: no claim marker. Fix: @pytest.mark.claim("ID") above the test',
        ),
        (
            '@pytest.mark.claim("FMT-BYTES")',
            '@pytest.mark.claim("FMT-BYTES", "SCL-NAN-INCREASE")',
            ":10: test_bytes: unknown claim ID 'SCL-NAN-INCREASE'. Fix: use a catalogue ID "
            "(closest: SCL-NAN-INCREASES",
        ),
        (
            'record.verdict("FMT-BYTES", "confirmed", f"fp16 {sizes[\'fp16\']} bytes")',
            "pass",
            ":11: test_bytes: declares FMT-BYTES but records no verdict for it. Fix: call "
            'record.verdict("FMT-BYTES", verdict, evidence) in the test or a helper it calls',
        ),
        (
            '"""Negative control: the fp32 row, which a probe answering 2 for everything fails."""',
            '"""The fp32 row, which a probe answering 2 for everything fails."""',
            ":11: test_bytes: no negative control. Fix: add the run that reproduces the pitfall",
        ),
    ],
    ids=["no-marker", "unknown-id", "no-verdict", "no-control"],
)
def test_each_breach_is_one_line_with_file_line_test_and_fix(tmp_path, capsys, old, new, expected):
    assert old in GOOD
    folder = scenarios(tmp_path, test_scn=GOOD.replace(old, new))
    assert cli.main(["validate", "--scenarios", str(folder)]) == 1
    out, err = capsys.readouterr()
    (line,) = out.splitlines()
    assert line.startswith(f"{folder / 'test_scn.py'}{expected}"), line
    assert err == "validate: 1 problem(s) in 1 scenario files\n"


def test_a_fixture_is_not_a_helper_of_the_test(tmp_path):
    """A module-scoped fixture serves several tests: its negative control is none of theirs,
    even when a test's parameter has the fixture's name."""
    source = GOOD.replace(
        "def measure():", "@pytest.fixture\ndef sizes():\n    return measure()\n\n\ndef measure():"
    ).replace("def test_bytes(record):\n    sizes = measure()", "def test_bytes(record, sizes):")
    (problem,) = problems(scenarios(tmp_path, test_scn=source))
    assert problem.endswith("test_bytes: no negative control. Fix: " + problem.split("Fix: ")[1])


def test_a_file_python_cannot_parse_is_one_problem(tmp_path):
    folder = scenarios(tmp_path, test_scn=GOOD + "\ndef broken(:\n")
    (problem,) = problems(folder)
    assert problem.startswith(f"{folder / 'test_scn.py'}:16: cannot be read: invalid syntax. Fix: ")


def test_validate_without_a_scenario_folder_says_where_to_run(tmp_path, capsys):
    assert cli.main(["validate", "--scenarios", str(tmp_path / "nowhere")]) == 2
    assert "no scenario folder" in capsys.readouterr().err


# --- validate: claims that only pytest can read ------------------------------------------------

MARK_IN_A_VARIABLE = """
import pytest

BYTES = pytest.mark.claim({ids})


@BYTES
def test_bytes(record):
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes")
    # Negative control: fp32 takes 4.
"""


def test_claims_kept_in_a_variable_are_read_by_collecting_the_module(tmp_path):
    good = MARK_IN_A_VARIABLE.format(ids='"FMT-BYTES"')
    assert problems(scenarios(tmp_path, test_scn=good)) == []
    folder = scenarios(tmp_path, test_scn=MARK_IN_A_VARIABLE.format(ids='"FMT-BYTES", "FMT-BYTE"'))
    (problem,) = problems(folder)  # the same path again: the module is read afresh
    assert problem.startswith(
        f"{folder / 'test_scn.py'}:8: test_bytes: unknown claim ID 'FMT-BYTE'. Fix: use a "
        "catalogue ID (closest: FMT-BYTES"
    )


def test_a_module_that_cannot_be_collected_says_why(tmp_path):
    source = "import no_such_module_here\n" + MARK_IN_A_VARIABLE.format(ids='"FMT-BYTES"')
    (problem,) = problems(scenarios(tmp_path, test_scn=source))
    assert "test_bytes: its claims are set at run time and collecting the module failed: " in (
        problem
    )
    assert "no_such_module_here" in problem and "Fix: run `pytest --collect-only" in problem
