"""The ledger's columns and cells, built from the sessions MLflow holds
(harness.reports.ledger_sessions), and what they say of the claims.

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

Evidence, failure messages and skip reasons are capped per entry (harness.reports.table.cap): the
numbers stay on the page, and each entry links to its MLflow run, whose record.json holds the
full text.
"""

from __future__ import annotations

from collections import defaultdict

from harness.catalogue import verdicts
from harness.catalogue.claims import catalogue
from harness.common.versions import version_key
from harness.records import environments as envs  # not `environments`: the ledger's columns
from harness.records import record
from harness.reports import atlas, differences, ledger_sessions
from harness.reports.ledger import Cell, Entry, Environment, Session, ago, kind
from harness.reports.table import cap

# Where an entry's capped text is whole. Not "N more in record.json": the tag read here may
# itself be cut (tracking keeps 5,000 characters of evidence), so N is only what was cut here.
IN_MLFLOW = "cut here; record.json in its MLflow run holds the full text"


def environments(runs: list, link, now: float) -> list[Environment]:
    """The ledger's columns: per environment, per test, its latest run since the environment's
    latest complete session (the module docstring says why)."""
    by_env: dict[tuple, list[Session]] = defaultdict(list)
    for facts, session in ledger_sessions.sessions(runs, link):
        session.age = ago(now - session.started)
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
            if ledger_sessions.partly_logged(run):
                continue  # `amp-harness sync` logs it again
            if ledger_sessions.interrupted(run) and test in latest:
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


def cell(claim: str, env: Environment, link) -> Cell:
    entries, statuses = [], []
    for run in env.tests:
        if claim not in run.data.tags.get("claims", "").split(","):
            continue
        status = ledger_sessions.status(run, claim)
        statuses.append(status)
        entries.append(
            Entry(
                claim=claim,
                verdict=status.label,
                kind=kind(status),
                evidence=cap(status.evidence, IN_MLFLOW),
                test=status.test,
                url=link(run.info.run_id),
                session=env.session_of[run.info.run_id],
            )
        )
    return Cell(verdicts.aggregate(statuses), entries)


def compared(environments: list[Environment], ledger: list[tuple]) -> list[differences.Column]:
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
                    ledger_sessions.test_of(run): (
                        run.data.tags.get("claims", "").split(","),
                        atlas.per_claim(
                            ledger_sessions.test_of(run),
                            record.key_metrics(run.data.params, run.data.metrics),
                        ),
                    )
                    for run in env.tests
                },
                facts=env.facts,
                depends_on={
                    ledger_sessions.test_of(run): envs.depends_on(
                        run.data.params.get(record.DEPENDS_ON_HARDWARE)
                    )
                    for run in env.tests
                },
            )
        )
    return columns


def classes(environments: list[Environment]) -> list[tuple[str, int, bool]]:
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


def capability_regressions(env: Environment) -> list[tuple[str, str, str]]:
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


def uncovered(runs: list) -> tuple[list, list]:
    """Claims without a verdict that stands (decided by a test that passed) in any run of the
    experiment, as two lists of (claim, statement, why): those no test has run ("not covered":
    no scenario declares them, or none ran), and those whose tests ran and decided nothing
    (skipped here, with the reasons, or failed)."""
    tried: dict[str, list[verdicts.Status]] = defaultdict(list)
    for run in runs:
        if run.data.tags.get("amp.kind") != "test":
            continue
        for claim in filter(None, run.data.tags.get("claims", "").split(",")):
            tried[claim].append(ledger_sessions.status(run, claim))
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


def unknown_claims(runs: list) -> list[str]:
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


def atlas_columns(environments: list[Environment]) -> list[atlas.Column]:
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
