"""The autocast atlas read back: op x (environment, dtype), from the records of
scenarios/test_autocast_atlas.py (its `op/<name>` metrics, harness.lab.autocast.docs.CODES, and
its params `autocast_dtype` and `mismatched_ops`; its `holds/<op>` key metrics are for
`compare`), each cell marked where the measurement and the documented list of that
environment's torch release disagree.

The report builds a column from each environment's latest atlas run (MLflow); `amp-harness
baseline changes` lists, per hardware and dtype, the ops whose measured behaviour or documented
list changed between the releases of the committed baselines.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.common import shown
from harness.lab.autocast import docs as autocast_docs

ATLAS_MODULE = "test_autocast_atlas.py::"
COMPILED_ATLAS_MODULE = "test_compiled_atlas.py::"  # the same ops compiled, held to eager
PREFIX = "op/"
HOLDS = "holds/"  # its key metrics, one per op: 1 where the op held to its documented list


@dataclass
class Column:
    label: str  # the environment, and the autocast dtype: "cpu x86_64 / torch 2.13.0+cpu: bfloat16"
    device: str  # cpu, cuda
    torch: str
    behaviours: dict[str, str]  # op -> what it measured: "lower", "float32", "input", ...
    mismatched: frozenset[str]  # the ops the scenario found disagreeing with `against`
    against: str = "documented"  # what a mismatch is held to: the docs, or eager (compiled)


@dataclass
class Cell:
    measured: str
    documented: str  # the list of that release's docs for that device ("no list" for none)
    differs: bool
    against: str = "documented"  # the column's: "documented" or "eager"


@dataclass
class Table:
    columns: list[Column]
    rows: list[tuple[str, list[Cell | None]]]  # op, a cell per column (None: not measured there)

    def disagreeing(self) -> list[tuple[str, list[Cell | None]]]:
        return [(op, cells) for op, cells in self.rows if any(c and c.differs for c in cells)]


def is_atlas_test(test: str) -> bool:
    """The eager atlas's tests and the compiled atlas's: each a column of the table."""
    return ATLAS_MODULE in test or COMPILED_ATLAS_MODULE in test


def per_claim(test: str, key_metrics: dict[str, float]) -> dict[str, float]:
    """A test's key metrics as the ledger and the changes page hold them against each of its
    claims: an atlas test's per-op ones are left to the atlas table, which shows each op with
    its documented list (five claims' rows each listing the same ops would say less). `compare`
    keeps them: a gate names the op that stopped holding even where the verdict stays partly.
    The compiled atlas's stay with its claim: a value that stopped matching eager's changes no
    behaviour the table shows."""
    if ATLAS_MODULE not in test:
        return key_metrics
    return {name: value for name, value in key_metrics.items() if not name.startswith(HOLDS)}


def behaviours(metrics: dict[str, float]) -> dict[str, str]:
    """op -> behaviour, from a record's `op/<name>` metrics."""
    return {
        name.removeprefix(PREFIX): autocast_docs.BEHAVIOURS.get(int(value), "?")
        for name, value in metrics.items()
        if name.startswith(PREFIX) and value == value  # NaN: nothing measured
    }


def column(label: str, device: str, torch: str, metrics: dict, params: dict) -> Column:
    mismatched = frozenset(filter(None, params.get("mismatched_ops", "").split(",")))
    against = "eager" if params.get("compiled_backend") else "documented"
    return Column(label, device, torch, behaviours(metrics), mismatched, against)


def table(columns: list[Column]) -> Table:
    """The atlas across `columns`: ops disagreeing anywhere first, then the rest, by name."""
    docs = [autocast_docs.documented(c.device, c.torch) for c in columns]
    ops = sorted({op for c in columns for op in c.behaviours})
    rows = []
    for op in ops:
        cells = [
            Cell(
                c.behaviours[op],
                autocast_docs.listed(op, doc, c.device),
                op in c.mismatched,
                c.against,
            )
            if op in c.behaviours
            else None
            for c, doc in zip(columns, docs, strict=True)
        ]
        rows.append((op, cells))
    rows.sort(key=lambda row: not any(c and c.differs for c in row[1]))
    return Table(columns, rows)


def cell_text(cell: Cell | None) -> str:
    if cell is None:
        return "not measured"
    if not cell.differs:
        return cell.measured
    if cell.against == "eager":
        return f"{cell.measured}, ≠ eager"
    return f"{cell.measured} ≠ documented {cell.documented}"


def markdown(atlas: Table) -> list[str]:
    """The ops that disagree somewhere, as a Markdown table (summary.md); the agreeing ones
    counted."""
    if not atlas.columns:
        return ["No atlas run (scenarios/test_autocast_atlas.py) in these environments."]
    wrong = atlas.disagreeing()
    lines = [
        f"{len(atlas.rows)} ops measured; {len(wrong)} disagree with their release's "
        "documentation (or, compiled, with eager) somewhere, the others agree everywhere they "
        "ran.",
    ]
    if wrong:
        header = ["op", *(c.label for c in atlas.columns)]
        lines += ["", _row(header), "|---" * len(header) + "|"]
        lines += [_row([op, *(cell_text(c) for c in cells)]) for op, cells in wrong]
    return lines


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(shown.markdown(c) for c in cells) + " |"  # labels are data


def changes(
    columns: list[Column], documented: bool = True
) -> list[tuple[str, list[tuple[str, str]], list[tuple[str, str]]]]:
    """Across the releases of one hardware and dtype (columns in release order): each op whose
    measured behaviour (or, with `documented`, its documented list) differs, with (torch, value)
    for each release."""
    found = []
    for op in sorted({op for c in columns for op in c.behaviours}):
        measured = [(c.torch, c.behaviours[op]) for c in columns if op in c.behaviours]
        listed = [
            (
                c.torch,
                autocast_docs.listed(op, autocast_docs.documented(c.device, c.torch), c.device),
            )
            for c in columns
        ]
        moved = len({v for _t, v in measured}) > 1
        if moved or (documented and len({v for _t, v in listed}) > 1):
            found.append((op, measured, listed))
    return found
