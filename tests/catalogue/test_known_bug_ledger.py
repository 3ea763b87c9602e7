"""The known-bug ledger (harness/catalogue/known_bugs.toml): every entry well formed, reproduced
(harness.lab.known_bugs), its bounds held to every committed baseline that measured it, its
reproduction shown able to fail on some release; a bad entry is an error naming the file, the
field and the fix; a team's own ledger beside its claims joins the catalogue."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.catalogue import claims, known_bugs
from harness.catalogue.files import CatalogueError
from harness.lab import known_bugs as reproductions
from harness.reports import known_bugs as read_back

REPO = Path(__file__).resolve().parents[2]
BASELINES = REPO / "reports" / "baselines"
ENTRY = {
    "id": "KB-TEAM-EXAMPLE",
    "title": "An example",
    "harm": "the loss goes NaN",
    "class": "grad-scaler",
    "devices": ["cpu"],
    "upstream": ["https://github.com/pytorch/pytorch/issues/1"],
    "fix": "https://github.com/pytorch/pytorch/pull/2",
    "introduced": "2.5",
    "introduced_basis": "read",
    "fixed": "2.7",
    "fixed_basis": "read",
    "how": "read from the PR's merge date",
    "workaround": "none",
}


def _toml(entry: dict) -> str:
    import json

    return "[[bug]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in entry.items())


def _load(tmp_path: Path, **changes) -> dict:
    path = tmp_path / "known_bugs.toml"
    entry = {k: v for k, v in (ENTRY | changes).items() if v is not None}
    path.write_text(_toml(entry), encoding="utf-8")
    return known_bugs.load(path, "project")


def test_the_built_in_ledger_reads_and_holds_its_entries():
    bugs = known_bugs.builtin()
    assert bugs and all(bug.id.startswith("KB-") for bug in bugs.values())
    assert {bug.kind for bug in bugs.values()} <= set(known_bugs.CLASSES)


def test_every_entry_has_a_reproduction_on_devices_it_names_and_every_reproduction_an_entry():
    """A reproduction runs where the bug can occur, or on part of it (an FSDP2 bug of CPU and
    CUDA, reproduced on gloo's CPU ranks)."""
    bugs, runs = known_bugs.builtin(), reproductions.REPRODUCTIONS
    assert sorted(set(bugs) - set(runs)) == [], "entries without a reproduction"
    assert sorted(set(runs) - set(bugs)) == [], "reproductions without an entry"
    pairs = {b: (bugs[b].devices, runs[b].devices) for b in bugs}
    wrong = {b: pair for b, pair in pairs.items() if not set(pair[1]) <= set(pair[0])}
    assert wrong == {}, "a reproduction runs on a device the ledger says the bug cannot occur on"


def test_the_prediction_follows_the_bounds(tmp_path):
    bug = _load(tmp_path)["KB-TEAM-EXAMPLE"]
    assert bug.predicted("2.4.1") == known_bugs.NOT_YET
    assert bug.predicted("2.5.0+cpu") == known_bugs.PRESENT
    assert bug.predicted("2.6.0") == known_bugs.PRESENT
    assert bug.predicted("2.7.1") == known_bugs.FIXED
    assert bug.state("refuted", "2.6.0") == known_bugs.CONTRADICTED
    assert bug.state("refuted", "2.13.0") == known_bugs.FIXED
    assert bug.state("confirmed", "2.13.0") == known_bugs.PRESENT
    assert "2.5" in bug.affects and "2.7" in bug.affects


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"introduced": "2.x"}, 'introduced = "2.x" is not a release'),
        ({"fixed": "soon"}, 'fixed = "soon" is not a release'),
        ({"class": "gradscaler"}, "closest: grad-scaler"),
        ({"devices": ["tpu"]}, 'devices holds "tpu"'),
        ({"introduced_basis": "guessed"}, "introduced_basis"),
        ({"fixed": "2.5"}, "is not after introduced"),
        ({"fix": "open"}, "disagree"),
        ({"fix": "PR 2"}, "give the fixing PR's URL"),
        ({"fix": "unknown"}, 'set fixed_basis = "measured"'),
        ({"workaround": None}, "workaround missing"),
        ({"id": "TEAM-X"}, "starts KB-"),
        ({"id": "KB-X\nFORGED"}, "white space"),
        ({"harm": ""}, '"harm" must be text'),
        ({"sevrity": "high"}, "closest: "),
    ],
)
def test_a_bad_entry_names_the_file_the_entry_the_field_and_the_fix(tmp_path, changes, named):
    with pytest.raises(CatalogueError) as caught:
        _load(tmp_path, **changes)
    message = str(caught.value)
    assert str(tmp_path / "known_bugs.toml") in message and "[[bug]] #1" in message
    assert named in message


def test_a_teams_own_ledger_beside_its_claims_joins_the_catalogue(tmp_path):
    (tmp_path / "known_bugs.toml").write_text(_toml(ENTRY), encoding="utf-8")
    restore = claims.use_project(tmp_path / "claims.toml")  # no claims.toml of its own
    try:
        assert claims.catalogue()["KB-TEAM-EXAMPLE"].catalogue == "project"
        assert "KB-TEAM-EXAMPLE" in claims.ledger()
    finally:
        restore()
    assert "KB-TEAM-EXAMPLE" not in claims.catalogue()


def _measured() -> list[read_back.Column]:
    return read_back.from_baselines(BASELINES)


def test_every_bound_agrees_with_every_committed_baseline_that_measured_it():
    """A verdict recorded on a release is the state the ledger predicts for it there: a bound
    that one build's behaviour contradicts is a defect of the ledger."""
    bugs = claims.ledger()
    wrong = [
        f"{c.label}: {bug} {cell.state}, the ledger predicts {bugs[bug].predicted(c.torch)}"
        for c in _measured()
        for bug, cell in c.cells.items()
        if cell.state != "skipped"
        and (cell.state == known_bugs.PRESENT)
        != (bugs[bug].predicted(c.torch) == known_bugs.PRESENT)
    ]
    assert wrong == []


def test_every_cpu_reproduction_was_seen_to_show_its_harm_with_a_clean_control_on_some_release():
    """What shows each reproduction can fail: on some committed release its harm showed and its
    control did not (the two paths told apart). CUDA-only entries wait for a GPU's baseline."""
    shown_apart = {
        bug
        for c in _measured()
        for bug, cell in c.cells.items()
        if cell.state == known_bugs.PRESENT and cell.stands
    }
    cpu_bugs = {b for b, bug in known_bugs.builtin().items() if "cpu" in bug.devices}
    assert sorted(cpu_bugs - shown_apart) == []


def test_an_upgrade_between_every_pair_of_committed_releases_is_answered():
    columns = _measured()
    by_class: dict[str, list[read_back.Column]] = {}
    for c in columns:
        by_class.setdefault(c.hardware_class, []).append(c)
    answered = 0
    for group in by_class.values():
        for older in group:
            for newer in group:
                if older is not newer:
                    found = read_back.upgrade(older, newer)
                    assert found.sentence().startswith(f"Upgrading from {older.torch}")
                    answered += 1
    assert answered >= 2
