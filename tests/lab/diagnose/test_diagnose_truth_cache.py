"""scripts/diagnose-truth's --cache: a model's result is reused only when the code that made it
and its truth (fp32's reruns, --seeds, or the paired truth's seeds, --paired) are this run's; a
result of other diagnose code, of another truth or another spread is computed again, never mixed
into a table."""

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


def _kept(script, folder, code: str, seeds: int, paired: int = 0) -> None:
    result = {"name": "healthy", "code": code, "seeds": seeds, "paired": paired, "rows": [],
              "fixes": []}  # fmt: skip
    (folder / f"healthy-150{script._suffix(False, paired)}.json").write_text(json.dumps(result))


@pytest.mark.parametrize("paired", [0, 8])
def test_a_result_of_this_code_and_truth_is_reused(script, tmp_path, paired):
    _kept(script, tmp_path, script._code_digest(), seeds=4, paired=paired)
    kept = script._cached(tmp_path, "healthy", 150, False, 4, paired, script._code_digest())
    assert kept["name"] == "healthy" and kept["paired"] == paired


@pytest.mark.parametrize(
    ("code", "seeds", "paired"),
    [("0123456789abcdef", 4, 0), (None, 2, 0), (None, 4, 8)],
    ids=["other-code", "other-spread", "paired-for-unpaired"],
)
def test_a_result_of_other_code_or_another_truth_is_computed_again(
    script, tmp_path, code, seeds, paired
):
    _kept(script, tmp_path, code or script._code_digest(), seeds, paired)
    assert script._cached(tmp_path, "healthy", 150, False, 4, 0, script._code_digest()) is None


def test_an_unpaired_result_is_not_taken_for_a_paired_one(script, tmp_path):
    _kept(script, tmp_path, script._code_digest(), seeds=4)
    assert script._cached(tmp_path, "healthy", 150, False, 4, 8, script._code_digest()) is None


def test_the_digest_covers_diagnose_the_zoo_and_its_truth(script):
    made_by = {path.relative_to(REPO).as_posix() for path in script.MADE_BY}
    assert {"harness/lab/diagnose/rules.py", "harness/lab/train.py"} <= made_by
    assert {"tests/helpers/zoo.py", "tests/helpers/zoo_truth.py"} <= made_by
