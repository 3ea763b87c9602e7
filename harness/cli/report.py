"""`amp-harness report`: the web page of verdicts and figures from MLflow, with the last session
against its baseline (the comparison `run` writes into its report too)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.arguments import accepted_changes, baselines, command, tracking
from harness.common.errors import HarnessError
from harness.records.journal import JOURNAL_NAME, Journal
from harness.records.tracking import resolve_uri
from harness.reports import baseline, compare, kinds, nearest, report


def add(sub) -> None:
    rep = command(sub, "report", "write the verdict ledger and figures from MLflow as a web page")
    tracking(rep)
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
    rep.set_defaults(handler=_report)


def _report(args: argparse.Namespace) -> int:
    uri = resolve_uri(args.tracking_uri, Path(args.reports))
    path = report.build(
        uri,
        report.report_dir(Path(args.reports), args.name),
        args.experiment,
        baseline_comparison(Path(args.reports), args.baseline, Path(args.baselines)),
    )
    print(f"report written: {path} (summary.md and the figures beside it)")
    return 0


def baseline_comparison(reports: Path, spec: str, baselines: Path) -> str | list[dict] | None:
    """The report's comparison: the journal's last session against a baseline (`auto`: the
    one `baseline save` names for that session's environment, else the nearest in `baselines`:
    harness.reports.nearest), each change of its kind, or why there is none."""
    if spec == "none":
        return None
    try:
        journal = Journal(reports / JOURNAL_NAME)
        label, last = baseline.load("last", journal)  # the last session of record
        if spec == "auto":
            chosen = nearest.choose(baselines, last["fingerprint"])
            path, summary, chose = chosen.path, chosen.summary, [chosen.why] if chosen.why else []
            if summary is None:
                raise baseline.MissingBaseline(path)
        else:
            path, chose = Path(spec), []
            summary = baseline.read_baseline(path)
        result = compare.compare(
            summary, last, labels=(str(path), label), accepted=accepted_changes(baselines)
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
