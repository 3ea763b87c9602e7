"""Negative controls: what a "negative control" marker marks, and whether an assertion reaches it.

The part of the scenario contract (harness/catalogue/contract.py) that reads data flow: each test
must have a negative control, asserted. Like the rest of `amp-harness validate` it reads the `ast`
of the scenario file: no scenario is imported.

A comment saying "negative control" (the convention: `# Negative control: ...`) marks the
statement it stands on, or else the paragraph under it (up to a blank line, a comment or the end
of the block); a docstring (or a comment on the `def` line) marks the whole function or class.
The control is asserted when the marked statements hold an assertion (`assert`,
`pytest.raises`/`warns`, an `assert_*` call, a helper that asserts), or when an assertion uses a
name they bind or a value computed from one (followed through assignments, loops and `with`, into
helpers the value is passed to, and out of functions that return it, up to the test). A marked
helper the test calls is the test's control, as is every marker inside the test: each must be
asserted. Controls marked further down the helpers count against a test only when none of its
controls is asserted.

The data flow over-approximates, as the helpers a test reaches do (scenario_source.py): a name
computed from a control counts whole (`runs` holds the control if `runs["plain"]` does). A static
check must not cry wolf.

The AST walkers the whole contract needs (`walk`, `call_name`) live here, and scenario_source.py
and contract.py import them from here: this module imports nothing of the harness, so there is no
cycle.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass

_CONTROL = re.compile(r"negative control", re.IGNORECASE)

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# `with pytest.raises(...)`, `pytest.warns`, `pytest.deprecated_call`: the block is an assertion.
_ASSERTING_CONTEXTS = {"raises", "warns", "deprecated_call"}


@dataclass(frozen=True)
class Control:
    """One "negative control" marker, in a test or a helper it reaches."""

    line: int  # the comment's line, or the docstring-marked function's
    root: ast.AST  # the test, or the module-level helper (function, class, method) holding it
    statements: list[ast.stmt]  # what the marker marks ([] for a helper marked as a whole)
    helper: ast.AST | None  # the function or class whose docstring (or `def` line) marks it

    def problem(self) -> tuple[str, str]:
        """What is wrong with this control when nothing asserts it, and the fix."""
        if self.helper is self.root:
            name = self.root.name
            return (
                f"negative control computed but never asserted: `{name}()` (line {self.line})",
                f"assert the control's predicted behaviour on what `{name}(...)` returns (bind "
                f"it to a name in the test), or inside `{name}` itself",
            )
        if not self.statements:
            return (
                f"negative control (line {self.line}) marks no statement",
                '"# Negative control: ..." goes directly above the statements that run the '
                "control; then assert their predicted behaviour",
            )
        names = _bound(self.statements, _assigned(self.root))
        what = ", ".join(f"`{n}`" for n in names) or "nothing kept in a name"
        line = _first_line(self.statements[0])
        return (
            f"negative control computed but never asserted: {what} (line {line})",
            "assert the predicted behaviour of the control (an `assert` that uses "
            f"{'one of these names' if names else 'its result, kept in a name'}, or a value "
            "computed from one); or move the comment above the statements that are the control",
        )


class Controls:
    """The negative controls of one scenario module: where they are marked, and whether an
    assertion reaches each. `defs` are the module's top-level functions and classes: a helper is
    called by its name, a method by its attribute."""

    def __init__(self, source: str, defs: dict[str, ast.AST]):
        self.lines = source.splitlines()
        self.defs = defs
        self.flows: dict[int, _Flow] = {}  # per function, the names bound and the assertions
        self.comments = [
            (token.start[0], token.string)
            for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT
        ]

    def find(self, roots: list[ast.AST]) -> list[Control]:
        """Every negative control marked in `roots` (a test and the helpers it reaches): each
        comment saying "negative control", and each function or class whose docstring says it."""
        found: dict[object, Control] = {}
        for line, text in self.comments:
            holders = [r for r in roots if r.lineno <= line <= self._end(r)]
            if not _CONTROL.search(text) or not holders:
                continue
            root = min(holders, key=lambda r: self._end(r) - r.lineno)  # a method, not its class
            inline = not self.lines[line - 1].lstrip().startswith("#")
            if inline and isinstance(root, _DEFS) and line < _first_line(root.body[0]):
                found[id(root)] = Control(line, root, [], root)  # on the `def` line: all of it
            else:
                found[line] = Control(line, root, self._marked(root, line), None)
        # Docstrings: the roots' own first, so that a method reached by its name is a helper
        # of its own rather than a def inside its class.
        for node, root in [(r, r) for r in roots] + [(n, r) for r in roots for n in walk(r)]:
            if isinstance(node, _DEFS) and _CONTROL.search(ast.get_docstring(node) or ""):
                statements = [] if node is root else [node]
                found.setdefault(id(node), Control(node.lineno, root, statements, node))
        return sorted(found.values(), key=lambda c: c.line)

    def _marked(self, root: ast.AST, line: int) -> list[ast.stmt]:
        """The statements a comment at `line` marks: the statement it stands on (or inside);
        else the paragraph under it, up to a blank line, a comment or the end of the block."""
        statements = [n for n in walk(root) if isinstance(n, ast.stmt) and n is not root]
        around = [
            s
            for s in statements
            if _first_line(s) <= line <= s.end_lineno and (line == s.lineno or not _blocks(s))
        ]
        if around:
            return [max(around, key=lambda s: s.lineno)]
        after = [s for s in statements if _first_line(s) > line]
        if not after:
            return []
        # The next statement; of a block and its first statement on one line, the block.
        first = min(after, key=lambda s: (_first_line(s), -s.end_lineno))
        block = next(b for n in walk(root) for b in _blocks(n) if any(s is first for s in b))
        paragraph = [first]
        for following in block[next(i for i, s in enumerate(block) if s is first) + 1 :]:
            between = self.lines[paragraph[-1].end_lineno : _first_line(following) - 1]
            if any(not text.strip() or text.lstrip().startswith("#") for text in between):
                break
            paragraph.append(following)
        return paragraph

    def unasserted(
        self, test: ast.AST, controls: list[Control], roots: list[ast.AST]
    ) -> list[Control]:
        """The controls of `controls` (all of them found in `roots`, the test and the helpers it
        reaches) that count against `test` because no assertion reaches them."""
        asserted = {id(c): self.asserted(c, roots) for c in controls}
        # The test's own controls (marked in it, or a marked helper it calls by name) must each
        # be asserted. A marked helper reached further down may serve other tests: it counts
        # against this one only when no control of the test is asserted at all.
        marked = [c for c in controls if c.root is test]
        marked_statements = [s for c in marked for s in c.statements]
        own = marked + [
            c  # a marked helper the test calls, unless through a statement marked itself
            for c in controls
            if c.helper is c.root
            and _uses(test, set(), self._names_of(c.root))
            and not any(_uses(s, set(), self._names_of(c.root)) for s in marked_statements)
        ]
        if own or not any(asserted.values()):
            return [c for c in own or controls if not asserted[id(c)]]
        return []

    def asserted(self, control: Control, roots: list[ast.AST]) -> bool:
        """Whether an assertion checks `control`: one among its statements; or one that uses a
        name they bind, or a value computed from it, in the same function; or, when the function
        returns such a value (or is the docstring-marked helper), one in a function that binds
        what it returns, followed the same way up to the test."""
        # Passing the control to a helper of this test that asserts asserts it.
        asserting = _Names()
        for helper in roots:
            if self._flow(helper).has_assertion:
                asserting |= self._names_of(helper)
        if control.helper is control.root:
            if self._flow(control.root).has_assertion:
                return True  # the helper checks its own control
            sources = self._names_of(control.root)
        else:
            if any(
                _has_assertion(s) or _calls(s, asserting) for s in control.statements
            ):  # the marked statements assert, or call a helper that does: `zero.check()`
                return True
            flow = self._flow(control.root)
            tainted = flow.taint(set(_bound(control.statements, flow.assigned)), _Names())
            if flow.asserts(tainted, _Names(), asserting - self._names_of(control.root)):
                return True
            if not flow.returns(tainted, _Names()):
                return False
            sources = self._names_of(control.root)
        while True:  # the functions whose results carry the control, up to the test
            grown = False
            for root in roots:
                flow = self._flow(root)
                if not _uses(root, set(), sources):
                    continue
                tainted = flow.taint(set(), sources)
                if flow.asserts(tainted, sources, asserting - self._names_of(root)):
                    return True
                names = self._names_of(root)
                if flow.returns(tainted, sources) and not names <= sources:
                    sources, grown = sources | names, True
            if not grown:
                return False

    def _flow(self, root: ast.AST) -> _Flow:
        if id(root) not in self.flows:
            self.flows[id(root)] = _Flow(root)
        return self.flows[id(root)]

    def _names_of(self, root: ast.AST) -> _Names:
        """How other functions refer to `root`: by name, or by attribute for a method."""
        if self.defs.get(getattr(root, "name", None)) is root:
            return _Names(frozenset({root.name}))
        return _Names(attrs=frozenset({getattr(root, "name", "")}))

    def _end(self, node: ast.AST) -> int:
        """The last line of `node`, counting the comments indented under it that follow its
        last statement (ast ends a function at its last statement)."""
        end = node.end_lineno
        while end < len(self.lines):
            text = self.lines[end]
            indent = len(text) - len(text.lstrip())
            if text.strip() and not (text.lstrip().startswith("#") and indent > node.col_offset):
                break
            end += 1
        return end


@dataclass(frozen=True)
class _Names:
    """Functions whose result carries a control: module-level ones by name, methods by
    attribute (`comparison.control()`)."""

    names: frozenset[str] = frozenset()
    attrs: frozenset[str] = frozenset()

    def __or__(self, other: _Names) -> _Names:
        return _Names(self.names | other.names, self.attrs | other.attrs)

    def __sub__(self, other: _Names) -> _Names:
        return _Names(self.names - other.names, self.attrs - other.attrs)

    def __le__(self, other: _Names) -> bool:
        return self.names <= other.names and self.attrs <= other.attrs


class _Flow:
    """Which names of one function hold a value computed from a control, and whether an
    assertion, a return or a call to an asserting helper uses them. Over-approximates (a name
    computed from a control counts whole): a static check must not cry wolf."""

    def __init__(self, root: ast.AST):
        self.root = root
        self.assigned = _assigned(root)
        self.sites = [(targets, values) for _, targets, values in _bindings(root, self.assigned)]
        self.has_assertion = _has_assertion(root)

    def taint(self, seeds: set[str], sources: _Names) -> set[str]:
        tainted, grown = set(seeds), True
        while grown:
            grown = False
            for targets, values in self.sites:
                if not tainted.issuperset(targets) and any(
                    _uses(v, tainted, sources) for v in values
                ):
                    tainted.update(targets)
                    grown = True
        return tainted

    def asserts(self, tainted: set[str], sources: _Names, asserting: _Names) -> bool:
        for node in walk(self.root):
            if isinstance(node, ast.Assert):
                used = not cannot_fail(node.test) and _uses(node.test, tainted, sources)
            elif isinstance(node, ast.With | ast.AsyncWith) and _asserting_block(node):
                used = _uses(node, tainted, sources)
            elif isinstance(node, ast.Call) and (
                call_name(node).startswith("assert") or _refers(node.func, asserting)
            ):
                used = _uses(node, tainted, sources)  # an argument, or the receiver: plain.check()
            elif isinstance(node, ast.If):  # if not ok: pytest.fail(...) / raise AssertionError
                used = _uses(node.test, tainted, sources) and any(
                    isinstance(n, ast.Raise) or call_name(n) == "fail"
                    for s in node.body
                    for n in walk(s)
                )
            else:
                continue
            if used:
                return True
        return False

    def returns(self, tainted: set[str], sources: _Names) -> bool:
        return any(
            isinstance(node, ast.Return | ast.Yield | ast.YieldFrom)
            and node.value is not None
            and _uses(node.value, tainted, sources)
            for node in walk(self.root)
        )


def _bindings(
    root: ast.AST, assigned: set[str]
) -> Iterator[tuple[ast.AST, list[str], list[ast.AST]]]:
    """(where, names bound, what they are computed from) at every binding in `root`, in source
    order. A comprehension's own names are left out: they live inside it."""
    sites = []
    for node in walk(root):
        if isinstance(node, ast.Assign):
            sites.append((node, [n for t in node.targets for n in _targets(t)], [node.value]))
        elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.NamedExpr):
            if node.value is not None:
                sites.append((node, _targets(node.target), [node.value]))
        elif isinstance(node, ast.For | ast.AsyncFor):
            sites.append((node, _targets(node.target), [node.iter]))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            sites.append((node.optional_vars, _targets(node.optional_vars), [node.context_expr]))
        elif isinstance(node, _DEFS) and node is not root:
            sites.append((node, [node.name], [node]))  # a closure over the control
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            # results.append(plain): the receiver, a local variable, now holds the control (not
            # a parameter: record.metric(plain=...) puts nothing into the test's values).
            receiver = _root_name(node.value.func)
            if receiver in assigned and isinstance(node.value.func, ast.Attribute):
                sites.append((node, [receiver], _call_arguments(node.value)))
    for node, targets, values in sorted(sites, key=lambda site: _position(site[0])):
        yield node, [n for n in targets if n != "_"], values


def _position(node: ast.AST) -> tuple[int, int]:
    return node.lineno, node.col_offset


def _assigned(root: ast.AST) -> set[str]:
    """The names `root` assigns (its parameters left out)."""
    return {n.id for n in walk(root) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _bound(statements: list[ast.stmt], assigned: set[str]) -> list[str]:
    """The names the statements compute, in source order: a `def` its own name only, a `for`
    loop what its body assigns (its loop variable is a name reused all over a test; a loop that
    checks the control asserts inside it)."""
    names: dict[str, None] = {}
    for statement in statements:
        if isinstance(statement, _DEFS):
            names[statement.name] = None
            continue
        for node, targets, _ in _bindings(statement, assigned):
            if not isinstance(node, ast.For | ast.AsyncFor):
                names.update(dict.fromkeys(targets))
    return list(names)


def _targets(target: ast.expr) -> list[str]:
    """The names an assignment target binds or changes (`d[k] = v` changes `d`), in order."""
    if isinstance(target, ast.Tuple | ast.List):
        return [n for e in target.elts for n in _targets(e)]
    if isinstance(target, ast.Starred):
        return _targets(target.value)
    name = _root_name(target)
    return [name] if name else []


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _uses(node: ast.AST, tainted: set[str], sources: _Names) -> bool:
    """Whether `node` reads a tainted name or calls a source. A comprehension's own variables
    are not the names they shadow: `{std: f(std) for std in STDS}` reads no `std` of the test."""
    walked = walk(node)
    own = {n for c in walked if isinstance(c, ast.comprehension) for n in _targets(c.target)}
    return any(
        (isinstance(n, ast.Name) and n.id not in own and (n.id in tainted or n.id in sources.names))
        or (isinstance(n, ast.Attribute) and n.attr in sources.attrs)
        for n in walked
    )


def _refers(node: ast.expr, names: _Names) -> bool:
    return (isinstance(node, ast.Name) and node.id in names.names) or (
        isinstance(node, ast.Attribute) and node.attr in names.attrs
    )


def _calls(root: ast.AST, names: _Names) -> bool:
    return any(isinstance(n, ast.Call) and _refers(n.func, names) for n in walk(root))


def _has_assertion(root: ast.AST) -> bool:
    return any(
        (isinstance(n, ast.Assert) and not cannot_fail(n.test))
        or (isinstance(n, ast.With | ast.AsyncWith) and _asserting_block(n))
        or (isinstance(n, ast.Call) and call_name(n).startswith("assert"))
        or (isinstance(n, ast.Call) and call_name(n) == "fail")
        for n in walk(root)
    )


def _asserting_block(node: ast.With | ast.AsyncWith) -> bool:
    return any(
        isinstance(i.context_expr, ast.Call) and call_name(i.context_expr) in _ASSERTING_CONTEXTS
        for i in node.items
    )


def _call_arguments(call: ast.Call) -> list[ast.expr]:
    return [*call.args, *(k.value for k in call.keywords)]


def _first_line(node: ast.stmt) -> int:
    """A statement's first line, its decorators included."""
    return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])


def _blocks(node: ast.AST) -> list[list[ast.stmt]]:
    """The statement lists directly in `node`: body, orelse, finalbody (an `except` clause's
    body is its handler's own)."""
    return [
        value
        for _, value in ast.iter_fields(node)
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt)
    ]


# --- assertions that cannot fail ------------------------------------------------------------------

_ALWAYS = (ast.Eq, ast.Is, ast.LtE, ast.GtE)  # x OP x holds for any x (NaN aside)
_NEVER_NEGATIVE = {"len", "abs"}  # len(x) >= 0, abs(x) >= 0 hold for any x


def cannot_fail(test: ast.expr) -> str | None:
    """Why an `assert test` holds whatever was measured, or None: a true constant, a value
    compared with itself (`x == x`), `len(x) >= 0`, or an `or` with such a part. Such an
    assertion asserts nothing: it never counts as checking a control, and validate reports it."""
    if isinstance(test, ast.Constant):
        return "a constant" if test.value else None
    if isinstance(test, ast.BoolOp):
        parts = [cannot_fail(v) for v in test.values]
        holds = any(parts) if isinstance(test.op, ast.Or) else all(parts)
        return next(p for p in parts if p) if holds else None
    if not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return None
    (op,), left, (right,) = test.ops, test.left, test.comparators
    if isinstance(op, _ALWAYS) and ast.dump(left) == ast.dump(right):
        return "a value compared with itself"
    # len(x) >= 0, len(x) > -1, 0 <= len(x)
    if isinstance(op, ast.Lt | ast.LtE):
        op, left, right = (ast.Gt() if isinstance(op, ast.Lt) else ast.GtE()), right, left
    bound = right.value if isinstance(right, ast.Constant) else None
    if isinstance(right, ast.UnaryOp) and isinstance(right.operand, ast.Constant):
        bound = -right.operand.value if isinstance(right.op, ast.USub) else None
    if (
        call_name(left) in _NEVER_NEGATIVE
        and isinstance(bound, int | float)
        and (bound < 0 or (bound == 0 and isinstance(op, ast.GtE)))
    ):
        return f"{call_name(left)}(...) is never negative"
    return None


# --- AST walkers, shared with scenario_source.py and contract.py ----------------------------------


def walk(node: ast.AST) -> list[ast.AST]:
    """`ast.walk(node)`, kept on the node: every test walks the same helpers again and again,
    and validate must stay well under a second."""
    walked = getattr(node, "_harness_walk", None)
    if walked is None:
        walked = node._harness_walk = list(ast.walk(node))
    return walked


def call_name(node: ast.AST) -> str:
    """`f` for f(...) and x.y.f(...); "" for anything else."""
    func = node.func if isinstance(node, ast.Call) else None
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else ""
