"""`amp-harness run`: pytest on the scenario folder through the plugin, then where to look next,
the report from the store the session logged to, and the session's id."""

from __future__ import annotations

import argparse
from pathlib import Path
from urllib.parse import urlparse

from harness.cli.arguments import command, scenarios
from harness.cli.report import baseline_comparison
from harness.common.errors import HarnessError
from harness.records.journal import JOURNAL_NAME
from harness.records.journal_index import short_id
from harness.records.options import BASELINES, EXPERIMENT, REPORTS, TRACKING_URI
from harness.records.tracking import command_line, redact, resolve_uri, sqlite_path
from harness.reports import report


def add(sub) -> None:
    run = command(
        sub,
        "run",
        "run the scenarios this machine can run, but the slow ones (extra options go to pytest)",
    )
    scenarios(run)
    run.add_argument(
        "--all",
        action="store_true",
        help="run the slow scenario tests too (marked slow: they compile or train to "
        "convergence, minutes on a CPU); a -k or -m of your own, or tests named "
        "(scenarios/test_x.py::test_y), run what they select",
    )
    run.set_defaults(handler=_run)


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
    if ran.id is None:  # nothing recorded: say why, and point only at what is there
        print(f"\nno session recorded: {_why_nothing(code, pytest_args)}")
    print("\n".join(_next_steps(session)))
    if ran.id is not None:
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
    options.add_argument(REPORTS.plugin, default=reports)
    for shared in (TRACKING_URI, EXPERIMENT, BASELINES):
        options.add_argument(shared.plugin, default=shared.default)
    options.add_argument("--no-mlflow", action="store_true")
    return options.parse_known_args(pytest_args)[0]


def _store_of(session: argparse.Namespace) -> str | None:
    """The tracking URI the session logged to; None under --no-mlflow."""
    return (
        None if session.no_mlflow else resolve_uri(session.tracking_uri, Path(session.amp_reports))
    )


def _why_nothing(code: int, pytest_args: list[str]) -> str:
    """Why a `run` recorded no session, from pytest's exit status, in words."""
    import pytest

    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        chosen = " ".join(f"-{o} {v!r}" for o, v in _selection(pytest_args).items() if v)
        return (
            "no scenario test was selected" + (f" by {chosen}" if chosen else "") + ": "
            "`amp-harness list` names the claims and the tests that check them"
        )
    if code == pytest.ExitCode.USAGE_ERROR:
        return "pytest stopped on the usage error above, before any test ran"
    if code == pytest.ExitCode.INTERRUPTED:
        return "interrupted before a scenario test ran"
    return f"pytest ended with exit status {int(code)} before a scenario test ran (above)"


def _next_steps(session: argparse.Namespace) -> list[str]:
    """Where to look after `run`, each line naming the folder and store the session used, and
    only what is there: a journal no session wrote, or a store never made, is not named."""
    reports, uri = Path(session.amp_reports), _store_of(session)
    lines = [
        "",
        "Where to look next:",
        f"  {command_line('list', reports=reports)}  each claim, the tests that check it, its "
        "last verdict",
    ]
    if uri is not None and urlparse(uri).scheme in ("http", "https"):
        lines.append(f"  {redact(uri)}  the tracking server: browse and compare the runs there")
    elif uri is not None and (sqlite_path(uri) is None or sqlite_path(uri).exists()):
        lines.append(
            f"  {command_line('ui', reports=reports, uri=uri)}  browse and compare the runs in "
            "MLflow (http://127.0.0.1:5000)"
        )
    journal = reports / JOURNAL_NAME
    if journal.is_file() and journal.stat().st_size:
        lines.append(f"  {journal}  every result, as recorded")
    return [*lines, ""]


def _selects(pytest_args: list[str]) -> bool:
    """Whether the user chose the tests with -k or -m: then those run, slow or not."""
    return any(v is not None for v in _selection(pytest_args).values())


def _selection(pytest_args: list[str]) -> dict[str, str | None]:
    """The -k and -m the user gave pytest (None: not given)."""
    options = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    options.add_argument("-k")
    options.add_argument("-m")
    return vars(options.parse_known_args(pytest_args)[0])


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
            baseline_comparison(reports, "auto", Path(session.amp_baselines)),
        )
    except Exception as exc:  # MLflow down, nothing logged, ...: say why, keep the exit code
        print(f"report: not written ({redact(str(exc))}); retry with {again}")
        return
    print(f"report: {path}")
