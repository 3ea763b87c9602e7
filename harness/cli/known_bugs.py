"""`amp-harness known-bugs [KB-ID] [--release R [--class C]] [--from A --to B]`: the known-bug
ledger with what this environment's last session showed, or a committed release's baselines;
one entry with its evidence and workaround; what an upgrade fixes, brings and keeps. Reads the
journal and the baselines only: nothing is run (docs/known-bugs.md)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from importlib import metadata
from pathlib import Path

from harness.cli.arguments import baselines, command
from harness.common import shown
from harness.common.errors import HarnessError, closest
from harness.records.journal import JOURNAL_NAME, Journal


def add(sub) -> None:
    found = command(
        sub,
        "known-bugs",
        "the known mixed-precision bugs of PyTorch's tracker, and which this environment (or a "
        "committed release) has",
    )
    found.add_argument("bug", nargs="?", metavar="KB-ID", help="show one entry, with its evidence")
    found.add_argument("--release", help="a committed release's verdicts (from the baselines)")
    found.add_argument("--class", dest="hardware_class", help="of this hardware class only")
    found.add_argument("--from", dest="older", metavar="RELEASE", help="upgrade from this release")
    found.add_argument("--to", dest="newer", metavar="RELEASE", help="upgrade to this release")
    found.add_argument("--json", action="store_true", help="print JSON instead of lines")
    baselines(found)
    found.set_defaults(handler=_known_bugs)


def _known_bugs(args: argparse.Namespace) -> int:
    from harness.catalogue.claims import ledger
    from harness.reports import known_bugs

    bugs = ledger()
    if (args.older is None) != (args.newer is None):
        raise HarnessError("--from and --to go together: `known-bugs --from 2.9.1 --to 2.13.0`")
    if args.bug is not None and args.bug not in bugs:
        raise HarnessError(
            f"{shown.visible(args.bug)}: no such entry in the ledger (closest: "
            f"{closest(args.bug, bugs)}); `amp-harness known-bugs` lists them"
        )
    if args.older is not None:
        columns = known_bugs.from_baselines(Path(args.baselines))
        found = known_bugs.upgrades(columns, args.older, args.newer, args.hardware_class)
        if args.json:
            _print_json([_upgrade_json(u) for u in found])
        else:
            for one in found:
                print(shown.visible(one.sentence()))
        return 0
    columns = _columns(args, known_bugs)
    if args.json:
        _print_json(_ledger_json(bugs, columns, args.bug))
        return 0
    if args.bug is not None:
        _show_one(bugs[args.bug], columns)
    else:
        _list(bugs, columns)
    return 0


def _columns(args: argparse.Namespace, known_bugs) -> list:
    """The environments asked for: a release's baselines; or this environment's last session
    (where it ran the reproductions) beside the committed baselines of the installed torch, each
    column naming where it was read from."""
    committed = known_bugs.from_baselines(Path(args.baselines))
    if args.release is not None:
        return known_bugs.pick(committed, args.release, args.hardware_class)
    found = []
    path = Path(args.reports) / JOURNAL_NAME
    if path.is_file():
        last = known_bugs.from_journal(Journal(path))
        found += [last] if last is not None else []
    # No baseline of this release: the session alone, or the ledger's prediction.
    with contextlib.suppress(HarnessError):
        found += known_bugs.pick(committed, _installed_torch(), args.hardware_class)
    return found


def _installed_torch() -> str:
    """The torch this environment has, read without importing it (a second, not a minute)."""
    return metadata.version("torch")


def _list(bugs: dict, columns: list) -> None:
    torch = _installed_torch()
    if columns:
        print(f"{len(bugs)} known bugs; columns, left to right:")
        for c in columns:
            print(shown.visible(f"  {c.label}: {c.source}"))
    else:
        print(
            f"{len(bugs)} known bugs. No session here ran their reproductions: the state shown "
            f"is the ledger's prediction for torch {torch}, not a measurement (`amp-harness run "
            f"--all -k known_bug` measures them; `--release R` reads a committed release)"
        )
    for bug in bugs.values():
        states = [c.state(bug.id) for c in columns] or [f"predicted {bug.predicted(torch)}"]
        print(shown.visible(f"{bug.id}  [{bug.kind}]  {' | '.join(states)}"))
        print(shown.visible(f"    {bug.harm}"))


def _show_one(bug, columns: list) -> None:
    lines = [
        f"{bug.id}: {bug.title}",
        f"harm: {bug.harm}",
        f"class: {bug.kind}; devices: {', '.join(bug.devices)}",
        f"affects: {bug.affects}",
        f"how the bounds were found: {bug.how}",
        f"upstream: {', '.join(bug.upstream)}",
        f"fix: {bug.fix}",
        f"workaround: {bug.workaround}",
    ]
    for c in columns:
        cell = c.cells.get(bug.id)
        if cell is None:
            lines.append(f"{c.label}: not measured")
            continue
        failed = "" if cell.stands else " (its test failed: the ledger did not predict it)"
        lines.append(f"{c.label}: {cell.state}{failed}: {cell.evidence}")
    if not columns:
        torch = _installed_torch()
        lines.append(
            f"this environment: not measured; the ledger predicts {bug.predicted(torch)} for "
            f"torch {torch}"
        )
    for line in lines:
        print(shown.visible(line))


def _ledger_json(bugs: dict, columns: list, only: str | None) -> list[dict]:
    return [
        {
            "id": bug.id,
            "title": bug.title,
            "harm": bug.harm,
            "class": bug.kind,
            "devices": list(bug.devices),
            "upstream": list(bug.upstream),
            "fix": bug.fix,
            "affects": bug.affects,
            "workaround": bug.workaround,
            "environments": [
                {
                    "hardware_class": c.hardware_class,
                    "torch": c.torch,
                    "source": c.source,
                    "state": c.state(bug.id),
                }  # fmt: skip
                for c in columns
            ],
        }
        for bug in bugs.values()
        if only in (None, bug.id)
    ]


def _upgrade_json(found) -> dict:
    return {
        "hardware_class": found.after.hardware_class,
        "from": found.before.torch,
        "to": found.after.torch,
        "fixes": found.fixes,
        "introduces": found.introduces,
        "keeps": found.keeps,
        "not_measured": found.unknown,
    }


def _print_json(data) -> None:
    print(json.dumps(data, ensure_ascii=False, indent=1))
    sys.stdout.flush()
