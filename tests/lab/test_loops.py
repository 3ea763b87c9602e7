"""harness.lab.loops.Across: one claim decided over the shapes a test tried, never hiding a shape
where it did not hold."""

from __future__ import annotations

from harness.lab.loops import Across


def test_a_claim_over_shapes_names_where_it_held_and_where_not():
    claim = Across()
    claim.add("param_groups", True, "gap 0")
    claim.add("fused", False, "1 of 9 skipped")
    assert claim.verdict() == "partly"
    evidence = claim.evidence()
    assert "held in 1 of 2 shapes, in param_groups, not in fused" in evidence
    assert "param_groups: gap 0; fused: 1 of 9 skipped" in evidence


def test_all_or_none_of_the_shapes_decide_confirmed_or_refuted():
    held, failed = Across(), Across()
    for shape in ("a", "b"):
        held.add(shape, True, "ok")
        failed.add(shape, False, "no")
    assert (held.verdict(), failed.verdict()) == ("confirmed", "refuted")
    assert "not in a, b" in failed.evidence() and "not in" not in held.evidence()


def test_no_shape_tried_decides_nothing():
    assert Across().verdict() == "inconclusive"
