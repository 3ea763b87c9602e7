"""Why a change between two runs may have happened: what differs between their environments, and
whether the hardware explains it.

Every change a comparison counts says why (harness.records.environments.causes). A verdict, a
lost decision or a key metric is explained by the hardware only where the classes differ in a
capability its tests depend on (Record.depends_on_hardware), or the test depends on the class as
a whole (timing); a statistical metric wherever the classes differ, since the kernels of another
instruction set round differently. What is not explained so is unexplained, until
harness.reports.kinds sorts it further. Apart from harness.reports.compare, which matches the
runs' verdicts and metrics: this module reads only their environments and what each test
depends on and ran.
"""

from __future__ import annotations

from collections.abc import Mapping

from harness.records import environments
from harness.records.record import SCENARIO_DIGEST
from harness.reports import kinds
from harness.reports.kinds import Attribution

NOTHING_DIFFERS = "nothing in the environment differs: the harness or noise"
EXPLAINED = kinds.TITLE[kinds.HARDWARE]


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


def scenario_changed(test: str, a: dict, b: dict) -> str:
    """That the two runs ran other code for `test`: its scenario file's digest differs ("" where
    it does not, or where a run did not record it, as a baseline from before digests)."""
    digests = [run["tests"].get(test, {}).get(SCENARIO_DIGEST) for run in (a, b)]
    if not all(digests) or digests[0] == digests[1]:
        return ""
    return f"the scenario changed (its file's sha256 {digests[0]} -> {digests[1]})"


def dependencies(test: str, *runs: dict) -> frozenset[str]:
    """A test's hardware dependencies (Record.depends_on_hardware) as either run recorded them;
    a baseline from before them has none."""
    recorded = [run["tests"].get(test, {}).get("depends_on_hardware") for run in runs]
    return frozenset().union(*map(environments.depends_on, recorded))


def claim_dependencies(claim: str, *runs: dict) -> frozenset[str]:
    """The hardware dependencies of every test of `claim` in either run."""
    tests = {v["test"] for run in runs for v in run["verdicts"] if v["claim"] == claim}
    tests |= {t for run in runs for t, e in run["tests"].items() if claim in e.get("claims", [])}
    return frozenset().union(*(dependencies(test, *runs) for test in tests))
