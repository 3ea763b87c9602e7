"""`amp-harness sessions [mark ID experimental|record]`: the sessions the journal recorded, read
from its index; a session marked experimental after the fact (or of record again), in the
journal and on its MLflow runs."""

from __future__ import annotations

import argparse
import json
import sys

from harness.cli.arguments import command, recorded, tracking
from harness.common import shown
from harness.records.journal import JOURNAL_NAME, Journal
from harness.records.options import REPORTS
from harness.records.tracking import resolve_uri


def add(sub) -> None:
    sessions = command(
        sub,
        "sessions",
        "the recorded sessions: id, start, commit, hardware class, complete or partial",
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
    mark.add_argument(REPORTS.cli, **REPORTS.arguments(default=argparse.SUPPRESS))
    tracking(mark)  # where its runs are tagged
    sessions.set_defaults(handler=_sessions)


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

    reports = recorded(args.reports)
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
