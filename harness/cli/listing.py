"""`amp-harness list`, `new` and `validate`: the claims of the catalogues with the tests that
check them and their last verdicts; a new scenario from the template, its claim added to the
project's catalogue; every scenario file held to the contract."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.catalogue import claims, verdicts
from harness.catalogue.files import CatalogueError
from harness.cli.arguments import baselines, command, scenarios
from harness.common import shown
from harness.common.errors import HarnessError
from harness.records import journal_index
from harness.records.journal import JOURNAL_NAME, Journal
from harness.reports import accepted

# `list` draws a table on a terminal; past this many claims, and in a log or a pipe, blocks: rich's
# Table takes about a millisecond a row (a project of 10,000 claims: 6 s), blocks a tenth of that.
TABLE_ROWS = 300


def _catalogue(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--claims",
        default=None,
        metavar="PATH",
        help="the project's claim catalogue (default: SCENARIOS/claims.toml)",
    )


def add_list(sub) -> None:
    listing = command(sub, "list", "each claim with the tests that check it and its last verdict")
    scenarios(listing)
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _catalogue(listing)
    listing.set_defaults(handler=_list)


def add_new(sub) -> None:
    new = command(
        sub,
        "new",
        "write scenarios/test_NAME.py from a template that runs and passes as written",
        reports=False,
    )
    new.add_argument("name", metavar="NAME", help="letters, digits and _ (no test_ prefix)")
    scenarios(new)
    _catalogue(new)
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
    new.set_defaults(handler=_new)


def add_validate(sub) -> None:
    validate = command(
        sub,
        "validate",
        "check every scenario file against the contract; exit 1 on any problem",
        reports=False,
    )
    scenarios(validate)
    _catalogue(validate)
    baselines(validate)
    validate.set_defaults(handler=_validate)


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

    from harness.catalogue.scenario_source import claimed_tests

    # Read from the files (no torch import: it answers at once); collected by pytest only where
    # a file's markers cannot be read without running it.
    tests = claimed_tests(Path(args.scenarios)) if Path(args.scenarios).is_dir() else {}
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


def _project_catalogue(args: argparse.Namespace) -> Path:
    """--claims, else claims.toml in the scenario folder (as the plugin finds it)."""
    return Path(args.claims or Path(args.scenarios) / claims.PROJECT_FILE)


def _new(args: argparse.Namespace) -> int:
    from harness.catalogue.template import new_scenario

    claim_id, statement = args.claim or (None, None)
    catalogue_path = _project_catalogue(args)
    path, claim = new_scenario(
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
    problems += _known_bug_problems(Path(args.scenarios), _project_catalogue(args))
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


def _known_bug_problems(scenarios: Path, catalogue: Path) -> list[str]:
    """The project's known-bug ledger (beside its claims) read and checked field by field, and
    each of its entries that no scenario test claims (docs/known-bugs.md)."""
    from harness.catalogue import known_bugs
    from harness.catalogue.scenario_source import claimed_tests

    try:
        bugs = known_bugs.project(catalogue)
    except CatalogueError as error:
        return [str(error)]
    claimed = claimed_tests(scenarios)
    if claimed is None:  # a module only pytest can read: `list` collects it; no guess here
        return []
    path = catalogue.with_name(known_bugs.PROJECT_FILE)
    return [
        f"{path}: {bug}: no scenario test claims it. Fix: reproduce it in a test marked "
        f'@pytest.mark.claim("{bug}") that calls record.known_bug("{bug}", ...)'
        for bug in bugs
        if bug not in claimed
    ]


def _accepted_problems(baselines: Path, catalogue: Path) -> list[str]:
    """The accepted-changes file's problems (harness.reports.accepted), its claims held to the
    built-in catalogues and the project's."""
    restore = claims.use_project(catalogue)
    try:
        known = claims.catalogue()
    finally:
        restore()
    return accepted.problems(accepted.default_path(baselines), known)
