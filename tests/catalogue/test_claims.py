"""The claim catalogues (the article's, the built-in bf16 one, a project's own): complete,
validated, merged, and clear about what is wrong with a bad file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.catalogue import claims
from harness.catalogue.claims import CatalogueError, load_catalogue

SHARED_CLAIMS = Path(__file__).resolve().parents[3] / "shared" / "CLAIMS.md"


def test_the_article_catalogue_has_the_29_claims_with_text_in_both_languages():
    article = load_catalogue(claims.CATALOGUE_PATH)
    assert len(article) == 29
    for claim in article.values():
        assert re.search(r"[\u4e00-\u9fff]", claim.article), f"{claim.id}: no Chinese sentence"
        assert claim.statement.isascii(), f"{claim.id}: the statement should be English"
        assert claim.catalogue == "article" and claim.source == f"article ({claim.section})"


def test_the_bf16_catalogue_is_built_in_after_the_articles():
    builtin = claims.builtin()
    article = load_catalogue(claims.CATALOGUE_PATH)
    assert list(builtin)[: len(article)] == list(article)  # the article's order, first
    bf16 = [c for c in builtin.values() if c.catalogue == "bf16"]
    assert [c.id for c in bf16] == ["BF16-NO-SCALER", "BF16-MASTER-WEIGHTS", "BF16-RANGE-PRECISION"]
    assert all(c.source and c.statement.isascii() and c.expected in claims.VERDICTS for c in bf16)
    assert set(builtin) <= set(claims.catalogue())  # whatever the project adds


@pytest.mark.skipif(not SHARED_CLAIMS.exists(), reason=f"{SHARED_CLAIMS} is not beside the repo")
def test_the_ids_are_those_of_claims_md():
    ids = set(re.findall(r"^\| ([A-Z0-9]+(?:-[A-Z0-9]+)+) \|", SHARED_CLAIMS.read_text(), re.M))
    assert ids == set(load_catalogue(claims.CATALOGUE_PATH))


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
    claims.reload()
    try:
        result = pytester.runpytest_inprocess("--no-mlflow", "--amp-device=cpu")
    finally:
        claims.reload()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f'*{path}: claims[[]0]: field "where" is missing or empty*'])


def test_unknown_ids_come_with_the_closest_valid_ones():
    ((bad, near),) = claims.unknown_ids(["FMT-BITS", "SCL-NAN-INCREASE"])
    assert bad == "SCL-NAN-INCREASE" and near.startswith("SCL-NAN-INCREASES, ")


# --- TOML catalogues: the built-in bf16 one and a project's scenarios/claims.toml -------------

TOML_ENTRY = 'id = "TEAM-LOSS"\nstatement = "s"\nsource = "an issue"\n'


def write_toml(folder: Path, *entries: str, name: str = "claims.toml") -> Path:
    path = folder / name
    path.write_text("".join(f"[[claim]]\n{e}\n" for e in entries), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (['id = "TEAM-LOSS"\nstatement = "unclosed'], r"cannot read the claim catalogue: .*TOML"),
        (
            [TOML_ENTRY + 'colour = "red"'],
            r'#1 \(id "TEAM-LOSS"\): unknown field\(s\) \[.colour.\]',
        ),
        ([TOML_ENTRY + 'sourse = "x"'], r"unknown field\(s\) \['sourse'\] \(closest: source"),
        (
            ['id = "TEAM-LOSS"\nstatement = "s"'],
            r'#1 \(id "TEAM-LOSS"\): field "source" is missing',
        ),
        (['id = "team loss"\nstatement = "s"\nsource = "x"'], r'id "team loss" is not of the'),
        ([TOML_ENTRY, TOML_ENTRY], r'#2 \(id "TEAM-LOSS"\): id "TEAM-LOSS" appears twice'),
        ([TOML_ENTRY + 'expected = "true"'], r'expected = "true" is not a verdict: use one of'),
        (['id = "FMT-BITS"\nstatement = "s"\nsource = "x"'], r"already a claim of the article"),
    ],
)
def test_a_malformed_project_catalogue_names_the_file_the_entry_and_the_fix(
    tmp_path, entries, message
):
    path = write_toml(tmp_path, *entries)
    restore = claims.use_project(path)
    try:
        with pytest.raises(CatalogueError, match=message) as error:
            claims.catalogue()
    finally:
        restore()
    assert str(path) in str(error.value)


@pytest.mark.parametrize("claim_id", ["TEAM-X\n", " TEAM-X", "TEAM-\tX"])
def test_an_id_with_white_space_is_refused_naming_it_and_the_fix(tmp_path, claim_id):
    """`re.match(...$)` let "TEAM-X\\n" through (`$` matches before a final line break): it
    reached MLflow's tag names. Each ID is shown as TOML writes it, on the error's one line."""
    entry = f'id = {json.dumps(claim_id)}\nstatement = "s"\nsource = "x"'
    path = write_toml(tmp_path, entry)
    with pytest.raises(CatalogueError) as error:
        claims.load_toml_catalogue(path, "project")
    shown = json.dumps(claim_id)
    assert str(error.value) == (
        f"{path}: [[claim]] #1 (id {shown}): id {shown} is not of the form GROUP-NAME (capitals, "
        "digits, dashes): it holds white space (a line break, a tab or a space), which MLflow's "
        'tag names would keep; write it "TEAM-X"'
    )


def test_a_top_level_key_other_than_claim_is_refused(tmp_path):
    path = tmp_path / "claims.toml"
    path.write_text('title = "ours"\n', encoding="utf-8")
    with pytest.raises(CatalogueError, match=r"unknown top-level key\(s\) \['title'\]"):
        claims.load_toml_catalogue(path, "project")


def test_a_project_catalogue_is_merged_after_the_built_in_ones_and_reread_when_it_changes(
    tmp_path,
):
    path = write_toml(tmp_path, TOML_ENTRY + 'expected = "confirmed"')
    restore = claims.use_project(path)
    try:
        merged = claims.catalogue()
        assert list(merged)[: len(claims.builtin())] == list(claims.builtin())
        claim = merged["TEAM-LOSS"]
        assert (claim.catalogue, claim.source, claim.expected) == (
            "project",
            "an issue",
            "confirmed",
        )
        assert claims.unknown_ids(["TEAM-LOSS", "BF16-NO-SCALER"]) == []
        write_toml(tmp_path, TOML_ENTRY, TOML_ENTRY.replace("TEAM-LOSS", "TEAM-LOSS-TWO"))
        assert "TEAM-LOSS-TWO" in claims.catalogue()
    finally:
        restore()
    assert claims.project_path() != path.resolve()  # restored


def test_a_malformed_project_catalogue_stops_a_session_before_any_test(pytester):
    pytester.mkdir("scenarios")
    path = write_toml(pytester.path / "scenarios", TOML_ENTRY, TOML_ENTRY)
    result = pytester.runpytest_inprocess("--no-mlflow", "--amp-device=cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (
        f'{path}: [[claim]] #2 (id "TEAM-LOSS"): id "TEAM-LOSS" appears twice'
        in result.stderr.str()
    )


def test_the_ini_option_names_another_project_catalogue(pytester):
    pytester.makeini("[pytest]\namp_claims = ours/claims.toml\n")
    pytester.mkdir("ours")
    write_toml(pytester.path / "ours", TOML_ENTRY)
    pytester.makepyfile(
        **{
            "scenarios/test_ours": """
import pytest

@pytest.mark.claim("TEAM-LOSS")
def test_ours(record):
    record.verdict("TEAM-LOSS", "confirmed", f"{2 + 2} of 4")
"""
        }
    )
    result = pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", f"--amp-reports={pytester.path / 'r'}",
        "-v",  # the full table: each claim's source under its ID
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*TEAM-LOSS*confirmed*", "*an issue*"])
    assert "TEAM-LOSS" not in claims.catalogue()  # the session's catalogue ended with it
