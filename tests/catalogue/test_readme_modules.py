"""The README's table of scenario modules is the map a new user reads first: every module of
scenarios/ has its row, and the row names every claim its tests declare (read from the files,
as `amp-harness list` reads them). A module added without its row fails here."""

from __future__ import annotations

import re
from pathlib import Path

from harness.catalogue.contract import claimed_tests

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


def test_every_scenario_module_has_a_readme_row_naming_its_claims(monkeypatch):
    monkeypatch.chdir(REPO)
    rows, declared = readme_rows(), declared_claims(REPO / "scenarios")
    missing = sorted(set(declared) - set(rows))
    assert not missing, f"README.md's table of scenario modules lacks a row for {missing}"
    unnamed = {m: sorted(c for c in claims if c not in rows[m]) for m, claims in declared.items()}
    unnamed = {m: claims for m, claims in unnamed.items() if claims}
    assert not unnamed, f"README.md's rows do not name these claims: {unnamed}"
    gone = sorted(set(rows) - set(declared))
    assert not gone, f"README.md has rows for modules scenarios/ no longer has: {gone}"


def test_a_module_without_its_row_is_named(tmp_path, monkeypatch):
    # The control: a new module beside a copy of the README's modules is missing from the rows.
    (tmp_path / "test_new_claim.py").write_text(
        'import pytest\n\n\n@pytest.mark.claim("TEAM-NEW")\ndef test_it(record):\n    pass\n',
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    assert "test_new_claim.py" in declared_claims(tmp_path)
    assert "test_new_claim.py" not in readme_rows()


def test_the_rows_of_slow_modules_say_so():
    """`amp-harness run` leaves out a module marked slow: its row says so, and no other row."""
    rows = readme_rows()
    slow = {
        m for m in rows if "pytestmark = pytest.mark.slow" in (REPO / "scenarios" / m).read_text()
    }
    said = {m for m, cell in rows.items() if cell.startswith("*slow (`--all`)*")}
    assert said == slow, f"README.md's rows marked slow: {sorted(said)}; modules: {sorted(slow)}"
