"""The floors of `harness/` (docs/architecture.md), held from the imports of its source.

Each layer imports only the layers below it: common at the bottom, catalogue and lab beside each
other above it (neither imports the other), records above both, reports above records, and the
two faces (`harness/cli/`, `harness/plugin/`) on top. Inside a layer modules may import each
other, but no module imports itself back through others: there is no circle anywhere. Every
import counts, a function's own included: a late import is still an arrow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import harness

ROOT = Path(harness.__file__).parent
FLOOR = {"common": 0, "catalogue": 1, "lab": 1, "records": 2, "reports": 3, "faces": 4}
FACES = ("cli", "plugin")


def layer_of(module: str) -> str:
    """`harness.lab.recipes` -> "lab"; `harness.cli` -> "faces"."""
    parts = module.split(".")
    return "faces" if parts[1] in FACES else parts[1]


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The harness modules `path` imports (each `from harness.x import name` that names a module
    counts as that module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("harness.")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "harness":
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in known else node.module)
    return found - {"harness"}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) for name, path in found.items() if name != "harness"}


def upward_arrows(arrows: dict[str, set[str]]) -> list[str]:
    wrong = []
    for importer, imported in arrows.items():
        for target in imported:
            low, high = layer_of(target), layer_of(importer)
            if low == high:
                continue
            if FLOOR[low] >= FLOOR[high]:
                wrong.append(f"{importer} ({high}) imports {target} ({low})")
    return sorted(wrong)


def circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(arrows.get(node, ())):
            if state.get(target) == "open":
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for node in sorted(arrows):
        if node not in state:
            visit(node, [node])
    return found


def test_every_module_lives_on_a_floor():
    stray = [m for m in modules() if m != "harness" and layer_of(m) not in FLOOR]
    assert stray == [], f"modules outside the floors {sorted(FLOOR)}: {stray}"


def test_each_layer_imports_only_the_layers_below_it():
    assert upward_arrows(graph()) == []


def test_no_module_imports_itself_back():
    assert circles(graph()) == []


def test_the_check_sees_an_upward_arrow_and_a_circle():
    # Negative control: the two rules flag what they exist to flag.
    arrows = {"harness.lab.recipes": {"harness.records.journal"}, "harness.records.journal": set()}
    assert upward_arrows(arrows) == [
        "harness.lab.recipes (lab) imports harness.records.journal (records)"
    ]
    sideways = {"harness.catalogue.claims": {"harness.lab.models"}, "harness.lab.models": set()}
    assert upward_arrows(sideways) != []
    loop = {"harness.lab.a": {"harness.lab.b"}, "harness.lab.b": {"harness.lab.a"}}
    assert circles(loop) == [["harness.lab.a", "harness.lab.b", "harness.lab.a"]]


SCENARIO_SURFACE = ("harness.lab", "harness.records.record")  # the record fixture's type


def outside_the_surface(source: str) -> list[str]:
    found = imports_of(source)
    return sorted(m for m in found if not m.startswith(SCENARIO_SURFACE))


def imports_of(source: str) -> set[str]:
    """The harness modules a scenario's import lines name (the template's placeholders elsewhere
    are not Python, so only its import lines are read)."""
    try:
        tree = ast.parse(source)  # a scenario: imports in parentheses over several lines too
    except SyntaxError:  # the template
        lines = [line for line in source.splitlines() if line.startswith(("from ", "import "))]
        tree = ast.parse("\n".join(lines))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
    return {name for name in found if name.split(".")[0] == "harness"}


def test_scenarios_import_the_lab_and_nothing_else_of_the_harness():
    scenarios = ROOT.parent / "scenarios"
    template = ROOT / "catalogue" / "templates" / "scenario.py.tmpl"
    wrong = {
        path.name: outside_the_surface(path.read_text())
        for path in [*sorted(scenarios.glob("test_*.py")), template]
    }
    assert {name: found for name, found in wrong.items() if found} == {}
    # Negative control: a scenario reaching into the journal is named.
    assert outside_the_surface("from harness.records import journal") == ["harness.records"]
