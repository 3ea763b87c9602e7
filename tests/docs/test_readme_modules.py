"""The README's table of scenario modules is the map a new user reads first: every built-in
module of scenarios/ has its row, and the row names every claim its tests declare (read from the
files, as `amp-harness list` reads them). A module added without its row fails here.

Built-in: a module whose claims are all in the harness's own catalogues (harness/catalogue/). A
team's module declares a claim of its own catalogue (scenarios/claims.toml): the team documents
it where it chooses (docs/writing-a-scenario.md), and a fork's CI stays green without a row."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from harness import cli
from harness.catalogue import claims
from harness.catalogue.scenario_source import claimed_tests

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `(test_\w+\.py)` \| (.*) \|$", re.MULTILINE)


def readme_rows() -> dict[str, str]:
    return dict(ROW.findall((REPO / "README.md").read_text(encoding="utf-8")))


def declared_claims(folder: Path) -> dict[str, set[str]]:
    claimed = claimed_tests(folder)
    assert claimed is not None, f"{folder}: a module's markers cannot be read without importing it"
    modules: dict[str, set[str]] = {}
    for claim, tests in claimed.items():
        for test in tests:
            modules.setdefault(Path(test.split("::")[0]).name, set()).add(claim)
    return modules


def readme_problems(folder: Path) -> list[str]:
    """What README.md's table lacks or holds too much of, for the scenario modules of `folder`:
    a built-in module without its row, a claim its row does not name, a row of no module."""
    rows, declared = readme_rows(), declared_claims(folder)
    builtin = {m: ids for m, ids in declared.items() if ids <= set(claims.builtin())}
    problems = []
    if missing := sorted(set(builtin) - set(rows)):
        problems.append(f"README.md's table of scenario modules lacks a row for {missing}")
    with_rows = {m: ids for m, ids in builtin.items() if m in rows}
    unnamed = {m: sorted(c for c in ids if c not in rows[m]) for m, ids in with_rows.items()}
    if unnamed := {m: ids for m, ids in unnamed.items() if ids}:
        problems.append(f"README.md's rows do not name these claims: {unnamed}")
    if gone := sorted(set(rows) - set(declared)):  # a team's own row for its module stays
        problems.append(f"README.md has rows for modules scenarios/ no longer has: {gone}")
    return problems


def test_every_scenario_module_has_a_readme_row_naming_its_claims(monkeypatch):
    monkeypatch.chdir(REPO)
    assert readme_problems(REPO / "scenarios") == []


def test_a_teams_scenario_needs_no_row_and_a_builtin_module_still_does(tmp_path, monkeypatch):
    """Issue 50, item 10: a scenario of a team's own claim, added as docs/writing-a-scenario.md
    shows (`amp-harness new`), failed the test above in every fork's CI."""
    scenarios = tmp_path / "scenarios"
    shutil.copytree(REPO / "scenarios", scenarios)
    monkeypatch.chdir(tmp_path)
    added = ["new", "team_claim", "--claim", "TEAM-OWN", "Our model trains in bf16."]
    assert cli.main([*added, "--scenarios", str(scenarios)]) == 0
    assert declared_claims(scenarios)["test_team_claim.py"] == {"TEAM-OWN"}
    assert readme_problems(scenarios) == []
    # Negative control: a module of a built-in claim, without its row, is named.
    (scenarios / "test_new_builtin.py").write_text(
        'import pytest\n\n\n@pytest.mark.claim("FMT-BYTES")\ndef test_it(record):\n    pass\n',
        encoding="utf-8",
    )
    assert readme_problems(scenarios) == [
        "README.md's table of scenario modules lacks a row for ['test_new_builtin.py']"
    ]


def test_the_rows_of_slow_modules_say_so():
    """`amp-harness run` leaves out a module marked slow: its row says so, and no other row."""
    rows = readme_rows()
    slow = {
        m for m in rows if "pytestmark = pytest.mark.slow" in (REPO / "scenarios" / m).read_text()
    }
    said = {m for m, cell in rows.items() if cell.startswith("*slow (`--all`)*")}
    assert said == slow, f"README.md's rows marked slow: {sorted(said)}; modules: {sorted(slow)}"
