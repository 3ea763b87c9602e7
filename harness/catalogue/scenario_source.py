"""A scenario file read from its source with `ast`, never imported: its tests, the claims each
declares, the helpers each may run and the verdicts they record.

Claims are read from the `claim` markers of a test, its class or the module (`pytestmark`),
written as strings or module-level names bound to them (CLAIM = "FMT-BITS"). Claims that only
exist once pytest has collected the module (`pytest.param(..., marks=...)`, markers built by a
function or kept in a variable) read as None here: collected_claims.py reads them. One
exception, by construction: scenarios/test_known_bugs.py's test claims the built-in known-bug
ledger's IDs, a case each.

"A helper the test refers to" is any function or class of the same module whose name the test
uses (called, or passed on as `run_ranks(rank_experiments, ...)` does), followed transitively,
plus every method of the module's classes whose name appears as an attribute
(`comparison.log(...)`). That over-approximates what runs, on purpose: a static check must not
cry wolf, and the plugin still checks the verdicts of every test that runs. Fixtures are not
followed: a module-scoped fixture serves several tests, and its control is none of them in
particular.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.catalogue import known_bugs
from harness.catalogue.controls import Controls, call_name, walk
from harness.common.errors import HarnessError


@dataclass(frozen=True)
class DeclaredClaim:
    id: str
    line: int  # where the ID is written


@dataclass
class ScenarioTest:
    name: str  # "test_x", or "TestY.test_x" inside a test class
    node: ast.FunctionDef | ast.AsyncFunctionDef
    claims: list[DeclaredClaim] | None  # None: not readable without collecting the module


class ScenarioModule:
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
                target, value = node.targets[0], strings(node.value)
                if isinstance(target, ast.Name) and value is not None:
                    self.constants[target.id] = value
                    if isinstance(node.value, ast.Constant):
                        self.texts.add(target.id)

    def tests(self) -> Iterator[ScenarioTest]:
        module_claims = self._pytestmark(self.tree.body)
        for node in self.tree.body:
            if _is_test(node):
                claims = _join(module_claims, self._marks(node.decorator_list))
                if not claims and (self.path.name, node.name) == known_bugs.SCENARIO:
                    # Parametrized over the built-in ledger, a case an entry: its claims are
                    # the ledger's IDs by construction, read here without collecting it.
                    claims = [DeclaredClaim(bug, node.lineno) for bug in known_bugs.builtin()]
                yield ScenarioTest(node.name, node, claims)
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                class_claims = _join(
                    module_claims,
                    self._marks(node.decorator_list),
                    self._pytestmark(node.body),
                )
                for method in node.body:
                    if _is_test(method):
                        claims = _join(class_claims, self._marks(method.decorator_list))
                        yield ScenarioTest(f"{node.name}.{method.name}", method, claims)

    def requirements(self) -> Iterator[tuple[str, int]]:
        """Each name of a `pytest.mark.requires(...)` of the module (in a decorator, a
        pytestmark or a pytest.param) with its line, in line order."""
        marks = [n for n in ast.walk(self.tree) if isinstance(n, ast.Call)]
        for node in sorted(marks, key=lambda n: n.lineno):
            if _mark_name(node.func) == "requires":
                for arg in node.args:
                    for name in strings(arg) or []:
                        yield name, arg.lineno

    def _pytestmark(self, body: list[ast.stmt]) -> list[DeclaredClaim] | None:
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

    def _marks(self, marks: list[ast.expr]) -> list[DeclaredClaim] | None:
        """The claim IDs these marker expressions declare; None when only pytest can tell."""
        claims: list[DeclaredClaim] = []
        for mark in marks:
            call = mark if isinstance(mark, ast.Call) else None
            name = _mark_name(call.func if call else mark)
            if name == "claim" and call is not None:
                for arg in call.args:
                    ids = self.ids(arg.value if isinstance(arg, ast.Starred) else arg)
                    if ids is None:
                        return None
                    claims += [DeclaredClaim(i, arg.lineno) for i in ids]
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

    def ids(self, node: ast.expr) -> list[str] | None:
        """The claim IDs `node` names: strings, or a module-level name bound to them; None for
        anything else."""
        if isinstance(node, ast.Name):
            return self.constants.get(node.id)
        return strings(node)

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
        """Claim IDs passed first to `.verdict(...)` or `.known_bug(...)` (a known bug's
        verdict); None when one of them is computed."""
        ids: set[str] = set()
        for node in (n for root in nodes for n in walk(root)):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("verdict", "known_bug")
            ):
                continue
            first = (
                node.args[0]
                if node.args
                else next((k.value for k in node.keywords if k.arg in ("claim", "bug")), None)
            )
            found = self.ids(first) if first is not None else None
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
                verdict, evidence = argument(node, 1, "verdict"), argument(node, 2, "evidence")
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


def claimed_tests(folder: Path) -> dict[str, list[str]] | None:
    """Each claim ID with the tests that declare it, as pytest names them from the current
    folder (without parametrization ids), read from the files without importing them: no torch,
    so `amp-harness list` answers at once. None where a file cannot be read that way (a syntax
    error, markers built at run time): collect it with pytest instead."""
    found: dict[str, list[str]] = {}
    for path in sorted(Path(folder).glob("test_*.py")):
        try:
            tests = list(ScenarioModule(path).tests())
        except (SyntaxError, UnicodeDecodeError):
            return None
        if any(test.claims is None for test in tests):
            return None
        where = Path(os.path.relpath(path.resolve(), Path.cwd())).as_posix()
        for test in tests:
            for claim in dict.fromkeys(c.id for c in test.claims):
                found.setdefault(claim, []).append(f"{where}::{test.name.replace('.', '::')}")
    return found


def scenario_folder(folder: Path) -> Path:
    """`folder`, where `validate` and `new` find the scenario files; refused when it is none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise HarnessError(
            f"no scenario folder {str(folder)!r} here: run from the repository root or pass "
            "--scenarios DIR"
        )
    return folder


def argument(call: ast.Call, index: int, keyword: str) -> ast.expr | None:
    """The argument of `call` at position `index`, else the one passed as `keyword`."""
    if len(call.args) > index:
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def strings(node: ast.expr) -> list[str] | None:
    """The strings `node` writes: "A", or ("A", "B"); None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List):
        items = [strings(e) for e in node.elts]
        if all(i is not None and len(i) == 1 for i in items):
            return [i[0] for i in items]
    return None


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


def _join(*parts: list[DeclaredClaim] | None) -> list[DeclaredClaim] | None:
    if any(p is None for p in parts):
        return None
    return [claim for part in parts for claim in part]
