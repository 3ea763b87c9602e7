"""The ledger: what the report shows, as a model (never the scenarios, never the journal).

A `Ledger` holds every claim of the catalogue x every environment found (its `rows`, a `Cell` per
column, an `Entry` per test), the claims run without a verdict apart from those no test has run,
the sessions marked experimental apart, the differences between environments, the autocast
atlas's columns, each class's history, the saved diagnoses and the capability regressions.
harness.reports.ledger_read reads it from MLflow (through ledger_sessions, ledger_columns and
ledger_history); harness.reports.report renders it. Apart from both: the model imports neither
MLflow nor the page, so that each side reads it alone.

A comparison of two sessions, one session each, is harness.reports.compare's job, not the ledger's.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from harness.catalogue import verdicts
from harness.records import environments as envs  # not `environments`: the ledger's columns
from harness.reports import atlas, differences, history

# Colours per kind of entry (a verdict that stands, or what voided it), shared by the HTML (CSS
# classes) and the overview figure.
COLOURS = {
    "confirmed": "#2e7d32",
    "refuted": "#c62828",
    "partly": "#ef8f00",
    "inconclusive": "#7b1fa2",
    "skipped": "#9e9e9e",
    verdicts.CANNOT_COMPILE: "#0277bd",  # about the compiler, not the claim: apart from both
    "failed": "#37474f",
    "capability-regression": "#b71c1c",
}
MIXED = "mixed"  # how a claim's verdict is drawn where its tests disagree: no colour of its own


# The facts a column's header shows where its sessions recorded them (harness.lab.machine):
# what decides the kernels (instruction sets, oneDNN's in force, what held it there, the
# libraries) and what describes the machine.
MACHINE_FACTS = {
    "cpu.model": "CPU",
    "cpu.instructions": "instructions",
    "cpu.onednn_isa": "oneDNN ISA",
    "cpu.held_by": "held by",
    "onednn": "oneDNN",
    "mkl": "MKL",
    "gpu.memory_gib": "GPU GiB",
    "gpu.mig": "MIG",
    "gpu.max_sm_clock_mhz": "max SM MHz",
    "gpu.max_memory_clock_mhz": "max memory MHz",
    "cublas": "cuBLAS",
    "cublaslt": "cuBLASLt",
}


@dataclass
class Session:
    """A session a ledger column draws from."""

    name: str
    url: str | None  # its parent run, when MLflow has one
    started: float  # seconds since the epoch
    commit: str  # the git commit it ran ("-dirty": with uncommitted edits)
    incomplete: str  # why it is incomplete, with its test count; "" if complete
    runs: list = field(default_factory=list, repr=False)  # the MLflow runs of its tests
    facts: dict[str, str] = field(default_factory=dict, repr=False)  # all its env.* facts
    shown: int = 0  # how many of the column's tests come from it
    age: str = ""  # "3 h ago", when the report was built
    experimental: str | None = None  # why it is marked experimental; None: of record
    id: str = ""  # its amp.session_id

    @property
    def when(self) -> str:
        return when(self.started)


@dataclass
class Entry:
    """One test's verdict on one claim, as it counts (harness.catalogue.verdicts), with the
    session it came from and the link to its MLflow run."""

    claim: str
    verdict: str  # the status's label: "partly", "failed (was: partly)", "skipped", ...
    kind: str  # a COLOURS key: the verdict that stands, or what voided it
    evidence: str
    test: str  # pytest node id
    url: str
    session: Session


@dataclass
class Cell:
    """One claim in one environment: its verdict across the tests (None: not run), and each
    test's entry."""

    verdict: verdicts.ClaimVerdict | None
    entries: list[Entry]


@dataclass
class Environment:
    """One ledger column: an environment, per test its latest run (harness.reports.ledger_columns
    says which)."""

    # The facts that make it (harness.records.environments.identity), without "env.".
    facts: dict[str, str]
    label: str
    sessions: list[Session]  # since its latest complete session, newest first
    tests: list = field(default_factory=list)  # the MLflow run shown for each test
    session_of: dict[str, Session] = field(default_factory=dict)  # run id -> its session

    @property
    def hardware_class(self) -> str:
        return envs.hardware_class(self.facts)

    @property
    def legacy(self) -> bool:
        """Its class is only a name: recorded before hardware classes."""
        return envs.is_legacy(self.facts)

    @property
    def machine(self) -> list[tuple[str, str]]:
        """(what, value) of each MACHINE_FACTS fact its sessions recorded; the values of all
        its sessions where runners of one class differ (another CPU model)."""
        found = []
        for name, what in MACHINE_FACTS.items():
            values = dict.fromkeys(envs.fact(s.facts, name) for s in self.sessions)
            values.pop("n/a", None)
            if values:
                found.append((what, " / ".join(values)))
        return found


@dataclass
class Ledger:
    """What one experiment's runs say, as the report shows it (ledger_read.read)."""

    built: float  # when it was read, seconds since the epoch: the sessions' ages count from it
    ui: str  # the MLflow UI its links point into (harness.reports.ledger_read)
    runs_url: str  # the experiment's runs in that UI, by claim where the experiment holds that view
    view: str | None
    environments: list[Environment]  # the columns
    experimental: list[tuple[str, Session]]  # (its environment's label, the session), newest first
    rows: list[tuple]  # (claim, a Cell per column), for each claim of the catalogue
    differences: dict[str, differences.Difference]  # by claim id, between the columns
    atlas: atlas.Table  # the autocast atlas of the columns
    history: list[history.ClassHistory]
    history_rows: list[tuple]  # (claim, its track per class)
    uncovered: list[tuple[str, str, str]]  # (claim, statement, why): no test has run it
    undecided: list[tuple[str, str, str]]  # its tests ran and decided nothing
    diagnoses: list[dict]
    regressions: list[list[tuple[str, str, str]]]  # per column (ledger_columns)
    unknown: list[str]  # verdict tags of claims the catalogue no longer has
    classes: list[tuple[str, int, bool]]  # the hardware classes, in column order

    @property
    def counts(self) -> list[Counter]:
        """Per column, how many entries of each kind (a COLOURS key) its cells hold."""
        return [
            Counter(e.kind for _claim, cells in self.rows for e in cells[i].entries)
            for i in range(len(self.environments))
        ]


def kind(status: verdicts.Status) -> str:
    """Its COLOURS key: the verdict that stands, or what voided it."""
    if status.stands:
        return status.label
    return {verdicts.REGRESSION: "capability-regression"}.get(status.kind, status.kind)


def when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


def ago(seconds: float) -> str:
    """How long ago, in the largest unit that keeps it a whole number above 0."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return "just now"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"
