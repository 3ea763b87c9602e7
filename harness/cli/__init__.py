"""`amp-harness run | list | report | baseline | compare | upgrade | known-bugs | sessions | sync |
ui | new | validate | diagnose`: thin wrappers over the plugin, the journal, the reports and
MLflow. A module a command or a group of them, each adding its own arguments and holding its
handler:

- `run`: run, where to look next, the report after it;
- `listing`: list, new, validate (the claims, a new scenario, the contract);
- `report`: report, and its comparison of the last session with a baseline;
- `baselines`: baseline save | changes, compare (and --range), upgrade;
- `known_bugs`: known-bugs (the ledger, per environment and upgrade);
- `sessions`: sessions, sessions mark;
- `store`: sync and ui (MLflow);
- `diagnose`: diagnose;
- `arguments`: what several commands take (those the plugin takes: harness.records.options);
- `__main__`: `python -m harness.cli`;
- this one: `parser()`, `main()`, and the errors every command ends with (exit 2).
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
from pathlib import Path

from harness.cli import baselines, diagnose, known_bugs, listing, report, run, sessions, store
from harness.common.errors import HarnessError

# Each adds its command's parser, in the order `amp-harness --help` lists them.
COMMANDS = (
    run.add,
    listing.add_list,
    store.add_sync,
    report.add,
    baselines.add_baseline,
    baselines.add_compare,
    baselines.add_upgrade,
    known_bugs.add,
    sessions.add,
    store.add_ui,
    listing.add_new,
    diagnose.add,
    listing.add_validate,
)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="amp-harness",
        description="Run the AMP claim scenarios, list the claims, and browse the results.",
    )
    sub = top.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return top


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        # A terminal that cannot show every character (LC_ALL=C: ASCII) shows `\u4e2d` for
        # what it cannot, instead of ending the command in a UnicodeEncodeError.
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    top = parser()
    args, rest = top.parse_known_args(argv)
    if rest and args.command != "run":
        top.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        # `run` hands what it does not know to pytest
        return args.handler(args, rest) if args.command == "run" else args.handler(args)
    except HarnessError as exc:
        print(f"amp-harness: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`amp-harness known-bugs | head`): stop quietly, as `cat` does,
        # and keep Python from failing again on flushing stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
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
