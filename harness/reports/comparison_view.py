"""A comparison on the terminal (`amp-harness compare`): changed verdicts, then metric changes
(flagged first), then what else was lost, accepted or only in one run, and the line that sums it
up. Apart from harness.reports.comparison, whose model it reads (never the other way round): the
same comparison is also JSON, the report's rows and the lines under the plugin's verdict table.
"""

from __future__ import annotations

import statistics

from harness.common import shown
from harness.reports import kinds, table
from harness.reports.comparison import Comparison, MetricChange, VerdictChange
from harness.reports.kinds import Attribution
from harness.reports.significance import percent


def render(comparison: Comparison, console) -> None:
    """Changed verdicts, then metric changes (flagged first): rich tables on a terminal at least
    table.TABLE_WIDTH wide, else blocks wrapped at the width (a log, a pipe, 80 columns: the
    tables' evidence column was one letter wide there). Every text is shown.text, never markup
    or terminal control: test ids carry brackets (`test_x[float16]`), evidence anything."""
    c = comparison
    for note in c.hardware_notes():  # first: it changes how every row below reads
        _line(console, note, "bold yellow")
    _line(console, f"A: {c.a}\nB: {c.b}")
    if c.environment:
        changed = "; ".join(f"{k} {a} -> {b}" for k, (a, b) in c.environment.items())
        _line(console, f"environment: {changed}")
    if c.scenarios_changed:
        _line(
            console,
            f"scenario changed (other code ran in A and B): {', '.join(c.scenarios_changed)}",
            "yellow",
        )
    wide = console.is_terminal and console.width >= table.TABLE_WIDTH
    if c.verdicts:
        explained = sum(v.attribution.explained for v in c.verdicts)
        _line(
            console,
            f"verdicts changed: {len(c.verdicts)}{_kinds_of(c.verdicts)}",
            "bold red" if explained < len(c.verdicts) else "bold yellow",
        )
        (_verdict_table if wide else _verdict_blocks)(c, console)
    if c.metrics:
        flagged = sum(m.flagged for m in c.metrics)
        _line(
            console,
            f"metrics changed: {len(c.metrics)}, flagged: {flagged} (Welch p < {c.alpha} and "
            f"a change beyond {c.threshold:.0%})",
            "bold",
        )
        (_metric_table if wide else _metric_blocks)(c, console)
    for lost in c.lost:
        _line(console, f"decision lost: {lost.describe()}", _style(lost.attribution))
    if c.not_compared:
        _line(
            console,
            f"not compared (B ran part of the suite): {', '.join(c.not_compared)}",
            "yellow",
        )
    for line in c.kind_lines():  # each kind apart, before the count of what fails
        _line(console, line, "yellow")
    for note in c.accepted_notes:
        _line(console, f"accepted change: {note}", "yellow")
    for side, missing in (("A", c.only_a), ("B", c.only_b)):
        if missing:
            more = f", ... ({len(missing)} in all)" if len(missing) > 5 else ""
            _line(console, f"only in {side}: {', '.join(missing[:5])}{more}")
    style = "bold red" if c.regressions else "green" if c.overlapped else "yellow"
    _line(console, c.summary_line(), style)


def _kinds_of(changes: list[VerdictChange]) -> str:
    """ " (2 predicted, 1 gained)": how many of the changes are of each kind but unexplained."""
    found = [v.attribution.kind for v in changes if v.attribution.explained]
    counts = [f"{found.count(kind)} {kind}" for kind in kinds.ORDER if kind in found]
    return f" ({', '.join(counts)})" if counts else ""


def _grid(*columns: tuple[str, dict]):
    """A rich table as wide as the console, with these columns: (header, add_column's options)."""
    from rich.table import Table

    grid = Table(expand=True)
    for header, options in columns:
        grid.add_column(header, **options)
    return grid


def _verdict_table(c: Comparison, console) -> None:
    grid = _grid(
        ("claim", {"no_wrap": True}),
        ("test", {"max_width": 40, "overflow": "fold"}),
        ("A -> B", {"max_width": 24, "overflow": "fold"}),
        # The evidence gets the room, and under it why the verdict may have changed.
        ("evidence, and why", {"ratio": 1, "overflow": "fold"}),
    )
    for v in c.verdicts:
        evidence = (
            shown.text(f"B: {v.evidence_after}\n")
            + shown.text(f"A: {v.evidence_before}\n", "dim")
            + _why_cell(v.attribution)
        )
        grid.add_row(
            shown.text(v.claim),
            shown.text(_short(v.test)),
            shown.text(f"{v.before} -> {v.after}"),
            evidence,
        )
    console.print(grid)


def _verdict_blocks(c: Comparison, console) -> None:
    """Per changed verdict: the claim, A -> B and the test on one line, then B's evidence, A's
    and why, indented."""
    for v in c.verdicts:
        console.print(shown.text(f"{v.claim}  {v.before} -> {v.after}  {_short(v.test)}", "bold"))
        _indented(console, f"B: {v.evidence_after}")
        _indented(console, f"A: {v.evidence_before}", "dim")
        _indented(console, f"why: {v.attribution.why}", _why_style(v.attribution))


def _metric_table(c: Comparison, console) -> None:
    grid = _grid(
        ("", {"no_wrap": True}),
        ("claims", {"max_width": 24, "overflow": "fold"}),
        ("metric (test)", {"ratio": 1, "overflow": "fold"}),
        ("A -> B", {"max_width": 24, "overflow": "fold"}),
        ("change", {"no_wrap": True}),
        ("p", {"max_width": 14, "overflow": "fold"}),
    )
    for m in c.metrics:
        metric = shown.text(f"{m.metric}\n") + shown.text(_short(m.test), "dim")
        if m.flagged:
            metric += shown.text("\n") + _why_cell(m.attribution)
        grid.add_row(
            shown.text(_flag(m)),
            shown.text(", ".join(m.claims)),
            metric,
            _change_cell(m),
            shown.text(percent(m.relative)),
            shown.text(f"{m.p_value:.2g}" if m.p_value is not None else m.note),
            style=_style(m.attribution) if m.flagged else None,
        )
    console.print(grid)


def _metric_blocks(c: Comparison, console) -> None:
    """Per metric change: its flag, claims and name on one line, then A -> B, the change, p and
    the test, and for a flagged one why, indented."""
    for m in c.metrics:
        flag = f"{_flag(m)}  " if m.flagged else ""
        head = f"{flag}{', '.join(m.claims) or '(no claim)'}  {m.metric}"
        console.print(shown.text(head, _style(m.attribution) if m.flagged else ""))
        p = f"p {m.p_value:.2g}" if m.p_value is not None else m.note
        means = f"{_means(m)} ({_repetitions(m)})" if _repetitions(m) else _means(m)
        _indented(console, f"{means}, {percent(m.relative)}, {p}; {_short(m.test)}")
        if m.flagged:
            _indented(console, f"why: {m.attribution.why}", _why_style(m.attribution))


def _indented(console, text: str, style: str = "", indent: str = table.INDENT) -> None:
    """`text` as data, wrapped at the console's width under `indent`."""
    for line in table.indented(shown.visible(text), console.width, indent):
        console.print(line, style=style, soft_wrap=True, markup=False, highlight=False)


def _line(console, text: str, style: str = "") -> None:
    """A line of the comparison's own, as data; what it wraps into indented under it (rich
    wrapped `A: session ... / torch` onto a line of its own at the left margin)."""
    _indented(console, text, style, indent="")


def _style(attribution: Attribution) -> str:
    return "yellow" if attribution.explained else "bold red"


def _why_style(attribution: Attribution) -> str:
    return "yellow" if attribution.explained else "bold"


def _why_cell(attribution: Attribution):
    return shown.text(f"why: {attribution.why}", _why_style(attribution))


def _flag(m: MetricChange) -> str:
    if not m.flagged:
        return ""
    return m.attribution.kind if m.attribution.explained else "FLAGGED"


def _change_cell(m: MetricChange):
    cell = shown.text(_means(m))
    if _repetitions(m):
        cell.append(f"\n{_repetitions(m)}", "dim")
    return cell


def _means(m: MetricChange) -> str:
    return f"{statistics.fmean(m.before):.4g} -> {statistics.fmean(m.after):.4g}"


def _repetitions(m: MetricChange) -> str:
    """How many samples each mean is of, where either is of several; "" where both are one."""
    return (
        f"means, n={len(m.before)} vs {len(m.after)}"
        if max(len(m.before), len(m.after)) > 1
        else ""
    )


def _short(test: str) -> str:
    return test.rsplit("/", 1)[-1]
