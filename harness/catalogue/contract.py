"""The scenario contract, checked before anything runs: `amp-harness validate`.

It reads every scenarios/test_*.py with `ast` (scenario_source.py; nothing is imported, so it
takes well under a second) and reports, per test, one line with the file, the line, the test,
what is wrong and the fix:
- claims declared and known: a `claim` marker on the test, its class or the module
  (`pytestmark`), with catalogue IDs; claims that only exist once pytest has collected the
  module are read by collecting it (collected_claims.py);
- a verdict per declared claim: each ID is the first argument of a `.verdict(...)` call in the
  test or in a helper it refers to (scenario_source.py says which), and its evidence is not text
  fixed in the source (a string, or an f-string without a {value}): it must be formatted from
  what was measured. Evidence built any other way (a name, a helper, a join) is left to
  `Record.verdict`, which refuses at run time evidence whose only digits are inside names such
  as fp16 or sm_90;
- a negative control, asserted: a "# Negative control: ..." comment (or docstring) in the
  test or a helper it refers to, and an assertion that reaches it; harness/catalogue/controls.py
  has the rules;
- no assertion that cannot fail, and every capability a test `requires` known.

`amp-harness new`'s template (template.py) keeps every check above.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.catalogue import collected_claims
from harness.catalogue.claims import PROJECT_FILE, unknown_ids, use_project
from harness.catalogue.controls import call_name, cannot_fail, walk
from harness.catalogue.scenario_source import (
    DeclaredClaim,
    ScenarioModule,
    ScenarioTest,
    argument,
    scenario_folder,
    strings,
)
from harness.common.errors import closest


@dataclass(frozen=True)
class Problem:
    path: Path
    line: int
    test: str  # the test function, or "" for a problem of the whole file
    what: str
    fix: str

    def __str__(self) -> str:
        test = f" {self.test}:" if self.test else ""
        return f"{self.path}:{self.line}:{test} {self.what}. Fix: {self.fix}"


def check(
    folder: Path, catalogue_path: Path | None = None, capabilities: Iterable[str] | None = None
) -> list[Problem]:
    """Every contract problem of the scenario files in `folder`, in file and line order. Claim
    IDs are those of the built-in catalogues and the project's (`catalogue_path`, by default
    claims.toml in `folder`). `capabilities`: every capability name a scenario may require (the
    lab's built-in ones, which this floor does not import, and the team's:
    `declared_capabilities`); given, each `requires` name is checked against them, as
    `amp-harness validate` does."""
    folder = scenario_folder(folder)
    restore = use_project(catalogue_path or folder / PROJECT_FILE)
    try:
        return _check_folder(folder, None if capabilities is None else set(capabilities))
    finally:
        restore()


def _check_folder(folder: Path, capabilities: set[str] | None) -> list[Problem]:
    problems: list[Problem] = []
    modules: list[tuple[ScenarioModule, list[ScenarioTest]]] = []
    for path in sorted(folder.glob("test_*.py")):
        try:
            module = ScenarioModule(path)
        except (SyntaxError, UnicodeDecodeError) as exc:
            line = getattr(exc, "lineno", None) or 1
            detail = exc.msg if isinstance(exc, SyntaxError) else str(exc)
            fix = "fix the file so that Python parses it"
            problems.append(Problem(path, line, "", f"cannot be read: {detail}", fix))
            continue
        modules.append((module, list(module.tests())))
    unread = [m.path.resolve() for m, tests in modules if any(t.claims is None for t in tests)]
    collected = collected_claims.collect(unread) if unread else None
    for module, tests in modules:
        problems += _check_module(module, tests, collected)
        if capabilities is not None:
            problems += _unknown_requirements(module, capabilities)
    return problems


def declared_capabilities(declared: Path) -> set[str]:
    """The capability names a team declares in `declared` (its scenarios/capabilities.py), read
    as text (`Capability("name", ...)`): importing it would run its probes' imports."""
    names: set[str] = set()
    try:
        tree = ast.parse(declared.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):  # none, or the plugin names its fault
        return names
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and call_name(node) == "Capability":
            name = argument(node, 0, "name")
            names.update((strings(name) if name is not None else None) or [])
    return names


def _unknown_requirements(module: ScenarioModule, known: set[str]) -> Iterator[Problem]:
    """Every `pytest.mark.requires("name")` of the module, in a decorator, a pytestmark or a
    pytest.param, naming no capability: at run time it fails the session's collection."""
    for name, line in module.requirements():
        if name not in known:
            yield Problem(
                module.path, line, "", f"requires unknown capability {name!r}",
                f"use one of {', '.join(sorted(known))} (closest: "
                f"{closest(name, sorted(known))}), or declare it in the team's "
                "capabilities.py beside the scenarios (docs/writing-a-scenario.md)",
            )  # fmt: skip


def _check_module(
    module: ScenarioModule,
    tests: list[ScenarioTest],
    collected: collected_claims.MarkerReader | None,
) -> Iterator[Problem]:
    path = module.path
    reported: set[int] = set()
    for test in tests:
        line = test.node.lineno
        claims = test.claims
        if claims is None:
            key = (path.resolve(), test.name)
            if key not in collected.claims:
                error = collected.errors.get(path.resolve(), "no item collected")
                yield Problem(
                    path, line, test.name,
                    f"its claims are set at run time and collecting the module failed: "
                    f"{_last_line(error)}",
                    f"run `pytest --collect-only {path}` and fix what it reports",
                )  # fmt: skip
                continue
            claims = [DeclaredClaim(i, line) for i in sorted(collected.claims[key])]
        if not claims:
            yield Problem(
                path, line, test.name, "no claim marker",
                '@pytest.mark.claim("ID") above the test (or pytestmark = pytest.mark.claim("ID") '
                "for the whole module); `amp-harness list` shows the IDs",
            )  # fmt: skip
            continue
        known = []
        bad = dict(unknown_ids([c.id for c in claims]))
        for claim in claims:
            if claim.id in bad:
                yield Problem(
                    path, claim.line, test.name, f"unknown claim ID {claim.id!r}",
                    f"use a catalogue ID (closest: {bad[claim.id]}); `amp-harness list` shows all",
                )  # fmt: skip
            else:
                known.append(claim.id)
        helpers = module.reachable(test.node)
        recorded = module.verdicts(helpers)
        for claim_id in dict.fromkeys(known):
            if recorded is not None and claim_id not in recorded:
                yield Problem(
                    path, line, test.name, f"declares {claim_id} but records no verdict for it",
                    f'call record.verdict("{claim_id}", verdict, evidence) in the test or a '
                    "helper it calls, with the verdict computed from what it measured",
                )  # fmt: skip
        for call in module.constant_evidence(helpers):
            evidence = argument(call, 2, "evidence")
            if id(evidence) in reported:  # a helper's verdict, reached by several tests
                continue
            reported.add(id(evidence))
            claim = argument(call, 0, "claim")
            ids = module.ids(claim) if claim is not None else None
            name = ids[0] if ids else "its claim"
            yield Problem(
                path, evidence.lineno, test.name,
                f"the evidence for {name} is fixed text: it reads the same whatever was measured",
                "format it from the values measured, e.g. f\"scale {before:g} -> {after:g}\", "
                "and record them with record.metric",
            )  # fmt: skip
        yield from _hollow_assertions(path, test.name, helpers, reported)
        controls = module.controls.find(helpers)
        if not controls:
            yield Problem(
                path, line, test.name, "no negative control",
                "add the run that reproduces the pitfall (or shows that the measurement tells the "
                'difference), assert it, and mark it with a comment "# Negative control: ..." in '
                "the test or a helper it calls",
            )  # fmt: skip
            continue
        for control in module.controls.unasserted(test.node, controls, helpers):
            what, fix = control.problem()
            yield Problem(path, line, test.name, what, fix)


def _hollow_assertions(
    path: Path, test: str, helpers: list[ast.AST], reported: set[int]
) -> Iterator[Problem]:
    """Each `assert` of the test and its helpers that holds whatever was measured (x == x,
    len(x) >= 0): it checks nothing, and counts as asserting no control (controls.py)."""
    for node in (n for h in helpers for n in walk(h) if isinstance(n, ast.Assert)):
        why = cannot_fail(node.test)
        if why and id(node) not in reported:  # a helper's, reached by several tests: once
            reported.add(id(node))
            fix = "assert what the experiment predicts, so that a broken behaviour fails it"
            what = f"an assertion that cannot fail ({why}): `{ast.unparse(node.test)}`"
            yield Problem(path, node.lineno, test, what, fix)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no message)"
