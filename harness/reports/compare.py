"""Compare two runs: changed verdicts first, then metric changes, flagged only when they are
both statistically significant and larger than a relative threshold.

Verdicts are compared as they count (harness.catalogue.verdicts): `partly -> failed (was: partly)`
is a change. Per claim, a verdict that stands in the first run and in the second is skipped, failed
or missing is a regression (missing is only "not compared" when the second run ran part of the suite
and says so). A comparison in which no verdict overlapped says so.

A run is the summary `harness.reports.baseline.summarize` makes of a session; a baseline file holds
the same shape (harness.reports.baseline.load reads either). A metric's repetitions (`seed<N>`,
`round<N>`, `rank<N>`) are compared as two sample sets with Welch's t-test
(harness.reports.significance). A metric recorded once per run has no spread to judge a change
against: its change is listed, never flagged.

Every change says why it may have happened (harness.reports.attribution). Then each change is
sorted into its kind (harness.reports.kinds): explained by the hardware, predicted by a known
change of the releases, gained, accepted (a reviewed entry of the accepted-changes file), or
unexplained. Only the unexplained are regressions: an AVX2 runner's missing bf16 LSTM is no torch
regression, and neither is FP8 saturation where torch 2.13 is known to have brought it. What comes
of it is a harness.reports.comparison.Comparison; harness.reports.comparison_view shows it.
"""

from __future__ import annotations

import datetime
import functools
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import replace

from harness.catalogue import verdicts
from harness.records import environments
from harness.reports import attribution, differences, kinds, significance
from harness.reports.accepted import Entry
from harness.reports.comparison import Comparison, LostDecision, MetricChange, VerdictChange
from harness.reports.kinds import Attribution

ALPHA = 0.05
THRESHOLD = 0.10  # relative: 10% of the first run's mean
SKIPPED = "skipped"  # a verdict's label, and a test's outcome, where it could not run
CANNOT_COMPILE = verdicts.CANNOT_COMPILE  # a label apart: no compiled arm compiled


def compare(
    a: dict,
    b: dict,
    threshold: float = THRESHOLD,
    alpha: float = ALPHA,
    labels: tuple[str, str] | None = None,
    accepted: Iterable[Entry] = (),
    today: datetime.date | None = None,
) -> Comparison:
    """Compare run `b` with run `a` (both summaries, as harness.reports.baseline.summarize
    makes), each change sorted into its kind with the `accepted` entries (harness.reports.kinds;
    `today` decides which expired)."""
    facts_a, facts_b = a.get("fingerprint", {}), b.get("fingerprint", {})

    @functools.cache  # a suite's tests share a few sets of dependencies
    def attributed(depends: frozenset[str], statistical: bool = False) -> Attribution:
        return attribution.attribute(facts_a, facts_b, set(depends), statistical)

    def of_test(test: str, statistical: bool = False) -> Attribution:
        """Why a change of `test` may have happened: its own code first, where it changed."""
        found = attributed(attribution.dependencies(test, a, b), statistical)
        changed = attribution.scenario_changed(test, a, b)
        return Attribution(found.kind, f"{changed}; {found.why}") if changed else found

    verdicts_a, verdicts_b = _verdicts(a), _verdicts(b)
    verdicts = [
        VerdictChange(
            claim,
            test,
            va["verdict"],
            vb["verdict"],
            va["evidence"],
            vb["evidence"],
            of_test(test),
            (va["stands"], vb["stands"]),
        )  # fmt: skip
        for (test, claim), va in verdicts_a.items()
        if (vb := verdicts_b.get((test, claim))) and vb["verdict"] != va["verdict"]
    ]
    # A test only one run has is listed once, by name, not verdict by verdict.
    both = a["tests"].keys() & b["tests"].keys()
    only_a = [
        f"{t} :: verdict {c}" for t, c in verdicts_a if t in both and (t, c) not in verdicts_b
    ]
    only_b = [
        f"{t} :: verdict {c}" for t, c in verdicts_b if t in both and (t, c) not in verdicts_a
    ]
    claims_of: dict[str, tuple[str, ...]] = {}
    for test, claim in {**verdicts_a, **verdicts_b}:
        claims_of[test] = (*claims_of.get(test, ()), claim)

    metrics: list[MetricChange] = []
    compared = 0
    for test, entry in a["tests"].items():
        if test not in b["tests"]:
            only_a.append(test)
            continue
        before, after = (
            significance.quantities(entry["metrics"]),
            significance.quantities(b["tests"][test]["metrics"]),
        )
        key = {*entry.get("key_metrics", []), *b["tests"][test].get("key_metrics", [])}
        why = functools.partial(of_test, test)
        only_a += [f"{test} :: metric {q}" for q in before if q not in after]
        only_b += [f"{test} :: metric {q}" for q in after if q not in before]
        for quantity in before.keys() & after.keys():
            compared += 1
            change = _metric_change(
                test, claims_of.get(test, ()), quantity, before[quantity], after[quantity],
                threshold, alpha, why, quantity in key,
            )  # fmt: skip
            if change:
                metrics.append(change)
    only_b += [test for test in b["tests"] if test not in a["tests"]]
    metrics.sort(key=lambda m: (not m.flagged, -significance.size(m.relative), m.test, m.metric))
    lost, not_compared = _lost_decisions(
        a,
        b,
        {v.claim for v in verdicts},
        lambda claim: attributed(attribution.claim_dependencies(claim, a, b)),
    )
    sorter = kinds.Sorter(facts_a, facts_b, accepted, today or datetime.date.today())
    verdicts, lost, metrics = _sorted_out(sorter, a, b, verdicts, lost, metrics)
    a_label, b_label = labels or (a.get("name", "A"), b.get("name", "B"))
    return Comparison(
        a=a_label,
        b=b_label,
        threshold=threshold,
        alpha=alpha,
        verdicts=verdicts,
        metrics=metrics,
        only_a=only_a,
        only_b=only_b,
        environment={
            k: (facts_a[k], facts_b[k])
            for k in facts_a
            if k in facts_b and facts_a[k] != facts_b[k]
        },
        compared={"verdicts": len(verdicts_a.keys() & verdicts_b.keys()), "metrics": compared},
        lost=lost,
        not_compared=not_compared,
        b_lacks=list(b.get("lacks", [])),
        classes=(environments.hardware_class(facts_a), environments.hardware_class(facts_b)),
        causes=environments.causes(facts_a, facts_b),
        legacy=tuple(
            side
            for side, facts in zip("AB", (facts_a, facts_b), strict=True)
            if environments.is_legacy(facts)
        ),
        scenarios_changed=tuple(t for t in a["tests"] if attribution.scenario_changed(t, a, b)),
        accepted_notes=tuple(sorter.notes()),
    )


def _sorted_out(
    sorter: kinds.Sorter,
    a: dict,
    b: dict,
    verdicts: list[VerdictChange],
    lost: list[LostDecision],
    metrics: list[MetricChange],
) -> tuple[list[VerdictChange], list[LostDecision], list[MetricChange]]:
    """The changes that count, each with its kind (harness.reports.kinds). A change is predicted
    only where B's test held its prediction for B's release: passed, or skipped where it cannot
    run (never failed)."""

    def outcome(run: dict, test: str) -> str:
        return run["tests"].get(test, {}).get("outcome", "")

    def verdict(v: VerdictChange) -> VerdictChange:
        # A test that could not compile held its prediction as a skip does: it passed.
        held = v.stands[1] or v.after in (SKIPPED, CANNOT_COMPILE)
        gained = v.stands[1] and not v.stands[0]
        skipped = v.stands[0] and v.after == SKIPPED
        sorted_out = sorter.sort(
            v.attribution, (v.claim,), test=v.test, held=held, gained=gained, skipped=skipped
        )
        return replace(v, attribution=sorted_out)

    def decision(d: LostDecision) -> LostDecision:
        skipped = d.after == SKIPPED
        sorted_out = sorter.sort(
            d.attribution, (d.claim,), held=skipped, gained=False, skipped=skipped
        )
        return replace(d, attribution=sorted_out)

    def metric(m: MetricChange) -> MetricChange:
        if not m.flagged:  # listed, never counted: nothing to sort out
            return m
        after = outcome(b, m.test)
        gained = outcome(a, m.test) == SKIPPED and after == "passed"
        sorted_out = sorter.sort(
            m.attribution,
            m.claims,
            m.metric,
            test=m.test,
            held=after in ("passed", SKIPPED),
            gained=gained,
        )
        return replace(m, attribution=sorted_out)

    # The metrics first: a test whose every flagged change is an op its releases document
    # otherwise has its verdicts' changes predicted by that too.
    metrics = [*map(metric, metrics)]
    flagged = [m for m in metrics if m.flagged]
    sorter.documented_tests = {m.test for m in flagged if m.attribution.kind == kinds.PREDICTED} - {
        m.test for m in flagged if not m.attribution.explained
    }
    return [*map(verdict, verdicts)], [*map(decision, lost)], metrics


def _verdicts(summary: dict) -> dict[tuple[str, str], dict]:
    return {(v["test"], v["claim"]): v for v in summary["verdicts"]}


def claim_verdicts(summary: dict) -> dict[str, verdicts.ClaimVerdict]:
    """Each claim's verdict across the run's tests, by harness.catalogue.verdicts' rule."""
    grouped: dict[str, list[verdicts.Status]] = {}
    for v in summary["verdicts"]:
        status = verdicts.from_label(v["verdict"], v["stands"], v["evidence"], v["test"])
        grouped.setdefault(v["claim"], []).append(status)
    return {claim: verdicts.aggregate(found) for claim, found in grouped.items()}


def _lost_decisions(
    a: dict, b: dict, changed: set[str], attributed: Callable[[str], Attribution]
) -> tuple[list[LostDecision], list[str]]:
    """Claims that stand in `a` and not in `b` (those a changed verdict of a test in both runs
    already reports are left to it), each attributed (`attributed(claim)`), and the claims a
    partial `b` did not run at all."""
    claims_a, claims_b = claim_verdicts(a), claim_verdicts(b)
    lost, not_compared = [], []
    for claim, before in claims_a.items():
        after = claims_b.get(claim)
        if not before.stands or claim in changed or (after and after.stands):
            continue
        if after is None and b.get("lacks"):
            not_compared.append(claim)
        elif after is None:
            lost.append(
                LostDecision(claim, before.label, "missing", "no test of it ran", attributed(claim))
            )
        else:
            lost.append(
                LostDecision(claim, before.label, after.label, after.evidence, attributed(claim))
            )
    return lost, not_compared


def _metric_change(
    test: str,
    claims: tuple[str, ...],
    quantity: str,
    before: dict[str, float | str],
    after: dict[str, float | str],
    threshold: float,
    alpha: float,
    why: Callable[[bool], Attribution],
    key: bool = False,
) -> MetricChange | None:
    """The change of one quantity, if it moved; `why(statistical)` attributes it."""
    if before == after:  # the raw values: inf and NaN are spelled as text, so NaN == NaN here
        return None
    xs, ys = [float(v) for v in before.values()], [float(v) for v in after.values()]
    relative = significance.relative(statistics.fmean(xs), statistics.fmean(ys))
    p_value, note = None, ""
    if key:  # which way the behaviour went (Record.key_metric): any change beyond rounding
        moved = [differences.value(x) for x in xs] != [differences.value(y) for y in ys]
        note = "key metric" + (": the behaviour changed" if moved else ", the same to 4 digits")
        return MetricChange(
            test, claims, quantity, tuple(xs), tuple(ys), relative, None, moved, why(False), note
        )
    if max(len(xs), len(ys)) == 1:
        note = "no repetitions"
    elif min(len(xs), len(ys)) == 1:
        note = f"too few repetitions (n={len(xs)} vs {len(ys)})"
    elif not all(math.isfinite(v) for v in xs + ys):
        note = "non-finite samples"
    else:
        p_value = significance.welch(xs, ys)
    flagged = p_value is not None and p_value < alpha and significance.size(relative) > threshold
    return MetricChange(
        test, claims, quantity, tuple(xs), tuple(ys), relative, p_value, flagged, why(True), note
    )
