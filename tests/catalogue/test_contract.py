"""`amp-harness new` and `amp-harness validate`: the template keeps the contract and can fail;
each breach of the contract is one line naming the file, the line, the test and the fix."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, assert_fails_naming, half_in_larger_buffers

from harness import cli
from harness.catalogue import claims, collected_claims, contract, template
from harness.lab import devices

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
    # A claim of its own, never an existing one: its verdicts would join that claim's row.
    assert (verdict["claim"], verdict["verdict"]) == ("PROJECT-DEMO", "confirmed")
    assert record["metrics"]["half/bytes_per_param"] == 2.0
    assert contract.check(pytester.path / "scenarios") == []


def test_new_with_a_claim_adds_it_to_the_project_catalogue(tmp_path, capsys):
    folder = scenarios(tmp_path)
    argv = ["new", "loss", "--scenarios", str(folder), "--claim", "TEAM-LOSS", 'a "quoted" $tmt']
    assert cli.main([*argv, "--source", "https://example.com/issue/1"]) == 0
    assert "claim TEAM-LOSS" in capsys.readouterr().out
    loaded = claims.load_toml_catalogue(folder / "claims.toml", "project")
    claim = loaded["TEAM-LOSS"]
    assert (claim.statement, claim.source) == ('a "quoted" $tmt', "https://example.com/issue/1")
    assert 'CLAIM = "TEAM-LOSS"' in (folder / "test_loss.py").read_text()
    assert contract.check(folder) == []
    assert cli.main(["new", "other", "--scenarios", str(folder)]) == 0  # appended after it
    assert list(claims.load_toml_catalogue(folder / "claims.toml", "p")) == [
        "TEAM-LOSS",
        "PROJECT-OTHER",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--claim", "FMT-BYTES", "s"], "--claim FMT-BYTES: already a claim of the article"),
        (["--claim", "BF16-NO-SCALER", "s"], "already a claim of the bf16 catalogue"),
        (["--claim", "team loss", "s"], 'id "team loss" is not of the form GROUP-NAME'),
        (["--claim", "TEAM-LOSS", " "], "give the claim a statement"),
    ],
)
def test_new_refuses_a_claim_it_cannot_add_and_writes_nothing(tmp_path, capsys, argv, message):
    folder = scenarios(tmp_path)
    assert cli.main(["new", "loss", "--scenarios", str(folder), *argv]) == 2
    assert message in capsys.readouterr().err
    assert list(folder.iterdir()) == []


def test_new_refuses_a_claim_id_ending_in_a_line_break_and_writes_nothing(tmp_path, capsys):
    """`re.match(...$)` took "TEAM-X\\n" for an ID: it went into claims.toml, then MLflow."""
    folder = scenarios(tmp_path)
    argv = ["new", "loss", "--scenarios", str(folder), "--claim", "TEAM-X\n", "s"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == (
        'amp-harness: error: --claim "TEAM-X\\n": id "TEAM-X\\n" is not of the form GROUP-NAME '
        "(capitals, digits, dashes): it holds white space (a line break, a tab or a space), which "
        'MLflow\'s tag names would keep; write it "TEAM-X"\n'
    )
    assert list(folder.iterdir()) == []


def test_the_template_fails_naming_its_claim_when_fp16_takes_four_bytes(pytester, monkeypatch):
    half_in_larger_buffers(monkeypatch)  # fp16 parameters whose storages hold 4 bytes a value
    assert_fails_naming(run_generated(pytester), "PROJECT-DEMO")


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is a dev extra")
def test_the_generated_file_is_lint_clean(tmp_path):
    folder = scenarios(tmp_path)
    path, _ = template.new_scenario("lint_me", folder, folder / "claims.toml")
    for command in (["check", "--no-cache"], ["format", "--check", "--no-cache"]):
        ran = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "--line-length", "100", str(path)],
            cwd=REPO, capture_output=True, text=True, timeout=120,  # REPO: harness is first-party
        )  # fmt: skip
        assert ran.returncode == 0, ran.stdout + ran.stderr


def test_new_expected_writes_the_teams_verdict_into_the_catalogue(tmp_path, capsys):
    folder = scenarios(tmp_path)
    statement = ["--claim", "TEAM-MINE", "It holds.", "--scenarios", str(folder)]
    assert cli.main(["new", "mine", *statement, "--expected", "partly"]) == 0
    (entry,) = claims.load_toml_catalogue(folder / "claims.toml", "project").values()
    assert (entry.id, entry.expected) == ("TEAM-MINE", "partly")
    # Negative control: a word that is not a verdict is refused, and nothing is written.
    with pytest.raises(SystemExit):
        cli.main(["new", "other", *statement[3:], "--claim", "TEAM-OTHER", "x", "--expected", "ok"])
    assert "invalid choice: 'ok'" in capsys.readouterr().err
    assert not (folder / "test_other.py").exists()
    with pytest.raises(claims.CatalogueError, match=r"--expected ok: not a verdict.*closest"):
        template.new_scenario("other", folder, folder / "claims.toml", expected="ok")
    assert not (folder / "test_other.py").exists()


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


def test_new_refuses_a_name_too_long_for_a_file_name_before_writing(tmp_path, capsys):
    """301 characters raised OSError "File name too long" with a traceback."""
    folder = scenarios(tmp_path)
    assert cli.main(["new", "a" * 301, "--scenarios", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("amp-harness: error: scenario name of 301 characters is too long: ")
    assert "NAME takes at most 247" in err and f"e.g. `amp-harness new {'a' * 40}`" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert list(folder.iterdir()) == []
    assert cli.main(["new", "a" * 247, "--scenarios", str(folder)]) == 0  # the longest that fits
    assert [len(p.name) for p in folder.glob("test_*.py")] == [255]


def test_new_without_a_scenario_folder_says_where_to_run(tmp_path, capsys):
    assert cli.main(["new", "demo", "--scenarios", str(tmp_path / "nowhere")]) == 2
    assert "no scenario folder" in capsys.readouterr().err


# --- validate: what passes ---------------------------------------------------------------------

PYTESTMARK_AND_CONSTANT = """
import pytest

CLAIM = "FMT-BYTES"
pytestmark = [pytest.mark.claim(CLAIM)]


def test_bytes(record):
    sizes = {"fp16": 2, "fp32": 4}
    record.verdict(CLAIM, "confirmed", f"fp16 {sizes['fp16']} bytes")
    # Negative control: fp32 takes 4.
    assert sizes["fp32"] == 4
"""

HELPERS = """
import pytest


def run(step, record):
    return step(record)


def decide(record):
    # negative control: the fp32 row, returned to the test
    sizes = {"fp16": 2, "fp32": 4}
    record.verdict("FMT-BYTES", "confirmed", f"fp16 {sizes['fp16']} bytes")
    return sizes


@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    sizes = run(decide, record)  # the helper is passed on, as run_ranks(rank_experiments) does
    assert sizes["fp32"] == 4
"""

COMPUTED_VERDICT = """
import pytest


@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    sizes = {"fp16": 2, "fp32": 4}
    for claim in record.claims:  # left to the plugin's run-time check
        record.verdict(claim, "confirmed", f"fp16 {sizes['fp16']} bytes")
    # Negative control: fp32 takes 4.
    assert sizes["fp32"] == 4
"""

PARAM_MARKS_IN_A_CLASS = """
import pytest


class TestBytes:
    @pytest.mark.parametrize("n", [pytest.param(2, marks=[pytest.mark.claim("FMT-BYTES")])])
    def test_bytes(self, record, n):
        record.verdict("FMT-BYTES", "confirmed", f"fp16 {n} bytes")
        # Negative control: fp32 takes twice as many.
        assert 2 * n == 4
"""


@pytest.mark.parametrize(
    "source", [GOOD, PYTESTMARK_AND_CONSTANT, HELPERS, COMPUTED_VERDICT, PARAM_MARKS_IN_A_CLASS]
)
def test_scenarios_that_keep_the_contract_pass(tmp_path, capsys, source):
    folder = scenarios(tmp_path, test_scn=source)
    # --baselines: this folder's (none), not the project's accepted changes
    assert cli.main(["validate", "--scenarios", str(folder), "--baselines", str(folder)]) == 0
    assert (
        capsys.readouterr().out == f"validate: the 1 scenario files in {folder} keep the contract\n"
    )


# Every shape of negative control the scenarios use, each with the edit that leaves it
# unasserted: (the test body, the text to replace, its replacement). The body follows a verdict.
SHAPES_MODULE = """
import contextlib

import pytest
import torch

BAND = (0.8, 1.25)


def run(recipe):
    return {"recipe": recipe, "bytes": 4 if recipe == "fp32" else 2}


def launch(target):
    return target()


def apply(step, recipe):
    return step(recipe)


def check(result):
    assert result["bytes"] == 4, f"FMT-BYTES: predicted 4 bytes, got {result}"


def control():
    \"\"\"Negative control: fp32, which a probe answering 2 for everything fails.\"\"\"
    return run("fp32")


def outputs():
    found = {"amp": run("amp")}
    # Negative control: fp32, kept beside the result and returned with it.
    found["fp32"] = run("fp32")
    return found


class Probe:
    def __init__(self, result):
        self.result = result

    def check(self):
        \"\"\"The prediction on the negative control.\"\"\"
        assert self.result["bytes"] == 4, f"FMT-BYTES: predicted 4 bytes, got {self.result}"


@pytest.mark.claim("FMT-BYTES")
def test_shape(record):
    amp = run("amp")
    record.verdict("FMT-BYTES", "confirmed", f"amp-fp16 {amp['bytes']} bytes")
"""

CONTROL_SHAPES = {
    "comment-above-an-assert": (
        '# Negative control: fp32 takes 4.\nassert run("fp32")["bytes"] == 4\n',
        'assert run("fp32")["bytes"] == 4',
        'plain = run("fp32")',
    ),
    "assignment-asserted-through-a-computed-name": (  # test_formats: plain_after -> plain_bad
        '# Negative control: fp32.\n_, plain = "fp32", run("fp32")\nplain_bytes = plain["bytes"]\n'
        "\nassert plain_bytes == 4\n",
        "assert plain_bytes == 4",
        "assert amp['bytes'] == 2",
    ),
    "inline-comment-on-an-assignment": (  # test_grad_scaler: clean = step(None)
        'clean = run("fp32")  # negative control: a clean step\n\nassert clean["bytes"] == 4\n',
        'assert clean["bytes"] == 4',
        'assert amp["bytes"] == 2',
    ),
    "inline-comment-on-a-def-passed-on": (  # test_grad_scaler: optimizer_step
        "def doubled(recipe):  # negative control: the scaled value, as it is\n"
        '    return run(recipe)["bytes"] * 2\n\nratio = apply(doubled, "fp32") / 4\n'
        "assert ratio == 2\n",
        "assert ratio == 2",
        'assert amp["bytes"] == 2',
    ),
    "setup-then-assert-in-one-paragraph": (  # test_speed, test_memory_speed: low, high = BAND
        'ratio = run("fp32")["bytes"] / run("fp32")["bytes"]\n'
        "# Negative control: the same arm twice is not told apart.\nlow, high = BAND\n"
        'assert ratio == 1.0, f"FMT-BYTES: {ratio} outside {low}-{high}"\n',
        'assert ratio == 1.0, f"FMT-BYTES: {ratio} outside {low}-{high}"',
        "",
    ),
    "loop-of-assertions": (  # test_formats' fp32 row, test_gradient_explosion
        'results = {r: run(r) for r in ("fp32", "amp")}\n'
        "# The fp32 row is the negative control: a probe answering 2 for all fails it.\n"
        "for recipe, result in results.items():\n"
        '    assert result["bytes"] == (4 if recipe == "fp32" else 2)\n',
        "for recipe, result in results.items():\n"
        '    assert result["bytes"] == (4 if recipe == "fp32" else 2)\n',
        'wrong = results["fp32"]\n',
    ),
    "pytest-raises": (
        "# Negative control: a recipe that does not exist is refused.\n"
        'with pytest.raises(KeyError):\n    {"fp32": 4}["fp8"]\n',
        'with pytest.raises(KeyError):\n    {"fp32": 4}["fp8"]\n',
        'plain = {"fp32": 4}.get("fp8")\n',
    ),
    "marked-helper-bound-and-asserted": (  # test_convergence: _control
        'plain = control()\nassert plain["bytes"] == 4\n',
        'assert plain["bytes"] == 4',
        'assert amp["bytes"] == 2',
    ),
    "marked-helper-asserted-directly": (
        'assert control()["bytes"] == 4\n',
        'assert control()["bytes"] == 4',
        "plain = control()",
    ),
    "marked-helper-passed-on": (  # test_distributed: run_ranks(_comm_dtype, ...)
        'runs = launch(control)\nassert runs["bytes"] == 4\n',
        'assert runs["bytes"] == 4',
        'assert amp["bytes"] == 2',
    ),
    "marked-in-a-helper-that-returns-it": (  # test_norm_layers: _layer_norm_outputs
        'errors = {k: v["bytes"] for k, v in outputs().items()}\n'
        'assert errors == {"amp": 2, "fp32": 4}\n',
        'assert errors == {"amp": 2, "fp32": 4}',
        'assert amp["bytes"] == 2',
    ),
    "passed-to-a-helper-that-asserts": (
        '# Negative control: fp32.\nplain = run("fp32")\n\ncheck(plain)\n',
        "check(plain)",
        "check(amp)",
    ),
    "a-method-that-asserts": (  # test_distributed: zero.check()
        'zero = Probe(run("fp32"))\n# Negative control (in check): fp32 takes 4.\nzero.check()\n',
        "zero.check()",
        "zero.result",
    ),
    "paragraph-inside-a-block": (  # test_grad_scaler: the tiny loss inside `with bind(...)`
        "with contextlib.nullcontext():\n"
        "    # Negative control: several statements, inside a block.\n"
        '    recipe, _ = "fp32", None\n    plain = run(recipe)\n    rescued = plain["bytes"]\n'
        "assert rescued == 4\n",
        "assert rescued == 4",
        'assert amp["bytes"] == 2',
    ),
    "an-assert-function": (
        '# Negative control: fp32.\nplain = run("fp32")\n\n'
        'torch.testing.assert_close(plain["bytes"], 4)\n',
        'torch.testing.assert_close(plain["bytes"], 4)',
        'torch.testing.assert_close(amp["bytes"], 2)',
    ),
}


@pytest.mark.parametrize(("body", "old", "new"), CONTROL_SHAPES.values(), ids=CONTROL_SHAPES)
def test_each_shape_of_control_passes_and_fails_once_it_is_not_asserted(tmp_path, body, old, new):
    asserted = SHAPES_MODULE + textwrap.indent(body, "    ")
    assert problems(scenarios(tmp_path, test_scn=asserted)) == []
    old, new = textwrap.indent(old, "    "), textwrap.indent(new, "    ")
    assert old in asserted
    folder = scenarios(tmp_path, test_scn=asserted.replace(old, new))
    (problem,) = problems(folder)
    assert problem.startswith(f"{folder / 'test_scn.py'}:48: test_shape: negative control "), (
        problem
    )


def test_validate_reads_the_files_without_importing_them(tmp_path, monkeypatch):
    monkeypatch.setattr(
        collected_claims, "collect", lambda paths: pytest.fail(f"collected {paths}")
    )
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
        (
            "    sizes = measure()\n",
            "    sizes = measure()\n"
            '    # Negative control: the fp32 row.\n    plain = sizes["fp32"]\n\n',
            ":11: test_bytes: negative control computed but never asserted: `plain` (line 14). "
            "Fix: assert the predicted behaviour of the control (an `assert` that uses one of "
            "these names",
        ),
        (
            "    sizes = measure()\n",
            '    sizes = {"fp16": 2}\n    control = measure()\n',
            ":11: test_bytes: negative control computed but never asserted: `measure()` (line 5). "
            "Fix: assert the control's predicted behaviour on what `measure(...)` returns",
        ),
        (
            '    assert sizes["fp16"] == 2, "FMT-BYTES: predicted 2 bytes"\n',
            '    assert sizes["fp16"] == 2, "FMT-BYTES: predicted 2 bytes"\n'
            "    # Negative control: fp32 takes 4.\n",
            ':11: test_bytes: negative control (line 15) marks no statement. Fix: "# Negative '
            'control: ..." goes directly above the statements that run the control',
        ),
        (
            "f\"fp16 {sizes['fp16']} bytes\"",
            '"fp16 2 bytes"',
            ":13: test_bytes: the evidence for FMT-BYTES is fixed text: it reads the same whatever "
            "was measured. Fix: format it from the values measured",
        ),
        (
            "f\"fp16 {sizes['fp16']} bytes\"",
            'f"fp16 2 bytes " + "fp32 4"',
            ":13: test_bytes: the evidence for FMT-BYTES is fixed text",
        ),
    ],
    ids=[
        "no-marker",
        "unknown-id",
        "no-verdict",
        "no-control",
        "control-never-asserted",
        "control-helper-never-asserted",
        "control-marks-nothing",
        "constant-evidence",
        "f-string-without-a-value",
    ],
)
def test_each_breach_is_one_line_with_file_line_test_and_fix(tmp_path, capsys, old, new, expected):
    assert old in GOOD
    folder = scenarios(tmp_path, test_scn=GOOD.replace(old, new))
    assert cli.main(["validate", "--scenarios", str(folder), "--baselines", str(folder)]) == 1
    out, err = capsys.readouterr()
    (line,) = out.splitlines()
    assert line.startswith(f"{folder / 'test_scn.py'}{expected}"), line
    assert err == "validate: 1 problem(s) in 1 scenario files\n"


EVIDENCE_SHAPES = """
import pytest

EVIDENCE = "fp16 2 bytes"


def describe(sizes):
    return f"fp16 {sizes['fp16']} bytes"


@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    sizes = measure()
    evidence = describe(sizes)
    record.verdict("FMT-BYTES", "confirmed", {evidence})
    assert sizes["fp16"] == 2, "FMT-BYTES: predicted 2 bytes"
"""


@pytest.mark.parametrize(
    "evidence",
    [
        "evidence",
        "describe(sizes)",
        '"sizes: " + describe(sizes)',
        '"; ".join(f"{k} {v}" for k, v in sizes.items())',
        '"fp16 2 bytes" if sizes else evidence',
    ],
)
def test_evidence_the_check_cannot_read_is_left_to_the_run(tmp_path, evidence):
    source = GOOD.split("@pytest")[0] + EVIDENCE_SHAPES.replace("{evidence}", evidence)
    assert problems(scenarios(tmp_path, test_scn=source)) == []


def test_evidence_kept_in_a_module_constant_is_fixed_text(tmp_path):
    source = GOOD.split("@pytest")[0] + EVIDENCE_SHAPES.replace("{evidence}", "EVIDENCE")
    folder = scenarios(tmp_path, test_scn=source)
    (problem,) = problems(folder)
    assert problem.startswith(
        f"{folder / 'test_scn.py'}:24: test_bytes: the evidence for FMT-BYTES is fixed text"
    ), problem


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
    sizes = dict(fp16=2, fp32=4)
    record.verdict("FMT-BYTES", "confirmed", f"fp16 {{sizes['fp16']}} bytes")
    # Negative control: fp32 takes 4.
    assert sizes["fp32"] == 4
"""


@pytest.mark.slow
def test_claims_kept_in_a_variable_are_read_by_collecting_the_module(tmp_path):
    good = MARK_IN_A_VARIABLE.format(ids='"FMT-BYTES"')
    assert problems(scenarios(tmp_path, test_scn=good)) == []
    folder = scenarios(tmp_path, test_scn=MARK_IN_A_VARIABLE.format(ids='"FMT-BYTES", "FMT-BYTE"'))
    (problem,) = problems(folder)  # the same path again: the module is read afresh
    assert problem.startswith(
        f"{folder / 'test_scn.py'}:8: test_bytes: unknown claim ID 'FMT-BYTE'. Fix: use a "
        "catalogue ID (closest: FMT-BYTES"
    )


@pytest.mark.slow
def test_a_module_that_cannot_be_collected_says_why(tmp_path):
    source = "import no_such_module_here\n" + MARK_IN_A_VARIABLE.format(ids='"FMT-BYTES"')
    (problem,) = problems(scenarios(tmp_path, test_scn=source))
    assert "test_bytes: its claims are set at run time and collecting the module failed: " in (
        problem
    )
    assert "no_such_module_here" in problem and "Fix: run `pytest --collect-only" in problem


# --- a control that cannot fail is no control --------------------------------------------------

CANNOT_FAIL = [
    # (file, the control's assertion as written, the one that cannot fail)
    ("test_formats.py", "assert b16 == (8, 7) and b16 != f16,", "assert len(b16) >= 0,"),
    (
        "test_formats.py",
        "assert torch.allclose(scaled, torch.full_like(scaled, 2e-8), rtol=1e-2), (",
        "assert scaled == scaled, (",
    ),
]


def test_a_control_asserted_only_by_what_cannot_fail_is_reported(tmp_path):
    """The issue's case: two negative-control asserts of a real scenario replaced by ones that
    cannot fail (`len(x) >= 0`, `x == x`). Each is reported, and the control it stood for counts
    as never asserted. The real file is the control of this test: no problem."""
    source = (REPO / "scenarios" / "test_formats.py").read_text()
    assert problems(scenarios(tmp_path, test_formats=source)) == []
    for _, real, hollow in CANNOT_FAIL:
        assert source.count(real) == 1, real
        source = source.replace(real, hollow)
    found = problems(scenarios(tmp_path, test_formats=source))
    assert any("cannot fail (len(...) is never negative): `len(b16) >= 0`" in p for p in found)
    assert any("cannot fail (a value compared with itself): `scaled == scaled`" in p for p in found)
    unasserted = [p for p in found if "negative control computed but never asserted" in p]
    for test in ("test_exponent_and_mantissa_bits_are_measured", "test_underflow_edge_and_a"):
        assert any(test in p for p in unasserted), (test, found)


@pytest.mark.parametrize(
    ("test", "why"),
    [
        ("True", "a constant"),
        ("x == x", "a value compared with itself"),
        ("f(a)[0] >= f(a)[0]", "a value compared with itself"),
        ("len(x) >= 0", "len(...) is never negative"),
        ("0 <= len(x)", "len(...) is never negative"),
        ("abs(x) > -1", "abs(...) is never negative"),
        ("x > 1 or len(x) >= 0", "len(...) is never negative"),
        ("x == y", None),
        ("len(x) > 0", None),
        ("len(x) >= 1", None),
        ("x > 1 or y", None),
        ("x == x and y", None),
    ],
)
def test_what_cannot_fail(test, why):
    from harness.catalogue.controls import cannot_fail

    assert cannot_fail(ast.parse(test, mode="eval").body) == why


REQUIRES = (
    GOOD.replace(
        '@pytest.mark.claim("FMT-BYTES")',
        '@pytest.mark.claim("FMT-BYTES")\n'
        '@pytest.mark.requires("grad_scaler", "team_kernel", "inductr")',
    )
    + '\nPARAMS = [pytest.param(1, marks=pytest.mark.requires("bf16_autocats"))]\n'
)
TEAM_CAPABILITY = """
from harness.lab.devices import Capability, Expected, Probe

CAPABILITIES = [Capability("team_kernel", "a kernel", lambda d: Probe(True, "ran"),
                           {"cpu": Expected(source="any CPU")})]
"""


def test_a_requirement_naming_no_capability_is_a_problem_with_the_closest_names(tmp_path):
    """Built-in names and the team's (capabilities.py beside the scenarios) pass; a misspelt
    one, in a decorator or a pytest.param, is named with its line, the closest names and where
    a team declares its own, before any run fails on it."""
    folder = scenarios(tmp_path, test_scn=REQUIRES, capabilities=TEAM_CAPABILITY)

    def problems(folder: Path) -> list[str]:  # as `amp-harness validate` checks them
        team = contract.declared_capabilities(folder / devices.TEAM_CAPABILITIES)
        known = {*devices.CAPABILITY_TEXT, *team}
        return [str(p) for p in contract.check(folder, capabilities=known)]

    found = problems(folder)
    assert len(found) == 2, found
    assert f"{folder / 'test_scn.py'}:11: requires unknown capability 'inductr'" in found[0]
    assert "requires unknown capability 'bf16_autocats'" in found[1]
    assert "(closest: bf16_autocast" in found[1] and "declare it in" in found[1]
    (folder / "capabilities.py").unlink()
    assert "'team_kernel'" in " ".join(problems(folder))
