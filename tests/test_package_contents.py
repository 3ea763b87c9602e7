"""Every package of `harness/`, and the tests' `helpers`, says what it holds: its `__init__`'s
docstring names each of its modules and subpackages, as `tests/docs/test_readme_modules.py` holds
the README to the scenarios. A module added without a line there fails here, naming the package
and the module. (A test module beside the helpers, test_*.py, is no helper: it is not named.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "harness"
HELPERS = Path(__file__).resolve().parent / "helpers"
PACKAGES = [*sorted(p.parent for p in HARNESS.rglob("__init__.py")), HELPERS]


def contents(package: Path) -> list[str]:
    """The modules and subpackages of `package`, by name."""
    modules = [
        p.stem
        for p in package.glob("*.py")
        if p.stem not in ("__init__", "__main__") and not p.stem.startswith("test_")
    ]
    return sorted(modules + [p.name for p in package.iterdir() if (p / "__init__.py").is_file()])


def unnamed(package: Path) -> list[str]:
    """What of `package` its docstring does not name, in backticks (`tracking`, `diagnose/`)."""
    text = ast.get_docstring(ast.parse((package / "__init__.py").read_text("utf-8"))) or ""
    named = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)/?`", text))
    return [name for name in contents(package) if name not in named]


@pytest.mark.parametrize(
    "package", PACKAGES, ids=lambda p: p.relative_to(HARNESS.parent).as_posix()
)
def test_every_package_names_each_of_its_modules(package):
    assert unnamed(package) == [], f"{package / '__init__.py'}'s docstring does not name them"


def test_a_module_the_docstring_does_not_name_fails(tmp_path):
    (tmp_path / "__init__.py").write_text('"""Holds `known`."""\n')
    (tmp_path / "known.py").write_text("")
    assert unnamed(tmp_path) == []
    (tmp_path / "added.py").write_text("")
    assert unnamed(tmp_path) == ["added"]


def test_no_test_module_shares_its_name_with_another_or_with_a_scenario():
    """Test folders have no __init__.py (pytest's prepend import mode), and the sensitivity
    tests import scenario modules into the same process: two modules of one name collide."""
    root = HARNESS.parent
    names = [p.name for p in (root / "tests").rglob("test_*.py")]
    names += [p.name for p in (root / "scenarios").glob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
