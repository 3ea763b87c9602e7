"""`amp-harness run | list | report | baseline | compare | upgrade | sessions | sync | ui | new |
validate | diagnose`: thin wrappers over the plugin, the journal, the reports and MLflow."""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

from harness.catalogue import claims, verdicts
from harness.common import shown
from harness.common.errors import HarnessError
from harness.records import journal_index
from harness.records.journal import JOURNAL_NAME, Journal
from harness.records.journal_index import short_id
from harness.records.tracking import (
    ARTIFACTS_NAME,
    DB_NAME,
    DEFAULT_EXPERIMENT,
    MlflowSink,
    command_line,
    default_uri,
    redact,
    resolve_uri,
    ui_url,
    views,
)
from harness.reports import accepted, baseline, compare, kinds, nearest, report


def _run(args: argparse.Namespace, pytest_args: list[str]) -> int:
    import pytest

    from harness.plugin import QUICK_TIER

    if not Path(args.scenarios).is_dir():
        raise HarnessError(
            f"no scenario folder {args.scenarios!r} here: run from the repository root or pass "
            "--scenarios DIR"
        )
    ran = _SessionId()
    named = _named(pytest_args)
    chosen = named or _selects(pytest_args)
    # The folder unless the user named modules or tests (else the whole folder ran beside them)
    where = [] if named else [args.scenarios]
    tier = [] if args.all or chosen else ["-m", QUICK_TIER]
    session = _session_options(args.reports, pytest_args)
    code = pytest.main([*where, f"--amp-reports={session.amp_reports}", *tier, *pytest_args],
                       plugins=[ran])  # fmt: skip
    reports = Path(session.amp_reports)
    print("\n".join(_next_steps(session)))
    _report_after_run(session)
    if ran.id:  # the last line: what `compare`, `baseline save --session` and `sessions` name
        sid = short_id(ran.id)
        print(f"session {sid}: compare it with another, "
              f"{command_line('compare', 'ID', sid, reports=reports)}; every session: "
              f"{command_line('sessions', reports=reports)}")  # fmt: skip
    return int(code)


def _session_options(reports: str, pytest_args: list[str]) -> argparse.Namespace:
    """The session's options `run` itself heeds, read from the pytest options passed on: where
    it records (pytest's --amp-reports wins over run's --reports, as pytest takes the last),
    its store, its experiment, its baselines."""
    options = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    options.add_argument("--amp-reports", default=reports)
    options.add_argument("--tracking-uri", default=None)
    options.add_argument("--amp-experiment", default=DEFAULT_EXPERIMENT)
    options.add_argument("--no-mlflow", action="store_true")
    options.add_argument("--amp-baselines", default=BASELINES)
    return options.parse_known_args(pytest_args)[0]


def _store_of(session: argparse.Namespace) -> str | None:
    """The tracking URI the session logged to; None under --no-mlflow."""
    return (
        None if session.no_mlflow else resolve_uri(session.tracking_uri, Path(session.amp_reports))
    )


def _next_steps(session: argparse.Namespace) -> list[str]:
    """Where to look after `run`, each line naming the folder and store the session used."""
    reports, uri = Path(session.amp_reports), _store_of(session)
    lines = [
        "",
        "Where to look next:",
        f"  {command_line('list', reports=reports)}  each claim, the tests that check it, its "
        "last verdict",
    ]
    if uri is not None and urlparse(uri).scheme in ("http", "https"):
        lines.append(f"  {redact(uri)}  the tracking server: browse and compare the runs there")
    elif uri is not None:
        lines.append(
            f"  {command_line('ui', reports=reports, uri=uri)}  browse and compare the runs in "
            "MLflow (http://127.0.0.1:5000)"
        )
    return [*lines, f"  {reports / JOURNAL_NAME}  every result, as recorded", ""]


def _selects(pytest_args: list[str]) -> bool:
    """Whether the user chose the tests with -k or -m: then those run, slow or not."""
    options = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    options.add_argument("-k")
    options.add_argument("-m")
    chosen, _ = options.parse_known_args(pytest_args)
    return chosen.k is not None or chosen.m is not None


def _named(pytest_args: list[str]) -> bool:
    """Whether the user named scenario modules or tests (`scenarios/test_x.py::test_y`)."""
    return any(arg.split("::")[0].endswith(".py") for arg in pytest_args)


class _SessionId:
    """A pytest plugin that notes the id of the session the plugin recorded (None: none)."""

    id: str | None = None

    def pytest_unconfigure(self, config) -> None:
        from harness.plugin import session_id

        self.id = session_id(config)


def _report_after_run(session: argparse.Namespace) -> None:
    """Write the report from the store the session logged to (none under --no-mlflow); its
    failure never changes the session's exit code (every result is in the journal and, where
    it was up, in MLflow)."""
    reports, uri = Path(session.amp_reports), _store_of(session)
    again = command_line("report", reports=reports, uri=uri)
    if uri is None:
        print(f"report: not written (--no-mlflow): {command_line('sync', reports=reports)}, "
              f"then {again}")  # fmt: skip
        return
    try:
        path = report.build(
            uri,
            report.report_dir(reports),
            session.amp_experiment,
            _baseline_comparison(reports, "auto", Path(session.amp_baselines)),
        )
    except Exception as exc:  # MLflow down, nothing logged, ...: say why, keep the exit code
        print(f"report: not written ({redact(str(exc))}); retry with {again}")
        return
    print(f"report: {path}")


class _Collector:
    """A pytest plugin that notes which collected tests check which claims."""

    def __init__(self) -> None:
        self.tests: dict[str, list[str]] = {}

    def pytest_collection_finish(self, session) -> None:
        for item in session.items:
            for marker in item.iter_markers("claim"):
                for claim_id in marker.args:
                    self.tests.setdefault(claim_id, []).append(item.nodeid)


def _collect_tests(scenarios: str) -> dict[str, list[str]]:
    import pytest

    collector = _Collector()
    code = pytest.main(
        [scenarios, "--collect-only", "-q", "-p", "no:cacheprovider", "--no-mlflow"],
        plugins=[collector],
    )
    if code not in (0, 5):  # 5: no tests collected
        raise HarnessError(f"collecting {scenarios} failed (pytest exit code {code}); see above")
    return collector.tests


def _last_verdicts(reports: str) -> dict[str, dict]:
    """Each claim's verdict in the last session of record (not marked experimental) that ran a
    test of it, across that session's tests (harness.catalogue.verdicts' rule: a later GPU-only
    skip does not hide earlier CPU decisions of the same session, and a failure is never
    hidden)."""
    journal = Journal(Path(reports) / JOURNAL_NAME)
    # The last session that declares each claim, found in the index: only those sessions'
    # records are read (a year of CI history holds thousands).
    latest: dict[str, str] = {}  # claim -> session id
    sessions = journal.index()
    for sid, session in sessions.items():  # oldest first
        if not journal_index.is_experimental(session.entry):
            latest.update(dict.fromkeys(session.claims, sid))
    last: dict[str, dict] = {}
    for sid, session in journal.load(sessions[s] for s in set(latest.values())).items():
        for claim, verdict in verdicts.by_claim(session.records).items():
            if latest[claim] != sid:
                continue  # a later session has its verdict
            last[claim] = {
                "verdict": verdict.label,
                "stands": verdict.stands,
                "evidence": verdict.evidence,
                "device": verdict.device,
                "tests": [
                    {"test": s.test, "status": s.label, "evidence": s.evidence}
                    for s in verdict.statuses
                ],
            }
    return last


def _list(args: argparse.Namespace) -> int:
    restore = claims.use_project(_project_catalogue(args))
    try:
        return _list_claims(args)
    finally:
        restore()  # the catalogue of a pytest session that called this one stays its own


def _list_claims(args: argparse.Namespace) -> int:
    import contextlib
    import io

    from harness.catalogue import contract

    # Read from the files (no torch import: it answers at once); collected by pytest only where
    # a file's markers cannot be read without running it.
    tests = contract.claimed_tests(Path(args.scenarios)) if Path(args.scenarios).is_dir() else {}
    if tests is None:
        quiet = io.StringIO()
        with contextlib.redirect_stdout(quiet):  # pytest's collection chatter
            try:
                tests = _collect_tests(args.scenarios)
            except HarnessError:
                sys.stderr.write(quiet.getvalue())
                raise
    last = _last_verdicts(args.reports)
    rows = [
        {
            "id": claim.id,
            "catalogue": claim.catalogue,
            "source": claim.source,
            "expected": claim.expected,
            "section": claim.section,
            "statement": claim.statement,
            "article": claim.article,
            "tests": tests.get(claim.id, []),
            "last_verdict": last.get(claim.id, {}).get("verdict"),
            "last_evidence": last.get(claim.id, {}).get("evidence"),
            "last_device": last.get(claim.id, {}).get("device"),
            "last_tests": last.get(claim.id, {}).get("tests", []),
        }
        for claim in claims.catalogue().values()
    ]
    if args.json:
        print(json.dumps(rows, ensure_ascii=False, indent=1))
        return 0
    from harness.reports.table import against_expected

    known = claims.catalogue()
    title = f"{len(rows)} claims (last verdicts from {args.reports}/{JOURNAL_NAME})"
    for row in rows:
        row["shown_tests"] = [t.split("/")[-1] for t in row["tests"]] or ["(no scenario yet)"]
        row["shown_verdict"] = (
            against_expected(row["last_verdict"], known[row["id"]]) if row["last_verdict"] else "-"
        )
    if sys.stdout.isatty() and len(rows) <= TABLE_ROWS:
        _claims_table(title, rows)
    else:
        import shutil

        width = max(shutil.get_terminal_size((80, 24)).columns, 40)
        sys.stdout.write(_claim_blocks(title, rows, width, sys.stdout.encoding))
    return 0


# `list` draws a table on a terminal; past this many claims, and in a log or a pipe, blocks: rich's
# Table takes about a millisecond a row (a project of 10,000 claims: 6 s), blocks a tenth of that.
TABLE_ROWS = 300
BASELINES = "reports/baselines"  # committed: the same folder whatever --reports says


def _claims_table(title: str, rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=shown.text(title))
    for name in ("claim", "statement", "source", "tests", "last verdict"):
        table.add_column(name, overflow="fold")
    for row in rows:
        cells = (row["id"], row["statement"], row["source"], "\n".join(row["shown_tests"]),
                 row["shown_verdict"])  # fmt: skip
        table.add_row(*map(shown.text, cells))  # data: never markup (a project's `[/bold]`)
    Console().print(table)


def _claim_blocks(title: str, rows: list[dict], width: int, encoding: str | None) -> str:
    """Each claim as a block that wraps at `width` (the terminal's; 80 in a log): its ID, last
    verdict and source on one line, then its statement and tests, indented; three lines a claim
    at 80 columns for most (a blank line and a line for the source made it 6 to 8). Every text
    is data (shown.visible: a project's `[/bold]` or ESC written out) in what `encoding` can
    show (`\u4e2d` on an ASCII terminal)."""
    from harness.reports.table import indented

    def lines(text: str, indent: str = "  ") -> list[str]:
        return indented(shown.for_encoding(shown.visible(str(text)), encoding), width, indent)

    out = lines(title, "") + [""]
    for row in rows:
        out += lines(f"{row['id']}  {row['shown_verdict']}  source: {row['source']}", "")
        out += lines(row["statement"])
        out += lines(f"tests: {', '.join(row['shown_tests'])}")
    return "\n".join(out) + "\n"


def _baseline(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    if args.action == "changes":
        from harness.reports import changes

        text = changes.write(Path(args.baselines), Path(args.page) if args.page else None)
        print(f"written: {args.page}" if args.page else text, end="\n" if args.page else "")
        return 0
    summary = baseline.summarize(
        Journal(Path(args.reports) / JOURNAL_NAME), args.session, saving=True
    )  # an experimental session is refused
    path = baseline.save(summary, Path(args.baselines), partial=args.partial, force=args.force)
    table = Table(title=shown.text(f"{summary['name']}: {len(summary['verdicts'])} verdicts"))
    for name in ("claim", "verdict", "evidence"):
        table.add_column(name, overflow="fold")
    for v in summary["verdicts"]:
        evidence = v["evidence"] if len(v["evidence"]) <= 90 else v["evidence"][:87] + "..."
        table.add_row(*map(shown.text, (v["claim"], v["verdict"], evidence)))
    Console().print(table)
    print(f"baseline written: {path}")
    if summary["lacks"]:
        print(f"marked incomplete (--partial): {'; '.join(summary['lacks'])}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    if args.range is not None:
        return _compare_range(args)
    if args.a is None:
        raise HarnessError("compare: give A (a session, a baseline file or `last`) or --range A..B")
    journal = Journal(Path(args.reports) / JOURNAL_NAME)
    try:
        a_label, a = compare.load(args.a, journal)
        b_label, b = compare.load(args.b, journal)
    except compare.MissingBaseline as exc:  # reported, not an error: there may be none yet
        if args.fail_on_regression:  # ... but a gate that compared nothing must not pass
            raise HarnessError(f"--fail-on-regression: {exc}") from None
        missing = {"missing_baseline": str(exc.path), "message": str(exc)}
        print(json.dumps(missing) if args.json else f"amp-harness: {exc}")
        return 0
    result = compare.compare(
        a, b, args.threshold, labels=(a_label, b_label), accepted=_accepted(Path(args.baselines))
    )
    passed = baseline.passed_over(journal) if "last" in (args.a, args.b) else ""
    if passed:  # `last` is the last session of record: the experiments after it are said
        print(f"amp-harness: {passed}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result.to_json(), ensure_ascii=False, indent=1, allow_nan=False))
    else:
        from rich.console import Console

        compare.render(result, Console())
    if args.fail_on_regression and not result.overlapped:
        print(
            f"amp-harness: error: --fail-on-regression: {a_label} against {b_label}: "
            f"{result.summary_line()}: a gate that compared nothing fails; compare runs of "
            "the same suite",
            file=sys.stderr,
        )
    return 1 if args.fail_on_regression and result.fails_the_gate else 0


def _compare_range(args: argparse.Namespace) -> int:
    """`compare --range A..B`: what changed when (harness.reports.ranges)."""
    from harness.reports import ranges

    if args.a is not None or args.fail_on_regression:  # a gate compares two runs, not a range
        raise HarnessError(
            "--range A..B takes the place of A and B, and gates nothing: give either the range, "
            "or A [B] (with --fail-on-regression)"
        )
    journal = Journal(Path(args.reports) / JOURNAL_NAME)
    found = ranges.over(journal, args.range, args.threshold, _accepted(Path(args.baselines)))
    if args.json:
        print(json.dumps(found.to_json(), ensure_ascii=False, indent=1, allow_nan=False))
    else:
        print(shown.for_encoding(shown.visible("\n".join(found.lines())), sys.stdout.encoding))
    return 0


def _upgrade(args: argparse.Namespace) -> int:
    """Per hardware class, the changes between the baselines of two torch releases, by kind
    (harness.reports.upgrade); exit 1 under --fail-on-regression when one is unexplained."""
    from harness.reports import upgrade

    since = upgrade.check_release("--from", args.since)
    until = upgrade.check_release("--to", args.to)
    folder = Path(args.baselines)
    found = upgrade.steps(folder, since, until, _accepted(folder), args.hardware_class)
    if args.json:
        print(json.dumps(upgrade.to_json(found, since, until), ensure_ascii=False, indent=1))
    else:
        print(f"torch {since} -> {until}, from the baselines in {folder}:")
        text = "\n".join(upgrade.lines(found, since, until))
        print(shown.for_encoding(shown.visible(text), sys.stdout.encoding))
    if not any(step.comparison for step, _ in found):
        raise HarnessError(
            f"no hardware class in {folder} has a baseline of both torch {since} and {until}: "
            "nothing compared (each class's releases are listed above)"
        )
    return 1 if args.fail_on_regression and upgrade.unexplained(found) else 0


def _fraction(text: str) -> float:
    """--threshold: a positive fraction, `0.1`, or a percentage, `10%`."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a fraction (0.1) or a percentage (10%)"
        ) from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the threshold must be above 0")
    return value


def _count(text: str) -> int:
    """--last: a whole number, 0 or more."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number, 0 or more (0: all)")
    return int(text)


def _sessions(args: argparse.Namespace) -> int:
    """The journal's sessions, oldest first (the last --last N), read from its index: a table on
    a wide terminal, two lines a session elsewhere (a log, a pipe, 80 columns)."""
    import shutil

    from harness.reports import sessions, table

    reports = Path(args.reports)
    if not reports.is_dir():
        raise HarnessError(
            f"--reports {args.reports}: no such folder ({reports.resolve()}): give the folder a "
            "session recorded into (`amp-harness run --reports DIR`, pytest's --amp-reports "
            "DIR), e.g. --reports reports"
        )
    journal = Journal(reports / JOURNAL_NAME)
    if args.action == "mark":  # the journal first, then the tags of its runs in MLflow
        entry, done = sessions.mark(journal, args.session, args.state, args.reason)
        print(done)
        uri = resolve_uri(args.tracking_uri, reports)
        print(sessions.tag_runs(entry, uri, args.experiment, reports))
        return 0
    found = sessions.rows(journal.index())
    chosen = found[-args.last :] if args.last else found
    if args.json:
        print(json.dumps([row.to_json() for row in chosen], ensure_ascii=False, indent=1))
        return 0
    if not found:
        print(f"no session recorded in {journal.path} yet: `amp-harness run` records one")
        return 0
    title = f"{len(found)} session{'s' if len(found) != 1 else ''} in {journal.path}, oldest first"
    if len(chosen) < len(found):
        title += f"; the last {len(chosen)} (--last 0: every one)"
    width = shutil.get_terminal_size((80, 24)).columns
    if sys.stdout.isatty() and width >= table.TABLE_WIDTH:
        from rich.console import Console

        Console().print(sessions.grid(chosen, title))
    else:
        title_lines = table.indented(shown.visible(title), width, "", whole_words=True)
        text = "\n".join([*title_lines, *sessions.blocks(chosen, width)])
        print(shown.for_encoding(text, sys.stdout.encoding))
    return 0


def _sync(args: argparse.Namespace) -> int:
    uri = resolve_uri(args.tracking_uri, Path(args.reports))
    journal = Journal(Path(args.reports) / JOURNAL_NAME)
    sink = MlflowSink(uri, args.experiment, Path(args.reports))

    def waiting() -> None:
        print(f"waiting for another `amp-harness sync` of {journal.path} to finish", flush=True)

    counts = sink.sync(journal, on_wait=waiting)
    for note in sink.notes:
        print(f"MLflow: {note}")
    parts = [
        f"{counts['sessions']} sessions",
        f"{counts['records_sent']} results sent"
        + (f" ({counts['records_replaced']} replacing half-logged runs)"
           if counts["records_replaced"] else ""),
        f"{counts['records_present']} already there",
    ]  # fmt: skip
    if counts["sessions_killed"]:
        parts.append(f"{counts['sessions_killed']} unfinished sessions ended as KILLED")
    if counts["copies_deleted"]:
        parts.append(f"{counts['copies_deleted']} runs made twice by a retried request deleted")
    if counts["runs_marked"]:
        parts.append(f"{counts['runs_marked']} runs tagged with their session's mark "
                     "(amp.experimental, `amp-harness sessions mark`)")  # fmt: skip
    if counts["sessions_running"]:
        parts.append(f"{counts['sessions_running']} still running, left to their own process")
    print(f"synced {journal.path} to {sink.label}: {', '.join(parts)}")
    for refused in sink.refused:
        print(f"amp-harness: error: MLflow refused {refused}", file=sys.stderr)
    if sink.refused:
        print(
            f"amp-harness: error: {len(sink.refused)} results refused by MLflow stay in the "
            "journal only: fix what it said (a value too long, a name it does not take), then "
            "sync again",
            file=sys.stderr,
        )
        return 2
    return 0


def _baseline_comparison(reports: Path, spec: str, baselines: Path) -> str | list[dict] | None:
    """The report's comparison: the journal's last session against a baseline (`auto`: the
    one `baseline save` names for that session's environment, else the nearest in `baselines`:
    harness.reports.nearest), each change of its kind, or why there is none."""
    if spec == "none":
        return None
    try:
        journal = Journal(reports / JOURNAL_NAME)
        label, last = compare.load("last", journal)  # the last session of record
        if spec == "auto":
            chosen = nearest.choose(baselines, last["fingerprint"])
            path, summary, chose = chosen.path, chosen.summary, [chosen.why] if chosen.why else []
            if summary is None:
                raise compare.MissingBaseline(path)
        else:
            path, chose = Path(spec), []
            summary = compare.read_baseline(path)
        result = compare.compare(
            summary, last, labels=(str(path), label), accepted=_accepted(baselines)
        )
    except HarnessError as exc:  # no session, no baseline, a bad one: the report says so
        return f"no comparison: {exc}"
    counted = [("verdict", v) for v in result.verdicts]
    counted += [("decision lost", d) for d in result.lost]
    counted += [("metric, flagged", m) for m in result.metrics if m.flagged]
    # The regressions first, then each other kind, then the metrics only listed.
    counted.sort(key=lambda kind_change: kinds.ORDER.index(kind_change[1].attribution.kind))
    rows = [
        {
            "change": kind
            + (f", {kinds.TITLE[change.attribution.kind]}" if change.attribution.explained else ""),
            "what": change.what(),
            "why": change.attribution.why,
        }
        for kind, change in counted + [("metric", m) for m in result.metrics if not m.flagged]
    ]
    rows += [{"change": "accepted change", "what": note} for note in result.accepted_notes]
    if result.not_compared:
        rows.append(
            {"change": "not compared", "what": f"part of the suite not run in {label} "
             f"({'; '.join(result.b_lacks)}): {', '.join(result.not_compared)}"}
        )  # fmt: skip
    notes = result.hardware_notes()  # across classes, or a class that is only a name
    passed = [text for text in [baseline.passed_over(journal)] if text]  # experiments after it
    if not rows:
        return " ".join(
            [f"{label} against {path}: {result.summary_line()}.", *chose, *notes, *passed]
        )
    return ([{"change": "session", "what": text} for text in passed]
            + [{"change": "baseline", "what": text} for text in chose]
            + [{"change": "hardware", "what": note} for note in notes] + rows)  # fmt: skip


def _accepted(baselines: Path) -> list:
    """The accepted changes beside the baselines (harness.reports.accepted), checked against the
    claims of every catalogue."""
    return accepted.read(accepted.default_path(baselines), claims.catalogue())


def _report(args: argparse.Namespace) -> int:
    uri = resolve_uri(args.tracking_uri, Path(args.reports))
    path = report.build(
        uri,
        report.report_dir(Path(args.reports), args.name),
        args.experiment,
        _baseline_comparison(Path(args.reports), args.baseline, Path(args.baselines)),
    )
    print(f"report written: {path} (summary.md and the figures beside it)")
    return 0


def _ui(args: argparse.Namespace) -> int:
    reports = Path(args.reports).resolve()
    if not reports.is_dir():  # MLflow would make the folder, and an empty store in it, silently
        raise HarnessError(
            f"--reports {args.reports}: no such folder ({reports}): give the folder a session "
            "recorded into (`amp-harness run --reports DIR`, pytest's --amp-reports DIR), e.g. "
            "--reports reports"
        )
    uri, cwd = default_uri(reports), None
    if uri != f"sqlite:///{reports / DB_NAME}":
        # A '?' or '%' in the path is escaped in the URI, and MLflow would create the folder the
        # escaped text names: from inside the folder, the plain file name needs no escape.
        uri, cwd = f"sqlite:///{DB_NAME}", reports
    _check_ui_address(args.host, args.port)
    command = [
        sys.executable, "-m", "mlflow", "ui",
        "--backend-store-uri", uri,
        "--default-artifact-root", (reports / ARTIFACTS_NAME).as_uri(),
        "--host", args.host, "--port", str(args.port),
        "--workers", "1",  # one person browsing: MLflow's default starts 4
    ]  # fmt: skip
    url = f"http://{args.host}:{args.port}"
    print(f"MLflow UI starting for {reports / DB_NAME} (Ctrl-C stops it)", flush=True)
    env = {
        **os.environ,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
        # MLflow 3's job runner starts seven huey consumer processes for GenAI jobs the harness
        # never submits: browsing runs needs none of them.
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    # Its own process group, so that a stop reaches the server and every worker it started.
    server = subprocess.Popen(
        command, env=env, start_new_session=True, **({"cwd": cwd} if cwd else {})
    )

    def stop(signum, _frame) -> None:
        # Unwind first: the server is stopped in `finally`, once server.wait() has let go of
        # the lock a second wait would block on.
        raise SystemExit(128 + signum)

    # SIGHUP too: a closed terminal or a dropped ssh session ends the UI as Ctrl-C does.
    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {s: signal.signal(s, stop) for s in stops}
    try:
        if _answers(f"{url}/health", server):
            runs = _runs_page(url, DEFAULT_EXPERIMENT)
            where = f"; the runs: {runs}" if runs else ""
            print(f"MLflow UI answering on {url}{where}", flush=True)
        return server.wait()
    except SystemExit as stopped:
        return 0 if stopped.code == 128 + signal.SIGINT else int(stopped.code)
    finally:
        _stop_group(server)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _answers(url: str, server: subprocess.Popen, timeout_s: float = 120.0) -> bool:
    """Wait until the server answers `url` (True), or exits or times out (False)."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            time.sleep(0.3)
    return False


def _runs_page(url: str, experiment: str) -> str | None:
    """The page of the experiment's runs on the UI at `url` (tracking.ui_url: the model training
    view, its test runs by claim), or None where the store has no such experiment yet. A store
    that lacks the harness's saved views (tracking.views: one from before them) is given them
    here, as MLflow's own "Save view" does; where it cannot be, the page is the runs list."""
    import urllib.parse
    import urllib.request

    api = f"{url}/ajax-api/2.0/mlflow/experiments"
    query = urllib.parse.urlencode({"experiment_name": experiment})
    try:
        with urllib.request.urlopen(f"{api}/get-by-name?{query}", timeout=10) as answer:
            found = json.load(answer)["experiment"]
        present = {t["key"]: t.get("value") for t in found.get("tags", [])}
        found = found["experiment_id"]
    except (OSError, ValueError, KeyError, TypeError):  # 404: no such experiment; an odd answer
        return None
    try:
        for key, value in views().items():
            if present.get(key) != value:
                tag = {"experiment_id": found, "key": key, "value": value}
                request = urllib.request.Request(
                    f"{api}/set-experiment-tag", json.dumps(tag).encode(), method="POST",
                    headers={"Content-Type": "application/json"},
                )  # fmt: skip
                urllib.request.urlopen(request, timeout=10).close()
    except OSError:  # a read-only store, a refusal: the runs list as MLflow opens it
        return ui_url(url, found, view=None)
    return ui_url(url, found)


def _stop_group(server: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, then SIGKILL if it has not ended in 10 s."""
    if server.poll() is not None:
        return
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    except ProcessLookupError:
        pass


def _check_ui_address(host: str, port: int) -> None:
    """Before the UI starts: the port must be free (MLflow's server would say so only in its
    log, and `amp-harness ui` would have claimed to serve it), and an address other than
    loopback is said to answer the network."""
    import ipaddress
    import socket

    if not 0 < port < 65536:
        raise HarnessError(f"--port {port}: give a port from 1 to 65535 (default 5000)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        raise HarnessError(
            f"--host {host}: not an address of this machine ({exc.strerror or exc}); the default "
            "127.0.0.1 serves this machine only"
        ) from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds it
        try:
            probe.bind(address)
        except OSError as exc:
            taken = exc.errno == errno.EADDRINUSE
            raise HarnessError(
                f"--port {port}: port {port} on {host} is taken (another `amp-harness ui`, or "
                f"another server): stop it, or pass another port, e.g. --port {port % 65535 + 1}"
                if taken
                else f"--host {host}: cannot listen there ({exc.strerror or exc}): use an "
                "address of this machine, e.g. 127.0.0.1 (the default)"
            ) from None
    if not ipaddress.ip_address(address[0]).is_loopback:
        print(
            f"amp-harness: warning: --host {host}: the MLflow UI answers the network, and it has "
            f"no authentication: anyone who reaches port {port} can read and delete the runs. "
            "Leave --host out to serve this machine only (127.0.0.1)",
            file=sys.stderr,
        )


def _project_catalogue(args: argparse.Namespace) -> Path:
    """--claims, else claims.toml in the scenario folder (as the plugin finds it)."""
    return Path(args.claims or Path(args.scenarios) / claims.PROJECT_FILE)


def _new(args: argparse.Namespace) -> int:
    from harness.catalogue import contract  # it imports pytest: only the commands that need it pay

    claim_id, statement = args.claim or (None, None)
    catalogue_path = _project_catalogue(args)
    path, claim = contract.new_scenario(
        args.name,
        Path(args.scenarios),
        catalogue_path,
        claim_id=claim_id,
        statement=statement,
        source=args.source,
        expected=args.expected,
    )
    print(
        f"wrote {path}: a working scenario of claim {claim.id}, added to "
        f"{catalogue_path}. Make it yours with docs/writing-a-scenario.md, then "
        f"`amp-harness validate` and `pytest {path}`"
    )
    return 0


def _validate(args: argparse.Namespace) -> int:
    from harness.catalogue import contract
    from harness.lab import devices  # the built-in capability names: torch, a second or two

    team = contract.declared_capabilities(Path(args.scenarios) / devices.TEAM_CAPABILITIES)
    known = {*devices.CAPABILITY_TEXT, *team}
    problems = contract.check(Path(args.scenarios), _project_catalogue(args), known)
    problems += _accepted_problems(Path(args.baselines), _project_catalogue(args))
    for problem in problems:
        print(problem)
    files = len(list(Path(args.scenarios).glob("test_*.py")))
    reviewed = accepted.default_path(Path(args.baselines))
    checked = f"{files} scenario files" + (f" and {reviewed}" if reviewed.exists() else "")
    if problems:
        print(f"validate: {len(problems)} problem(s) in {checked}", file=sys.stderr)
        return 1
    print(f"validate: the {files} scenario files in {args.scenarios} keep the contract")
    if reviewed.exists():
        print(f"validate: {reviewed} is well formed, and no entry of it expired")
    return 0


def _accepted_problems(baselines: Path, catalogue: Path) -> list[str]:
    """The accepted-changes file's problems (harness.reports.accepted), its claims held to the
    built-in catalogues and the project's."""
    restore = claims.use_project(catalogue)
    try:
        known = claims.catalogue()
    finally:
        restore()
    return accepted.problems(accepted.default_path(baselines), known)


def _diagnose(args: argparse.Namespace) -> int:
    """Measure the factory's model under every recipe the device runs; print the table, then
    keep the diagnosis in a file and in MLflow. Exit 1 when it could not judge (a capability
    regression, an fp32 reference that diverged) or could not keep it."""
    import shutil

    from harness.lab import devices, diagnose
    from harness.reports import diagnoses

    found = diagnose.diagnose(
        args.factory, devices.resolve(args.device, "--device"), steps=args.steps, lr=args.lr,
        optimizer=args.optimizer, names=args.recipes or diagnose.RECIPES, horizon=args.horizon,
        verify=args.verify, seeds=args.seeds, step_limit_s=args.step_timeout or None,
        compile_backend=args.compile,
    )  # fmt: skip
    width = shutil.get_terminal_size((100, 24)).columns
    print(diagnoses.render(found, width, sys.stdout.isatty()), end="")
    broken = [r.recipe for r in found.runs.values() if r.status in diagnose.BROKEN]
    code = 1 if broken else 0
    if broken:
        print(f"diagnose: not judged or regressed: {', '.join(broken)} (see above)",
              file=sys.stderr)  # fmt: skip
    try:
        saved = diagnoses.save(found, Path(args.reports))
    except OSError as exc:
        print(f"diagnose: the diagnosis above was not saved: {exc.strerror or exc} "
              f"({exc.filename or args.reports}); pass --reports a writable folder",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"diagnosis: {saved}")
    if args.no_mlflow:
        print("MLflow: off (--no-mlflow); the diagnosis is in the file above")
        return code
    try:
        uri = resolve_uri(args.tracking_uri, Path(args.reports))
        run_id = diagnoses.log(found, uri, saved, Path(args.reports))
    except Exception as exc:  # a dead server, an unopenable store: the file holds everything
        print(f"MLflow: not logged ({redact(str(exc))}); the diagnosis is in {saved}")
        return code
    print(f"MLflow: run {run_id} in experiment {diagnoses.EXPERIMENT!r} at {redact(uri)}")
    return code


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="amp-harness",
        description="Run the AMP claim scenarios, list the claims, and browse the results.",
    )
    sub = top.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--reports", default="reports", help="results folder (default: reports)")
        return p

    def baselines(p: argparse.ArgumentParser, *aliases: str) -> None:
        """The one folder of committed baselines and their accepted-changes.toml, never under
        --reports (what sessions produce)."""
        p.add_argument(
            "--baselines",
            *aliases,
            dest="baselines",
            default=BASELINES,
            metavar="DIR",
            help=f"the committed baselines and accepted-changes.toml (default: {BASELINES})",
        )

    run = command(
        "run",
        "run the scenarios this machine can run, but the slow ones (extra options go to pytest)",
    )
    run.add_argument("--scenarios", default="scenarios", help="scenario folder")
    run.add_argument(
        "--all",
        action="store_true",
        help="run the slow scenario tests too (marked slow: they compile or train to "
        "convergence, minutes on a CPU); a -k or -m of your own, or tests named "
        "(scenarios/test_x.py::test_y), run what they select",
    )
    listing = command("list", "each claim with the tests that check it and its last verdict")
    listing.add_argument("--scenarios", default="scenarios", help="scenario folder")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    claims_help = "the project's claim catalogue (default: SCENARIOS/claims.toml)"
    listing.add_argument("--claims", default=None, metavar="PATH", help=claims_help)
    sync = command("sync", "replay the journal into MLflow; what is there already is skipped")
    sync.add_argument(
        "--tracking-uri",
        default=None,
        help="default: $MLFLOW_TRACKING_URI or sqlite:///REPORTS/mlflow.db",
    )
    sync.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment")
    rep = command("report", "write the verdict ledger and figures from MLflow as a web page")
    rep.add_argument(
        "--tracking-uri",
        default=None,
        help="default: $MLFLOW_TRACKING_URI or sqlite:///REPORTS/mlflow.db",
    )
    rep.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment")
    rep.add_argument(
        "--name",
        default=report.DEFAULT_NAME,
        help=f"folder under REPORTS (default: {report.DEFAULT_NAME}, replaced by each build)",
    )
    rep.add_argument(
        "--baseline",
        default="auto",
        metavar="PATH|auto|none",
        help="compare the last session with this baseline file (default auto: its "
        "environment's in --baselines, else the nearest earlier release of its class, then the "
        "nearest class)",
    )
    baselines(rep)
    base = command("baseline", "save a session's verdicts and key metrics as a baseline file")
    base.add_argument(
        "action",
        choices=["save", "changes"],
        help="save: write a session's baseline; changes: the page of what differs between the "
        "torch releases of the baselines in --baselines (docs/what-changed-across-releases.md)",
    )
    baselines(base, "--out")  # --out: the name save's folder had before
    base.add_argument("--page", default=None, help="changes: write the page here (default: print)")
    base.add_argument(
        "--session", default=None, help="session id or a unique prefix (default: the last one; "
        "one marked experimental is refused)",
    )  # fmt: skip
    base.add_argument(
        "--partial",
        action="store_true",
        help="save a session that is not a complete run of the suite (deselected tests, modules "
        "not run, failed or interrupted tests), marked incomplete with what it lacks",
    )
    base.add_argument("--force", action="store_true", help="replace an existing baseline file")
    comp = command("compare", "compare two runs: changed verdicts, then metric changes")
    comp.add_argument(
        "a", metavar="A", nargs="?", help="a baseline JSON file, a session id (or a unique "
        "prefix), or `last` (the last session not marked experimental)",
    )  # fmt: skip
    comp.add_argument("b", metavar="B", nargs="?", default="last", help="the same (default: last)")
    comp.add_argument(
        "--range", metavar="A..B", default=None, help="instead of A and B: every session of "
        "record from A to B of A's hardware class, each against the one before it; per claim "
        "the sessions at which its verdict or a key metric changed (docs/history.md)",
    )  # fmt: skip
    comp.add_argument(
        "--threshold",
        type=_fraction,
        default=compare.THRESHOLD,
        help="relative change beyond which a significant metric change is flagged "
        f"(default {compare.THRESHOLD * 100:.0f}%%; 0.2 or 20%% for 20%%)",
    )
    comp.add_argument("--json", action="store_true", help="print JSON instead of tables")
    comp.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit 1 when a change is unexplained: not predicted by a known change of the "
        "release, gained, accepted (--baselines' accepted-changes.toml) or the hardware's",
    )
    baselines(comp)
    upgrade = command(
        "upgrade",
        "what an upgrade of torch changes on each hardware class, from the committed baselines: "
        "each change predicted, gained, accepted, the hardware's, or unexplained",
    )
    for name, when in (("--from", "before"), ("--to", "after")):
        upgrade.add_argument(
            name,
            dest=name[2:].replace("from", "since"),
            required=True,
            metavar="RELEASE",
            help=f"the torch release {when} the upgrade: 2.9.1, 2.9 (its newest patch among the "
            "baselines) or one build, 2.9.1+cu128",
        )
    upgrade.add_argument("--class", dest="hardware_class", default=None, help="only this class")
    upgrade.add_argument("--json", action="store_true", help="print JSON instead of lines")
    upgrade.add_argument(
        "--fail-on-regression", action="store_true", help="exit 1 when a change is unexplained"
    )
    baselines(upgrade)
    sessions = command(
        "sessions", "the recorded sessions: id, start, commit, hardware class, complete or partial"
    )
    sessions.add_argument(
        "--last",
        type=_count,
        default=20,
        metavar="N",
        help="the last N sessions (default 20; 0: every one)",
    )
    sessions.add_argument("--json", action="store_true", help="print JSON instead of lines")
    mark_help = (
        "mark a session experimental (kept out of the report's ledger, `baseline save` and "
        "`compare last`; its MLflow runs tagged amp.experimental=true), or of record again"
    )
    mark = sessions.add_subparsers(dest="action", metavar="mark").add_parser(
        "mark", help=mark_help, description=mark_help
    )
    mark.add_argument("session", metavar="ID", help="a session id or a unique prefix of it")
    mark.add_argument("state", choices=["experimental", "record"])
    mark.add_argument("--reason", default="", help="why, recorded with the mark")
    # SUPPRESS: `sessions --reports DIR mark ...` keeps its DIR
    mark.add_argument("--reports", default=argparse.SUPPRESS, help="results folder (reports)")
    mark.add_argument(
        "--tracking-uri",
        default=None,
        help="where its runs are tagged (default: $MLFLOW_TRACKING_URI or "
        "sqlite:///REPORTS/mlflow.db)",
    )
    mark.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment")
    ui = command("ui", "start the MLflow UI on the embedded store")
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    ui.add_argument("--port", type=int, default=5000)
    new_help = "write scenarios/test_NAME.py from a template that runs and passes as written"
    new = sub.add_parser("new", help=new_help, description=new_help)
    new.add_argument("name", metavar="NAME", help="letters, digits and _ (no test_ prefix)")
    new.add_argument("--scenarios", default="scenarios", help="scenario folder")
    new.add_argument("--claims", default=None, metavar="PATH", help=claims_help)
    new.add_argument(
        "--claim",
        nargs=2,
        metavar=("ID", "STATEMENT"),
        default=None,
        help="the claim the scenario checks, added to the project's catalogue (default: an ID "
        "made from NAME, with the template's example statement)",
    )
    new.add_argument(
        "--source",
        default="team decision",
        help="where the claim comes from: a paper, an issue, a URL (default: team decision)",
    )
    new.add_argument(
        "--expected",
        choices=claims.VERDICTS,
        default=None,
        help="the verdict the team expects for the claim: the verdict table flags another",
    )
    diag = command(
        "diagnose",
        "train a few steps of your model under every recipe and say which are safe, and why",
    )
    diag.add_argument(
        "factory",
        metavar="MODULE:FUNCTION",
        help="a function returning (model, batches, loss), e.g. harness.lab.diagnose.examples:mlp "
        "(docs/diagnose.md)",
    )
    diag.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    diag.add_argument("--steps", type=int, default=8, help="training steps per recipe (8)")
    diag.add_argument("--lr", type=float, default=1e-3, help="learning rate (1e-3)")
    diag.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    diag.add_argument(
        "--verify", type=int, default=0, metavar="N",
        help="then train N steps under each recipe and each recommended fix, and say whether "
        "the quick look's judgement held (the ground truth; slower)",
    )  # fmt: skip
    diag.add_argument(
        "--seeds", type=int, default=1, metavar="K",
        help="with --verify: train every recipe and fix from K initialisations (6 to 16; the "
        "factory's own seeds where it takes `seed`) beside fp32 from the same ones, and call a "
        "gap only where it is consistent (a paired sign-flip test, p < 0.05) and beyond fp32's "
        "seed spread: a gap under a rerun's spread shows; K times --verify's cost",
    )  # fmt: skip
    diag.add_argument(
        "--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
        help="also run each recipe with the model under torch.compile (inductor, or the backend "
        "named: aot_eager needs no compiler) and say where it does not train as eager",
    )  # fmt: skip
    diag.add_argument(
        "--horizon", type=int, default=1000, metavar="STEPS",
        help="how far ahead the growth forecast looks (1000)",
    )  # fmt: skip
    diag.add_argument(
        "--step-timeout", type=float, default=300, metavar="S",
        help="a training step that runs longer is stopped, with an error (300; 0: no limit)",
    )  # fmt: skip
    diag.add_argument(
        "--recipes", nargs="+", default=None, metavar="RECIPE",
        help="default: fp32 amp-fp16 amp-fp16-noscaler amp-bf16 half (fp32 always runs)",
    )  # fmt: skip
    diag.add_argument(
        "--tracking-uri", default=None,
        help="default: $MLFLOW_TRACKING_URI or sqlite:///REPORTS/mlflow.db",
    )  # fmt: skip
    diag.add_argument("--no-mlflow", action="store_true", help="the diagnosis file only")
    validate_help = "check every scenario file against the contract; exit 1 on any problem"
    validate = sub.add_parser("validate", help=validate_help, description=validate_help)
    validate.add_argument("--scenarios", default="scenarios", help="scenario folder")
    validate.add_argument("--claims", default=None, metavar="PATH", help=claims_help)
    baselines(validate)
    return top


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        # A terminal that cannot show every character (LC_ALL=C: ASCII) shows `\u4e2d` for
        # what it cannot, instead of ending the command in a UnicodeEncodeError.
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    args, rest = parser().parse_known_args(argv)
    if rest and args.command != "run":
        parser().error(f"unrecognized arguments: {' '.join(rest)}")
    handlers = {
        "list": _list,
        "sync": _sync,
        "ui": _ui,
        "baseline": _baseline,
        "report": _report,
        "compare": _compare,
        "upgrade": _upgrade,
        "new": _new,
        "validate": _validate,
        "diagnose": _diagnose,
        "sessions": _sessions,
    }
    try:
        return _run(args, rest) if args.command == "run" else handlers[args.command](args)
    except HarnessError as exc:
        print(f"amp-harness: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.filename is None:
            raise
        print(f"amp-harness: error: {_cannot_write(args.command, exc)}", file=sys.stderr)
        return 2


# The way round a folder a command cannot write in: the option that says where it writes.
_ELSEWHERE = "copy the reports folder to one you can write in and pass --reports there"
_WRITES_TO = {
    "baseline": "pass --baselines a folder you can write in",
    "new": "pass --scenarios a folder you can write in",
}


def _cannot_write(command: str, exc: OSError) -> str:
    """A file a command could not write (a read-only folder, a full disk, a name too long), as
    one line naming it and the fix. Every command writes its output whole or not at all (the
    report and baselines in a new file renamed into place): nothing recorded is lost."""
    where = Path(exc.filename)
    why = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        fix = f"free space on the disk of {where.parent}"
    else:
        fix = f"make {where.parent} writable, or {_WRITES_TO.get(command, _ELSEWHERE)}"
    return f"cannot write {where}: {why}. Fix: {fix}, then run `amp-harness {command}` again"


if __name__ == "__main__":
    sys.exit(main())
