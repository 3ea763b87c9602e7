"""scripts/diagnose-truth's --cache: a model's result is reused only when the code that made it
and fp32's reruns (--seeds) are this run's; a result of other diagnose code, of another truth or
another spread is computed again, never mixed into a table."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json

import pytest
from conftest import REPO


@pytest.fixture(scope="module")
def script():
    loader = importlib.machinery.SourceFileLoader(
        "diagnose_truth", str(REPO / "scripts" / "diagnose-truth")
    )
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def _kept(folder, code: str, seeds: int) -> None:
    result = {"name": "healthy", "code": code, "seeds": seeds, "rows": [], "fixes": []}
    (folder / "healthy-150.json").write_text(json.dumps(result))


def test_a_result_of_this_code_and_spread_is_reused(script, tmp_path):
    _kept(tmp_path, script._code_digest(), seeds=4)
    kept = script._cached(tmp_path, "healthy", 150, False, 4, script._code_digest())
    assert kept["name"] == "healthy"


@pytest.mark.parametrize(("code", "seeds"), [("0123456789abcdef", 4), (None, 2)])
def test_a_result_of_other_code_or_another_spread_is_computed_again(script, tmp_path, code, seeds):
    _kept(tmp_path, code or script._code_digest(), seeds)
    assert script._cached(tmp_path, "healthy", 150, False, 4, script._code_digest()) is None


def test_the_digest_covers_diagnose_the_zoo_and_its_truth(script):
    made_by = {path.relative_to(REPO).as_posix() for path in script.MADE_BY}
    assert {"harness/lab/diagnose/rules.py", "harness/lab/train.py"} <= made_by
    assert {"tests/zoo.py", "tests/zoo_truth.py"} <= made_by
