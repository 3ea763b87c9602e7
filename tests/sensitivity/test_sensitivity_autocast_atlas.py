"""scenarios/test_autocast_atlas.py can fail, and names what it finds: an op whose autocast rule
is broken is a mismatch named in its claim's verdict; an op that changes dtype with autocast off
fails the negative control."""

from __future__ import annotations

import json

import torch
from autocast_breaks import mm_without_autocast
from conftest import assert_fails_naming

MODULE = "test_autocast_atlas.py"


def _verdicts(folder) -> dict[tuple[str, str], tuple[str, str]]:
    """(test id, claim) -> (verdict, evidence), from the nested run's journal."""
    journal = folder / "reports" / "journal.jsonl"
    found = {}
    for line in journal.read_text().splitlines():
        entry = json.loads(line)
        if entry["type"] == "record":
            record = entry["record"]
            for verdict in record["verdicts"]:
                test = record["test"].split("[")[-1].rstrip("]")
                found[test, verdict["claim"]] = (verdict["verdict"], verdict["evidence"])
    return found


def test_the_module_passes_unpatched(run_scenario, pytester):
    run_scenario(MODULE).assert_outcomes(passed=2)
    verdict, evidence = _verdicts(pytester.path)["bfloat16", "AUTOCAST-LOWER-LIST"]
    assert verdict == "confirmed", evidence


def test_an_op_whose_rule_is_broken_is_named_in_the_verdict(run_scenario, pytester):
    with mm_without_autocast():
        run_scenario(MODULE, "-k", "bfloat16").assert_outcomes(passed=1)
    verdict, evidence = _verdicts(pytester.path)["bfloat16", "AUTOCAST-LOWER-LIST"]
    assert verdict == "partly"
    assert "not: mm (documented lower, measured input)" in evidence


def test_an_op_that_lowers_without_autocast_fails_the_control(run_scenario, monkeypatch):
    exp = torch.exp
    monkeypatch.setattr(torch, "exp", lambda x: exp(x).to(torch.bfloat16))
    result = run_scenario(MODULE, "-k", "bfloat16")
    assert_fails_naming(result, "AUTOCAST-LOWER-LIST")
