"""The scenario contract, checked before anything runs, and the template that satisfies it.

`amp-harness validate` reads every scenarios/test_*.py with `ast` (nothing is imported, so it
takes well under a second) and reports, per test, one line with the file, the line, the test,
what is wrong and the fix:
- claims declared and known: a `claim` marker on the test, its class or the module
  (`pytestmark`), with catalogue IDs;
- a verdict per declared claim: each ID is the first argument of a `.verdict(...)` call in the
  test or in a helper it refers to, and its evidence is not text fixed in the source (a string,
  or an f-string without a {value}): it must be formatted from what was measured. Evidence built
  any other way (a name, a helper, a join) is left to `Record.verdict`, which refuses at run time
  evidence whose only digits are inside names such as fp16 or sm_90;
- a negative control, asserted: a "# Negative control: ..." comment (or docstring) in the
  test or a helper it refers to, and an assertion that reaches it; harness/catalogue/controls.py
  has the rules.

"A helper it refers to" is any function or class of the same module whose name the test uses
(called, or passed on as `run_ranks(rank_experiments, ...)` does), followed transitively, plus
every method of the module's classes whose name appears as an attribute (`comparison.log(...)`).
That over-approximates what runs, on purpose: a static check must not cry wolf, and the plugin
still checks the verdicts of every test that runs. Fixtures are not followed: a module-scoped
fixture serves several tests, and its control is none of them in particular.

Claims that only exist once pytest has collected the module (`pytest.param(..., marks=...)`,
markers built by a function or kept in a variable) are read by collecting that module.

`amp-harness new NAME` writes scenarios/test_NAME.py from templates/scenario.py.tmpl: a real
scenario that passes as written and satisfies every check above.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import string
import sys
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.catalogue.claims import (
    PROJECT_FILE,
    Claim,
    add_project_claim,
    unknown_ids,
    use_project,
)
from harness.catalogue.controls import Controls, call_name, cannot_fail, walk
from harness.common import filenames, shown
from harness.common.errors import HarnessError, closest

TEMPLATE_PATH = Path(__file__).parent / "templates" / "scenario.py.tmpl"
_NAME = re.compile(r"[A-Za-z0-9_]+")


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


@dataclass(frozen=True)
class _Claim:
    id: str
    line: int  # where the ID is written


@dataclass
class _Test:
    name: str  # "test_x", or "TestY.test_x" inside a test class
    node: ast.FunctionDef | ast.AsyncFunctionDef
    claims: list[_Claim] | None  # None: not readable without collecting the module


class _Module:
    """One scenario file as `ast` and `tokenize` see it."""

    def __init__(self, path: Path):
        self.path = path
        source = path.read_text(encoding="utf-8")
        self.tree = ast.parse(source, filename=str(path))
        body = self.tree.body
        self.defs = {
            n.name: n
            for n in body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        }
        self.methods: dict[str, list[ast.AST]] = {}
        for cls in (n for n in body if isinstance(n, ast.ClassDef)):
            for method in cls.body:
                if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
                    self.methods.setdefault(method.name, []).append(method)
        self.controls = Controls(source, self.defs)  # the negative controls: see controls.py
        # Module-level names bound to claim IDs: CLAIM = "FMT-BITS", CLAIMS = ("A", "B").
        self.constants: dict[str, list[str]] = {}
        self.texts: set[str] = set()  # names bound to one string: EVIDENCE = "fp16 2 bytes"
        for node in body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], _strings(node.value)
                if isinstance(target, ast.Name) and value is not None:
                    self.constants[target.id] = value
                    if isinstance(node.value, ast.Constant):
                        self.texts.add(target.id)

    def tests(self) -> Iterator[_Test]:
        module_claims = self._pytestmark(self.tree.body)
        for node in self.tree.body:
            if _is_test(node):
                yield _Test(node.name, node, _join(module_claims, self._marks(node.decorator_list)))
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                class_claims = _join(
                    module_claims,
                    self._marks(node.decorator_list),
                    self._pytestmark(node.body),
                )
                for method in node.body:
                    if _is_test(method):
                        claims = _join(class_claims, self._marks(method.decorator_list))
                        yield _Test(f"{node.name}.{method.name}", method, claims)

    def _pytestmark(self, body: list[ast.stmt]) -> list[_Claim] | None:
        for node in body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
            ):
                marks = (
                    node.value.elts
                    if isinstance(node.value, ast.List | ast.Tuple)
                    else [node.value]
                )
                return self._marks(marks)
        return []

    def _marks(self, marks: list[ast.expr]) -> list[_Claim] | None:
        """The claim IDs these marker expressions declare; None when only pytest can tell."""
        claims: list[_Claim] = []
        for mark in marks:
            call = mark if isinstance(mark, ast.Call) else None
            name = _mark_name(call.func if call else mark)
            if name == "claim" and call is not None:
                for arg in call.args:
                    ids = self._ids(arg.value if isinstance(arg, ast.Starred) else arg)
                    if ids is None:
                        return None
                    claims += [_Claim(i, arg.lineno) for i in ids]
            elif name == "parametrize" and call is not None:
                # pytest.param(..., marks=...) may declare claims for one case: count them.
                for keyword in (k for n in walk(call) for k in _keywords(n)):
                    if keyword.arg == "marks":
                        value = keyword.value
                        per_case = self._marks(
                            value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
                        )
                        if per_case is None:
                            return None
                        claims += per_case
            elif name is None:
                return None  # a decorator or mark kept in a variable: ask pytest
        return claims

    def _ids(self, node: ast.expr) -> list[str] | None:
        if isinstance(node, ast.Name):
            return self.constants.get(node.id)
        return _strings(node)

    def reachable(self, test: ast.AST) -> list[ast.AST]:
        """The test and every module-level function, class or method it may run."""
        seen: dict[int, ast.AST] = {id(test): test}
        todo = [test]
        while todo:
            root = todo.pop()
            local = _local_names(root)  # a parameter `ranks` is not the fixture `ranks`
            for node in walk(root):
                if isinstance(node, ast.Name):
                    found = [self.defs[node.id]] if node.id in self.defs.keys() - local else []
                elif isinstance(node, ast.Attribute):
                    found = self.methods.get(node.attr, [])
                else:
                    continue
                for target in found:
                    if id(target) not in seen:
                        seen[id(target)] = target
                        todo.append(target)
        return list(seen.values())

    def verdicts(self, nodes: list[ast.AST]) -> set[str] | None:
        """Claim IDs passed first to `.verdict(...)`; None when one of them is computed."""
        ids: set[str] = set()
        for node in (n for root in nodes for n in walk(root)):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "verdict"
            ):
                continue
            first = (
                node.args[0]
                if node.args
                else next((k.value for k in node.keywords if k.arg == "claim"), None)
            )
            found = self._ids(first) if first is not None else None
            if found is None:
                return None  # `record.verdict(claim, ...)` in a loop: the plugin checks it
            ids.update(found)
        return ids

    def constant_evidence(self, nodes: list[ast.AST]) -> Iterator[ast.Call]:
        """The `.verdict(...)` calls whose evidence is text fixed in the source: a string, an
        f-string without a {value}, or a module constant. Anything else (a name, a call, a
        join) may be formatted from a measurement: the plugin checks it when it runs."""
        for root in nodes:
            local = _local_names(root)
            for node in walk(root):
                if not (isinstance(node, ast.Call) and call_name(node) == "verdict"):
                    continue
                verdict, evidence = _argument(node, 1, "verdict"), _argument(node, 2, "evidence")
                skipped = isinstance(verdict, ast.Constant) and verdict.value == "skipped"
                if evidence is not None and not skipped and self._fixed(evidence, local):
                    yield node

    def _fixed(self, node: ast.expr, local: set[str]) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str)
        if isinstance(node, ast.JoinedStr):
            return not any(isinstance(v, ast.FormattedValue) for v in node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self._fixed(node.left, local) and self._fixed(node.right, local)
        if isinstance(node, ast.IfExp):
            return self._fixed(node.body, local) and self._fixed(node.orelse, local)
        if isinstance(node, ast.Name):
            return node.id not in local and node.id in self.texts
        return False


def _is_test(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")


def _local_names(root: ast.AST) -> set[str]:
    """Parameters and assigned names inside `root`: they hide module-level names."""
    names = getattr(root, "_harness_local", None)
    if names is None:
        names = root._harness_local = set()
        for node in walk(root):
            if isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names


def _strings(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List):
        items = [_strings(e) for e in node.elts]
        if all(i is not None and len(i) == 1 for i in items):
            return [i[0] for i in items]
    return None


def _keywords(node: ast.AST) -> list[ast.keyword]:
    return node.keywords if isinstance(node, ast.Call) else []


def _mark_name(node: ast.expr) -> str | None:
    """NAME for pytest.mark.NAME or mark.NAME (called or not); None for anything else."""
    if isinstance(node, ast.Attribute):
        inner = node.value
        if isinstance(inner, ast.Attribute) and inner.attr == "mark":
            return node.attr
        if isinstance(inner, ast.Name) and inner.id == "mark":
            return node.attr
    return None


def _join(*parts: list[_Claim] | None) -> list[_Claim] | None:
    if any(p is None for p in parts):
        return None
    return [claim for part in parts for claim in part]


def _argument(call: ast.Call, index: int, keyword: str) -> ast.expr | None:
    if len(call.args) > index:
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


# --- collection, for the claims only pytest can read -----------------------------------------


class _MarkerReader:
    """A pytest plugin noting the claim markers of every function collected, before the harness
    plugin can refuse the module for them (its check runs on the finished collect report)."""

    def __init__(self) -> None:
        self.claims: dict[tuple[Path, str], set[str]] = {}
        self.errors: dict[Path, str] = {}
        self.root = Path.cwd()

    def pytest_configure(self, config: pytest.Config) -> None:
        self.root = config.rootpath

    @pytest.hookimpl(wrapper=True)
    def pytest_pycollect_makeitem(self, collector, name, obj):
        items = yield
        for item in items if isinstance(items, list) else []:
            cls = item.getparent(pytest.Class)
            test = f"{cls.name}.{item.originalname}" if cls else item.originalname
            ids = {i for marker in item.iter_markers("claim") for i in marker.args}
            self.claims.setdefault((Path(item.path).resolve(), test), set()).update(ids)
        return items

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            path = (self.root / report.nodeid.split("::")[0]).resolve()
            self.errors[path] = report.longreprtext


def _collect(paths: list[Path]) -> _MarkerReader:
    """Collect (never run) the scenario files at `paths`, in this process."""
    reader = _MarkerReader()
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # pytest's collection chatter
            pytest.main(
                [*map(str, paths), "--collect-only", "-q", "-p", "no:cacheprovider",
                 "--import-mode=importlib", "--assert=plain", "--no-mlflow", "--amp-device=cpu"],
                plugins=[reader],
            )  # fmt: skip
    finally:
        # importlib mode keeps each module under a name derived from its path: forget them, so
        # that a later check in this process reads the files as they are then.
        for name, module in list(sys.modules.items()):
            if getattr(module, "__file__", None) and Path(module.__file__).resolve() in paths:
                del sys.modules[name]
    return reader


# --- the checks --------------------------------------------------------------------------------


def check(
    folder: Path, catalogue_path: Path | None = None, capabilities: Iterable[str] | None = None
) -> list[Problem]:
    """Every contract problem of the scenario files in `folder`, in file and line order. Claim
    IDs are those of the built-in catalogues and the project's (`catalogue_path`, by default
    claims.toml in `folder`). `capabilities`: every capability name a scenario may require (the
    lab's built-in ones, which this floor does not import, and the team's:
    `declared_capabilities`); given, each `requires` name is checked against them, as
    `amp-harness validate` does."""
    folder = _scenario_folder(folder)
    restore = use_project(catalogue_path or folder / PROJECT_FILE)
    try:
        return _check_folder(folder, None if capabilities is None else set(capabilities))
    finally:
        restore()


def claimed_tests(folder: Path) -> dict[str, list[str]] | None:
    """Each claim ID with the tests that declare it, as pytest names them from the current
    folder (without parametrization ids), read from the files without importing them: no torch,
    so `amp-harness list` answers at once. None where a file cannot be read that way (a syntax
    error, markers built at run time): collect it with pytest instead."""
    found: dict[str, list[str]] = {}
    for path in sorted(Path(folder).glob("test_*.py")):
        try:
            tests = list(_Module(path).tests())
        except (SyntaxError, UnicodeDecodeError):
            return None
        if any(test.claims is None for test in tests):
            return None
        where = Path(os.path.relpath(path.resolve(), Path.cwd())).as_posix()
        for test in tests:
            for claim in dict.fromkeys(c.id for c in test.claims):
                found.setdefault(claim, []).append(f"{where}::{test.name.replace('.', '::')}")
    return found


def _check_folder(folder: Path, capabilities: set[str] | None) -> list[Problem]:
    problems: list[Problem] = []
    modules: list[tuple[_Module, list[_Test]]] = []
    for path in sorted(folder.glob("test_*.py")):
        try:
            module = _Module(path)
        except (SyntaxError, UnicodeDecodeError) as exc:
            line = getattr(exc, "lineno", None) or 1
            detail = exc.msg if isinstance(exc, SyntaxError) else str(exc)
            fix = "fix the file so that Python parses it"
            problems.append(Problem(path, line, "", f"cannot be read: {detail}", fix))
            continue
        modules.append((module, list(module.tests())))
    unread = [m.path.resolve() for m, tests in modules if any(t.claims is None for t in tests)]
    collected = _collect(unread) if unread else None
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
            name = _argument(node, 0, "name")
            names.update((_strings(name) if name is not None else None) or [])
    return names


def _unknown_requirements(module: _Module, known: set[str]) -> Iterator[Problem]:
    """Every `pytest.mark.requires("name")` of the module, in a decorator, a pytestmark or a
    pytest.param, naming no capability: at run time it fails the session's collection."""
    marks = [n for n in ast.walk(module.tree) if isinstance(n, ast.Call)]
    for node in sorted(marks, key=lambda n: n.lineno):
        if _mark_name(node.func) != "requires":
            continue
        for arg in node.args:
            for name in _strings(arg) or []:
                if name not in known:
                    yield Problem(
                        module.path, arg.lineno, "", f"requires unknown capability {name!r}",
                        f"use one of {', '.join(sorted(known))} (closest: "
                        f"{closest(name, sorted(known))}), or declare it in the team's "
                        "capabilities.py beside the scenarios (docs/writing-a-scenario.md)",
                    )  # fmt: skip


def _check_module(
    module: _Module, tests: list[_Test], collected: _MarkerReader | None
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
            claims = [_Claim(i, line) for i in sorted(collected.claims[key])]
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
            evidence = _argument(call, 2, "evidence")
            if id(evidence) in reported:  # a helper's verdict, reached by several tests
                continue
            reported.add(id(evidence))
            claim = _argument(call, 0, "claim")
            ids = module._ids(claim) if claim is not None else None
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


def _scenario_folder(folder: Path) -> Path:
    folder = Path(folder)
    if not folder.is_dir():
        raise HarnessError(
            f"no scenario folder {str(folder)!r} here: run from the repository root or pass "
            "--scenarios DIR"
        )
    return folder


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no message)"


# --- new ---------------------------------------------------------------------------------------


def new_scenario(
    name: str,
    folder: Path,
    catalogue_path: Path,
    claim_id: str | None = None,
    statement: str | None = None,
    source: str = "team decision",
    expected: str | None = None,
) -> tuple[Path, Claim]:
    """Write folder/test_NAME.py from the template, checking a claim of its own that is added to
    the project catalogue at `catalogue_path`: `claim_id` and `statement`, or else an ID made from
    NAME with the template's example statement (never an existing claim: its verdicts would
    join that claim's), with the verdict the team `expected`, if given. Never overwrites;
    writes nothing when anything is wrong."""
    if not _NAME.fullmatch(name) or name.startswith("test_"):
        suggestion = re.sub(r"\W+", "_", name.removeprefix("test_"), flags=re.ASCII).strip("_")
        raise HarnessError(
            f"scenario name {name!r}: use letters, digits and underscores only, without the test_ "
            f"prefix (the file is test_NAME.py, a Python module name); e.g. "
            f"`amp-harness new {suggestion.lower() or 'my_claim'}`"
        )
    folder = _scenario_folder(folder)
    name_max = filenames.name_max(folder)
    longest = name_max - len("test_.py")
    if len(name) > longest:
        raise HarnessError(
            f"scenario name of {len(name)} characters is too long: test_NAME.py must fit the "
            f"{name_max}-character file names of {folder}, so NAME takes at most {longest}; "
            f"pick a shorter one, e.g. `amp-harness new {name[:40].rstrip('_') or 'my_claim'}`"
        )
    path = folder / f"test_{name}.py"
    if path.exists():
        raise HarnessError(
            f"{path} exists: pick another NAME, or delete the file first if you mean to start over"
        )
    if claim_id is None:
        claim_id = "PROJECT-" + (re.sub(r"[^A-Z0-9]+", "-", name.upper()).strip("-") or "X")
        statement, source = TEMPLATE_STATEMENT, TEMPLATE_SOURCE
    before = catalogue_path.read_bytes() if catalogue_path.exists() else None
    # A statement typed in a Latin-1 terminal reaches sys.argv as surrogates: escaped, so the
    # catalogue (UTF-8 TOML) takes it.
    statement, source = shown.storable(statement), shown.storable(source)
    claim = add_project_claim(catalogue_path, claim_id, statement, source, expected)
    text = string.Template(TEMPLATE_PATH.read_text(encoding="utf-8")).substitute(
        name=name, claim=claim.id, statement=_comment(f"{claim.id}: {claim.statement}")
    )
    try:
        with path.open("x", encoding="utf-8") as f:  # "x": fails if the file exists
            f.write(text)
    except OSError as exc:  # a read-only folder, a full disk: the reason, never a traceback
        # The claim goes with its scenario: the catalogue is put back as it was.
        if before is None:
            catalogue_path.unlink(missing_ok=True)
        else:
            catalogue_path.write_bytes(before)
        raise HarnessError(
            f"cannot write {path}: {exc.strerror}; make {folder} writable or pass --scenarios DIR"
        ) from None
    return path, claim


TEMPLATE_STATEMENT = (
    "After .half() a parameter and its gradient take 2 bytes each; under fp16 autocast they stay "
    "float32, 4 bytes each: autocast alone does not halve the memory of parameters."
)
TEMPLATE_SOURCE = "amp-harness new: the template's example claim (replace it with yours)"


def _comment(text: str) -> str:
    """`text` as the lines of a Python comment that fit the line length (any character is safe
    in a comment; a line break is not)."""
    return "\n".join(f"# {line}" for line in textwrap.wrap(" ".join(text.split()), 96))
