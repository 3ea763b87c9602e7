"""The report: reads MLflow (never the scenarios, never the journal) and writes reports/<name>/.

- `index.html`: self-contained (styles inline, figures as base64 data URIs; it loads nothing from
  the network), rendered by Jinja2 with autoescape on: every run's text reaches it as text.
- `summary.md`: the same ledger as a markdown table, for a pull request or a wiki page.
- the figures as PNG files: the scenarios' figures and an overview of the verdicts.

What it shows: the verdict ledger (every claim of the catalogue x every environment found),
the claims run without a verdict apart from those no test has run, each scenario's figures
grouped by test, and a comparison passed in by the caller (`comparison=`; harness.reports.compare
builds it).

An environment (a ledger column) is what changes behaviour: the `env.*` facts but the commit,
the harness version and the kernel's release (harness.records.environments.identity). Those are
shown with each entry instead, so that editing a file (a `-dirty` commit) does not split the ledger.
Nor do the facts that only describe the machine (its CPU model, core count, GPU memory, clocks):
the header of a column shows them, with the facts that decide its kernels. The columns are grouped
by hardware class (`cpu-x86-64-avx2`, `NVIDIA-H200`), named above them; where a claim differs
between two classes in a capability its tests depend on (a test run's `depends_on_hardware`
param), its cells are marked as differing with the hardware, and the differences say why.

What a column shows: per test, its latest run from the environment's sessions since its latest
complete session (all its sessions where none is complete), with the session it came from and
its age. A complete session ran the whole suite, so it says which tests exist (a test renamed
or removed before it is gone); a partial run since then (`-k scaler`, a killed session) refines
the column test by test instead of erasing the rest. A test run only partly logged
(`amp.complete=false`: a process killed while it logged) is not shown (`amp-harness sync` logs
it again), and an interrupted run (Ctrl-C) replaces no earlier run of its test: it decided
nothing. The sessions since the latest complete one are listed above the ledger, each with how
many of the column's tests it gives and, when incomplete, why.

When a session is complete. Its parent run ended: status
FINISHED or FAILED (FAILED: a test failed, the session still ran to its end), an end time, the
`tests.*` counts `MlflowSink._end_session` logs at the end, MLflow holds every test those counts
name, and none of them is only partly logged (`amp.complete=false`). Any other session is
incomplete: still RUNNING (killed, crashed, or running now: nothing ended it), KILLED (Ctrl-C,
or ended by `amp-harness sync` as killed, with its `amp.end_reason`), one that ran part of the
suite (`amp.left_out`: -k, a module not run) or ended on pytest's internal or usage error
(`amp.exitstatus` 3 or 4), or lacking tests the tracking server never fully received
(`amp-harness sync` sends them).

A session marked experimental (its runs tagged `amp.experimental=true`: pytest's
--amp-experimental, `amp-harness sessions mark`) is no part of the team's record: none of its runs
is a column's latest, nor counts for the claims covered; its sessions are listed apart, with why,
above the ledger and in summary.md, never left out silently.

A comparison of two sessions, one session each, is harness.reports.compare's job, not the ledger's.

Evidence, failure messages and skip reasons are capped per entry (harness.reports.table.cap): the
numbers stay on the page, and each entry links to its MLflow run, whose record.json holds the
full text. Reading MLflow fails as one HarnessError naming the tracking URI (without its
password) and the fix; every call is bounded by tracking.client's settings (about 10 s against
a server that hangs).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import harness
from harness.catalogue import verdicts
from harness.catalogue.claims import catalogue
from harness.common import filenames, shown
from harness.common.errors import HarnessError
from harness.lab.releases import version_key
from harness.records import environments as envs  # not `environments`: the ledger's columns
from harness.records import record, tracking

# Tags harness.records.tracking writes; runs logged by older versions have none of them.
from harness.records.tracking import (
    COMPLETE,
    DEFAULT_EXPERIMENT,
    END_REASON,
    EXIT_STATUS,
    EXPERIMENTAL,
    EXPERIMENTAL_REASON,
    LEFT_OUT,
)
from harness.reports import atlas, baseline, diagnoses, differences, history, table
from harness.reports.table import PER_CLAIM_AND_TEST, cap

DEFAULT_NAME = "report"  # a fixed name, overwritten by the next build: a stable path to bookmark
EMBEDDED_UI = "http://127.0.0.1:5000"  # what `amp-harness ui` (and `mlflow ui`) serve by default
TEMPLATE = "report.html.j2"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
ENDED = ("FINISHED", "FAILED")  # parent run statuses of a session that ran to its end
# Where an entry's capped text is whole. Not "N more in record.json": the tag read here may
# itself be cut (tracking keeps 5,000 characters of evidence), so N is only what was cut here.
IN_MLFLOW = "cut here; record.json in its MLflow run holds the full text"
# Colours per kind of entry (a verdict that stands, or what voided it), shared by the HTML (CSS
# classes) and the overview figure.
COLOURS = {
    "confirmed": "#2e7d32",
    "refuted": "#c62828",
    "partly": "#ef8f00",
    "inconclusive": "#7b1fa2",
    "skipped": "#9e9e9e",
    "failed": "#37474f",
    "capability-regression": "#b71c1c",
}
MIXED = "mixed"  # how a claim's verdict is drawn where its tests disagree: no colour of its own

Comparison = str | Sequence[Mapping[str, object]] | None

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
HARDWARE_NOTE = "differs with the hardware"


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
        return _when(self.started)


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
    """One ledger column: an environment, per test its latest run (the module docstring)."""

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
class Figure:
    test: str
    name: str  # the artifact's file name
    file: str  # the PNG's name inside the report folder
    data_uri: str


def build(
    tracking_uri: str,
    out: Path,
    experiment: str = DEFAULT_EXPERIMENT,
    comparison: Comparison = None,
) -> Path:
    """Write the report into the folder `out` (replaced whole if it holds an earlier report) and
    return the path of its index.html.

    `comparison` is the hook for harness.reports.compare: a line of text (escaped in summary.md, as
    preformatted text in the HTML: it quotes session names, paths and what was wrong with a
    baseline, all data) or a list of rows (dicts with the same keys), shown as a table.
    """
    out = Path(out)
    _check_target(out)
    ui = _ui(tracking_uri)
    with _reading(tracking_uri, "reading the experiment and its runs"):
        client, experiment_id = _open(tracking_uri, experiment)
        runs = tracking.search_runs(client, experiment_id)
        diagnosed = _diagnoses(client, ui)
        # The test runs of every environment by claim, where the experiment holds that view.
        held = client.get_experiment(experiment_id).tags
        view = tracking.BY_CLAIM if tracking.VIEW_TAG + tracking.BY_CLAIM in held else None
        runs_url = tracking.ui_url(ui, experiment_id, view=view)

    def link(run_id: str) -> str:
        return tracking.ui_url(ui, experiment_id, run_id)

    built = time.time()
    runs, experimental = _apart(runs, link, built)  # the team's record, and the experiments
    environments = _environments(runs, link, built)
    uncovered, undecided = _uncovered(runs)
    ledger = [
        (claim, [_cell(claim.id, env, link) for env in environments])
        for claim in catalogue().values()
    ]
    differ = differences.find(
        (claim.id for claim, _cells in ledger), _columns_compared(environments, ledger)
    )
    autocast_atlas = atlas.table(_atlas_columns(environments))
    timeline = _history(runs, link)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    work.chmod(0o755)  # mkdtemp's 0o700 would hide the report from the people it is for
    try:
        with _reading(tracking_uri, "downloading the figures"), tracking.progress_bars_off():
            figures = [_figures(env, tracking_uri, work, i) for i, env in enumerate(environments)]
        counts = [
            Counter(e.kind for _claim, cells in ledger for e in cells[i].entries)
            for i in range(len(environments))
        ]
        overview = _overview(environments, counts, work) if environments else None
        context = {
            "title": "amp-harness verdict report",
            "built": _when(built),
            "source": tracking.redact(tracking_uri),
            "experiment": experiment,
            "ui": ui,
            "runs_url": runs_url,
            "runs_view": view,
            "harness_version": harness.__version__,
            "environments": environments,
            "experimental": experimental,
            "experimental_words": baseline.experimental_words,
            "classes": _classes(environments),
            "hardware_note": HARDWARE_NOTE,
            "counts": counts,
            "counted": PER_CLAIM_AND_TEST,  # the words the session's last lines count claims in
            "ledger": ledger,
            "differences": differ,
            "atlas": autocast_atlas,
            "atlas_cell": atlas.cell_text,
            "history": timeline,
            "history_rows": _history_rows(timeline),
            "history_shown": history.SHOWN,
            "trend_size": (history.WIDTH, history.HEIGHT),
            "mixed": MIXED,
            "uncovered": uncovered,
            "undecided": undecided,
            "diagnoses": diagnosed,
            "regressions": [_capability_regressions(env) for env in environments],
            "unknown": _unknown_claims(runs),
            "figures": figures,
            "overview": overview,
            "comparison": comparison,
            "comparison_columns": _columns(comparison),
            "verdict_order": list(COLOURS),
            "evidence_chars": f"{table.EVIDENCE_CHARS:,}",
            "colours": COLOURS,
        }
        (work / "index.html").write_text(_render(context), encoding="utf-8")
        (work / "summary.md").write_text(_markdown(context), encoding="utf-8")
        _replace(out, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out / "index.html"


def report_dir(reports: Path, name: str = DEFAULT_NAME) -> Path:
    """reports/<name>, for a name that is one plain folder name, short enough for the file
    system with the temporary names built beside it (`_replace`, `build`'s mkdtemp)."""
    if not _NAME.fullmatch(name):
        raise HarnessError(
            f"--name {name!r}: use one folder name of letters, digits, '.', '_' or '-' "
            f"(e.g. {DEFAULT_NAME} or 2025-06-01-h200)"
        )
    longest = filenames.name_max(reports) - len(_old_name("", 2**22))  # pid_max: 7 digits
    if len(name) > longest:
        raise HarnessError(
            f"--name of {len(name)} characters is too long: the report folder and the "
            f"temporary one beside it must fit the file names of {reports}, so the name takes "
            f"at most {longest}; pick a shorter one, e.g. --name {name[:40]}"
        )
    return Path(reports) / name


def _check_target(out: Path) -> None:
    """Only a folder that holds an earlier report is replaced: never reports/records, the
    artifact store or a user's own folder."""
    if out.exists() and not (out.is_dir() and (out / "index.html").is_file()):
        raise HarnessError(
            f"{out} exists and is not an amp-harness report (no index.html): pass another --name"
        )


def _old_name(name: str, pid: int) -> str:
    """Where the earlier report is moved while the new one takes its place."""
    return f".{name}-old-{pid}"


def _replace(out: Path, work: Path) -> None:
    old = None
    if out.exists():
        old = out.with_name(_old_name(out.name, os.getpid()))
        out.rename(old)
    work.rename(out)
    if old:
        shutil.rmtree(old, ignore_errors=True)


# --- reading MLflow -------------------------------------------------------------------------


@contextlib.contextmanager
def _reading(uri: str, what: str):
    """MLflow's own errors while reading (a server down or hanging, a database that refuses)
    as one HarnessError naming the store and the fix; MLflow's messages repeat the URI, so
    they are redacted too."""
    started = time.monotonic()
    try:
        yield
    except HarnessError:
        raise
    except Exception as exc:  # MlflowException, requests' and SQLAlchemy's errors alike
        first = tracking.reason(exc)
        if urlparse(uri).scheme in ("http", "https"):
            fix = "start the tracking server, or correct its address"
        else:
            fix = "check that the store and its artifacts are there and readable"
        raise HarnessError(
            f"cannot read MLflow at {tracking.redact(uri)}: {what} failed after "
            f"{time.monotonic() - started:.1f} s ({first}). "
            f"Fix: {fix} (--tracking-uri or $MLFLOW_TRACKING_URI), then run `amp-harness "
            "report` again. Nothing is lost: every result is in the journal, and `amp-harness "
            "sync` sends MLflow what it lacks"
        ) from None


def _open(uri: str, experiment: str):
    # Opening a missing SQLite file would create an empty store: say where to look instead. The
    # file as SQLAlchemy reads the URI (tracking.sqlite_path): urlparse cuts a path at '#'.
    path = tracking.sqlite_path(uri)
    if path is not None and not path.is_file():
        raise HarnessError(
            f"no MLflow store {path}: run `amp-harness run` first, or pass --reports DIR "
            "or --tracking-uri URI for the store that holds the runs"
        )
    client = tracking.client(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = [e.name for e in client.search_experiments()]
        raise HarnessError(
            f"no experiment {experiment!r} at {tracking.redact(uri)}; it has: "
            f"{', '.join(names) or 'none'} (pass --experiment NAME)"
        )
    return client, found.experiment_id


def _diagnoses(client, ui: str) -> list[dict]:
    """`amp-harness diagnose` runs, the latest per factory, device and torch, each with its
    link and its reasons capped for the page."""
    found = diagnoses.latest(client)
    for d in found:
        d["url"] = tracking.ui_url(ui, d["experiment_id"], d["run_id"])
        d["when"] = _when(d["started"] / 1000)
        d["recipes"] = [
            (recipe, status, cap(reasons, "in the MLflow run", chars=600))
            for recipe, status, reasons in d["recipes"]
        ]
    return found


def _env(run) -> dict[str, str]:
    return {k[4:]: v for k, v in run.data.tags.items() if k.startswith("env.")}


def _environments(runs: list, link, now: float) -> list[Environment]:
    """The ledger's columns: per environment, per test, its latest run since the environment's
    latest complete session (the module docstring says why)."""
    by_env: dict[tuple, list[Session]] = defaultdict(list)
    for facts, session in _sessions(runs, link):
        session.age = _age(now - session.started)
        by_env[tuple(sorted(envs.identity(facts).items()))].append(session)
    columns = [
        _column(dict(identity), envs.label(dict(identity)), group)
        for identity, group in by_env.items()
    ]
    # By hardware class, then torch release as numbers (2.4 before 2.13), then the rest.
    columns.sort(
        key=lambda env: (
            env.hardware_class,
            version_key(env.facts.get("torch", "")),
            env.label,
            sorted(env.facts.items()),
        )
    )
    _disambiguate(columns)
    return columns


def _apart(runs: list, link, now: float) -> tuple[list, list[tuple[str, Session]]]:
    """The runs of the team's record, and the sessions marked experimental, kept apart from it:
    (its environment's label, the session), newest first."""
    sessions = _sessions(runs, link)
    apart = sorted(
        ((envs.label(facts), session) for facts, session in sessions if session.experimental
         is not None), key=lambda found: found[1].started, reverse=True,
    )  # fmt: skip
    for _label, session in apart:
        session.age = _age(now - session.started)
    left_out = {session.id for _label, session in apart}
    return [r for r in runs if r.data.tags.get("amp.session_id") not in left_out], apart


def _experimental(parent, tests: list) -> str | None:
    """Why the session of these runs is marked experimental ("" where no reason was given), as
    its parent run says (its tests where MLflow has none); None where it is of record."""
    for run in [parent] if parent else tests:
        if run.data.tags.get(EXPERIMENTAL) == "true":
            return run.data.tags.get(EXPERIMENTAL_REASON, "")
    return None


def _sessions(runs: list, link) -> list[tuple[dict[str, str], Session]]:
    """Every harness session in `runs`, with its env.* facts: its parent run's, or its tests'
    where MLflow has no parent run."""
    groups: dict[str, list] = {}
    for run in runs:
        tags = run.data.tags
        sid = tags.get("amp.session_id")
        if tags.get("amp.kind") in ("session", "test") and sid:
            groups.setdefault(sid, []).append(run)  # else: not a harness run
    found: dict[str, dict] = {}
    for sid, group in groups.items():
        # Where a retried runs/create made two parent runs (issue 24), the session's is the one
        # tracking.main_parent names; the other is neither the session nor one of its tests.
        parent = tracking.main_parent(group)
        tests = [r for r in group if r.data.tags.get("amp.kind") == "test"]
        found[sid] = {
            "env": _env(parent or group[0]),
            "started": min(r.info.start_time for r in [parent, *tests] if r),
            "parent": parent,
            "tests": tests,
        }
    return [
        (
            s["env"],
            Session(
                name=s["parent"].info.run_name if s["parent"] else sid,
                url=link(s["parent"].info.run_id) if s["parent"] else None,
                started=s["started"] / 1000,
                commit=s["env"].get("git_commit", "unknown"),
                incomplete=_incomplete(s["parent"], s["tests"]),
                runs=s["tests"],
                facts=s["env"],
                experimental=_experimental(s["parent"], s["tests"]),
                id=sid,
            ),
        )
        for sid, s in found.items()
    ]


def _column(facts: dict[str, str], label: str, group: list[Session]) -> Environment:
    """One environment's column from its sessions: per test, its latest run since the latest
    complete session that ran tests (from all its sessions where none did)."""
    group = sorted(group, key=lambda s: s.started, reverse=True)
    # What its sessions probed, the newest's standing: not what makes the environment
    # (envs.identity), but what the hardware attribution reads.
    probed = {k: v for s in reversed(group) for k, v in envs.capabilities(s.facts).items()}
    complete = next((i for i, s in enumerate(group) if not s.incomplete and s.runs), len(group) - 1)
    since = group[: complete + 1]
    latest: dict[str, tuple] = {}  # test -> (its run, its session)
    for session in reversed(since):  # oldest first: a later run replaces an earlier one
        for run in sorted(session.runs, key=lambda r: r.info.start_time):
            test = run.data.tags.get("amp.test", run.info.run_name)
            if _partly_logged(run):
                continue  # `amp-harness sync` logs it again
            if _interrupted(run) and test in latest:
                continue  # Ctrl-C decided nothing: the earlier run stands
            latest[test] = (run, session)
    for _run, session in latest.values():
        session.shown += 1
    return Environment(
        facts=facts | probed,
        label=label,
        sessions=since,
        tests=[run for _test, (run, _session) in sorted(latest.items())],
        session_of={run.info.run_id: session for run, session in latest.values()},
    )


def _partly_logged(run) -> bool:
    """A process killed while it logged the run: its metrics or files may be missing."""
    return run.data.tags.get(COMPLETE) == "false"


def _interrupted(run) -> bool:
    """Ctrl-C ended the test: it decided nothing."""
    return run.data.tags.get("outcome") == "interrupted"


def _claims(run) -> list[str]:
    return [claim for claim in run.data.tags.get("claims", "").split(",") if claim]


def _history(runs: list, link) -> list[history.ClassHistory]:
    """Per hardware class, what each session of record said of each claim it ran
    (harness.reports.history), from the runs the ledger read: no query of its own.

    A session of part of the suite (-k, killed part-way) says nothing of the tests it did not
    run: where it ran some of a claim's tests, the claim's verdict takes the others' from the
    class's sessions since its latest complete one, as a ledger column does, so that a `-k` run
    of one test never reads as a change of a claim of several."""
    by_class: dict[str, list[history.Point]] = defaultdict(list)
    standing: dict[str, dict] = {}  # class -> test -> its latest run
    for facts, session in sorted(_sessions(runs, link), key=lambda found: found[1].started):
        ordered = sorted(session.runs, key=lambda r: r.info.start_time)
        ran = {_test(r): r for r in ordered if not _partly_logged(r) and not _interrupted(r)}
        if not ran:
            continue  # it decided nothing: no point, and the class's standing is unchanged
        name = envs.hardware_class(facts)
        standing[name] = {**standing.get(name, {}), **ran} if session.incomplete else ran
        by_class[name].append(_point(session, ran, standing[name]))
    return history.build(by_class)


def _point(session: Session, ran: dict, standing: dict) -> history.Point:
    """What `session` said of each claim of the tests it `ran`: the claim's verdict across its
    tests as they stand after it (`standing`), and the key metrics it measured."""
    tests_of: dict[str, list] = defaultdict(list)
    for run in standing.values():
        for claim in _claims(run):
            tests_of[claim].append(run)
    metrics: dict[str, dict[str, float]] = defaultdict(dict)
    for test, run in ran.items():
        key = atlas.per_claim(test, record.key_metrics(run.data.params, run.data.metrics))
        for claim in _claims(run):
            metrics[claim].update({f"{test}: {name}": number for name, number in key.items()})
    claims = dict.fromkeys(claim for run in ran.values() for claim in _claims(run))
    said = {c: _drawn(verdicts.aggregate(_status(r, c) for r in tests_of[c])) for c in claims}
    return history.Point(
        session=session.id,
        name=session.name,
        when=session.when,
        started=session.started,
        torch=envs.fact(session.facts, "torch"),
        url=session.url,
        verdicts=said,
        metrics=dict(metrics),
    )


def _drawn(verdict: verdicts.ClaimVerdict) -> tuple[str, str]:
    """A claim's verdict as the history draws it: (its label, its COLOURS key, or MIXED)."""
    kind = _kind(verdict)  # a ClaimVerdict has the stands, label and kind a Status has
    return verdict.label, kind if kind in COLOURS else MIXED


def _history_rows(timeline: list[history.ClassHistory]) -> list[tuple]:
    """(claim, its track in each class: None where the class never ran it) for each claim of
    the catalogue that some class has a history of, in the ledger's order."""
    rows = []
    for claim in catalogue().values():
        tracks = [found.tracks.get(claim.id) for found in timeline]
        if any(tracks):
            rows.append((claim, tracks))
    return rows


def _atlas_columns(environments: list[Environment]) -> list[atlas.Column]:
    """A column of the autocast atlas per environment and dtype: its latest atlas runs that
    passed (a failed one's measurement is not shown as valid)."""
    return [
        atlas.column(
            f"{env.label}: {run.data.params.get('autocast_dtype', '?')}"
            + (f", compiled ({b})" if (b := run.data.params.get("compiled_backend")) else ""),
            envs.fact(env.facts, "device"),
            envs.fact(env.facts, "torch"),
            run.data.metrics,
            run.data.params,
        )
        for env in environments
        for run in env.tests
        if atlas.is_atlas_test(run.data.tags.get("amp.test", run.info.run_name))
        and run.data.tags.get("outcome") == "passed"
    ]


def _incomplete(parent, tests: list) -> str:
    """Why a session is incomplete, with what it recorded; "" for a complete one (the module
    docstring's rule). `parent`: its session run, None where MLflow has none."""
    recorded = f"{_plural(len(tests), 'test')} recorded"
    if parent is None:
        return f"no session run in MLflow; {recorded}"
    status = parent.info.status
    if status == "KILLED":
        why = parent.data.tags.get(END_REASON) or "killed or interrupted (MLflow status KILLED)"
        return f"{why}; {recorded}"
    if status not in ENDED or not parent.info.end_time:
        return f"did not end (MLflow status {status}): killed, crashed or still running; {recorded}"
    if parent.data.tags.get(LEFT_OUT):  # -k, a module not run: its other claims say nothing
        return f"ran part of the suite ({parent.data.tags[LEFT_OUT]}); {recorded}"
    if parent.data.tags.get(EXIT_STATUS) in ("3", "4"):  # pytest: internal error, usage error
        return f"ended on pytest exit status {parent.data.tags[EXIT_STATUS]}; {recorded}"
    counted = sum(int(v) for k, v in parent.data.metrics.items() if k.startswith("tests."))
    if tests and not counted:  # _end_session logs the counts before the status: not its end
        return f"ended without its tests.* counts; {recorded}"
    if counted > len(tests):  # the server went down during the session
        return (
            f"MLflow has {len(tests)} of the {counted} tests it ran: `amp-harness sync` sends "
            "the rest from the journal"
        )
    half = sum(run.data.tags.get(COMPLETE) == "false" for run in tests)
    if half:  # a process killed while it logged them: their metrics or files may be missing
        return (
            f"{half} of its {len(tests)} test runs only partly logged: `amp-harness sync` logs "
            "them again from the journal"
        )
    return ""


def _disambiguate(environments: list[Environment]) -> None:
    """Environments with the same label get the facts that tell them apart (Python, a TF32
    flag, ...): every column's label is its own."""
    by_label: dict[str, list[Environment]] = defaultdict(list)
    for env in environments:
        by_label[env.label].append(env)
    for same in by_label.values():
        if len(same) < 2:
            continue
        keys = sorted({k for env in same for k in env.facts})
        differing = [k for k in keys if len({env.facts.get(k, "n/a") for env in same}) > 1]
        for env in same:
            env.label += " (" + ", ".join(f"{k} {env.facts.get(k, 'n/a')}" for k in differing) + ")"


def _status(run, claim: str) -> verdicts.Status:
    """The test run's verdict on `claim` as it counts: what it recorded, voided by a failure."""
    tags = run.data.tags
    return verdicts.status(
        tags.get(f"verdict.{claim}"),
        tags.get(f"evidence.{claim}", ""),
        tags.get("outcome", "?"),
        tags.get("outcome.message", ""),
        tags.get("amp.test", run.info.run_name),
    )


def _kind(status: verdicts.Status) -> str:
    if status.stands:
        return status.label
    return {verdicts.REGRESSION: "capability-regression"}.get(status.kind, status.kind)


def _cell(claim: str, env: Environment, link) -> Cell:
    entries, statuses = [], []
    for run in env.tests:
        if claim not in run.data.tags.get("claims", "").split(","):
            continue
        status = _status(run, claim)
        statuses.append(status)
        entries.append(
            Entry(
                claim=claim,
                verdict=status.label,
                kind=_kind(status),
                evidence=cap(status.evidence, IN_MLFLOW),
                test=status.test,
                url=link(run.info.run_id),
                session=env.session_of[run.info.run_id],
            )
        )
    return Cell(verdicts.aggregate(statuses), entries)


def _columns_compared(
    environments: list[Environment], ledger: list[tuple]
) -> list[differences.Column]:
    """The columns as harness.reports.differences compares them: the verdicts that stand and the key
    metrics of each test."""
    columns = []
    for index, env in enumerate(environments):
        cells = {claim.id: cells[index] for claim, cells in ledger}
        columns.append(
            differences.Column(
                label=env.label,
                device=env.facts.get("device", "?"),
                torch=env.facts.get("torch", "0.0"),
                verdicts={c: cell.verdict.label for c, cell in cells.items() if _stands(cell)},
                tests={
                    _test(run): (
                        run.data.tags.get("claims", "").split(","),
                        atlas.per_claim(
                            _test(run), record.key_metrics(run.data.params, run.data.metrics)
                        ),
                    )
                    for run in env.tests
                },
                facts=env.facts,
                depends_on={
                    _test(run): envs.depends_on(run.data.params.get(record.DEPENDS_ON_HARDWARE))
                    for run in env.tests
                },
            )
        )
    return columns


def _test(run) -> str:
    return run.data.tags.get("amp.test", run.info.run_name)


def _classes(environments: list[Environment]) -> list[tuple[str, int, bool]]:
    """The ledger's hardware classes, in column order: (class, how many columns, whether it is
    only a name)."""
    found: list[tuple[str, int, bool]] = []
    for env in environments:  # sorted by class (_environments)
        if found and found[-1][0] == env.hardware_class:
            name, count, legacy = found[-1]
            found[-1] = (name, count + 1, legacy or env.legacy)
        else:
            found.append((env.hardware_class, 1, env.legacy))
    return found


def _stands(cell: Cell) -> bool:
    return cell.verdict is not None and cell.verdict.stands


def _capability_regressions(env: Environment) -> list[tuple[str, str, str]]:
    """(what was missing, tests, claims) for each capability regression of the session."""
    found: dict[str, list] = defaultdict(list)
    for run in env.tests:
        if run.data.tags.get("outcome") == verdicts.CAPABILITY_REGRESSION:
            found[run.data.tags.get("outcome.message", "")].append(run)
    return [
        (
            cap(message, IN_MLFLOW),
            ", ".join(r.data.tags.get("amp.test", r.info.run_name) for r in runs),
            ", ".join(dict.fromkeys(c for r in runs for c in r.data.tags["claims"].split(","))),
        )
        for message, runs in found.items()
    ]


def _uncovered(runs: list) -> tuple[list, list]:
    """Claims without a verdict that stands (decided by a test that passed) in any run of the
    experiment, as two lists of (claim, statement, why): those no test has run ("not covered":
    no scenario declares them, or none ran), and those whose tests ran and decided nothing
    (skipped here, with the reasons, or failed)."""
    tried: dict[str, list[verdicts.Status]] = defaultdict(list)
    for run in runs:
        if run.data.tags.get("amp.kind") != "test":
            continue
        for claim in filter(None, run.data.tags.get("claims", "").split(",")):
            tried[claim].append(_status(run, claim))
    uncovered, undecided = [], []
    for claim in catalogue().values():
        statuses = tried.get(claim.id, [])
        if any(s.stands for s in statuses):
            continue
        if not statuses:
            uncovered.append((claim.id, claim.statement, "no verdict in any run"))
            continue
        reasons = sorted(
            {f"{s.label}: {cap(s.evidence, IN_MLFLOW)}" for s in statuses if s.evidence}
        )
        why = "no verdict that stands" + (f": {'; '.join(reasons)}" if reasons else "")
        undecided.append((claim.id, claim.statement, why))
    return uncovered, undecided


def _unknown_claims(runs: list) -> list[str]:
    """Verdict tags for IDs the catalogue no longer has (renamed or removed claims)."""
    known = catalogue()
    return sorted(
        {
            key.removeprefix("verdict.")
            for run in runs
            for key in run.data.tags
            if key.startswith("verdict.") and key.removeprefix("verdict.") not in known
        }
    )


def _figures(env: Environment, uri: str, work: Path, index: int) -> list[Figure]:
    """Download the figures/*.png of the session's tests into the report folder.

    Through the run's artifact URI, which search_runs already returned: MlflowClient's
    run-id path looks the run up again (two queries and a logged-model lookup per call, about
    13 ms a run on SQLite), which alone would take a 1,000-run report past its 10 s budget."""
    import mlflow.artifacts

    figures = []
    for run in env.tests:
        root = run.info.artifact_uri.rstrip("/")
        listed = mlflow.artifacts.list_artifacts(artifact_uri=f"{root}/figures", tracking_uri=uri)
        test = run.data.tags.get("amp.test", run.info.run_name)
        for info in listed:
            name = info.path.rsplit("/", 1)[-1]
            if info.is_dir or not name.endswith(".png"):
                continue
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=f"{root}/{info.path}",
                dst_path=str(work / ".download"),
                tracking_uri=uri,
            )
            data = Path(local).read_bytes()
            file = f"env{index + 1}-{_slug(test)}-{name}"
            (work / file).write_bytes(data)
            figures.append(Figure(test, name, file, _data_uri(data)))
    shutil.rmtree(work / ".download", ignore_errors=True)
    return figures


def _overview(environments: list[Environment], counts: list[Counter], work: Path) -> Figure:
    """Verdict counts per environment, as stacked bars coloured as in the ledger."""
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=(9, 0.6 + 0.55 * len(environments)), layout="constrained")
    ax = fig.subplots()
    labels = [env.label for env in environments]  # distinct (_disambiguate): barh merges equal ones
    left = [0] * len(environments)
    for kind, colour in COLOURS.items():
        widths = [c.get(kind, 0) for c in counts]
        if any(widths):
            ax.barh(labels, widths, left=left, color=colour, label=kind)
            left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel(f"verdicts in the ledger ({PER_CLAIM_AND_TEST})")
    ax.legend(ncols=6, fontsize="small", loc="lower left", bbox_to_anchor=(0, 1.02))
    file = "verdicts.png"
    fig.savefig(work / file, dpi=100)
    return Figure("", "verdicts per environment", file, _data_uri((work / file).read_bytes()))


# --- rendering -------------------------------------------------------------------------------


def _render(context: dict) -> str:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
        autoescape=True,  # always: run names, tags and evidence are text, never markup
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env.get_template(TEMPLATE).render(context)


def _markdown(context: dict) -> str:
    environments = context["environments"]
    lines = [
        f"# {context['title']}",
        "",
        f"Built {context['built']} from {context['source']} (experiment "
        f"`{context['experiment']}`): per environment, each test's latest run since its latest "
        "complete session, with the session it came from. Evidence longer than "
        f"{context['evidence_chars']} characters is cut: each entry's MLflow run holds it "
        "whole (record.json).",
        "",
    ]
    for env in environments:
        tests = _plural(len(env.tests), "test")
        lines.append(f"- **{_md(env.label)}**: {tests}; {_md(_machine_line(env))}")
        lines += [
            f"  - session of {s.when} (commit {_md(s.commit)}): {_plural(s.shown, 'test')}"
            + (f"; incomplete: {_md(s.incomplete)}" if s.incomplete else "")
            for s in env.sessions
        ]
    if not environments:
        lines.append(
            "No session of record in this experiment yet: only experimental ones (below)."
            if context["experimental"]
            else "No harness runs in this experiment yet."
        )
    if context["experimental"]:
        lines += ["", "## Experimental sessions, kept out of the ledger", ""]
        lines += [
            f"- {_md(label)}: session of {s.when}, {s.age} (commit {_md(s.commit)}), "
            f"{_plural(len(s.runs), 'test')}: {_md(baseline.experimental_words(s.experimental))}"
            for label, s in context["experimental"]
        ]
    lines += ["", "## Verdict ledger", ""]
    if environments:
        grouped = "; ".join(
            f"{name} ({_plural(span, 'column')}{', a name only' if legacy else ''})"
            for name, span, legacy in context["classes"]
        )
        lines += [f"Columns by hardware class: {_md(grouped)}.", ""]
    lines.append("| claim | " + " | ".join(_md(env.label) for env in environments) + " |")
    lines.append("|---" * (len(environments) + 1) + "|")
    for claim, cells in context["ledger"]:
        difference = context["differences"].get(claim.id)
        marked = difference.hardware_columns if difference else []
        row = [
            "<br>".join(
                ([f"**{_md(cell.verdict.label)}**"] if len(cell.entries) > 1 else [])
                + [
                    f"[{_md(e.verdict)}]({e.url}): {_md(e.evidence)} "
                    f"({_md(e.test.split('::')[-1])}; {e.session.when}, {e.session.age})"
                    for e in cell.entries
                ]
            )
            or "not run"
            for cell in cells
        ]
        row = [
            f"{text}<br>*{HARDWARE_NOTE}*" if env.label in marked else text
            for env, text in zip(environments, row, strict=True)
        ]
        lines.append(f"| {claim.id} | " + " | ".join(row) + " |")
    lines += ["", "## Differences between environments", ""]
    lines += [
        f"- **{cid}**: {_md(difference.summary())}"
        for cid, difference in context["differences"].items()
    ] or ["The environments agree on every claim they decided, key metrics included."]
    lines += _history_markdown(context)
    lines += ["", "## Autocast atlas", "", *atlas.markdown(context["atlas"])]
    regressions = [
        f"- {_md(env.label)}: {_md(what)} (tests {_md(tests)}; claims {_md(claims)})"
        for env, found in zip(environments, context["regressions"], strict=True)
        for what, tests, claims in found
    ]
    if regressions:
        lines += ["", "## Capability regressions", ""] + regressions
    lines += ["", "## Claims run without a verdict (skipped here, or failed)", ""]
    lines += [f"- {cid}: {_md(why)}" for cid, _statement, why in context["undecided"]] or [
        "Every claim that ran has a verdict."
    ]
    lines += ["", "## Claims no test has run", ""]
    lines += [f"- {cid}: {_md(why)}" for cid, _statement, why in context["uncovered"]] or [
        "A test of every claim has run."
    ]
    for d in context["diagnoses"]:
        lines += ["", f"## Diagnosis of {_md(d['factory'])} on {_md(d['device'])}, torch "
                  f"{_md(d['torch'])} ({d['when']})", ""]  # fmt: skip
        lines += [f"- {recipe}: **{status}**: {_md(why)}" for recipe, status, why in d["recipes"]]
    comparison = context["comparison"]
    if comparison is not None:
        lines += ["", "## Comparison", ""]
        if isinstance(comparison, str):  # it quotes session names and paths: data too
            lines.append(_md(comparison))
        else:
            columns = context["comparison_columns"]
            lines.append("| " + " | ".join(_md(c) for c in columns) + " |")
            lines.append("|---" * len(columns) + "|")
            lines += [
                "| " + " | ".join(_md(str(row.get(c, ""))) for c in columns) + " |"
                for row in comparison
            ]
    figures = [f for group in context["figures"] for f in group]
    if context["overview"]:
        figures.insert(0, context["overview"])
    if figures:
        lines += ["", "## Figures", ""]
        lines += [f"- [{_md(f.test or f.name)}: {f.name}]({f.file})" for f in figures]
    return "\n".join(lines) + "\n"


def _history_markdown(context: dict) -> list[str]:
    """The history's section of summary.md: a line per class, then per claim a line per class
    that ran it. A list, not a table: a reader of summary.md finds a claim's ledger row by its
    `| CLAIM |`, and the ledger's is the one table of claims."""
    timeline = context["history"]
    lines = [
        "", "## History per hardware class", "",
        "Per claim and class: its verdict in the latest session that ran it, since when it has "
        "held (sessions marked experimental left out), and where it changed over the last "
        f"{context['history_shown']} sessions of the class its verdicts in order and each key "
        "metric that took more than one value, a block per session (`amp-harness compare "
        "--range A..B`: what changed at which session).", "",
    ]  # fmt: skip
    if not timeline:
        return [*lines, "No session of record yet."]
    for found in timeline:
        changed = ", ".join(found.changed())
        lines.append(f"- **{_md(found.name)}**: {_md(found.words())}"
                     + (f"; changed: {_md(changed)}" if changed else ""))  # fmt: skip
    lines.append("")
    for claim, tracks in context["history_rows"]:
        lines.append(f"- **{claim.id}**")
        lines += [
            f"  - {_md(found.name)}: {_track_markdown(track)}"
            for found, track in zip(timeline, tracks, strict=True)
            if track is not None
        ]
    return lines


def _track_markdown(track: history.Track) -> str:
    parts = [f"**{_md(track.label)}** {_md(track.since_words())}"]
    if len(track.stretches) > 1:
        parts.append(_md(track.stretch_words()))
    parts += [f"{_md(t.label)}: {t.blocks()} {_md(t.words())}" for t in track.trends]
    return "; ".join(parts)


def _machine_line(env: Environment) -> str:
    """The column's class and the facts of its machine, in one line."""
    legacy = " (only a name: recorded before hardware classes)" if env.legacy else ""
    facts = "".join(f"; {what}: {value}" for what, value in env.machine)
    return f"class {env.hardware_class}{legacy}{facts}"


def _columns(comparison: Comparison) -> list[str]:
    if comparison is None or isinstance(comparison, str):
        return []
    return list(dict.fromkeys(key for row in comparison for key in row))


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def _md(text: str) -> str:
    """Text in a markdown table cell: no markup (no link, image or raw HTML from a claim, evidence
    or a baseline), no cell break, no line break."""
    return shown.markdown(text)


def _slug(test: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", test.removeprefix("scenarios/")).strip("_")


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


def _age(seconds: float) -> str:
    """How long ago, in the largest unit that keeps it a whole number above 0."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return "just now"


def _ui(uri: str) -> str:
    """Where the MLflow UI for this store is: the server itself, or `amp-harness ui` /
    `mlflow ui --backend-store-uri URI` on their default address for a database store."""
    if urlparse(uri).scheme in ("http", "https"):
        return tracking.redact(uri).rstrip("/")
    return EMBEDDED_UI
