"""Compare two runs: changed verdicts first, then metric changes, flagged only when they are
both statistically significant and larger than a relative threshold.

Verdicts are compared as they count (harness.catalogue.verdicts): `partly -> failed (was: partly)`
is a change. Per claim, a verdict that stands in the first run and in the second is skipped, failed
or missing is a regression (missing is only "not compared" when the second run ran part of the suite
and says so). A comparison in which no verdict overlapped says so.

A run is the summary `harness.reports.baseline.summarize` makes of a session; a baseline file holds
the same shape. Metric keys that differ only in a `seed<N>`, `round<N>` or `rank<N>` path component
(`mlp/amp-fp16/seed0/val_accuracy`, `.../seed1/...`) are repetitions of one quantity, and the two
sample sets are compared with Welch's t-test. A metric recorded once per run has no spread to judge
a change against: its change is listed, never flagged.

Every change says why it may have happened: the causes that differ between the two runs'
environments (harness.records.environments.causes), and whether the hardware explains it. A
verdict, a lost decision or a key metric is explained by the hardware only where the classes
differ in a capability its tests depend on (Record.depends_on_hardware), or the test depends on
the class as a whole (timing); a statistical metric wherever the classes differ, since the kernels
of another instruction set round differently. Then each change is sorted into its kind
(harness.reports.kinds): explained by the hardware, predicted by a known change of the releases,
gained, accepted (a reviewed entry of the accepted-changes file), or unexplained. Only the
unexplained are regressions: an AVX2 runner's missing bf16 LSTM is no torch regression, and
neither is FP8 saturation where torch 2.13 is known to have brought it.
"""

from __future__ import annotations

import datetime
import functools
import math
import re
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from harness.catalogue import verdicts
from harness.common import shown
from harness.common.errors import HarnessError
from harness.records import environments
from harness.records.journal import Journal
from harness.records.journal_index import short_id
from harness.records.record import SCENARIO_DIGEST, _jsonable
from harness.reports import baseline, differences, kinds, table
from harness.reports.accepted import Entry
from harness.reports.kinds import Attribution

ALPHA = 0.05
THRESHOLD = 0.10  # relative: 10% of the first run's mean
_REPETITION = re.compile(r"^(seed|round|rank)\d+$")
NOTHING_DIFFERS = "nothing in the environment differs: the harness or noise"
EXPLAINED = kinds.TITLE[kinds.HARDWARE]
SKIPPED = "skipped"  # a verdict's label, and a test's outcome, where it could not run


def attribute(
    a: Mapping[str, str], b: Mapping[str, str], depends: set[str], statistical: bool = False
) -> Attribution:
    """A change between environments `a` and `b` of a test that depends on `depends`
    (Record.depends_on_hardware). `statistical`: a metric judged over repetitions, which moves
    with the kernels of any other class, whatever the test depends on."""
    reason = environments.hardware_explains(a, b, {environments.CLASS} if statistical else depends)
    if reason and statistical:
        reason += ": the kernels of another instruction set round differently"
    if reason:
        return Attribution(kinds.HARDWARE, f"{EXPLAINED}: {reason}")
    return Attribution(kinds.UNEXPLAINED, _unexplained(a, b, depends))


def _unexplained(a: Mapping[str, str], b: Mapping[str, str], depends: set[str]) -> str:
    """What differs between the environments, for a change the hardware does not explain."""
    parts = []
    for cause, what in environments.causes(a, b).items():
        part = f"{cause} ({'; '.join(what)})"
        if cause == environments.HARDWARE:
            part += (
                f", but not what the test depends on ({', '.join(sorted(depends))})"
                if depends
                else ", and the test depends on no capability of it"
            )
        parts.append(part)
    text = f"not {EXPLAINED}; differs: {'; '.join(parts)}" if parts else NOTHING_DIFFERS
    commits = environments.fact(a, "git_commit"), environments.fact(b, "git_commit")
    if commits[0] != commits[1]:  # the harness and the scenarios changed with it
        text += f"; the commit changed ({commits[0]} -> {commits[1]})"
    return text


class _Attributed:
    """A change that carries its attribution: `describe()` ends with it, so that every line
    printed of a change (`regressions`, the plugin's end of session) says why."""

    attribution: Attribution

    def what(self) -> str:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.what()} -- {self.attribution.why}"

    def claims_changed(self) -> tuple[str, ...]:
        """The claims the change is reported against."""
        raise NotImplementedError


@dataclass(frozen=True)
class VerdictChange(_Attributed):
    claim: str
    test: str
    before: str
    after: str
    evidence_before: str
    evidence_after: str
    attribution: Attribution
    stands: tuple[bool, bool] = (True, True)  # whether A's and B's verdict stand

    def claims_changed(self) -> tuple[str, ...]:
        return (self.claim,)

    def what(self) -> str:
        return (
            f"{self.claim} ({self.test}): verdict {self.before} -> {self.after}: "
            f"{self.evidence_after}"
        )


@dataclass(frozen=True)
class MetricChange(_Attributed):
    test: str
    claims: tuple[str, ...]  # the claims the test decides: a change is reported against them
    metric: str  # repetitions collapsed: `mlp/amp-fp16/seed*/val_accuracy`
    before: tuple[float, ...]
    after: tuple[float, ...]
    relative: float  # (mean after - mean before) / |mean before|
    p_value: float | None  # Welch's t-test; None when it cannot be computed, `note` says why
    flagged: bool
    attribution: Attribution
    note: str = ""

    def claims_changed(self) -> tuple[str, ...]:
        return self.claims

    def what(self) -> str:
        why = (
            f"Welch p={self.p_value:.2g}, n={len(self.before)} vs {len(self.after)}"
            if self.p_value is not None
            else self.note
        )
        return (
            f"{', '.join(self.claims) or '(no claim)'} ({self.test}): metric {self.metric} "
            f"{_mean_text(self.before)} -> {_mean_text(self.after)} "
            f"({_percent(self.relative)}, {why})"
        )


@dataclass(frozen=True)
class LostDecision(_Attributed):
    """A claim decided in the first run, and not decided in the second."""

    claim: str
    before: str  # the first run's verdict on the claim, across its tests
    after: str  # the second's: "skipped", "failed", "capability regression" or "missing"
    evidence: str
    attribution: Attribution

    def claims_changed(self) -> tuple[str, ...]:
        return (self.claim,)

    def what(self) -> str:
        return f"{self.claim}: decided ({self.before}) before, {self.after} now: {self.evidence}"


@dataclass
class Comparison:
    a: str  # what the first run is: a file, or a session's name
    b: str
    threshold: float
    alpha: float
    verdicts: list[VerdictChange]
    metrics: list[MetricChange]  # flagged first, then by the size of the change
    only_a: list[str]  # tests, verdicts and metrics one run has and the other lacks
    only_b: list[str]
    environment: dict[str, tuple[str, str]]  # fingerprint facts that differ
    compared: dict[str, int]  # verdicts and metrics present in both runs
    lost: list[LostDecision]  # claims decided in A, not in B
    not_compared: list[str]  # claims decided in A that B, a part of the suite, did not run
    b_lacks: list[str]  # what B says it lacks (a partial run)
    classes: tuple[str, str]  # the runs' hardware classes (harness.records.environments)
    causes: dict[str, list[str]]  # environments.causes: what differs, per cause
    legacy: tuple[str, ...] = ()  # "A", "B": a fingerprint from before hardware classes
    scenarios_changed: tuple[str, ...] = ()  # tests whose scenario file differs between the runs
    accepted_notes: tuple[str, ...] = ()  # accepted entries that expired or covered nothing

    @property
    def overlapped(self) -> bool:
        """Some verdict was in both runs: without one, "nothing changed" would mean nothing."""
        return self.compared["verdicts"] > 0

    @property
    def across_hardware(self) -> bool:
        return self.classes[0] != self.classes[1]

    def _counted(self) -> list[VerdictChange | LostDecision | MetricChange]:
        """The changes that would be regressions: changed verdicts, lost decisions, flagged
        metrics."""
        return [*self.verdicts, *self.lost, *(m for m in self.metrics if m.flagged)]

    @property
    def regressions(self) -> list[str]:
        """What --fail-on-regression fails on: every changed verdict, lost decision and flagged
        metric of no other kind than unexplained (harness.reports.kinds).

        A change either way counts: the harness predicts behaviour, it does not rank it."""
        return self.of_kind(kinds.UNEXPLAINED)

    @property
    def explained(self) -> list[str]:
        """The changes of every other kind: shown, never failing."""
        return [c.describe() for c in self._counted() if c.attribution.explained]

    def changes_of(self, kind: str) -> list[VerdictChange | LostDecision | MetricChange]:
        return [c for c in self._counted() if c.attribution.kind == kind]

    def of_kind(self, kind: str) -> list[str]:
        return [c.describe() for c in self.changes_of(kind)]

    def kind_lines(self) -> list[str]:
        """A line for each kind but the unexplained that has changes: how many, and of which
        claims ("predicted by a known change of the release: 3 (PIT2-NORM-HALF, ...)")."""
        lines = []
        for kind in kinds.ORDER:
            found = self.changes_of(kind)
            if found and kind != kinds.UNEXPLAINED:
                named = dict.fromkeys(claim for c in found for claim in c.claims_changed())
                lines.append(f"{kinds.TITLE[kind]}: {len(found)} ({', '.join(named)})")
        return lines

    def counts(self) -> dict[str, int]:
        """How many changes of each kind, in harness.reports.kinds.ORDER, those with none left
        out but the unexplained."""
        found = {kind: len(self.of_kind(kind)) for kind in kinds.ORDER}
        return {k: n for k, n in found.items() if n or k == kinds.UNEXPLAINED}

    @property
    def fails_the_gate(self) -> bool:
        """--fail-on-regression: a regression fails, and so does a comparison of nothing (a
        gate that compared no verdict has checked nothing, and must not pass)."""
        return bool(self.regressions) or not self.overlapped

    def hardware_notes(self) -> list[str]:
        """What a reader must know first about the hardware of the two runs, in words."""
        notes = []
        if self.across_hardware:
            notes.append(
                f"across hardware classes: {self.classes[0]} (A) vs {self.classes[1]} (B): a "
                f"change the hardware explains is shown, never a regression"
            )
        if self.legacy:
            sides = zip("AB", self.classes, strict=True)
            names = " and ".join(f"{side}'s {cls}" for side, cls in sides if side in self.legacy)
            notes.append(
                f"hardware class only a name: {names} (a fingerprint from before hardware "
                "classes: its CPU's instruction sets were not recorded); classes count as "
                "different only where the names differ"
            )
        return notes

    def summary_line(self) -> str:
        """One line: how much was compared and what came of it."""
        counts = f"{self.compared['verdicts']} verdicts, {self.compared['metrics']} metrics"
        if not self.overlapped:
            return f"no verdict of one run is in the other: nothing compared ({counts})"
        if not self.regressions and not self.explained:
            return f"no verdict changed, no decision lost, no metric flagged ({counts} compared)"
        explained = ""
        for kind, count in self.counts().items():
            if kind == kinds.UNEXPLAINED:
                continue
            explained += f"; {count} difference{'s' if count != 1 else ''} {kinds.TITLE[kind]}"
            if kind == kinds.HARDWARE:
                explained += f" ({self.classes[0]} vs {self.classes[1]})"
        return f"regressions: {len(self.regressions)}{explained} ({counts} compared)"

    def to_json(self) -> dict:
        return {
            "a": self.a,
            "b": self.b,
            "threshold": self.threshold,
            "alpha": self.alpha,
            "hardware_classes": list(self.classes),
            "across_hardware": self.across_hardware,
            "legacy_fingerprints": list(self.legacy),
            "hardware_notes": self.hardware_notes(),
            "environment": {k: list(v) for k, v in self.environment.items()},
            "causes": self.causes,
            "compared": self.compared,
            "regressions": self.regressions,
            "explained": self.explained,
            "kinds": {kind: self.of_kind(kind) for kind in kinds.ORDER},
            "accepted_notes": list(self.accepted_notes),
            "verdict_changes": [asdict(v) for v in self.verdicts],
            "metric_changes": [
                {
                    **asdict(m),
                    "claims": list(m.claims),
                    "before": [_jsonable(x) for x in m.before],
                    "after": [_jsonable(x) for x in m.after],
                    "relative": _jsonable(m.relative),
                }
                for m in self.metrics
            ],
            "only_in_a": self.only_a,
            "only_in_b": self.only_b,
            "lost_decisions": [asdict(d) for d in self.lost],
            "not_compared": self.not_compared,
            "b_lacks": self.b_lacks,
            "scenarios_changed": list(self.scenarios_changed),
            "overlapped": self.overlapped,
        }


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
        return attribute(facts_a, facts_b, set(depends), statistical)

    def of_test(test: str, statistical: bool = False) -> Attribution:
        """Why a change of `test` may have happened: its own code first, where it changed."""
        found = attributed(_depends(test, a, b), statistical)
        changed = _scenario_changed(test, a, b)
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
        before, after = _quantities(entry["metrics"]), _quantities(b["tests"][test]["metrics"])
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
    metrics.sort(key=lambda m: (not m.flagged, -_size(m.relative), m.test, m.metric))
    lost, not_compared = _lost_decisions(
        a, b, {v.claim for v in verdicts}, lambda claim: attributed(_claim_depends(claim, a, b))
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
        scenarios_changed=tuple(t for t in a["tests"] if _scenario_changed(t, a, b)),
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
        held = v.stands[1] or v.after == SKIPPED
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


def _scenario_changed(test: str, a: dict, b: dict) -> str:
    """That the two runs ran other code for `test`: its scenario file's digest differs ("" where
    it does not, or where a run did not record it, as a baseline from before digests)."""
    digests = [run["tests"].get(test, {}).get(SCENARIO_DIGEST) for run in (a, b)]
    if not all(digests) or digests[0] == digests[1]:
        return ""
    return f"the scenario changed (its file's sha256 {digests[0]} -> {digests[1]})"


def _depends(test: str, *runs: dict) -> frozenset[str]:
    """A test's hardware dependencies (Record.depends_on_hardware) as either run recorded them;
    a baseline from before them has none."""
    recorded = [run["tests"].get(test, {}).get("depends_on_hardware") for run in runs]
    return frozenset().union(*map(environments.depends_on, recorded))


def _claim_depends(claim: str, *runs: dict) -> frozenset[str]:
    """The hardware dependencies of every test of `claim` in either run."""
    tests = {v["test"] for run in runs for v in run["verdicts"] if v["claim"] == claim}
    tests |= {t for run in runs for t, e in run["tests"].items() if claim in e.get("claims", [])}
    return frozenset().union(*(_depends(test, *runs) for test in tests))


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


def _quantities(metrics: dict) -> dict[str, dict[str, float | str]]:
    """{quantity: {metric key: value}}: keys that differ only in seed<N>, round<N> or rank<N>
    are samples of one quantity."""
    grouped: dict[str, dict[str, float | str]] = {}
    for key, value in metrics.items():
        parts = [_REPETITION.sub(r"\1*", part) for part in key.split("/")]
        grouped.setdefault("/".join(parts), {})[key] = value
    return grouped


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
    relative = _relative(statistics.fmean(xs), statistics.fmean(ys))
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
        p_value = _welch(xs, ys)
    flagged = p_value is not None and p_value < alpha and _size(relative) > threshold
    return MetricChange(
        test, claims, quantity, tuple(xs), tuple(ys), relative, p_value, flagged, why(True), note
    )


def _relative(before: float, after: float) -> float:
    if before == 0:
        return 0.0 if after == 0 else math.copysign(math.inf, after)
    return (after - before) / abs(before)


def _welch(xs: list[float], ys: list[float]) -> float:
    """Two-sided p-value of Welch's t-test (unequal variances)."""
    if len(set(xs)) == 1 and len(set(ys)) == 1:
        # No spread on either side (a count that is the same on every seed): the t statistic
        # is undefined, and any difference is beyond the noise.
        return 1.0 if xs[0] == ys[0] else 0.0
    # scipy.special's t distribution, not scipy.stats.ttest_ind: the same p-value, and stats
    # takes half a second to import (`amp-harness upgrade` answers in under a second). Here, not
    # at the top: few sessions compare.
    from scipy.special import stdtr

    var_x, var_y = statistics.variance(xs) / len(xs), statistics.variance(ys) / len(ys)
    t = (statistics.fmean(xs) - statistics.fmean(ys)) / math.sqrt(var_x + var_y)
    # Welch-Satterthwaite's degrees of freedom
    df = (var_x + var_y) ** 2 / (var_x**2 / (len(xs) - 1) + var_y**2 / (len(ys) - 1))
    return float(2 * stdtr(df, -abs(t)))


def _size(relative: float) -> float:
    return 0.0 if math.isnan(relative) else abs(relative)


def _mean_text(values: tuple[float, ...]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.4g}" if len(values) == 1 else f"{mean:.4g} (mean of {len(values)})"


def _percent(relative: float) -> str:
    return "n/a" if math.isnan(relative) else f"{relative:+.1%}"


# --- reading runs ------------------------------------------------------------------------------


def load(spec: str, journal: Journal) -> tuple[str, dict]:
    """(label, summary) of a run named on the command line: a baseline JSON file, a session id
    recorded in the journal, or `last` for its last session."""
    if spec == "last":
        summary = baseline.summarize(journal)
    elif spec.endswith(".json") or "/" in spec or Path(spec).exists():
        return spec, baseline.read_baseline(Path(spec))
    else:
        try:
            summary = baseline.summarize(journal, spec)
        except HarnessError as exc:
            raise HarnessError(f"{exc} (or give a baseline file, *.json, or `last`)") from None
    return f"session {short_id(summary['session_id'])} ({summary['name']})", summary


# --- presenting --------------------------------------------------------------------------------


def render(comparison: Comparison, console) -> None:
    """Changed verdicts, then metric changes (flagged first): rich tables on a terminal at least
    table.TABLE_WIDTH wide, else blocks wrapped at the width (a log, a pipe, 80 columns: the
    tables' evidence column was one letter wide there). Every text is shown.text, never markup
    or terminal control: test ids carry brackets (`test_x[float16]`), evidence anything."""
    c = comparison
    for note in c.hardware_notes():  # first: it changes how every row below reads
        _line(console, note, "bold yellow")
    _line(console, f"A: {c.a}\nB: {c.b}")
    if c.environment:
        changed = "; ".join(f"{k} {a} -> {b}" for k, (a, b) in c.environment.items())
        _line(console, f"environment: {changed}")
    if c.scenarios_changed:
        _line(
            console,
            f"scenario changed (other code ran in A and B): {', '.join(c.scenarios_changed)}",
            "yellow",
        )
    wide = console.is_terminal and console.width >= table.TABLE_WIDTH
    if c.verdicts:
        explained = sum(v.attribution.explained for v in c.verdicts)
        _line(
            console,
            f"verdicts changed: {len(c.verdicts)}{_kinds_of(c.verdicts)}",
            "bold red" if explained < len(c.verdicts) else "bold yellow",
        )
        (_verdict_table if wide else _verdict_blocks)(c, console)
    if c.metrics:
        flagged = sum(m.flagged for m in c.metrics)
        _line(
            console,
            f"metrics changed: {len(c.metrics)}, flagged: {flagged} (Welch p < {c.alpha} and "
            f"a change beyond {c.threshold:.0%})",
            "bold",
        )
        (_metric_table if wide else _metric_blocks)(c, console)
    for lost in c.lost:
        _line(console, f"decision lost: {lost.describe()}", _style(lost.attribution))
    if c.not_compared:
        _line(
            console,
            f"not compared (B ran part of the suite): {', '.join(c.not_compared)}",
            "yellow",
        )
    for line in c.kind_lines():  # each kind apart, before the count of what fails
        _line(console, line, "yellow")
    for note in c.accepted_notes:
        _line(console, f"accepted change: {note}", "yellow")
    for side, missing in (("A", c.only_a), ("B", c.only_b)):
        if missing:
            more = f", ... ({len(missing)} in all)" if len(missing) > 5 else ""
            _line(console, f"only in {side}: {', '.join(missing[:5])}{more}")
    style = "bold red" if c.regressions else "green" if c.overlapped else "yellow"
    _line(console, c.summary_line(), style)


def _kinds_of(changes: list[VerdictChange]) -> str:
    """ " (2 predicted, 1 gained)": how many of the changes are of each kind but unexplained."""
    found = [v.attribution.kind for v in changes if v.attribution.explained]
    counts = [f"{found.count(kind)} {kind}" for kind in kinds.ORDER if kind in found]
    return f" ({', '.join(counts)})" if counts else ""


def _verdict_table(c: Comparison, console) -> None:
    from rich.table import Table

    grid = Table(expand=True)
    grid.add_column("claim", no_wrap=True)
    grid.add_column("test", max_width=40, overflow="fold")
    grid.add_column("A -> B", max_width=24, overflow="fold")
    # The evidence gets the room, and under it why the verdict may have changed.
    grid.add_column("evidence, and why", ratio=1, overflow="fold")
    for v in c.verdicts:
        evidence = (
            shown.text(f"B: {v.evidence_after}\n")
            + shown.text(f"A: {v.evidence_before}\n", "dim")
            + _why_cell(v.attribution)
        )
        grid.add_row(
            shown.text(v.claim),
            shown.text(_short(v.test)),
            shown.text(f"{v.before} -> {v.after}"),
            evidence,
        )
    console.print(grid)


def _verdict_blocks(c: Comparison, console) -> None:
    """Per changed verdict: the claim, A -> B and the test on one line, then B's evidence, A's
    and why, indented."""
    for v in c.verdicts:
        console.print(shown.text(f"{v.claim}  {v.before} -> {v.after}  {_short(v.test)}", "bold"))
        _indented(console, f"B: {v.evidence_after}")
        _indented(console, f"A: {v.evidence_before}", "dim")
        _indented(console, f"why: {v.attribution.why}", _why_style(v.attribution))


def _metric_table(c: Comparison, console) -> None:
    from rich.table import Table

    grid = Table(expand=True)
    grid.add_column("", no_wrap=True)
    grid.add_column("claims", max_width=24, overflow="fold")
    grid.add_column("metric (test)", ratio=1, overflow="fold")
    grid.add_column("A -> B", max_width=24, overflow="fold")
    grid.add_column("change", no_wrap=True)
    grid.add_column("p", max_width=14, overflow="fold")
    for m in c.metrics:
        metric = shown.text(f"{m.metric}\n") + shown.text(_short(m.test), "dim")
        if m.flagged:
            metric += shown.text("\n") + _why_cell(m.attribution)
        grid.add_row(
            shown.text(_flag(m)),
            shown.text(", ".join(m.claims)),
            metric,
            _change_cell(m),
            shown.text(_percent(m.relative)),
            shown.text(f"{m.p_value:.2g}" if m.p_value is not None else m.note),
            style=_style(m.attribution) if m.flagged else None,
        )
    console.print(grid)


def _metric_blocks(c: Comparison, console) -> None:
    """Per metric change: its flag, claims and name on one line, then A -> B, the change, p and
    the test, and for a flagged one why, indented."""
    for m in c.metrics:
        flag = f"{_flag(m)}  " if m.flagged else ""
        head = f"{flag}{', '.join(m.claims) or '(no claim)'}  {m.metric}"
        console.print(shown.text(head, _style(m.attribution) if m.flagged else ""))
        p = f"p {m.p_value:.2g}" if m.p_value is not None else m.note
        means = f"{_means(m)} ({_repetitions(m)})" if _repetitions(m) else _means(m)
        _indented(console, f"{means}, {_percent(m.relative)}, {p}; {_short(m.test)}")
        if m.flagged:
            _indented(console, f"why: {m.attribution.why}", _why_style(m.attribution))


def _indented(console, text: str, style: str = "", indent: str = table.INDENT) -> None:
    """`text` as data, wrapped at the console's width under `indent`."""
    for line in table.indented(shown.visible(text), console.width, indent):
        console.print(line, style=style, soft_wrap=True, markup=False, highlight=False)


def _line(console, text: str, style: str = "") -> None:
    """A line of the comparison's own, as data; what it wraps into indented under it (rich
    wrapped `A: session ... / torch` onto a line of its own at the left margin)."""
    _indented(console, text, style, indent="")


def _style(attribution: Attribution) -> str:
    return "yellow" if attribution.explained else "bold red"


def _why_style(attribution: Attribution) -> str:
    return "yellow" if attribution.explained else "bold"


def _why_cell(attribution: Attribution):
    return shown.text(f"why: {attribution.why}", _why_style(attribution))


def _flag(m: MetricChange) -> str:
    if not m.flagged:
        return ""
    return m.attribution.kind if m.attribution.explained else "FLAGGED"


def _change_cell(m: MetricChange):
    cell = shown.text(_means(m))
    if _repetitions(m):
        cell.append(f"\n{_repetitions(m)}", "dim")
    return cell


def _means(m: MetricChange) -> str:
    return f"{statistics.fmean(m.before):.4g} -> {statistics.fmean(m.after):.4g}"


def _repetitions(m: MetricChange) -> str:
    """How many samples each mean is of, where either is of several; "" where both are one."""
    return (
        f"means, n={len(m.before)} vs {len(m.after)}"
        if max(len(m.before), len(m.after)) > 1
        else ""
    )


def _short(test: str) -> str:
    return test.rsplit("/", 1)[-1]
