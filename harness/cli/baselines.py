"""`amp-harness baseline save | changes`, `compare` and `upgrade`: a session kept as a baseline,
two runs set side by side (or every session of a range), the baselines of two torch releases;
each change of its kind, with the accepted changes beside the baselines."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.cli.arguments import accepted_changes, baselines, command
from harness.common import shown
from harness.common.errors import HarnessError
from harness.records.journal import JOURNAL_NAME, Journal
from harness.reports import baseline, compare, comparison_view


def add_baseline(sub) -> None:
    base = command(sub, "baseline", "save a session's verdicts and key metrics as a baseline file")
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
    base.set_defaults(handler=_baseline)


def add_compare(sub) -> None:
    comp = command(sub, "compare", "compare two runs: changed verdicts, then metric changes")
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
    comp.set_defaults(handler=_compare)


def add_upgrade(sub) -> None:
    upgrade = command(
        sub,
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
    upgrade.set_defaults(handler=_upgrade)


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
        a_label, a = baseline.load(args.a, journal)
        b_label, b = baseline.load(args.b, journal)
    except baseline.MissingBaseline as exc:  # reported, not an error: there may be none yet
        if args.fail_on_regression:  # ... but a gate that compared nothing must not pass
            raise HarnessError(f"--fail-on-regression: {exc}") from None
        missing = {"missing_baseline": str(exc.path), "message": str(exc)}
        print(json.dumps(missing) if args.json else f"amp-harness: {exc}")
        return 0
    result = compare.compare(
        a,
        b,
        args.threshold,
        labels=(a_label, b_label),
        accepted=accepted_changes(Path(args.baselines)),
    )
    passed = baseline.passed_over(journal) if "last" in (args.a, args.b) else ""
    if passed:  # `last` is the last session of record: the experiments after it are said
        print(f"amp-harness: {passed}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result.to_json(), ensure_ascii=False, indent=1, allow_nan=False))
    else:
        from rich.console import Console

        comparison_view.render(result, Console())
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
    found = ranges.over(journal, args.range, args.threshold, accepted_changes(Path(args.baselines)))
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
    found = upgrade.steps(folder, since, until, accepted_changes(folder), args.hardware_class)
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
