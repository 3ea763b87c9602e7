"""The ledger: what the report shows, read from MLflow (never the scenarios, never the journal).

`read` gives a `Ledger`: every claim of the catalogue x every environment found (its `rows`, a
`Cell` per column), the claims run without a verdict apart from those no test has run, the
sessions marked experimental apart, the differences between environments, the autocast atlas's
columns, each class's history (harness.reports.history: its input, read here), the saved
diagnoses and the capability regressions. harness.reports.report renders it.

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

import contextlib
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from urllib.parse import urlparse

from harness.catalogue import verdicts
from harness.catalogue.claims import catalogue
from harness.common.errors import HarnessError
from harness.lab.releases import version_key
from harness.records import environments as envs  # not `environments`: the ledger's columns
from harness.records import record, tracking

# Tags harness.records.tracking writes; runs logged by older versions have none of them.
from harness.records.tracking import (
    COMPLETE,
    END_REASON,
    EXIT_STATUS,
    EXPERIMENTAL,
    EXPERIMENTAL_REASON,
    LEFT_OUT,
)
from harness.reports import atlas, diagnoses, differences, history
from harness.reports.table import cap

EMBEDDED_UI = "http://127.0.0.1:5000"  # what `amp-harness ui` (and `mlflow ui`) serve by default
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
class Ledger:
    """What one experiment's runs say, as the report shows it (`read`)."""

    built: float  # when it was read, seconds since the epoch: the sessions' ages count from it
    ui: str  # the MLflow UI its links point into (`_ui`)
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
    regressions: list[list[tuple[str, str, str]]]  # per column (_capability_regressions)
    unknown: list[str]  # verdict tags of claims the catalogue no longer has
    classes: list[tuple[str, int, bool]]  # the hardware classes, in column order

    @property
    def counts(self) -> list[Counter]:
        """Per column, how many entries of each kind (a COLOURS key) its cells hold."""
        return [
            Counter(e.kind for _claim, cells in self.rows for e in cells[i].entries)
            for i in range(len(self.environments))
        ]


def read(tracking_uri: str, experiment: str) -> Ledger:
    """The ledger of `experiment` at `tracking_uri`; reading MLflow fails as one HarnessError
    naming the store and the fix (`reading`)."""
    ui = _ui(tracking_uri)
    with reading(tracking_uri, "reading the experiment and its runs"):
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
    rows = [
        (claim, [_cell(claim.id, env, link) for env in environments])
        for claim in catalogue().values()
    ]
    differ = differences.find(
        (claim.id for claim, _cells in rows), _columns_compared(environments, rows)
    )
    autocast_atlas = atlas.table(_atlas_columns(environments))
    timeline = _history(runs, link)
    return Ledger(
        built=built,
        ui=ui,
        runs_url=runs_url,
        view=view,
        environments=environments,
        experimental=experimental,
        rows=rows,
        differences=differ,
        atlas=autocast_atlas,
        history=timeline,
        history_rows=_history_rows(timeline),
        uncovered=uncovered,
        undecided=undecided,
        diagnoses=diagnosed,
        regressions=[_capability_regressions(env) for env in environments],
        unknown=_unknown_claims(runs),
        classes=_classes(environments),
    )


# --- reading MLflow -------------------------------------------------------------------------


@contextlib.contextmanager
def reading(uri: str, what: str):
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
        d["when"] = when(d["started"] / 1000)
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
    recorded = f"{plural(len(tests), 'test')} recorded"
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


def when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


def _age(seconds: float) -> str:
    """How long ago, in the largest unit that keeps it a whole number above 0."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return "just now"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def _ui(uri: str) -> str:
    """Where the MLflow UI for this store is: the server itself, or `amp-harness ui` /
    `mlflow ui --backend-store-uri URI` on their default address for a database store."""
    if urlparse(uri).scheme in ("http", "https"):
        return tracking.redact(uri).rstrip("/")
    return EMBEDDED_UI
