"""The claim catalogue: complete, validated, and clear about what is wrong with a bad file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness import claims
from harness.claims import CatalogueError, load_catalogue

SHARED_CLAIMS = Path(__file__).resolve().parents[2] / "shared" / "CLAIMS.md"


def test_the_catalogue_has_the_29_claims_with_text_in_both_languages():
    catalogue = claims.catalogue()
    assert len(catalogue) == 29
    for claim in catalogue.values():
        assert re.search(r"[\u4e00-\u9fff]", claim.article), f"{claim.id}: no Chinese sentence"
        assert claim.statement.isascii(), f"{claim.id}: the statement should be English"


@pytest.mark.skipif(not SHARED_CLAIMS.exists(), reason=f"{SHARED_CLAIMS} is not beside the repo")
def test_the_ids_are_those_of_claims_md():
    ids = set(re.findall(r"^\| ([A-Z0-9]+(?:-[A-Z0-9]+)+) \|", SHARED_CLAIMS.read_text(), re.M))
    assert ids == set(claims.catalogue())


def write(tmp_path: Path, doc) -> Path:
    path = tmp_path / "claims.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return path


ENTRY = {"id": "FMT-BITS", "section": "s", "article": "a", "statement": "t", "where": "cpu"}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ('{"claims": [', r"claims\.json: cannot read the claim catalogue"),
        ({"claims": []}, r'non-empty "claims" list'),
        ({"claims": [{**ENTRY, "statement": ""}]}, r'claims\[0\]: field "statement" is missing'),
        ({"claims": [{**ENTRY, "id": "fmt bits"}]}, r'claims\[0\]: id "fmt bits" is not of the'),
        ({"claims": [ENTRY, ENTRY]}, r'claims\[1\]: id "FMT-BITS" appears twice'),
        ({"claims": [{**ENTRY, "colour": "red"}]}, r"claims\[0\]: unknown field\(s\) \['colour'\]"),
    ],
)
def test_a_malformed_catalogue_names_the_file_the_entry_and_the_field(tmp_path, doc, message):
    path = write(tmp_path, doc)
    with pytest.raises(CatalogueError, match=message) as error:
        load_catalogue(path)
    assert str(path) in str(error.value)


def test_a_malformed_catalogue_stops_a_session_before_any_test(pytester, monkeypatch):
    path = write(pytester.path, {"claims": [{**ENTRY, "where": None}]})
    monkeypatch.setattr(claims, "CATALOGUE_PATH", path)
    claims.catalogue.cache_clear()
    try:
        result = pytester.runpytest_inprocess("--no-mlflow", "--amp-device=cpu")
    finally:
        claims.catalogue.cache_clear()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f'*{path}: claims[[]0]: field "where" is missing or empty*'])


def test_unknown_ids_come_with_the_closest_valid_ones():
    ((bad, near),) = claims.unknown_ids(["FMT-BITS", "SCL-NAN-INCREASE"])
    assert bad == "SCL-NAN-INCREASE" and near.startswith("SCL-NAN-INCREASES, ")
